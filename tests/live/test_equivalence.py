"""The same policy module drives the simulator and the live scheduler: on the same small trace, the live
scheduler (compressed real time, emulated hosts following the perf table) makes the same decisions."""

from __future__ import annotations

import dataclasses

import pytest

from libarena.schedule.live.jobfile import JobSubmission
from libarena.schedule.live.server import ServeConfig, Server
from libarena.schedule.live.store import Store
from tests.live.helpers import OVERHEADS, live_decisions, sim_decisions, simulate, small_trace, write_inputs


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "offset"), [("arena", 0.0), ("fcfs", 0.0), ("elasticflow-ls", 0.0), ("arena", 100.0)])
def test_live_matches_simulator(tmp_path, policy, offset):
    """offset: the trace's first job arrives that late; the live scheduler ticks from 0 all the same, as the
    simulator does with --start 0 (by default it ticks from the first submission)."""
    cluster, perf = write_inputs(tmp_path)
    specs = [dataclasses.replace(s, submit_time=s.submit_time + offset) for s in small_trace(10)]
    res = simulate(specs, cluster, perf, policy, start_s=0.0)
    expected = sim_decisions(res)
    actions = {a for _, _, a, _, _ in expected}
    assert "launch" in actions and "finish" in actions
    if policy == "arena":
        assert "rescale" in actions  # the trace exercises elastic scaling
    span = res.end_time - res.start_time
    state = tmp_path / "state.db"
    store = Store(state, create=True)
    for s in specs:  # replayed at their trace times
        store.submit(JobSubmission(s.model, s.global_batch, s.num_iterations, s.job_id, s.priority, None,
                                   s.requested_type, s.requested_gpus), not_before=s.submit_time)
    cfg = ServeConfig(cluster, perf, state, policy=policy, tick_s=300.0, compression=span / 6.0,
                      launcher="perf-table", overheads=OVERHEADS, poll_s=0.02, event_passes=False)
    server = Server(cfg)
    server.serve(until_idle=True, max_wall_s=60, install_signals=False)
    got = live_decisions(server.store)
    server.close()
    by_job = lambda seq, j: [x for x in seq if x[1] == j]  # noqa: E731
    for s in specs:
        assert by_job(got, s.job_id) == by_job(expected, s.job_id), s.job_id
    assert sorted(got) == sorted(expected)
    final = {j["job_id"]: j["status"] for j in Store(state).jobs()}
    assert set(final.values()) <= {"finished", "dropped"}
