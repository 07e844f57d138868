"""Training gpt__tiny and moe__tiny under a pipelined proxy plan (2 host devices, through the CLI): the
loss falls over a 200-step run. At lr 3e-3 the loss goes from ~5.7 (chance level is ln 256 = 5.5) to below ~3 by step 60; the
criterion asks for the last 10 steps' mean below 0.6x the first 10 steps'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.run.conftest import make_plans
from tests.run.test_cli import arena_run

STEPS = 200  # the issue asks for a 200-step run


@pytest.mark.slow
@pytest.mark.multidevice
@pytest.mark.parametrize("model", ["gpt__tiny", "moe__tiny"])
def test_loss_falls(model: str, tmp_path: Path) -> None:
    plans = make_plans(model, 8, tmp_path)
    proc = arena_run("--plan", str(plans), "--grid", "a100,2,2", "--model", model, "--global-batch", "8", "--steps", str(STEPS),
                     "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "0", "--no-ray", "--devices", "2", "--json",
                     "--lr", "3e-3", devices=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["plan"]["pipeline_degree"] == 2
    losses = [loss for _, loss in report["train"]["losses"]]
    assert len(losses) == STEPS
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.6 * first, (first, last)
