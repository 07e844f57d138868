"""Elastic resume: N steps on plan A (2 devices), checkpoint, resume on plan B (4 devices) -> the losses
match an uninterrupted run; data resumes exactly. Corrupt or mismatched checkpoints: one-line errors,
checkpoint untouched."""

from __future__ import annotations

from dataclasses import replace

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from libarena.errors import ArenaError
from libarena.models import get_model
from libarena.run.train import batch_for_step
from tests.run.conftest import run_worker

PLAN_A = {"bounds": [0], "dp": [2], "tp": [1], "micro": 2, "zero": [1]}  # pure DP + ZeRO on 2 devices
PLAN_B = {"bounds": [0, 2], "dp": [2, 1], "tp": [1, 2], "micro": 4, "zero": [0, 0]}  # PP x (DP | TP) on 4 devices


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_data_stream_is_a_function_of_position() -> None:
    model = get_model("gpt__tiny")
    two_steps = batch_for_step(model, 0, 16, 3)
    second = batch_for_step(model, 8, 8, 3)
    np.testing.assert_array_equal(two_steps["tokens"][8:], second["tokens"])


@pytest.mark.multidevice
def test_resume_on_another_plan_and_device_count_matches_uninterrupted(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    # Process 1 (2 devices): the uninterrupted 6-step reference, then 3 checkpointed steps on the same plan.
    full, first = run_worker("tests.run.resume_worker", [json.dumps([
        {"plan": PLAN_A, "steps": 6, "checkpoint_dir": None, "every": 0},
        {"plan": PLAN_A, "steps": 3, "checkpoint_dir": str(ckpt), "every": 3},
    ])], 2)
    assert first["checkpoints"] == [3]
    # Process 3 (4 devices): resume on plan B up to step 6.
    (second,) = run_worker("tests.run.resume_worker", [json.dumps([{"plan": PLAN_B, "steps": 6, "checkpoint_dir": str(ckpt), "every": 3}])], 4)
    assert second["resumed_from"] == 3 and second["start_step"] == 3 and second["end_step"] == 6
    assert second["num_devices"] == 4 and first["num_devices"] == 2
    reference = dict((s, l) for s, l in full["losses"])
    resumed = dict((s, l) for s, l in first["losses"] + second["losses"])
    assert sorted(resumed) == [1, 2, 3, 4, 5, 6]  # no step repeated or skipped
    for step in range(1, 7):
        assert resumed[step] == pytest.approx(reference[step], rel=1e-5), step
    # The loss moved: resuming from a fresh init instead would not match.
    assert abs(reference[6] - reference[1]) > 1e-3


def _make_checkpoint(tmp_path: Path) -> tuple[Path, object]:
    from libarena.models.training import OptimizerConfig, init_optimizer_state, init_params
    from libarena.run.checkpoint import CheckpointMeta, CheckpointStore, param_signature
    from tests.run.micro import micro_gpt

    model = micro_gpt()
    opt = OptimizerConfig()
    params = init_params(model, 0)
    unit_opt = init_optimizer_state(params, opt)
    store = CheckpointStore(tmp_path / "ckpt")
    meta = CheckpointMeta(model.name, 8, 2, 16, 0, "fp32", {"learning_rate": 1e-3, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.0},
                          param_signature(model), "p", 1)
    store.save(params, unit_opt, meta)
    return tmp_path / "ckpt", model


def test_checkpoint_roundtrip_and_mismatch(tmp_path: Path) -> None:
    from libarena.models.training import OptimizerConfig
    from libarena.run.checkpoint import CheckpointStore
    from tests.run.micro import micro_moe

    root, model = _make_checkpoint(tmp_path)
    store = CheckpointStore(root)
    params, opt, meta = store.restore(model, OptimizerConfig())
    assert meta.step == 2 and meta.data_position == 16 and len(params) == len(model.units)
    before = _tree_digest(root)
    with pytest.raises(ArenaError, match="global batch 8, not 16"):
        store.check_compatible(meta, model, 16, 0, OptimizerConfig())
    with pytest.raises(ArenaError, match="not 'moe__micro'"):
        store.check_compatible(meta, micro_moe(), 8, 0, OptimizerConfig())
    with pytest.raises(ArenaError, match="optimizer"):
        store.check_compatible(meta, model, 8, 0, OptimizerConfig(learning_rate=0.5))
    # the compute dtype, in any of its spellings (a checkpoint may record "float32" or "bfloat16")
    store.check_compatible(meta, model, 8, 0, OptimizerConfig(), dtype="float32")
    with pytest.raises(ArenaError, match="was trained in fp32, not bf16"):
        store.check_compatible(meta, model, 8, 0, OptimizerConfig(), dtype="bf16")
    store.check_compatible(replace(meta, dtype="bfloat16"), model, 8, 0, OptimizerConfig(), dtype="bf16")
    assert _tree_digest(root) == before


def test_corrupt_checkpoint_is_one_line_error_and_untouched(tmp_path: Path) -> None:
    from libarena.models.training import OptimizerConfig
    from libarena.run.checkpoint import CheckpointStore

    root, model = _make_checkpoint(tmp_path)
    victims = [p for p in (root / "2" / "state").rglob("*") if p.is_file() and p.stat().st_size > 0 and "manifest" in p.name]
    assert victims
    for p in victims:
        p.write_bytes(b"\x00garbage" * 4)
    before = _tree_digest(root)
    with pytest.raises(ArenaError) as info:
        CheckpointStore(root).restore(model, OptimizerConfig())
    assert "corrupt" in info.value.message and "\n" not in info.value.message
    assert _tree_digest(root) == before


def test_newest_usable_skips_corrupt_and_empty_newer_checkpoints(tmp_path: Path) -> None:
    """A save killed half-way (an empty step directory) or a damaged newer checkpoint does not block resuming
    from an earlier one; each skipped one is named with why; with none usable the first problem is the error."""
    import shutil

    from libarena.models.training import OptimizerConfig
    from libarena.run.checkpoint import CheckpointStore

    root, model = _make_checkpoint(tmp_path)
    shutil.copytree(root / "2", root / "4")
    (root / "4" / "meta" / "metadata").write_text("{not json")
    (root / "6").mkdir()
    # valid JSON with a field of the wrong type (it used to escape as a TypeError where first multiplied)
    shutil.copytree(root / "2", root / "8")
    meta_file = root / "8" / "meta" / "metadata"
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "step": 8, "global_batch": None}))
    before = _tree_digest(root)
    meta, skipped = CheckpointStore(root).newest_usable(model, 8, 0, OptimizerConfig())
    assert meta.step == 2
    assert [s["step"] for s in skipped] == [8, 6, 4]
    assert "incomplete metadata: global_batch is None, expected an integer" in skipped[0]["why"]
    assert all("corrupt" in s["why"] for s in skipped[1:])
    assert _tree_digest(root) == before  # the skipped checkpoints are left as they were
    shutil.rmtree(root / "8")
    before = _tree_digest(root)
    assert all("\n" not in s["why"] and len(s["why"]) < 400 for s in skipped)
    # a checkpoint of another job is not damage: an error, not skipped
    with pytest.raises(ArenaError, match="global batch 8, not 16"):
        CheckpointStore(root).newest_usable(model, 16, 0, OptimizerConfig())
    shutil.rmtree(root / "2")
    with pytest.raises(ArenaError, match=r"ckpt/6 is corrupt .*; no earlier checkpoint .* is usable"):
        CheckpointStore(root).newest_usable(model, 8, 0, OptimizerConfig())
    assert _tree_digest(root) == {k: v for k, v in before.items() if not k.startswith("2/")}


def test_processes_that_would_resume_from_different_steps_stop_before_training(tmp_path: Path, monkeypatch) -> None:
    """A multi-host job's processes each read --checkpoint-dir: where one sees another step (a directory that is
    not shared by the nodes) they would train a mixture of two states, then hang in a collective. Each process
    compares the step it would resume from with the others' and stops, the checkpoint untouched. (The gather is
    a real collective on a multi-host job; here one process stands for a host that saw no checkpoint.)"""
    import jax

    from libarena.models.training import OptimizerConfig
    from libarena.run import distributed
    from libarena.run.plan import simple_plan
    from libarena.run.train import TrainConfig, train

    root, model = _make_checkpoint(tmp_path)
    before = _tree_digest(root)
    seen = []

    def another_host_saw_none(value: int) -> list[int]:
        seen.append(value)
        return [value, 0]

    monkeypatch.setattr(distributed, "gather_over_processes", another_host_saw_none)
    plan = simple_plan(model, 8, [0], [1], [1], 1)
    config = TrainConfig(8, 3, optimizer=OptimizerConfig(), checkpoint_dir=str(root), checkpoint_every=1, profile_step=0)
    with pytest.raises(ArenaError, match=rf"^the job's processes would resume from different steps \(2, 0 by process\): "
                                         rf"every host must see the same --checkpoint-dir {root} \(a directory shared"):
        train(model, plan, config, jax.devices()[:1])
    assert seen == [2] and _tree_digest(root) == before
