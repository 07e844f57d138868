"""``arena-schedule cancel``: a running job's run is stopped and its GPUs go to the next job in the same pass; a
queued job never starts, under every policy; one arriving or profiling never arrives; a request made while the
server is down is acted on when it starts; unknown and ended jobs are refused in one line, nothing requested.

The server runs in this process on a controlled clock, stepped by hand, with the emulated-hosts launcher (as
tests/live/test_events.py), so every time below is exact."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from libarena.errors import ArenaError
from libarena.schedule.config import OverheadConfig
from libarena.schedule.live import store as st
from libarena.schedule.live.jobfile import JobSubmission
from libarena.schedule.live.server import ServeConfig, Server
from libarena.schedule.live.status import job_rows
from libarena.schedule.live.store import Store
from libarena.schedule.policies import policy_names
from tests.live.helpers import SetClock, cli_env, tool, wait_until
from tests.schedule.perf_fixtures import synthetic_perf_rows, write_perf

MODEL, BATCH = "gpt__760M", 128
REPO = Path(__file__).resolve().parents[2]


def _config(tmp_path, policy: str = "fcfs", **kw) -> ServeConfig:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"name": "one-gpu", "node_groups": [{"gpu_type": "a100", "nodes": 1,
                                                                           "gpus_per_node": 1}]}))
    perf = tmp_path / "perf.parquet"
    write_perf(perf, [(MODEL, BATCH)], ["a100"], max_gpus=1)
    return ServeConfig(cluster, perf, tmp_path / "state.db", policy=policy, tick_s=300.0, launcher="perf-table",
                       overheads=OverheadConfig(0, 0, 0, 0, 0, 0), poll_s=0.01, **kw)


def _server(config: ServeConfig, t: float = 0.0) -> tuple[Server, SetClock]:
    server = Server(config)
    clock = SetClock()
    clock.t = t
    server.clock = clock
    return server, clock


def _serve(config: ServeConfig, jobs: list[tuple[str, int]], times: tuple[float, ...]) -> None:
    """A server that ticks at 0, takes ``jobs`` (name, iterations), steps once at each of ``times``, then stops."""
    server, clock = _server(config)
    try:
        server.step()
        for name, iterations in jobs:
            server.store.submit(JobSubmission(MODEL, BATCH, iterations, name))
        for t in times:
            clock.t = t
            server.step()
    finally:
        server.close()


def _rate() -> float:
    rows = synthetic_perf_rows([(MODEL, BATCH)], ["a100"], max_gpus=1)
    return next(t for t, v in zip(rows["throughput"], rows["view"]) if v == "ap") / BATCH


def _events(server: Server, job_id: str) -> dict[str, float | None]:
    return {e["kind"]: e["time"] for e in server.store.log_of(job_id)}


def _cancel_once_it_is(server: Server, clock: SetClock, submission: JobSubmission, status: str,
                       not_before: float | None = None) -> None:
    """Submit a job at 0 s, let the server take it to ``status`` at 10 s, request its cancel, and see the server
    cancel it at once in a pass at 20 s."""
    server.store.submit(submission, not_before=not_before)
    clock.t = 10.0
    server.step()
    assert server.store.job(submission.name)["status"] == status
    server.store.request_cancel([submission.name], "no longer needed")
    clock.t = 20.0
    assert server.step()
    assert server.store.job(submission.name)["status"] == st.CANCELLED


def test_cancelling_a_running_job_stops_it_and_gives_its_gpu_to_the_queue(tmp_path):
    server, clock = _server(_config(tmp_path))
    try:
        assert server.step()  # the tick at 0
        server.store.submit(JobSubmission(MODEL, BATCH, 600, "a"))
        server.store.submit(JobSubmission(MODEL, BATCH, 600, "b"))
        clock.t = 10.0
        assert server.step()  # a takes the one GPU, b waits
        assert _events(server, "a")["launch"] == 10.0 and "launch" not in _events(server, "b")
        assert server.store.request_cancel(["a"], "  wrong   data ") == {"a": st.STARTING}  # (until the launcher reports it)
        assert job_rows(server.store)["jobs"][0]["cancel_requested"]
        clock.t = 50.0
        assert server.step()  # the request runs a pass at once
        a = server.store.job("a")
        assert a["status"] == st.CANCELLED and a["error"] == "wrong data"
        assert _events(server, "a")["cancel"] == 50.0
        assert _events(server, "b")["launch"] == 50.0  # a's GPU, in the same pass
        snap = a["state"]["snapshot"]
        assert snap["finish_time"] == 50.0 and snap["progress"] == pytest.approx(40.0 * _rate())
        # the emulated run stopped when it was cancelled: its progress stays at 40 s of training
        assert server.launcher._progress_at(("a", 1), 1e9) == pytest.approx(40.0 * _rate())
        row = next(r for r in job_rows(server.store)["jobs"] if r["job_id"] == "a")
        assert row["status"] == st.CANCELLED and not row["cancel_requested"]
        clock.t = 60.0
        server.step()  # (b reported training)
        assert [e["kind"] for e in server.store.log_of("a")].count("cancel") == 1  # acted on once
        assert server.store.cancel_requests(server.store.cancels_seen())[0] == []
        with pytest.raises(ArenaError, match=r"job 'a' has already ended \(cancelled\)"):
            server.store.request_cancel(["a"], "again")
    finally:
        server.close()


@pytest.mark.parametrize("policy", policy_names())
def test_a_cancelled_queued_job_never_starts(tmp_path, policy):
    """Every policy forgets a queued job it is told to withdraw (``Policy.withdraw``): when the GPU frees, the
    job behind it starts, not the cancelled one. (ElasticFlow keeps the jobs it cannot admit as best effort
    here: dropping them, its default, would leave none queued on one GPU.)"""
    options = {"drop_infeasible": False} if policy.startswith("elasticflow") else {}
    server, clock = _server(_config(tmp_path, policy=policy, policy_options=options))
    try:
        server.step()
        for name in ("a", "b", "c"):
            server.store.submit(JobSubmission(MODEL, BATCH, 300, name))
        clock.t = 10.0
        server.step()
        started = [j for j in "abc" if "launch" in _events(server, j)]
        assert len(started) == 1, started
        waiting = [j for j in "abc" if j not in started]
        server.store.request_cancel([waiting[0]], "not needed")
        clock.t = 20.0
        assert server.step()
        assert server.store.job(waiting[0])["status"] == st.CANCELLED
        finish = 10.0 + 300 / _rate()
        clock.t = finish + 1
        while server.step():
            pass
        assert "launch" in _events(server, waiting[1])
        assert "launch" not in _events(server, waiting[0])
        clock.t = finish + 2 * 300 / _rate() + 600
        for _ in range(1000):  # the ticks up to then, one a step
            if not server.step():
                break
        assert server.idle()
        assert server.store.job(waiting[1])["status"] == st.FINISHED
        assert server.store.job(waiting[0])["status"] == st.CANCELLED
    finally:
        server.close()


def test_a_job_cancelled_before_it_arrives_never_arrives(tmp_path):
    """Nor does it keep the server busy until its arrival time: ``serve --until-idle`` ends at once, as it
    would after a restart (which does not reload a cancelled job)."""
    server, clock = _server(_config(tmp_path))
    try:
        server.step()
        _cancel_once_it_is(server, clock, JobSubmission(MODEL, BATCH, 300, "later"), st.ARRIVING, not_before=1000.0)
        assert server.idle() and not server.live.heap
        clock.t = 1200.0
        while server.step():
            pass
        assert "launch" not in _events(server, "later") and "arrive" not in _events(server, "later")
        assert server.idle() and server.live.pending_arrivals == 0
    finally:
        server.close()


def test_a_job_cancelled_while_profiling_is_not_rejected_when_its_profile_fails(tmp_path):
    """A job waiting for its (model, batch) to be profiled is cancelled at once; the profile's later failure
    rejects only the jobs still waiting for it."""
    server, clock = _server(_config(tmp_path, profile_script="sleep 0.5; false"))
    try:
        server.step()
        _cancel_once_it_is(server, clock, JobSubmission("gpt__tiny", 8, 10, "new-pair"), st.PROFILING)
        assert _events(server, "new-pair")["cancel"] == 20.0
        wait_until(lambda: (server.step() or True) and not server.profiler.pending, 60)
        assert server.store.job("new-pair")["status"] == st.CANCELLED
    finally:
        server.close()


def test_a_profile_no_job_waits_for_any_more_is_stopped(tmp_path):
    """Its only job cancelled, a running profile is stopped (it would hold the one profiling slot, up to its time
    limit, from pairs whose jobs wait); the pair's next job has it profiled afresh."""
    import os

    from libarena.schedule.live.processes import running_pid

    server, clock = _server(_config(tmp_path, profile_script="sleep 120"))
    try:
        server.step()
        server.store.submit(JobSubmission("gpt__tiny", 8, 10, "only"))
        pid_file = server.profiler.dir_of("gpt__tiny", 8) / "pid"
        clock.t = 10.0
        wait_until(lambda: (server.step() or True) and running_pid(pid_file) is not None, 30)
        pid = running_pid(pid_file)
        server.store.request_cancel(["only"], "no longer needed")
        clock.t = 20.0
        assert server.step()
        assert server.store.job("only")["status"] == st.CANCELLED
        assert not server.profiler.pending and running_pid(pid_file) is None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # stopped and reaped
        assert any(e["kind"] == "profile-withdrawn" for e in server.store.log_of(None))
        server.store.submit(JobSubmission("gpt__tiny", 8, 10, "again"))
        clock.t = 30.0
        wait_until(lambda: (server.step() or True) and running_pid(pid_file) is not None, 30)
        assert server.profiler.pending == [("gpt__tiny", 8)] and server.store.job("again")["status"] == st.PROFILING
    finally:
        server.close()


def test_a_request_made_while_the_server_is_down_is_acted_on_at_its_start(tmp_path):
    config = _config(tmp_path)
    _serve(config, [("a", 600)], (10.0,))
    store = Store(config.state)
    try:
        store.request_cancel(["a"], "while down")
        assert job_rows(store)["jobs"][0]["cancel_requested"]
    finally:
        store.close()
    server, clock = _server(config, t=30.0)
    try:
        assert server.step()
        assert server.store.job("a")["status"] == st.CANCELLED
        assert not server.live.active and server.live.cluster.pools[0].free_total == 1
    finally:
        server.close()
    server, clock = _server(config, t=40.0)  # acted on once: a restart does not act on it again
    try:
        assert server.store.cancel_requests(server.store.cancels_seen())[0] == []
    finally:
        server.close()


def test_with_ticks_only_a_cancel_waits_for_the_tick(tmp_path):
    server, clock = _server(_config(tmp_path, event_passes=False))
    try:
        server.step()
        server.store.submit(JobSubmission(MODEL, BATCH, 100_000, "a"))
        clock.t = 300.0
        server.step()
        server.store.request_cancel(["a"], "stop")
        clock.t = 310.0
        assert not server.step()
        assert server.store.job("a")["status"] == st.STARTING  # (no pass since its launch)
        clock.t = 600.0
        assert server.step()
        assert server.store.job("a")["status"] == st.CANCELLED and _events(server, "a")["cancel"] == 600.0
    finally:
        server.close()


def test_cancel_command_refuses_unknown_and_ended_jobs_in_one_line(tmp_path):
    config = _config(tmp_path)
    _serve(config, [("short", 10), ("long", 100_000)], (10.0, 10.0 + 10 / _rate() + 1))
    store = Store(config.state)
    try:
        assert store.job("short")["status"] == st.FINISHED
    finally:
        store.close()

    def cancel(*args: str) -> subprocess.CompletedProcess:
        env = cli_env()
        env["PYTHONPATH"] = str(REPO)
        return subprocess.run([tool("arena-schedule"), "cancel", *args, "--state", str(config.state)],
                              capture_output=True, text=True, env=env, timeout=120)

    for args, message in ((("nosuch",), "no job 'nosuch'"), (("long", "short"), "job 'short' has already ended (finished)")):
        out = cancel(*args)
        assert out.returncode != 0 and out.stdout == ""
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], out.stderr
    store = Store(config.state)
    try:  # nothing was requested for "long" by the refused command
        assert store.cancel_requests(store.cancels_seen())[0] == []
    finally:
        store.close()
    out = cancel("long", "--reason", "over budget")
    assert out.returncode == 0 and out.stdout == "long\tstarting\n", out.stderr  # (no pass since its launch)
    store = Store(config.state)
    try:
        ((_, job_id, why, _),) = store.cancel_requests(store.cancels_seen())[0]
        assert (job_id, why) == ("long", "over budget")
    finally:
        store.close()


def test_a_server_catching_up_on_its_ticks_cancels_at_the_tick_after_the_request(tmp_path):
    """A server restarted behind its clock runs the ticks it missed in order; a request made meanwhile is acted on
    at the first of them at or after the request's time, not at an earlier one (the run would be stopped before
    it was asked to be)."""
    config = _config(tmp_path, event_passes=False)
    _serve(config, [("a", 100_000)], (0.0, 300.0))  # (ticks only: no pass at 0 after the submission) a launched at 300
    store = Store(config.state)
    try:
        store.request_cancel(["a"], "late")
        ((_, _, _, wall),), _ = store.cancel_requests(store.cancels_seen())
    finally:
        store.close()

    class RequestAt700(SetClock):
        def at(self, w: float) -> float:
            return 700.0 if w == wall else self.t

    server = Server(config)
    server.clock = RequestAt700(t=1000.0)
    try:
        assert server.step()  # the tick at 600: before the request
        assert server.store.job("a")["status"] == st.RUNNING
        assert server.step()  # the tick at 900
        assert server.store.job("a")["status"] == st.CANCELLED and _events(server, "a")["cancel"] == 900.0
    finally:
        server.close()
