"""arena_cupti: CUPTI kernel timing for arena-profile (implementation in ``arena_cupti.activity``).

Import ``arena_cupti.activity`` (works for both editable and regular installs).
"""

from arena_cupti.activity import (  # noqa: F401
    BUFFER_BYTES,
    CuptiUnavailable,
    KernelActivityRecorder,
    KernelRecord,
    available,
    kernel_seconds,
)
