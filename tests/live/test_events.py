"""The live scheduler reacts to events: an arrival or a completion runs a scheduling pass at once (the tick
stays the periodic re-optimisation), a finish is recorded when the job finished, and ``status`` shows true
progress (a job still training is never at 100%, ETA 0).

The server runs in this process on a controlled clock (scheduler time set by the test), stepped by hand,
with the emulated-hosts launcher, so every time below is exact."""

from __future__ import annotations

import time
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
from tests.live.helpers import SetClock
from tests.schedule.perf_fixtures import synthetic_perf_rows, write_perf

MODEL, BATCH = "gpt__760M", 128


def _server(tmp_path, event_passes: bool = True, extra_models: tuple = ()) -> tuple[Server, SetClock]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"name": "one-gpu", "node_groups": [{"gpu_type": "a100", "nodes": 1,
                                                                           "gpus_per_node": 1}]}))
    perf = tmp_path / "perf.parquet"
    write_perf(perf, [(MODEL, BATCH), *extra_models], ["a100"], max_gpus=1)
    cfg = ServeConfig(cluster, perf, tmp_path / "state.db", policy="fcfs", tick_s=300.0, launcher="perf-table",
                      overheads=OverheadConfig(0, 0, 0, 0, 0, 0), poll_s=0.01, event_passes=event_passes)
    server = Server(cfg)
    clock = SetClock()
    server.clock = clock
    return server, clock


def _rate() -> float:
    rows = synthetic_perf_rows([(MODEL, BATCH)], ["a100"], max_gpus=1)
    return next(t for t, v in zip(rows["throughput"], rows["view"]) if v == "ap") / BATCH


def _log(server: Server, job_id: str) -> dict[str, float]:
    return {e["kind"]: e["time"] for e in server.store.log_of(job_id) if e["time"] is not None}


def test_arrival_and_completion_schedule_at_once(tmp_path):
    server, clock = _server(tmp_path)
    try:
        assert server.step()  # the first periodic tick, at 0, with nothing to do
        server.store.submit(JobSubmission(MODEL, BATCH, 600, "a"))
        clock.t = 10.0
        assert server.step()  # the arrival runs a pass now, not at the next tick (300)
        assert _log(server, "a")["launch"] == 10.0
        server.store.submit(JobSubmission(MODEL, BATCH, 600, "b"))
        clock.t = 20.0
        assert server.step()  # b arrives; the one GPU is busy: b waits
        assert "launch" not in _log(server, "b")
        finish = 10.0 + 600 / _rate()
        assert finish < 250
        clock.t = finish - 1
        assert not server.step()  # nothing happened: no pass
        clock.t = finish + 5
        assert server.step()  # a's completion runs a pass at once: b is launched on the freed GPU
        assert _log(server, "a")["finish"] == pytest.approx(finish)  # recorded when it finished, not when learnt
        assert _log(server, "b")["launch"] == finish + 5
        a = server.store.job("a")
        assert a["status"] == st.FINISHED and a["state"]["snapshot"]["finish_time"] == pytest.approx(finish)
        assert server.last_tick == 0.0  # event passes leave the periodic ticks where they were
        assert [t.periodic for t in server.ticks] == [True, False, False, False]
    finally:
        server.close()


def test_ticks_only_waits_for_the_tick(tmp_path):
    """What the event passes replace: with --ticks-only the arrival waits for the next tick."""
    server, clock = _server(tmp_path, event_passes=False)
    try:
        server.step()
        server.store.submit(JobSubmission(MODEL, BATCH, 600, "a"))
        clock.t = 10.0
        assert not server.step()
        clock.t = 300.0
        assert server.step()
        assert _log(server, "a")["launch"] == 300.0
    finally:
        server.close()


def test_a_server_behind_its_clock_takes_a_submission_at_its_own_time(tmp_path):
    """With ticks due faster than the server runs them (a high --compression), a job submitted now would arrive at
    the clock's time, ahead of every pass for a long while: it arrives at the server's next pass instead."""
    server, clock = _server(tmp_path, event_passes=False)
    try:
        assert server.step()  # the tick at 0
        clock.t = 3000.0  # ten ticks behind
        server.store.submit(JobSubmission(MODEL, BATCH, 600, "late"))
        assert server.step()  # the tick due at 300, its submissions first
        assert _log(server, "late")["launch"] == 300.0
    finally:
        server.close()


def _with_snapshot(directory, status: str, snapshot: dict, iterations: int = 100) -> dict:
    directory.mkdir(exist_ok=True)
    store = Store(directory / "status.db", create=True)
    store.set_meta("settings", {"compression": 1.0, "policy": "fcfs"})
    store.set_meta("wall_origin", time.time() - 1000.0)  # scheduler time now: about 1000 s
    store.submit(JobSubmission(MODEL, BATCH, iterations, "j"))
    with store.transaction() as c:
        Store.set_status(c, "j", status, state={"snapshot": snapshot})
    try:
        return job_rows(store)["jobs"][0]
    finally:
        store.close()


def test_status_never_shows_a_training_job_complete(tmp_path):
    # the perf table's model says the job should have ended 900 s ago; the launcher has not reported it
    snap = {"remaining": 50.0, "true_rate": 1.0, "snapshot_time": 50.0, "measured_progress": False}
    row = _with_snapshot(tmp_path, st.RUNNING, snap)
    assert row["iterations_done"] == 99 and row["progress"] < 1.0
    assert row["overdue"] and row["eta"] is None
    # a launcher that measures progress (arena-run: its newest checkpoint) is never extrapolated
    snap = {"remaining": 50.0, "true_rate": 1.0, "snapshot_time": 50.0, "measured_progress": True,
            "reported_iterations": 30.0}
    row = _with_snapshot(tmp_path / "m", st.RUNNING, snap)
    assert row["iterations_done"] == 30 and row["eta"]["scheduler_s"] == pytest.approx(70.0) and not row["overdue"]
    # no checkpoint yet: nothing measured is nothing done
    snap = {"remaining": 100.0, "true_rate": 1.0, "snapshot_time": 50.0, "measured_progress": True, "progress": 0.0}
    row = _with_snapshot(tmp_path / "n", st.RUNNING, snap)
    assert row["iterations_done"] == 0
    # and a finished job is complete
    row = _with_snapshot(tmp_path / "f", st.FINISHED, {"finish_time": 10.0})
    assert row["progress"] == 1.0


def _started_job(server, clock):
    """Job "a" submitted, launched at 10 s and reported running by the launcher: (the live cluster, the job)."""
    from libarena.schedule.live.launchers import RunStatus

    server.step()
    server.store.submit(JobSubmission(MODEL, BATCH, 600, "a"))
    clock.t = 10.0
    server.step()
    live = server.live
    job = live.by_id["a"]
    live.apply({"a": RunStatus("a", job.version, "running", 10.0, None, 0.0)}, False)
    return live, job


def test_a_finish_learnt_late_is_recorded_when_it_happened(tmp_path):
    """A completion reported after scheduler time moved past it (a restart, a slow poll) keeps its own time."""
    from libarena.schedule.live.launchers import RunStatus

    server, clock = _server(tmp_path)
    try:
        live, job = _started_job(server, clock)
        live.advance(500.0)
        live.apply({"a": RunStatus("a", job.version, "finished", 10.0, 123.0, 600.0)}, False)
        live.advance(500.0)
        assert job.finish_time == 123.0
        assert [(t, kind) for t, j, kind, _ in live.log_entries if kind == "finish"] == [(123.0, "finish")]
    finally:
        server.close()


def test_an_unschedulable_job_says_why(tmp_path):
    """A job the policy can never place is terminal, and its status says why (before: no reason at all)."""
    big = ("gpt__6.7B", 256)  # in the synthetic table it fits one A100 in no view
    server, clock = _server(tmp_path, extra_models=(big,))
    try:
        server.store.submit(JobSubmission(*big, 100, "huge"))
        server.store.submit(JobSubmission(MODEL, BATCH, 100, "small", num_gpus=4))
        assert server.step()
        huge = server.store.job("huge")
        assert huge["status"] == st.UNSCHEDULABLE
        assert huge["error"] == ("fcfs: gpt__6.7B at global batch 256 fits in memory on no GPU type and count of "
                                 "this cluster in the performance table")
        assert server.store.job("small")["status"] != st.UNSCHEDULABLE  # (more GPUs than exist: placed on fewer)
        rows = {r["job_id"]: r for r in job_rows(server.store)["jobs"]}
        assert rows["huge"]["error"] == huge["error"]
        # written once: later passes do not rewrite it (a long-lived server would, for every such job, every pass)
        written = []
        set_status = Store.set_status
        Store.set_status = staticmethod(lambda c, job_id, *a, **k: (written.append(job_id), set_status(c, job_id, *a, **k)))
        try:
            for t in (310.0, 620.0):
                clock.t = t
                assert server.step()
        finally:
            Store.set_status = staticmethod(set_status)
        assert "huge" not in written
    finally:
        server.close()


def test_a_stop_requested_in_the_last_step_still_counts_as_the_end(tmp_path):
    """``serve --until-idle`` reports an interruption only when it stopped before its end: a signal arriving in
    the very step that finished the last job does not turn a complete run into an 'interrupted' one."""
    import signal

    server, clock = _server(tmp_path)
    try:
        server.store.submit(JobSubmission(MODEL, BATCH, 50, "a"))
        step = server.step

        def step_then_signal() -> bool:
            clock.t += 1000.0  # each step: the job's whole run
            did = step()
            if server.idle():
                server.request_stop(signal.SIGTERM)  # as the handler would, during the last step
            return did

        server.step = step_then_signal
        assert server.serve(until_idle=True, install_signals=False, max_wall_s=60) is True
        assert server.stop_signal == signal.SIGTERM and server.store.job("a")["status"] == st.FINISHED
        server._stop = False
        server.step = lambda: (server.request_stop(signal.SIGINT), False)[1]  # stopped before any end
        assert server.serve(until_idle=True, install_signals=False, max_wall_s=60) is False
    finally:
        server.close()


def test_a_server_stops_once_its_database_is_removed_or_replaced(tmp_path):
    """A server whose state file was moved away or replaced writes to a file no name leads to (its jobs would be
    lost, and a second server could take the new file): its next step stops it with a one-line error."""
    import os

    from libarena.errors import ArenaError

    for change in ("replace", "move away"):
        (tmp_path / change).mkdir()
        server, _ = _server(tmp_path / change)
        try:
            server.step()  # while the name leads to its file, it serves
            state = server.lock.state
            if change == "replace":
                other = state.with_name("other.db")
                other.write_bytes(b"")
                os.replace(other, state)
            else:
                state.rename(state.with_name("moved.db"))
            expected = (r"replaced by another file while this server held it; stopped \(the new file can be served now\)$"
                        if change == "replace" else r"removed or moved away while this server held it; stopped \(a "
                        r"moved one can be served under its new name\)$")
            with pytest.raises(ArenaError, match=r"state\.db: the state database was " + expected):
                server.step()
        finally:
            server.close()


def test_submit_reads_its_job_back_through_the_database_name(tmp_path, monkeypatch):
    """A first serve that fails on a new path removes the database it made when it holds no job: a job inserted
    just after that check would go with the file. submit reads the job back through the name and says so."""
    import os
    from pathlib import Path

    from libarena.errors import ArenaError
    from libarena.schedule.live.jobfile import JobSubmission
    from libarena.schedule.live.store import Store, submit_job

    state = tmp_path / "s.db"
    assert submit_job(state, JobSubmission(MODEL, BATCH, 10)) == "job-1"
    original = Store.submit
    for change in ("remove", "replace with a text file", "replace with another database"):
        def submit_then_change(self, sub, not_before=None):
            job_id = original(self, sub, not_before)
            for suffix in ("", "-wal", "-shm"):  # what the failed start does after finding no job
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            if change == "replace with a text file":
                self.path.write_text("not a database")
            elif change == "replace with another database":  # whose jobs have the same ids
                other = Store(tmp_path / "other.db", create=True)
                for _ in range(3):
                    original(other, JobSubmission(MODEL, BATCH, 99))
                other.close()
                os.replace(tmp_path / "other.db", self.path)
            return job_id

        monkeypatch.setattr(Store, "submit", submit_then_change)
        with pytest.raises(ArenaError, match=r"^.*s\.db: the state database was removed or replaced while job job-\d "
                                             r"was submitted \(a serve that fails to start .*\); submit it again$"):
            submit_job(state, JobSubmission(MODEL, BATCH, 10))
        state.unlink(missing_ok=True)
        monkeypatch.setattr(Store, "submit", original)
        assert submit_job(state, JobSubmission(MODEL, BATCH, 10)) == "job-1"


def test_close_releases_the_lock_after_the_database_whatever_fails(tmp_path):
    """Releasing the server lock closes a descriptor of the database file, which drops the POSIX locks SQLite
    holds on a connection still open: so the database is closed first, even when the launcher's close fails."""
    import sqlite3

    server, _ = _server(tmp_path)

    def broken_close():
        raise RuntimeError("launcher close failed")

    server.launcher.close = broken_close
    with pytest.raises(RuntimeError, match="launcher close failed"):
        server.close()
    with pytest.raises(sqlite3.ProgrammingError):  # closed
        server.store.conn.execute("SELECT 1")
    assert server.lock.fd is None


def test_a_measured_iteration_count_is_as_of_the_poll(tmp_path):
    """arena-run reports the iterations it has done when polled; the progress model then adds rate x time from
    the poll on. Stamped with the last pass's time instead, the time since that pass was counted twice."""
    from libarena.schedule.live.launchers import RunStatus

    server, clock = _server(tmp_path)
    try:
        live, job = _started_job(server, clock)
        live.advance(100.0)
        assert job.state.value == "running" and job.rate > 0
        live.apply({"a": RunStatus("a", job.version, "running", 10.0, None, 50.0)}, True, polled_at=400.0)
        assert (job.progress, job.progress_time) == (50.0, 400.0)
        assert job.remaining_at(400.0) == job.spec.num_iterations - 50.0
    finally:
        server.close()


def test_a_new_database_does_not_take_over_another_databases_workdir(tmp_path):
    """Job files are named by job id and version, which every database starts afresh at job-1: a new database
    served in the workdir of a deleted one would find that one's job-1 finished (or its process running, its
    checkpoints) and report its own job-1 done without running it. The workdir names the database it serves."""
    from libarena.schedule.live.jobfile import JobSubmission
    from libarena.schedule.live.server import WORKDIR_OWNER

    server, clock = _server(tmp_path)
    try:
        server.step()
        job_id = server.store.submit(JobSubmission(MODEL, BATCH, 600))
        clock.t = 10.0
        server.step()
        clock.t = 290.0
        server.step()
        assert server.store.job(job_id)["status"] == "finished"
        owner = (server.workdir / WORKDIR_OWNER).read_text().strip()
        assert owner == server.store.get_meta("state_id") and len(owner) == 32
    finally:
        server.close()
    # the same database is served again in its workdir
    again, _ = _server(tmp_path)
    again.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path / 'state.db'}{suffix}").unlink(missing_ok=True)
    with pytest.raises(ArenaError, match=rf"state.db: --workdir .*state.db.d holds the jobs of another state database "
                                         rf"\({WORKDIR_OWNER} names {owner}\); serve that database, or give this one"):
        _server(tmp_path)
    assert not (tmp_path / "state.db").exists()  # the refused start leaves no database behind
    # a workdir damaged beyond naming its owner is refused too, in one line
    (tmp_path / "state.db.d" / WORKDIR_OWNER).write_bytes(b"\x00" * 100_000)
    with pytest.raises(ArenaError, match=r"is not a state id \(this workdir's owner file is damaged"):
        _server(tmp_path)


def test_a_damaged_stored_submission_is_a_one_line_error_naming_the_job(tmp_path):
    """A submitted row whose spec is valid JSON of the wrong shape (a hand edit) stops the server with an error
    naming the job, not an internal error from deep in the ingest."""
    import sqlite3

    server, clock = _server(tmp_path)
    try:
        job_id = server.store.submit(JobSubmission(MODEL, BATCH, 600))
        conn = sqlite3.connect(server.config.state)
        with conn:
            conn.execute("UPDATE jobs SET spec = json_remove(spec, '$.iterations') WHERE job_id = ?", (job_id,))
        conn.close()
        with pytest.raises(ArenaError, match=rf"state.db: job {job_id}'s stored submission is damaged \(TypeError"):
            server.step()
    finally:
        server.close()


def test_a_server_holds_only_the_jobs_not_ended(tmp_path):
    """Ended jobs leave the server's memory once their last state is committed (a server runs for months and
    each pass walks its jobs): what it holds is what a restart would rebuild; status still shows them."""
    server, clock = _server(tmp_path)
    try:
        server.step()
        for i in range(5):
            server.store.submit(JobSubmission(MODEL, BATCH, 60, f"j{i}"))
        clock.t = 10.0
        while not server.idle():
            server.step()
            clock.t += 60.0
        assert all(server.store.job(f"j{i}")["status"] == st.FINISHED for i in range(5))
        assert server.live.jobs == [] and server.live.by_id == {} and not server.live.requests
        assert not server.live._reported and not server.live._finished_at
        assert [r["status"] for r in job_rows(server.store)["jobs"]] == [st.FINISHED] * 5
        server.store.submit(JobSubmission(MODEL, BATCH, 60, "later"))
        server.step()
        assert [j.spec.job_id for j in server.live.jobs] == ["later"]
    finally:
        server.close()
