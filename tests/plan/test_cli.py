"""arena-plan end to end through its console script: files, stdin pipes, show, export, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from libarena.artifacts import Provenance, read_table, write_table
from tests.plan.optables import transformer_cluster, write_operator_table

REPO = Path(__file__).resolve().parents[2]
ARENA_PLAN = REPO / ".venv" / "bin" / "arena-plan"
PAPER = REPO / "examples" / "clusters" / "paper-sim-1280.yaml"
CLUSTER_A = REPO / "examples" / "clusters" / "cluster-a.yaml"


def run(*args: str, stdin: bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(ARENA_PLAN), *map(str, args)], input=stdin, capture_output=True, cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def ops_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ops") / "ops.parquet"
    return write_operator_table(path, [transformer_cluster(i, 2048, 1024, 256) for i in range(16)], name="gpt__test")


@pytest.fixture(scope="module")
def plans_file(ops_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plans") / "plans.parquet"
    proc = run("--ops", ops_file, "--cluster", PAPER, "-o", out)
    assert proc.returncode == 0, proc.stderr.decode()
    return out


def test_plans_file_has_frontiers_proxies_and_metadata(plans_file, ops_file):
    art = read_table(plans_file, "plans")
    rows = art.table.to_pylist()
    grids = {(r["gpu_type"], r["num_gpus"], r["pipeline_degree"]) for r in rows}
    assert len(grids) == 4 * (1 + 2 + 4 + 8 + 16)
    proxies = [r for r in rows if r["is_proxy"]]
    assert len(proxies) == len({(r["gpu_type"], r["num_gpus"], r["pipeline_degree"]) for r in rows if r["feasible"]})
    assert any(not r["feasible"] and "out of memory" in r["infeasible_reason"] for r in rows)
    ops = read_table(ops_file, "operator_table")
    meta = art.metadata
    assert meta["model"] == ops.metadata["model"] and meta["cluster"] == "paper-sim-1280"
    assert meta["clusters"] == ops.metadata["clusters"] and len(meta["operator_table_sha256"]) == 64
    assert art.provenance.inputs[0]["kind"] == "operator_table"


def test_stdin_arrow_stream_gives_the_same_plans(ops_file, plans_file, tmp_path):
    # Produce the stream the way arena-analyze -o - does: write_table to stdout in another process.
    maker = (
        "import sys; from libarena.artifacts import read_table, write_table, Provenance; "
        f"a = read_table({str(ops_file)!r}, 'operator_table'); "
        "write_table('-', 'operator_table', a.table, Provenance(tool='tests'), a.metadata)"
    )
    stream = subprocess.run([sys.executable, "-c", maker], capture_output=True, check=True, cwd=REPO).stdout
    assert stream[:4] == b"\xff\xff\xff\xff"
    proc = run("--cluster", PAPER, "-o", "-", stdin=stream)
    assert proc.returncode == 0, proc.stderr.decode()
    piped = read_table(_write(tmp_path / "piped.arrow", proc.stdout), "plans")
    from_file = read_table(plans_file, "plans")
    assert piped.table.column("plan_id").to_pylist() == from_file.table.column("plan_id").to_pylist()
    assert piped.metadata["operator_table_sha256"] == from_file.metadata["operator_table_sha256"]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_show_rich_and_json(plans_file):
    proc = run("show", plans_file)
    assert proc.returncode == 0, proc.stderr.decode()
    text = proc.stdout.decode()
    assert "proxy" in text and "infeasible" in text and "gpt__test" in text
    proc = run("show", plans_file, "--json", "--proxies")
    data = json.loads(proc.stdout)
    assert data["cluster"] == "paper-sim-1280" and len(data["grids"]) == 124
    feasible = [g for g in data["grids"] if g["feasible"]]
    assert all(len(g["plans"]) == 1 and g["plans"][0]["is_proxy"] for g in feasible)


def test_export_alpa(plans_file, tmp_path):
    out = tmp_path / "alpa.json"
    proc = run("export", plans_file, "--format", "alpa", "--gpu-type", "a100", "--num-gpus", "16", "--stages", "4", "-o", out)
    assert proc.returncode == 0, proc.stderr.decode()
    spec = json.loads(out.read_text())
    stage = spec["stage_option"]
    assert spec["format"] == "alpa.ManualStageOption" and spec["num_micro_batches"] == 16
    assert sum(len(ids) for ids in stage["forward_stage_layer_ids"]) == spec["layer_num"] == 16
    assert [ids[0] for ids in stage["forward_stage_layer_ids"]] == [0, 4, 8, 12]
    for phys, logical in zip(stage["submesh_physical_shapes"], stage["submesh_logical_shapes"]):
        assert phys[0] * phys[1] == logical[0] * logical[1] and phys[1] <= 4
    ambiguous = run("export", plans_file, "--format", "alpa", "--gpu-type", "a100")
    assert ambiguous.returncode == 2 and b"proxy plans match" in ambiguous.stderr


def test_exhaustive_marks_the_frontier(tmp_path):
    ops = write_operator_table(tmp_path / "ops.parquet", [transformer_cluster(i, 1024, 256, 32) for i in range(6)])
    out = tmp_path / "all.parquet"
    proc = run("--ops", ops, "--cluster", CLUSTER_A, "--exhaustive", "--gpu-type", "a40", "--num-gpus", "4", "-o", out)
    assert proc.returncode == 0, proc.stderr.decode()
    rows = read_table(out, "plans").table.to_pylist()
    assert any(not r["on_frontier"] for r in rows) and sum(r["is_proxy"] for r in rows) == 4
    too_big = run("--ops", ops, "--cluster", CLUSTER_A, "--exhaustive", "--exhaustive-limit", "10", "-o", tmp_path / "x.parquet")
    assert too_big.returncode == 2 and b"--exhaustive" in too_big.stderr and not (tmp_path / "x.parquet").exists()


def _comm_table(path: Path, gpu_type: str) -> Path:
    table = pa.table(
        {
            "primitive": ["all-reduce"] * 2 + ["all-reduce"] * 2,
            "gpu_type": [gpu_type] * 4,
            "num_devices": [2, 2, 4, 4],
            "crosses_nodes": [False, False, True, True],
            "bytes": [1e3, 1e9, 1e3, 1e9],
            "latency_s": [1e-5, 0.5, 2e-5, 1.0],
        }
    )
    write_table(path, "comm_table", table, Provenance(tool="tests"), {})
    return path


def test_measured_comm_table_is_used_and_other_hardware_falls_back(ops_file, tmp_path):
    comm = _comm_table(tmp_path / "comm.parquet", "a40")
    out = tmp_path / "p.parquet"
    proc = run("--ops", ops_file, "--cluster", CLUSTER_A, "--comm", comm, "-o", out)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"no measurements for a10" in proc.stderr
    rows = read_table(out, "plans").table.to_pylist()
    labels = {r["gpu_type"]: set() for r in rows}
    for r in rows:
        labels[r["gpu_type"]].add(r["comm_model"])
    assert labels["a10"] == {"alpha-beta"}
    assert any("measured" in label for label in labels["a40"])
    forced = run("--ops", ops_file, "--cluster", CLUSTER_A, "--comm", comm, "--comm-required", "-o", tmp_path / "f.parquet")
    assert forced.returncode == 2 and b"no measurements for a10" in forced.stderr
    assert not (tmp_path / "f.parquet").exists()


def test_model_that_fits_nowhere_is_a_valid_all_infeasible_output(tmp_path):
    ops = write_operator_table(tmp_path / "huge.parquet", [transformer_cluster(i, 32768, 128, 16) for i in range(4)])
    out = tmp_path / "p.parquet"
    proc = run("--ops", ops, "--cluster", CLUSTER_A, "-o", out)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"fits in no grid" in proc.stderr
    rows = read_table(out, "plans").table.to_pylist()
    assert rows and all(not r["feasible"] and "out of memory" in r["infeasible_reason"] for r in rows)


def _bad_cases(tmp_path: Path, ops_file: Path, plans_file: Path):
    empty = tmp_path / "empty.parquet"
    art = read_table(ops_file, "operator_table")
    write_table(empty, "operator_table", art.table.slice(0, 0), Provenance(tool="tests"), art.metadata)
    unknown_gpu = tmp_path / "unknown.yaml"
    unknown_gpu.write_text("name: x\nnode_groups:\n  - {gpu_type: quantum9000, nodes: 2}\n")
    no_nodes = tmp_path / "nonodes.yaml"
    no_nodes.write_text("name: x\nnode_groups: []\n")
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"this is not a table at all")
    return [
        (("--ops", plans_file, "--cluster", PAPER), "expected operator_table"),
        (("--ops", empty, "--cluster", PAPER), "empty"),
        (("--ops", ops_file, "--cluster", unknown_gpu), "unknown GPU type"),
        (("--ops", ops_file, "--cluster", no_nodes), "no nodes"),
        (("--ops", ops_file, "--cluster", PAPER, "--gpu-type", "h100"), "no h100 GPUs"),
        (("--ops", ops_file, "--cluster", PAPER, "--gpu-type", "nonsense"), "unknown GPU type"),
        (("--ops", garbage, "--cluster", PAPER), "not a operator_table artifact"),
        (("--ops", tmp_path / "missing.parquet", "--cluster", PAPER), "no such file"),
        (("--ops", ops_file), "missing --cluster"),
        (("--ops", tmp_path / "missing.parquet", "--model", "gpt__tiny", "--global-batch", "8", "--cluster", PAPER),
         "give --ops or --model"),
    ]


def test_bad_input_is_one_line_exit_2_and_no_output(tmp_path, ops_file, plans_file):
    for args, message in _bad_cases(tmp_path, ops_file, plans_file):
        out = tmp_path / "out.parquet"
        proc = run(*args, "-o", out)
        err = proc.stderr.decode()
        assert proc.returncode == 2, (args, err)
        assert len(err.strip().splitlines()) == 1, (args, err)
        assert message in err, (args, err)
        assert "Traceback" not in err
        assert not out.exists() and not list(tmp_path.glob(".out.parquet.*"))


def test_empty_stdin_is_an_error(tmp_path):
    proc = run("--cluster", PAPER, "-o", tmp_path / "o.parquet", stdin=b"")
    assert proc.returncode == 2 and len(proc.stderr.decode().strip().splitlines()) == 1
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_the_filesystem_refuses_is_found_before_planning(ops_file):
    proc = run("--ops", ops_file, "--cluster", PAPER, "-o", "/proc/arena-plans.parquet")
    err = proc.stderr.decode()
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1 and "cannot write /proc/arena-plans" in err


def test_an_output_that_is_the_file_on_stdin_is_refused(ops_file, tmp_path):
    """`--ops - < FILE -o FILE` (or -o /proc/self/fd/0) would replace the input read from stdin by the output."""
    copy = tmp_path / "ops.parquet"
    copy.write_bytes(ops_file.read_bytes())
    for target in (copy, "/proc/self/fd/0"):
        with open(copy, "rb") as stdin:
            proc = subprocess.run([str(ARENA_PLAN), "--ops", "-", "--cluster", str(CLUSTER_A), "-o", str(target)],
                                  stdin=stdin, capture_output=True, timeout=120)
        err = proc.stderr.decode()
        assert proc.returncode == 2 and "is the file on stdin (--ops -): refusing to overwrite an input" in err, err
        assert len(err.strip().splitlines()) == 1 and copy.read_bytes() == ops_file.read_bytes()
    # a pipe on stdin is nothing to overwrite
    out = tmp_path / "plans.parquet"
    proc = subprocess.run([str(ARENA_PLAN), "--ops", "-", "--cluster", str(CLUSTER_A), "-o", str(out)],
                          input=ops_file.read_bytes(), capture_output=True, timeout=120)
    assert proc.returncode == 0 and read_table(out, "plans").table.num_rows > 0



def test_refusing_to_overwrite_the_file_on_stdin_in_process(tmp_path):
    """The library's check itself, with this process's stdin redirected from the file (and a directory output
    holding it)."""
    import os

    from libarena.artifacts import refuse_overwriting_inputs
    from libarena.errors import ArenaError

    victim = tmp_path / "out" / "input.parquet"
    victim.parent.mkdir()
    victim.write_bytes(b"input")
    saved = os.dup(0)
    try:
        with open(victim, "rb") as f:
            os.dup2(f.fileno(), 0)
        with pytest.raises(ArenaError, match=r"is the file on stdin \(--plans -\): refusing to overwrite an input"):
            refuse_overwriting_inputs(victim, {"--plans": "-"})
        with pytest.raises(ArenaError, match=r"holds the file on stdin \(--trace -\), and the output directory"):
            refuse_overwriting_inputs(tmp_path / "out", {"--trace": "-"}, directory=True)
        refuse_overwriting_inputs(tmp_path / "other.parquet", {"--plans": "-"})  # another file: fine
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert victim.read_bytes() == b"input"


@pytest.mark.parametrize("damage, needle", [
    (lambda m: m.update(global_batch=None), "plans metadata 'global_batch' must be an integer of at least 1, got None"),
    (lambda m: m.update(global_batch=0), "plans metadata 'global_batch' must be an integer of at least 1, got 0"),
    (lambda m: m["clusters"][1].update(index="x"), "plans metadata: clusters[1].index is 'x', expected 1"),
    (lambda m: m["clusters"][0].update(flops=float("nan")), "plans metadata: clusters[0].flops: expected a non-negative number, got nan"),
    (lambda m: m["clusters"][2].update(tp_allreduce_bytes=-1.0), "clusters[2].tp_allreduce_bytes: expected a non-negative number"),
])
def test_damaged_plans_metadata_is_a_one_line_error_for_every_reader(plans_file, tmp_path, damage, needle):
    """Metadata every reader relies on (show's global batch, export's layer indices, the runtime search's and
    the profiler's cluster volumes) is checked where the file is read, not met as an int(None) deep inside."""
    art = read_table(plans_file, "plans")
    metadata = json.loads(json.dumps(art.metadata))
    damage(metadata)
    bad = tmp_path / "bad.parquet"
    write_table(bad, "plans", art.table, Provenance(tool="tests"), metadata)
    for args in (("show", bad, "--json"), ("export", bad, "--gpu-type", "a40", "--num-gpus", "4", "--stages", "2")):
        proc = run(*args)
        err = proc.stderr.decode()
        assert proc.returncode == 2 and len(err.strip().splitlines()) == 1 and needle in err, (args, err)


@pytest.mark.parametrize("damage, needle", [
    (lambda m: m["model"].update(param_count="lots"), "operator table metadata model.param_count: expected a non-negative number, got 'lots'"),
    (lambda m: m.update(module_cost={"flops": "x"}), "module_cost.flops: expected a non-negative number"),
    (lambda m: m.update(attribution={"unattributed_flops": None}), "attribution.unattributed_flops: expected a non-negative number, got None"),
])
def test_an_operator_table_with_damaged_summary_numbers_is_a_one_line_error(ops_file, tmp_path, damage, needle):
    """arena-analyze show adds and prints these: a string or None there was an internal error (exit 1)."""
    art = read_table(ops_file, "operator_table")
    metadata = json.loads(json.dumps(art.metadata))
    damage(metadata)
    bad = tmp_path / "bad.parquet"
    write_table(bad, "operator_table", art.table, Provenance(tool="tests"), metadata)
    proc = subprocess.run([str(ARENA_PLAN.with_name("arena-analyze")), "show", str(bad)], capture_output=True,
                          timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
