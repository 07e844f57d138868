"""Seed inputs for the fuzz tests: small, valid artifacts that the strategies then break.

The operator table and the plans are real (arena-analyze of gpt__tiny, arena-plan on a two-GPU cluster);
perf tables, traces, clusters and job files are built in code (no shared files, no profiling run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.fuzz.harness import invoke

TINY_CLUSTER = {"name": "tiny", "node_groups": [{"gpu_type": "a40", "nodes": 1, "gpus_per_node": 2},
                                                {"gpu_type": "a10", "nodes": 1, "gpus_per_node": 2}]}
TRACE_HEADER = ["job_id", "submission_time", "num_iteration", "model_name", "deadline", "batch_size", "num_gpu",
                "gpu_type"]
TRACE_ROWS = [["j0", "0", "200", "gpt__1.3B", "90000", "256", "1", "a40"],
              ["j1", "60", "300", "moe__2.4B", "", "512", "2", "a10"],
              ["j2", "120", "100", "gpt__1.3B", "5000", "256", "2", "a40"],
              ["j3", "600", "150", "bert__760M", "", "128", "1", "a10"]]
TRACE_MODELS = [("gpt__1.3B", 256), ("moe__2.4B", 512), ("bert__760M", 128)]
JOB_FILE = {"name": "fuzz-job", "model": "gpt__tiny", "global_batch": 8, "iterations": 20, "priority": 1,
            "deadline": 3600, "gpu_type": "a40", "num_gpus": 1}


@dataclass
class Seeds:
    root: Path
    ops_bytes: bytes
    ops: Any  # TableArtifact
    plans_bytes: bytes
    plans: Any
    perf_bytes: bytes
    perf: Any
    comm_bytes: bytes
    comm: Any
    trace_header: list[str] = field(default_factory=lambda: list(TRACE_HEADER))
    trace_rows: list[list[str]] = field(default_factory=lambda: [list(r) for r in TRACE_ROWS])
    cluster: dict = field(default_factory=lambda: dict(TINY_CLUSTER))
    job: dict = field(default_factory=lambda: dict(JOB_FILE))

    @property
    def cluster_yaml(self) -> Path:
        return self.root / "cluster.yaml"

    def plan_files(self, **override: bytes) -> dict[str, bytes]:
        """The working-directory files of a plans-reading tool's case (``override`` replaces or adds some)."""
        return {"plans.parquet": self.plans_bytes, "ops.parquet": self.ops_bytes, **override}

    def perf_csv(self) -> tuple[list[str], list[list[str]]]:
        table = self.perf.table
        header = [c for c in table.column_names if c in ("model", "global_batch", "gpu_type", "num_gpus", "view",
                                                          "iter_time_s", "throughput", "fits_in_memory")]
        rows = [[str(v) for v in row.values()] for row in table.select(header).slice(0, 12).to_pylist()]
        return header, rows


def _comm_table() -> pa.Table:
    rows = []
    for primitive in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "p2p"):
        for size in (1024.0, 65536.0, 4194304.0):
            rows.append({"primitive": primitive, "gpu_type": "a40", "num_devices": 2, "crosses_nodes": False,
                         "bytes": size, "latency_s": 5e-6 + size / 50e9})
    return pa.Table.from_pylist(rows)


@pytest.fixture(scope="session")
def seeds(tmp_path_factory) -> Seeds:
    import yaml

    from libarena.artifacts import Provenance, read_table, write_table
    from tests.schedule.perf_fixtures import synthetic_perf_table

    root = tmp_path_factory.mktemp("fuzz-seeds")
    (root / "cluster.yaml").write_text(yaml.safe_dump(TINY_CLUSTER))
    r = invoke("arena-analyze", ["--model", "gpt__tiny", "--global-batch", "8", "--num-clusters", "4",
                                 "-o", str(root / "ops.parquet")])
    assert r.code == 0, r.describe()
    r = invoke("arena-plan", ["--ops", str(root / "ops.parquet"), "--cluster", str(root / "cluster.yaml"),
                              "--max-gpus", "2", "-o", str(root / "plans.parquet")])
    assert r.code == 0, r.describe()
    perf = synthetic_perf_table(TRACE_MODELS, ["a40", "a10"], max_gpus=4)
    write_table(root / "perf.parquet", "perf_table", perf, Provenance(tool="fuzz-seed"))
    write_table(root / "comm.parquet", "comm_table", _comm_table(), Provenance(tool="fuzz-seed"))
    return Seeds(
        root=root,
        ops_bytes=(root / "ops.parquet").read_bytes(), ops=read_table(root / "ops.parquet", "operator_table"),
        plans_bytes=(root / "plans.parquet").read_bytes(), plans=read_table(root / "plans.parquet", "plans"),
        perf_bytes=(root / "perf.parquet").read_bytes(), perf=read_table(root / "perf.parquet", "perf_table"),
        comm_bytes=(root / "comm.parquet").read_bytes(), comm=read_table(root / "comm.parquet", "comm_table"),
    )


def pytest_terminal_summary(terminalreporter):
    from tests.fuzz.harness import OUTCOMES

    if OUTCOMES:
        tools = sorted({tool for tool, _ in OUTCOMES})
        parts = [f"{tool}: " + ", ".join(f"exit {code}: {n}" for (t, code), n in sorted(OUTCOMES.items()) if t == tool)
                 for tool in tools]
        terminalreporter.write_line("fuzz cases by outcome: " + "; ".join(parts))
