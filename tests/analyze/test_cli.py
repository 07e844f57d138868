"""arena-analyze through its console script: files, the Arrow stream, show, --list-models, bad input."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import pyarrow.ipc as ipc
import pytest

from libarena.analyze import read_operator_table

REPO = Path(__file__).resolve().parents[2]
ARENA_ANALYZE = REPO / ".venv" / "bin" / "arena-analyze"


def run(*args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(ARENA_ANALYZE), *map(str, args)], capture_output=True, cwd=cwd, timeout=300)


def assert_one_line_error(proc: subprocess.CompletedProcess, words: str) -> None:
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("arena-analyze: error:"), err
    assert words in lines[0], err
    assert "Traceback" not in err and proc.stdout == b""


@pytest.fixture(scope="module")
def ops_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("analyze") / "ops.parquet"
    proc = run("--model", "moe__tiny", "--global-batch", "8", "--num-clusters", "4", "-o", out)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == b""  # progress goes to stderr only
    assert "arena-analyze:" in proc.stderr.decode()
    return out


def test_writes_an_operator_table_with_provenance(ops_file):
    ops = read_operator_table(ops_file)
    assert ops.model_name == "moe__tiny" and ops.metadata["num_clusters"] == 4
    assert ops.provenance.tool == "arena-analyze"
    assert ops.provenance.parameters == {"model": "moe__tiny", "global_batch": 8, "seq_len": None, "dtype": "bf16", "num_clusters": 4}
    assert [c["index"] for c in ops.clusters] == [0, 1, 2, 3]


def test_dash_streams_arrow_ipc_to_stdout(ops_file):
    proc = run("-m", "moe__tiny", "-b", "8", "--num-clusters", "4", "-o", "-")
    assert proc.returncode == 0, proc.stderr.decode()
    table = ipc.open_stream(io.BytesIO(proc.stdout)).read_all()
    ops = read_operator_table(ops_file)
    assert table.replace_schema_metadata(None).equals(ops.table)


def test_show_prints_top_ops_and_clusters(ops_file):
    proc = run("show", ops_file, "--top", "5")
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()
    assert "moe__tiny" in out and "top 5 instructions by FLOPs" in out and "4 clustered operators" in out
    proc = run("show", ops_file, "--json", "--top", "3")
    data = json.loads(proc.stdout)
    assert len(data["top_ops"]) == 3 and len(data["clusters"]) == 4
    flops = [r["flops"] for r in data["top_ops"]]
    assert flops == sorted(flops, reverse=True) and flops[0] > 0


def test_list_models_lists_the_zoo_with_actual_parameter_counts():
    proc = run("--list-models", "--json")
    assert proc.returncode == 0, proc.stderr.decode()
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert {"moe__27B", "gpt__6.7B", "bert__760M", "wide_resnet__6.8B", "gpt__tiny"} <= set(rows)
    assert rows["gpt__tiny"]["param_count"] == 235136 and rows["moe__27B"]["num_units"] == 18
    assert all(0.8 < r["param_count"] / r["nominal_params"] < 1.2 for r in rows.values())


def test_list_models_table_renders_nominal_and_actual_counts():
    from rich.console import Console

    from libarena.analyze.show import render_zoo

    console = Console(width=140, record=True, file=io.StringIO())
    render_zoo(
        [
            {"name": "moe__27B", "family": "moe", "size": "27B", "paper_size": True, "nominal_params": 27e9, "param_count": 26173279488, "num_units": 18},
            {"name": "gpt__tiny", "family": "gpt", "size": "tiny", "paper_size": False, "nominal_params": 235e3, "param_count": 235136, "num_units": 6},
        ],
        console,
    )
    text = console.export_text()
    assert "moe__27B" in text and "26,173,279,488" in text and "27 G" in text and "test size" in text


@pytest.mark.parametrize(
    "args, words",
    [
        (("--model", "nope__1B", "-b", "8"), "unknown model 'nope__1B'"),
        (("--model", "gpt__3B", "-b", "8"), "unknown size '3B'"),
        (("--model", "gpt__tiny", "-b", "0"), "--global-batch: "),
        (("--model", "gpt__tiny", "-b", "-4"), "--global-batch: "),
        (("--model", "gpt__tiny", "-b", "eight"), "'--global-batch'"),
        (("--model", "gpt__tiny", "-b", "8", "--dtype", "int3"), "unknown dtype 'int3'"),
        (("--model", "gpt__tiny"), "missing --global-batch"),
        (("-b", "8"), "missing --model"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_file(args, words, tmp_path):
    out = tmp_path / "ops.parquet"
    proc = run(*args, "-o", out)
    assert_one_line_error(proc, words)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_unwritable_output_is_one_line_exit_2(tmp_path):
    proc = run("--model", "gpt__tiny", "-b", "8", "-o", tmp_path / "missing" / "ops.parquet")
    assert_one_line_error(proc, "does not exist")
    proc = run("--model", "gpt__tiny", "-b", "8", "-o", tmp_path)
    assert_one_line_error(proc, "is a directory")
    assert list(tmp_path.iterdir()) == []
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        proc = run("--model", "gpt__tiny", "-b", "8", "-o", locked / "ops.parquet")
        assert_one_line_error(proc, "not writable")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_an_output_the_filesystem_refuses_is_found_before_the_work():
    """/proc refuses new files even to root, whom permission bits do not stop: the output is tried up front."""
    proc = run("--model", "gpt__tiny", "-b", "8", "-o", "/proc/arena-ops.parquet")
    assert_one_line_error(proc, "cannot write /proc/arena-ops.parquet")


def test_show_rejects_other_artifacts(tmp_path):
    bogus = tmp_path / "x.parquet"
    bogus.write_bytes(b"not a table")
    assert_one_line_error(run("show", bogus), "x.parquet")
