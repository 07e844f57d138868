"""One training step under every plan of a small grid equals the single-device step (loss, updated
parameters, Adam moments), on 1, 2, 4 and 8 host devices (one subprocess per device count)."""

from __future__ import annotations

import pytest

from tests.run.conftest import run_worker
from tests.run.equivalence_worker import GRIDS


@pytest.mark.multidevice
@pytest.mark.parametrize("num_devices", [1, 2, 4, 8])
def test_plans_match_single_device_step(num_devices: int) -> None:
    results = run_worker("tests.run.equivalence_worker", [str(num_devices)], num_devices)
    assert len(results) == len(GRIDS[num_devices])
    for r in results:
        where = f"{r['model']} {r['plan']} on {num_devices} devices"
        assert abs(r["loss"] - r["reference_loss"]) <= 1e-5 * abs(r["reference_loss"]), where
        # lr 1e-2: parameters move by ~1e-2 in one step; a wrong gradient shows up far above 1e-5.
        assert r["param_error"] < 1e-5, (where, r["param_error"])
        assert r["moment_error"] < 1e-6, (where, r["moment_error"])
