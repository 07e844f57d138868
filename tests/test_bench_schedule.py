"""The scheduler benchmark measures on the table the current pipeline makes: its default table goes through
perf build's cache every run (a file left by older code is not reused), and the file records which table it was."""

from __future__ import annotations

import json

from tests.schedule.helpers import job
from tests.schedule.perf_fixtures import write_perf


def test_the_default_table_is_made_by_perf_build_every_run(tmp_path, monkeypatch):
    import libarena.pipeline.perf_build as perf_build_module
    from bench import bench_schedule
    from libarena.artifacts.io import file_sha256
    from libarena.schedule.traces import trace_csv

    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "simulate_trace_philly.csv").write_text(trace_csv(
        [job(f"j{i}", "gpt__1.3B", 200, 2, "a100", submit=60.0 * i, row=i + 1, priority=None) for i in range(4)]))
    stale = tmp_path / "perf-paper-sim.parquet"
    stale.write_bytes(b"a table older code left here")
    built = []

    def perf_build(cluster, output, config, trace=None):  # stands in for the pipeline's (cached) build
        built.append(output)
        write_perf(output, [("gpt__1.3B", 256)], ["a100", "a40", "v100", "a10"])

    monkeypatch.setattr(bench_schedule, "TRACES", traces)
    monkeypatch.setattr(bench_schedule, "DEFAULT_PERF", stale)
    monkeypatch.setattr(perf_build_module, "perf_build", perf_build)
    (tmp_path / "results").mkdir()
    assert bench_schedule.run(tmp_path / "results", policies=("fcfs",), row=False)
    assert built == [str(stale)]
    doc = json.loads((tmp_path / "results" / "schedule.json").read_text())
    assert doc["perf_table_sha256"] == file_sha256(stale)
    assert doc["traces"]["philly"]["policies"]["fcfs"]["metrics"]["finished_jobs"] == 4
