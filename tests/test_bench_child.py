"""The long benchmarks' measuring child (bench.child.run_child, bench_profile's per-model results): a run
stopped midway keeps the models it finished, marked incomplete, instead of losing them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from libarena.errors import ArenaError


def _writes_then_sleeps(out, payload) -> list[str]:
    return [sys.executable, "-c", f"import json, time; open({str(out)!r}, 'w').write({json.dumps(json.dumps(payload))}); time.sleep(60)"]


def test_a_finished_child_returns_its_payload(tmp_path):
    from bench.child import run_child

    out = tmp_path / "result.json"
    payload, stopped = run_child([sys.executable, "-c", f"open({str(out)!r}, 'w').write('{{\"rows\": [1, 2]}}')"], out, 30.0)
    assert payload == {"rows": [1, 2]} and stopped is None


def test_an_overrunning_child_is_stopped_and_its_last_file_kept(tmp_path):
    from bench.child import run_child

    out = tmp_path / "result.json"
    t0 = time.perf_counter()
    payload, stopped = run_child(_writes_then_sleeps(out, {"models_done": ["gpt__tiny"]}), out, 3.0)
    assert payload == {"models_done": ["gpt__tiny"]} and stopped == "overran 3 s"
    assert time.perf_counter() - t0 < 30  # stopped, not waited for
    out.unlink()
    with pytest.raises(ArenaError, match="^the benchmark overran 1 s before finishing a model"):
        run_child([sys.executable, "-c", "import time; time.sleep(60)"], out, 1.0)
    with pytest.raises(ArenaError, match="^bench_x failed \\(exit 3"):
        run_child([sys.executable, "-c", "raise SystemExit(3)"], out, 30.0, what="bench_x")


def test_a_terminated_benchmark_keeps_what_its_child_finished(tmp_path, repo_root):
    """SIGTERM to the benchmark (the parent) stops its child; the parent goes on with the child's last file."""
    out = tmp_path / "result.json"
    script = (f"import json, sys; from pathlib import Path; from bench.child import run_child; "
              f"payload, stopped = run_child({_writes_then_sleeps(out, {'models_done': ['bert__tiny']})!r}, Path({str(out)!r})); "
              f"print(json.dumps([payload, stopped]))")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=repo_root)
    deadline = time.monotonic() + 60
    while not out.is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    parent.send_signal(signal.SIGTERM)
    stdout, _ = parent.communicate(timeout=60)
    assert parent.returncode == 0
    assert json.loads(stdout) == [{"models_done": ["bert__tiny"]}, "interrupted"]


def test_an_incomplete_profile_run_lists_what_it_did_not_do_and_meets_nothing():
    from bench.bench_profile import judge_completeness

    summary = {"met": True}
    judge_completeness(summary, ("gpt__tiny", "bert__tiny", "gpt__small"),
                       {"models_done": ["gpt__tiny"], "models_skipped_for_time": ["gpt__small"]}, "interrupted")
    assert summary == {"met": False, "complete": False, "stopped": "interrupted", "models_not_done": ["bert__tiny", "gpt__small"],
                       "models_skipped_for_time": ["gpt__small"]}
    summary = {"met": True}
    judge_completeness(summary, ("gpt__tiny",), {"models_done": ["gpt__tiny"], "models_skipped_for_time": []}, None)
    assert summary == {"met": True, "complete": True, "models_not_done": [], "models_skipped_for_time": []}


def test_the_profile_benchmarks_child_writes_its_result_and_skips_models_out_of_time(tmp_path, repo_root):
    """The measuring interpreter (a fresh one: the thread layout applies before JAX starts) writes its result file
    itself; with no time left it starts no model."""
    request, out = tmp_path / "request.json", tmp_path / "result.json"
    request.write_text(json.dumps({"models": ["gpt__tiny", "bert__tiny"], "threading": "default", "time_budget_s": 0.0}))
    proc = subprocess.run([sys.executable, "-m", "bench.bench_profile", "--child", str(request), str(out)], cwd=repo_root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["models_done"] == [] and result["models_skipped_for_time"] == ["gpt__tiny", "bert__tiny"]
    assert result["finished"] and result["rows"] == []
