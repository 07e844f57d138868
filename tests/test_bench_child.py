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
    payload, stopped = run_child(_writes_then_sleeps(out, {"models_done": ["gpt__tiny"]}), out, 10.0)
    assert payload == {"models_done": ["gpt__tiny"]} and stopped == "overran 10 s"
    assert time.perf_counter() - t0 < 30  # stopped, not waited for
    out.unlink()
    with pytest.raises(ArenaError, match="^the benchmark overran 1 s before finishing a model"):
        run_child([sys.executable, "-c", "import time; time.sleep(60)"], out, 1.0)
    with pytest.raises(ArenaError, match="^bench_x failed \\(exit 3"):
        run_child([sys.executable, "-c", "raise SystemExit(3)"], out, 30.0, what="bench_x")


def test_a_sigterm_as_the_child_starts_is_caught_and_the_handler_restored(tmp_path, monkeypatch):
    """The SIGTERM handler is in place before the child is started, so a SIGTERM that arrives while it starts is a
    clean stop (a one-line error: nothing was finished), not a run left going with the default handler's death."""
    import bench.child as child

    def terminated_while_starting(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)  # handled at once, in this thread: the handler is already installed
        raise AssertionError("the SIGTERM handler was not installed before the child started")

    class ReachedTheOuterHandler(Exception):
        pass

    def outer(signum, frame):  # what the SIGTERM would meet without run_child's handler (not death, in a test)
        raise ReachedTheOuterHandler

    monkeypatch.setattr(child.subprocess, "Popen", terminated_while_starting)
    original = signal.signal(signal.SIGTERM, outer)
    try:
        with pytest.raises(ArenaError, match="^the benchmark interrupted before finishing a model"):
            child.run_child([sys.executable, "-c", "pass"], tmp_path / "result.json", 30.0)
        assert signal.getsignal(signal.SIGTERM) is outer
    finally:
        signal.signal(signal.SIGTERM, original)


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


def test_the_profile_child_writes_every_plan_it_times_skips_kept_ones_and_stops_between_plans(tmp_path, monkeypatch):
    """The measuring interpreter's bookkeeping (its host calibration, cost run and plan timings replaced): its
    result is rewritten after the cost run and after every plan; a resumed model's kept plans and cost run are not
    timed again; once the time budget is spent no further plan starts and the model is listed as left for time."""
    import dataclasses
    from types import SimpleNamespace

    import libarena.hardware.comm
    import libarena.plan
    import libarena.profile
    import libarena.profile.concurrency
    import libarena.profile.host
    import libarena.profile.profiler
    from bench import bench_profile

    @dataclasses.dataclass(frozen=True)
    class Sharing:
        measured: object = "slowdown"

        def to_dict(self):
            return {"measured": self.measured}

    def plan(n, plan_id):
        return SimpleNamespace(grid=SimpleNamespace(num_gpus=n), plan_id=plan_id)

    plans = {"gpt__tiny": [plan(1, "a"), plan(1, "b"), plan(2, "c")], "bert__tiny": [plan(1, "d"), plan(2, "e")]}
    out = tmp_path / "result.json"
    writes, cost_runs, timed = [], [], []
    real_write = bench_profile.write_json

    def write_json(path, payload):  # every rewrite of the result, as written
        writes.append(json.loads(json.dumps(payload)))
        real_write(path, payload)

    def interleaved(planset, plans_path, comm, layout, sharing, alternatives, isolation, gate, skip, on_row, out_of_time):
        rows = []
        for p in plans[planset.model_name]:
            if (p.grid.num_gpus, p.plan_id) in skip:
                continue
            if out_of_time():
                return rows, []
            clock[0] += 1.0  # a plan's timing, on the benchmark's clock (a real sleep raced the budget on a slow host)
            timed.append(p.plan_id)
            rows.append({"model": planset.model_name, "num_gpus": p.grid.num_gpus, "plan_id": p.plan_id, "measurement_device_s": 3.0})
            on_row(rows[-1], [])
        return rows, []

    def cost_run(tmp, planset, comm, layout, isolation):
        cost_runs.append(planset.model_name)
        return {"device_s": 5.0, "co_run_device_s": 0.0, "summary": {"stages_profiled": 2, "stage_costs": []},
                "estimates": {(p.grid.num_gpus, p.plan_id): 0.5 for p in plans[planset.model_name]}}

    clock = [0.0]
    monkeypatch.setattr(bench_profile, "time", SimpleNamespace(perf_counter=lambda: clock[0], sleep=time.sleep))
    monkeypatch.setattr(libarena.profile.host, "apply_threading", lambda *a: {"name": "default"})
    monkeypatch.setattr(libarena.profile, "write_comm_table", lambda *a, **k: None)
    monkeypatch.setattr(libarena.profile, "resolve_device", lambda *a: None)
    monkeypatch.setattr(libarena.hardware.comm, "load_comm_model", lambda *a: None)
    monkeypatch.setattr(libarena.profile.profiler, "host_sharing", lambda *a: Sharing())
    monkeypatch.setattr(libarena.profile.concurrency, "host_concurrency", lambda *a: None)
    monkeypatch.setattr(libarena.plan, "read_plans", lambda path, **k: SimpleNamespace(model_name=path, layout=None))
    monkeypatch.setattr(bench_profile, "_plans", lambda tmp, model: model)
    monkeypatch.setattr(bench_profile, "plans_of", lambda planset: plans[planset.model_name])
    monkeypatch.setattr(bench_profile, "grid_stage_counts", lambda *a: [])
    monkeypatch.setattr(bench_profile, "_cost_run", cost_run)
    monkeypatch.setattr(bench_profile, "_interleaved", interleaved)
    monkeypatch.setattr(bench_profile, "write_json", write_json)
    monkeypatch.setattr(bench_profile, "quiet_before_model", lambda settings: {"quiet": True})

    # gpt__tiny resumed: plan "a" and the cost run kept (with its plain estimates); within 1.5 s of budget "b" and "c" start
    kept_cost = {"model": "gpt__tiny", "plain_estimates": [[1, "a", 0.4], [1, "b", 0.41], [2, "c", 0.42]]}
    request = {"models": ["gpt__tiny", "bert__tiny"], "threading": "default", "time_budget_s": 1.5,
               "kept": {"gpt__tiny": {"plans": [[1, "a"]], "cost": kept_cost}}}
    bench_profile._child(request, str(out))
    assert cost_runs == [] and timed == ["b", "c"]
    result = json.loads(out.read_text())
    assert [(r["plan_id"], r["estimate_plain_s"]) for r in result["rows"]] == [("b", 0.41), ("c", 0.42)]
    assert result["models_done"] == ["gpt__tiny"] and result["models_skipped_for_time"] == ["bert__tiny"] and result["finished"]
    assert [len(w["rows"]) for w in writes] == [1, 2, 2, 2]  # after each plan, after the model, at the end
    # a fresh run: the cost run is written before its plans; the budget stops between two plans of one model
    writes.clear()
    timed.clear()
    bench_profile._child({"models": ["gpt__tiny", "bert__tiny"], "threading": "default", "time_budget_s": 1.5}, str(out))
    assert cost_runs == ["gpt__tiny"] and timed == ["a", "b"]
    assert [(len(w["costs"]), len(w["rows"])) for w in writes] == [(1, 0), (1, 1), (1, 2), (1, 2), (1, 2)]
    result = json.loads(out.read_text())
    assert result["models_done"] == [] and result["models_skipped_for_time"] == ["gpt__tiny", "bert__tiny"]
    assert result["costs"][0]["plain_estimates"] == [[1, "a", 0.5], [1, "b", 0.5], [2, "c", 0.5]]
    assert [r["estimate_plain_s"] for r in result["rows"]] == [0.5, 0.5]
