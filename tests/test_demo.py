"""``make demo`` (the README's first command) end to end: embedded trace, analyze -> plan -> perf build ->
compare of every policy -> report, from a checkout, with nothing downloaded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")
def test_demo_runs_every_policy_on_the_embedded_trace(tmp_path):
    out = tmp_path / "demo-out"
    proc = subprocess.run(
        [sys.executable, "-m", "libarena.demo", "--out", str(out), f"CACHE_DIR={tmp_path / 'cache'}"],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    (trace,) = results["traces"]
    by_policy = {p["policy"]: p for p in trace["policies"]}
    assert set(by_policy) == {"arena", "fcfs", "gavel", "elasticflow", "elasticflow-ls", "sia"}
    arena = by_policy["arena"]
    # Every job of the 40-job trace runs to completion under Arena, and it beats FCFS on average JCT.
    assert arena["submitted_jobs"] == 40 and arena["finished_jobs"] == 40 and arena["unfinished_jobs"] == 0
    assert arena["avg_jct_s"] < by_policy["fcfs"]["avg_jct_s"]
    assert (out / "results.md").stat().st_size > 0 and (out / "summary.png").stat().st_size > 0
    # The operator tables went to the cache directory given, not to the checkout.
    assert any((tmp_path / "cache").rglob("*.parquet"))
