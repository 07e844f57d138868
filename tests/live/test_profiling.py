"""Profiling on arrival with the default script: the pipeline's perf build of the new (model, batch), run
detached the way the live scheduler runs it, gives performance rows for the cluster's GPU types."""

from __future__ import annotations

import pytest
import yaml

from libarena.artifacts import read_table
from libarena.schedule.live.profiling import ArrivalProfiler
from tests.live.helpers import wait_until

pytestmark = pytest.mark.slow


def _profiled(tmp_path, model: str, batch: int) -> list[dict]:
    """The default script's rows for one (model, batch) on one 2-GPU A100 node, run as the live scheduler runs it."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"name": "c", "node_groups": [{"gpu_type": "a100", "nodes": 1, "gpus_per_node": 2}]}))
    profiler = ArrivalProfiler(tmp_path / "profiles", cluster)
    profiler.request(model, batch)
    done: list = []
    wait_until(lambda: bool(done.extend(profiler.poll()) or done), 240)
    ((got_model, got_batch, path, message),) = done
    assert (got_model, got_batch, message) == (model, batch, "profiled"), (tmp_path / "profiles").glob("*/output.log")
    return read_table(path, "perf_table").table.to_pylist()


def test_default_profiling_script_builds_rows_for_a_new_pair(tmp_path):
    rows = _profiled(tmp_path, "gpt__tiny", 8)
    assert {r["view"] for r in rows} == {"arena", "ap", "dp"}
    assert {(r["gpu_type"], r["num_gpus"]) for r in rows} == {("a100", 1), ("a100", 2)}
    assert all(r["estimated"] and r["iter_time_s"] > 0 for r in rows)  # profiled here, scaled to the A100


def test_default_profiling_script_estimates_a_paper_size_model_from_its_roofline(tmp_path):
    """A paper-size model is not executed here (its stages took the host's whole memory under --mode local): the
    default script's auto mode writes its rows from the roofline, in seconds."""
    rows = _profiled(tmp_path, "gpt__760M", 64)
    assert rows and all(r["timer"] == "roofline" and r["estimated"] for r in rows)
