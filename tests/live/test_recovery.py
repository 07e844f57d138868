"""kill -9 the live scheduler mid-run (a real subprocess) and restart it: nothing lost, nothing launched twice,
and, since the restored state is exact, the decisions are still the simulator's."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from collections import Counter

import pytest

from libarena.schedule.live.jobfile import JobSubmission
from libarena.schedule.live.store import Store
from tests.live.helpers import (OVERHEADS, cli_env, live_decisions, sim_decisions, simulate, small_trace, tool, wait_until,
                                write_inputs)


def _serve(cluster, perf, state, compression, until_idle=False):
    args = [tool("arena-schedule"), "serve", "--cluster", str(cluster), "--perf", str(perf), "--state", str(state),
            "--launcher", "perf-table", "--time-compression", str(compression), "--tick", "300", "--poll", "0.02",
            "--ticks-only"]  # passes at ticks only: the decisions are then exactly the simulator's
    args += [f"--overhead={k}={v}" for k, v in OVERHEADS.__dict__.items()]
    if until_idle:
        args.append("--until-idle")
    return subprocess.Popen(args, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _count(state, kind: str) -> int:
    conn = sqlite3.connect(str(state), timeout=30)
    try:
        return conn.execute("SELECT COUNT(*) FROM log WHERE kind = ?", (kind,)).fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


@pytest.mark.slow
def test_kill9_and_restart_recovers(tmp_path):
    cluster, perf = write_inputs(tmp_path)
    specs = small_trace(12, seed=1)
    res = simulate(specs, cluster, perf)
    expected = sim_decisions(res)
    span = res.end_time - res.start_time
    state = tmp_path / "state.db"
    store = Store(state, create=True)
    for s in specs:
        store.submit(JobSubmission(s.model, s.global_batch, s.num_iterations, s.job_id, s.priority, None,
                                   s.requested_type, s.requested_gpus), not_before=s.submit_time)
    store.close()
    compression = span / 12.0  # ~12 wall seconds of scheduling, plus restarts
    kills = []
    # kill twice: once early (jobs launching), once after rescales happened
    for wait_kind, wait_n in (("launch", 4), ("rescale", 2)):
        proc = _serve(cluster, perf, state, compression)
        try:
            wait_until(lambda: _count(state, wait_kind) >= wait_n or proc.poll() is not None, 60)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        kills.append(_count(state, "launch") + _count(state, "rescale"))
    assert kills[0] < len(expected)  # killed mid-run
    proc = _serve(cluster, perf, state, compression, until_idle=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    store = Store(state)
    got = live_decisions(store)
    jobs = store.jobs()
    assert sorted(j["job_id"] for j in jobs) == sorted(s.job_id for s in specs)
    assert {j["status"] for j in jobs} == {"finished"}  # none lost
    launches = store.launches()
    assert {r["state"] for r in launches} <= {"launched", "superseded"}  # every intent was carried out
    # none launched twice: one launch action per job, each (job, version) decided once, versions in order
    assert Counter(j for _, j, a, _, _ in got if a == "launch") == Counter(s.job_id for s in specs)
    versions = [(r["job_id"], r["version"]) for r in launches]
    assert len(versions) == len(set(versions))
    hosts = sqlite3.connect(str(state) + ".d/launcher/emulated-hosts.db")
    runs = hosts.execute("SELECT job_id, version FROM runs").fetchall()
    assert len(runs) == len(set(runs)) == len([r for r in launches if r["state"] == "launched"])
    assert _count(state, "recover") >= 1
    # the profiles and plans later starts reuse were saved with the state, finished jobs' pairs included
    saved = store.get_meta("reuse_state")
    assert {(m, b) for m, b, _ in saved["profiles"]} == {(s.model, s.global_batch) for s in specs}
    # the restored state was exact: the whole run made the simulator's decisions
    assert sorted(got) == sorted(expected)
