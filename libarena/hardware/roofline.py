"""The roofline model, in one place: how long an operator needs on a device from its FLOPs and bytes.

eq. 2 of the paper, L = F / R(F / M) with R(I) = min(peak, I x bandwidth), is the same as
``max(F / peak, M / bandwidth)``: the time of the FLOPs at peak or of the bytes at the memory bandwidth,
whichever is longer. That form also charges zero-FLOP operators (copies, transposes) their bytes and
zero-byte ones their FLOPs, and it works element-wise on numpy arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def roofline_seconds(flops: Any, bytes_moved: Any, peak_flops: float, bandwidth: float) -> Any:
    """Roofline time of operators with ``flops`` and ``bytes_moved`` (scalars or arrays, element-wise)."""
    return np.maximum(np.asarray(flops, dtype=np.float64) / peak_flops, np.asarray(bytes_moved, dtype=np.float64) / bandwidth)
