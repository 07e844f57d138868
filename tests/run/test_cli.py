"""arena-run end to end (in-process mode) and its bad-input contract: one line, exit 2, checkpoint untouched."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.run.conftest import REPO, device_env


def arena_run(*args: str, devices: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "arena_run.main", *args], cwd=REPO, env=device_env(devices), capture_output=True,
                          text=True, timeout=600)


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("arena-run: error:"), proc.stderr[-2000:]
    assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def trained(gpt_tiny_plans: Path, tmp_path_factory) -> tuple[Path, dict]:
    """Two steps of gpt__tiny's 1-GPU proxy plan through the CLI, checkpointed."""
    ckpt = tmp_path_factory.mktemp("cli") / "ckpt"
    proc = arena_run("--plan", str(gpt_tiny_plans), "--grid", "a100,1,1", "--model", "gpt__tiny", "--global-batch", "8", "--steps", "2",
                     "--checkpoint-dir", str(ckpt), "--no-ray", "--json", "--devices", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return ckpt, json.loads(proc.stdout)


def test_cli_trains_the_proxy_plan_and_checkpoints(trained) -> None:
    ckpt, report = trained
    assert report["plan"]["is_proxy"] and report["plan"]["num_gpus"] == 1
    assert [s for s, _ in report["train"]["losses"]] == [1, 2]
    assert report["train"]["checkpoints"] == [2]
    assert (ckpt / "2").is_dir()
    assert report["train"]["stage_peak_memory_bytes"][0] > 0


def test_plan_needing_more_devices_than_exist(gpt_tiny_plans: Path, tmp_path: Path) -> None:
    proc = arena_run("--plan", str(gpt_tiny_plans), "--grid", "a100,4,1", "--model", "gpt__tiny", "--global-batch", "8", "--steps", "1",
                     "--checkpoint-dir", str(tmp_path / "c"), "--no-ray", "--devices", "2")
    _one_line_error(proc, "needs 4 a100 GPUs but only 2 devices exist")
    assert not (tmp_path / "c").exists()


def test_plan_for_another_model(gpt_tiny_plans: Path, tmp_path: Path) -> None:
    proc = arena_run("--plan", str(gpt_tiny_plans), "--grid", "a100,1,1", "--model", "moe__tiny", "--global-batch", "8", "--steps", "1",
                     "--checkpoint-dir", str(tmp_path / "c"), "--no-ray")
    _one_line_error(proc, "plans for model 'gpt__tiny', not 'moe__tiny'")


def test_a_report_path_that_is_the_plans_file_is_refused_by_its_own_name(gpt_tiny_plans: Path, tmp_path: Path) -> None:
    import shutil

    plans = tmp_path / "plans.parquet"
    shutil.copy(gpt_tiny_plans, plans)
    before = plans.read_bytes()
    proc = arena_run("--plan", str(plans), "--grid", "a100,1,1", "--model", "gpt__tiny", "--global-batch", "8", "--steps", "1",
                     "--checkpoint-dir", str(tmp_path / "c"), "--no-ray", "--report", str(plans))
    _one_line_error(proc, f"--report {plans} is the input --plan {plans}: refusing to overwrite an input")
    assert plans.read_bytes() == before


def test_unreachable_ray_address(gpt_tiny_plans: Path, tmp_path: Path) -> None:
    import socket

    # a port this test holds without listening: nothing can answer there (a fixed one may have a listener)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{held.getsockname()[1]}"
        proc = arena_run("--plan", str(gpt_tiny_plans), "--grid", "a100,1,1", "--model", "gpt__tiny", "--global-batch", "8",
                         "--steps", "1", "--checkpoint-dir", str(tmp_path / "c"), "--address", address)
    _one_line_error(proc, f"cannot reach the Ray cluster at {address}")


def test_mismatched_and_corrupt_checkpoints_are_left_untouched(trained, gpt_tiny_plans: Path, tmp_path: Path) -> None:
    import shutil

    ckpt, _ = trained
    # Mismatched: the checkpoint is gpt__tiny at global batch 8; resume it with another learning rate.
    before = _digest(ckpt)
    proc = arena_run("--plan", str(gpt_tiny_plans), "--grid", "a100,1,1", "--model", "gpt__tiny", "--global-batch", "8", "--steps", "3",
                     "--checkpoint-dir", str(ckpt), "--no-ray", "--lr", "0.5")
    _one_line_error(proc, "was trained with optimizer")
    assert _digest(ckpt) == before
    # Corrupt: a copy whose metadata is garbage.
    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    for meta in (broken / "2" / "meta").glob("metadata"):
        meta.write_text("{not json")
    before = _digest(broken)
    proc = arena_run("--plan", str(gpt_tiny_plans), "--grid", "a100,1,1", "--model", "gpt__tiny", "--global-batch", "8", "--steps", "3",
                     "--checkpoint-dir", str(broken), "--no-ray")
    _one_line_error(proc, "is corrupt")
    assert _digest(broken) == before


def test_resume_falls_back_past_a_corrupt_latest_checkpoint(trained, gpt_tiny_plans: Path, tmp_path: Path) -> None:
    """The newest checkpoint's arrays are damaged (its metadata still reads) and an empty step directory is newer
    still: arena-run says which ones it skipped and why, resumes from the newest valid one and trains on."""
    import shutil

    ckpt, _ = trained
    work = tmp_path / "ckpt"
    shutil.copytree(ckpt, work)
    args = ("--plan", str(gpt_tiny_plans), "--grid", "a100,1,1", "--model", "gpt__tiny", "--global-batch", "8",
            "--checkpoint-dir", str(work), "--no-ray", "--devices", "1")
    proc = arena_run(*args, "--steps", "4", "--checkpoint-every", "2")
    assert proc.returncode == 0 and (work / "4").is_dir(), proc.stderr[-2000:]
    for manifest in (work / "4" / "state").rglob("manifest.ocdbt"):
        manifest.write_bytes(b"garbage")
    (work / "6").mkdir()
    proc = arena_run(*args, "--steps", "6", "--checkpoint-every", "2", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    # it trains through the damaged steps and saves them anew: they were set aside, not in its way
    assert report["resumed_from"] == 2 and [s for s, _ in report["train"]["losses"]] == [3, 4, 5, 6]
    assert report["train"]["checkpoints"] == [4, 6]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: skipped checkpoint")]
    assert len(warnings) == 2, proc.stderr
    assert f"{work}/6 (set aside as {work}/unusable-6):" in warnings[0]
    assert f"{work}/4 (set aside as {work}/unusable-4):" in warnings[1]
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in work.iterdir()) == ["4", "6", "unusable-4", "unusable-6"]  # the newest two kept
    proc = arena_run(*args, "--steps", "7", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["resumed_from"] == 6, proc.stderr[-2000:]
    assert "warning" not in proc.stderr


def test_steps_below_the_checkpoint_say_so(trained, gpt_tiny_plans: Path) -> None:
    ckpt, _ = trained  # at step 2
    args = ("--plan", str(gpt_tiny_plans), "--grid", "a100,1,1", "--model", "gpt__tiny", "--global-batch", "8",
            "--checkpoint-dir", str(ckpt), "--no-ray", "--devices", "1")
    before = _digest(ckpt)
    _one_line_error(arena_run(*args, "--steps", "1"), "is already at step 2, past --steps 1")
    proc = arena_run(*args, "--steps", "2")
    assert proc.returncode == 0 and "nothing to train: the checkpoint is already at step 2 (--steps 2)" in proc.stderr
    assert _digest(ckpt) == before
    # a finished job rerun with a runtime search searches nothing (it would measure every candidate for no step)
    proc = arena_run(*args, "--steps", "2", "--search", "pruned", "--json")
    assert proc.returncode == 0 and "nothing to train: the checkpoint is already at step 2 (--steps 2)" in proc.stderr
    report = json.loads(proc.stdout)
    assert report["plan"] is None and "search" not in report and report["resumed_from"] == 2
    assert _digest(ckpt) == before


def test_a_checkpoint_dir_that_cannot_be_written_is_refused_before_training(gpt_tiny_plans: Path, tmp_path: Path,
                                                                           monkeypatch) -> None:
    """Found at the first save it would cost the training up to it (the whole run with --checkpoint-every 0)."""
    import tempfile

    from libarena.errors import ArenaError
    from libarena.run.api import check_checkpoint_writable

    proc = arena_run("--plan", str(gpt_tiny_plans), "--grid", "a100,1,1", "--model", "gpt__tiny", "--global-batch", "8",
                     "--steps", "1", "--checkpoint-dir", str(tmp_path / "ckpt"), "--no-ray",
                     "--report", str(tmp_path / "ckpt"))
    _one_line_error(proc, "is the --checkpoint-dir: write the report elsewhere")
    check_checkpoint_writable(str(tmp_path / "new"))  # a new directory in a writable folder: nothing made
    assert list(tmp_path.iterdir()) == []

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)  # (a read-only mount: permission bits do not show it)
    with pytest.raises(ArenaError, match=rf"^--checkpoint-dir {tmp_path / 'new'}: cannot write in {tmp_path} "
                                         r"\(Read-only file system\)$"):
        check_checkpoint_writable(str(tmp_path / "new"))


def test_checkpoint_dir_parents_are_not_created(gpt_tiny_plans: Path, tmp_path: Path) -> None:
    proc = arena_run("--plan", str(gpt_tiny_plans), "--grid", "a100,1,1", "--model", "gpt__tiny", "--global-batch", "8",
                     "--steps", "1", "--checkpoint-dir", str(tmp_path / "no" / "such" / "ckpt"), "--no-ray")
    _one_line_error(proc, "does not exist (only the checkpoint directory itself is created)")
    assert not (tmp_path / "no").exists()


def test_the_proxy_plan_runs_where_its_micro_batch_count_does_not_divide_the_global_batch(tmp_path: Path) -> None:
    """arena-plan prices a 2-stage grid at B = 8 micro-batches; a global batch of 12 splits into 6 at most (as
    the search's candidates do), where before the proxy plan was refused ("not divisible into 8 micro-batches")."""
    from tests.run.conftest import make_plans

    plans = make_plans("gpt__tiny", 12, tmp_path)
    proc = arena_run("--plan", str(plans), "--grid", "a100,2,2", "--model", "gpt__tiny", "--global-batch", "12", "--steps", "1",
                     "--checkpoint-dir", str(tmp_path / "c"), "--no-ray", "--json", "--devices", "2", devices=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["plan"]["is_proxy"] and report["plan"]["pipeline_degree"] == 2 and report["plan"]["num_microbatches"] == 6
    assert [s for s, _ in report["train"]["losses"]] == [1]


def test_resuming_in_another_dtype_is_refused(trained, gpt_tiny_plans: Path) -> None:
    ckpt, _ = trained  # trained in fp32
    before = _digest(ckpt)
    proc = arena_run("--plan", str(gpt_tiny_plans), "--grid", "a100,1,1", "--model", "gpt__tiny", "--global-batch", "8",
                     "--checkpoint-dir", str(ckpt), "--no-ray", "--devices", "1", "--steps", "3", "--dtype", "bf16")
    _one_line_error(proc, "was planned for fp32, not --dtype bf16")
    assert _digest(ckpt) == before


def test_a_checkpoint_resumes_in_its_own_dtype_beside_plans_of_another(trained, tmp_path: Path) -> None:
    """A job checkpointed in fp32 (as arena-run trained before it followed its plans' dtype) resumed with plans
    made in bf16: it goes on in fp32, with a warning that the plans were priced in bf16; asking for bf16
    explicitly is refused, since resuming keeps the compute dtype."""
    import shutil

    from tests.run.conftest import make_plans

    source, _ = trained  # trained in fp32
    ckpt = tmp_path / "ckpt"
    shutil.copytree(source, ckpt)
    bf16_plans = make_plans("gpt__tiny", 8, tmp_path, dtype="bf16")
    args = ["--plan", str(bf16_plans), "--grid", "a100,1,1", "--model", "gpt__tiny", "--global-batch", "8",
            "--checkpoint-dir", str(ckpt), "--no-ray", "--devices", "1"]
    proc = arena_run(*args, "--steps", "3", "--dtype", "bf16")
    _one_line_error(proc, "was trained in fp32, not bf16 (resuming keeps the compute dtype)")
    proc = arena_run(*args, "--steps", "3", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "warning: resuming in fp32, the dtype the checkpoint was trained in; the plans were priced in bf16" in proc.stderr
    report = json.loads(proc.stdout)
    assert report["dtype"] == "fp32" and report["resumed_from"] is not None


def test_a_dtype_other_than_the_plans_is_refused_and_none_means_theirs(gpt_tiny_plans: Path, tmp_path: Path) -> None:
    """Plans are priced (memory, times) in the dtype their operator table was analysed in: arena-run trains in
    it by default, and refuses another in one line (before, it trained fp32 whatever the plans were made in)."""
    from tests.run.conftest import make_plans

    bf16_plans = make_plans("gpt__tiny", 8, tmp_path, dtype="bf16")
    for plans, other in ((gpt_tiny_plans, "bf16"), (bf16_plans, "fp32")):
        proc = arena_run("--plan", str(plans), "--grid", "a100,1,1", "--model", "gpt__tiny", "--global-batch", "8",
                         "--checkpoint-dir", str(tmp_path / f"c-{other}"), "--no-ray", "--devices", "1", "--steps", "1",
                         "--dtype", other)
        _one_line_error(proc, f"was planned for {'fp32' if other == 'bf16' else 'bf16'}, not --dtype {other}")
        assert not (tmp_path / f"c-{other}").exists()
    proc = arena_run("--plan", str(bf16_plans), "--grid", "a100,1,1", "--model", "gpt__tiny", "--global-batch", "8",
                     "--checkpoint-dir", str(tmp_path / "c"), "--no-ray", "--devices", "1", "--steps", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    from libarena.models import get_model
    from libarena.models.training import OptimizerConfig
    from libarena.run.checkpoint import CheckpointStore

    store = CheckpointStore(str(tmp_path / "c"))
    try:
        meta, _ = store.newest_usable(get_model("gpt__tiny"), 8, 0, OptimizerConfig(), dtype="bf16")
    finally:
        store.close()
    assert meta is not None and meta.dtype == "bf16"


def test_plans_made_at_another_sequence_length_are_refused(tmp_path: Path) -> None:
    """The runtime trains at the model's own sequence length: plans analysed at another describe another
    computation, refused in one line as the profiler refuses them."""
    from libarena.analyze.api import AnalyzeConfig, analyze_model
    from libarena.artifacts import Provenance, read_table
    from libarena.hardware import load_cluster
    from libarena.plan import PlannerConfig, plan_job, write_plans

    cluster = tmp_path / "local.yaml"
    cluster.write_text("name: local-a100\nnode_groups:\n  - {gpu_type: a100, nodes: 1, gpus_per_node: 8}\n")
    ops = tmp_path / "ops.parquet"
    analyze_model(AnalyzeConfig("gpt__tiny", 8, seq_len=16, dtype="fp32", num_clusters=4)).write(ops)
    plans = tmp_path / "plans.parquet"
    write_plans(plans, plan_job(read_table(ops, "operator_table"), load_cluster(cluster), PlannerConfig(max_gpus=1)),
                Provenance(tool="tests/run", parameters={}))
    proc = arena_run("--plan", str(plans), "--grid", "a100,1,1", "--model", "gpt__tiny", "--global-batch", "8",
                     "--checkpoint-dir", str(tmp_path / "c"), "--no-ray", "--devices", "1", "--steps", "1")
    _one_line_error(proc, "was planned at sequence length 16; the runtime trains gpt__tiny at its own")
