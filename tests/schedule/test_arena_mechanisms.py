"""Arena's mechanisms on hand-built cases: deadline objective, defragmenting migration, priority queues, the
in-flight exchange and trade."""

from __future__ import annotations

from libarena.schedule.config import Objective, OverheadConfig
from tests.schedule.helpers import NO_OVERHEADS, cluster, hand_table, job, simulate

TABLE = hand_table({
    ("gpt__1.3B", "a100"): {"ap": {1: 10.0, 2: 19.0, 4: 36.0}, "arena": {1: 10.0, 2: 19.0, 4: 36.0}},
    ("moe__2.4B", "a100"): {"ap": {2: 20.0}, "arena": {2: 20.0}},  # runs on exactly 2 GPUs
    ("moe__10B", "a100"): {"ap": {4: 20.0}, "arena": {4: 20.0}},  # runs on exactly 4 GPUs
}, batch=10)


def _actions(res, action):
    d = res.decisions
    return [(t, res.jobs[j].spec.job_id, n) for t, j, a, n in zip(d["time"], d["job_index"], d["action"], d["num_gpus"])
            if a == action]


def test_deadline_objective_uses_fewest_gpus_that_meet_it_and_drops_the_hopeless():
    spec = cluster([("a100", 1, 4)])
    # 1000 iterations of batch 10: 1000 s on 1 GPU, 526 s on 2, 278 s on 4
    jobs = [job("fits-on-2", "gpt__1.3B", 1000, 1, "a100", batch=10, deadline=700.0, row=1),
            job("hopeless", "gpt__1.3B", 1000, 1, "a100", batch=10, deadline=200.0, row=2)]
    res = simulate(jobs, TABLE, spec, "arena", objective=Objective.DEADLINE)
    assert _actions(res, "launch") == [(0.0, "fits-on-2", 2)]
    assert [j for _, j, _ in _actions(res, "drop")] == ["hopeless"]
    assert res.jobs[0].finish_time <= 700.0


def test_defragmenting_migration_unblocks_a_job():
    spec = cluster([("a100", 2, 4)])
    jobs = [job("a", "moe__2.4B", 100000, 2, "a100", batch=10, row=1),
            job("b", "moe__2.4B", 500, 2, "a100", batch=10, row=2),
            job("c", "moe__2.4B", 500, 2, "a100", batch=10, row=3),
            job("d", "moe__2.4B", 100000, 2, "a100", batch=10, row=4),
            job("e", "moe__10B", 1000, 4, "a100", batch=10, submit=1200.0, row=5)]
    res = simulate(jobs, TABLE, spec, "arena")
    launches = {j: (t, n) for t, j, n in _actions(res, "launch")}
    assert set(launches) == {"a", "b", "c", "d", "e"}
    # b and c finish at 250 s, leaving 2 free GPUs on each node: e (4 GPUs on one node) is blocked until the
    # periodic defragmentation (every 3600 s) migrates one 2-GPU job next to the other
    migrations = _actions(res, "migrate")
    assert len(migrations) == 1 and migrations[0][0] == 3600.0 and migrations[0][1] in ("a", "d")
    assert launches["e"] == (3600.0, 4)


def test_blocked_queue_stops_lower_queues_from_scaling_others_down():
    spec = cluster([("a100", 2, 4)])
    base = [job("big", "moe__10B", 100000, 4, "a100", batch=10, row=1, priority=1),
            job("other", "gpt__1.3B", 100000, 1, "a100", batch=10, row=2, priority=1),
            job("low", "gpt__1.3B", 1000, 1, "a100", batch=10, submit=600.0, row=4, priority=2),
            job("same", "gpt__1.3B", 1000, 1, "a100", batch=10, submit=900.0, row=5, priority=1)]
    blocked = job("blocked", "moe__10B", 1000, 4, "a100", batch=10, submit=600.0, row=3, priority=1)
    free_run = simulate(base, TABLE, spec, "arena", promotion_time_s=1e9)
    assert {j: t for t, j, _ in _actions(free_run, "launch")}["low"] == 600.0  # nothing blocked: it may shrink "other"
    res = simulate(base + [blocked], TABLE, spec, "arena", promotion_time_s=1e9)
    launches = {j: t for t, j, _ in _actions(res, "launch")}
    # "blocked" (queue 1) cannot be placed even after scaling down: queue 2 may not scale others down for "low",
    # but "same", in the blocked job's own queue, may
    assert launches["low"] > 600.0
    assert launches["same"] == 900.0
    assert (900.0, "other", 2) in _actions(res, "rescale")
    assert launches["blocked"] > 900.0



def test_a_launch_halves_running_jobs_only_on_the_type_it_is_placed_on():
    """The launch handler's search halves running jobs on every type the queued job may use until it fits; the
    halvings on its other types free GPUs it never takes, so only those on the type it lands on are made."""
    spec = cluster([("a100", 1, 4), ("v100", 1, 4)])
    table = hand_table({
        ("gpt__1.3B", "a100"): {"ap": {2: 100.0, 4: 101.0}, "arena": {2: 100.0, 4: 101.0}},  # barely gains from 4
        ("moe__2.4B", "v100"): {"ap": {2: 100.0, 4: 150.0}, "arena": {2: 100.0, 4: 150.0}},
        ("bert__2.6B", "a100"): {"ap": {4: 100.0}, "arena": {4: 100.0}},  # 4 A100s or 2 V100s
        ("bert__2.6B", "v100"): {"ap": {2: 60.0}, "arena": {2: 60.0}},
    })
    jobs = [job("x", "gpt__1.3B", 200000, 2, "a100", row=1), job("y", "moe__2.4B", 200000, 2, "v100", row=2),
            job("z", "bert__2.6B", 20000, 2, "v100", submit=600.0, row=3)]
    for overheads in (OverheadConfig(), NO_OVERHEADS):
        res = simulate(jobs, table, spec, "arena", overheads=overheads)
        at_launch = [(j, n) for t, j, n in _actions(res, "rescale") if t == 600.0]
        # x (the cheapest halving, on the A100s) was halved in the search, but z, which 2 A100s cannot hold,
        # lands on the V100s that halving y frees: x keeps its GPUs
        assert (600.0, "z", 2) in _actions(res, "launch")
        assert at_launch == [("y", 2)]
        assert res.jobs[0].reschedules == 0

def test_exchange_moves_a_job_stranded_on_a_slow_type_by_halving_a_job_that_barely_gains():
    """The in-flight exchange (off by default): "slow" launched on V100s (10x slower) because a job that gains
    little from its last doubling holds every A100. Halving that job costs it 1 sample/s and gives "slow" 15.4
    more: the exchange does it, without it "slow" waits on the V100s until the A100s free up. (The hog cannot
    run on V100s, so no trade applies.)"""
    table = hand_table({
        ("gpt__1.3B", "a100"): {"arena": {1: 10.0, 2: 19.0, 4: 36.0}},
        ("gpt__1.3B", "v100"): {"arena": {1: 1.0, 2: 1.9, 4: 3.6}},
        ("moe__2.4B", "a100"): {"arena": {2: 20.0, 4: 21.0}},  # exactly 2 or 4 A100s, nearly no gain from 4
    }, batch=10)
    spec = cluster([("a100", 1, 4), ("v100", 1, 4)])
    jobs = [job("hog", "moe__2.4B", 100000, 2, "a100", batch=10, row=1),
            job("slow", "gpt__1.3B", 20000, 1, "a100", batch=10, row=2)]
    off = simulate(jobs, table, spec, "arena", exchange_margin=0.0)
    # without: "slow" moves to the A100s only once the hog finishes (100,000 iterations at 21/s: 47,619 s)
    assert [(j, n) for _, j, n in _actions(off, "rescale")] == [("slow", 4)] and _actions(off, "rescale")[0][0] > 47619
    res = simulate(jobs, table, spec, "arena", exchange_margin=3.0)
    rescales = _actions(res, "rescale")
    # one round halves the hog and moves "slow" to 2 A100s; the hog grows back once "slow" is done
    assert [(j, n) for _, j, n in rescales] == [("hog", 2), ("slow", 2), ("hog", 4)] and rescales[0][0] == rescales[1][0]
    finish = {j.spec.job_id: j.finish_time for j in res.jobs}
    finish_off = {j.spec.job_id: j.finish_time for j in off.jobs}
    # 20,000 iterations of batch 10: 10,526 s on 2 A100s after the exchange
    assert finish_off["slow"] > 47619 and finish["slow"] < 12000
    finish_slow = finish["slow"]
    assert rescales[2][0] >= finish_slow and finish["hog"] > finish_off["hog"]  # the hog paid a little for it


TRADE_TABLE = hand_table({
    ("gpt__1.3B", "a100"): {"arena": {4: 40.0}},
    ("gpt__1.3B", "v100"): {"arena": {4: 10.0}},
}, batch=10)


def test_a_launching_short_job_takes_a_long_jobs_fast_gpus_which_restarts_on_the_free_slow_ones():
    """A trade at launch: "long" holds the A100s; "short" (10x shorter) arrives when only the V100s are free.
    The A100s gain "short" 30 samples/s at 10x the weight that "long" loses them at (the JCT objective's
    1 / isolated duration), so in the round "short" launches, "long" restarts on the V100s and "short" starts on
    the A100s; without trades "short" runs on the V100s to the end. Nobody loses GPUs."""
    spec = cluster([("a100", 1, 4), ("v100", 1, 4)])
    jobs = [job("long", "gpt__1.3B", 400000, 4, "a100", batch=10, row=1),
            job("short", "gpt__1.3B", 40000, 4, "a100", batch=10, submit=10.0, row=2)]
    off = simulate(jobs, TRADE_TABLE, spec, "arena", trade_margin=0.0)
    assert _actions(off, "rescale") == [] and _actions(off, "launch")[1] == (300.0, "short", 4)
    res = simulate(jobs, TRADE_TABLE, spec, "arena")
    d = res.decisions
    first = [(t, res.jobs[j].spec.job_id, a, g) for t, j, a, g in zip(d["time"], d["job_index"], d["action"], d["gpu_type"])][:3]
    assert first == [(0.0, "long", "launch", "a100"), (300.0, "long", "rescale", "v100"), (300.0, "short", "launch", "a100")]
    finish = {j.spec.job_id: j.finish_time for j in res.jobs}
    finish_off = {j.spec.job_id: j.finish_time for j in off.jobs}
    # 40,000 iterations of batch 10: 40,000 s on the V100s, 10,000 s on the A100s
    assert finish_off["short"] == 40300.0 and finish["short"] == 10300.0
    # "long" goes back to the A100s once "short" is done; the sum of JCTs drops although "long" paid for it
    assert _actions(res, "rescale")[1][1:] == ("long", 4) and _actions(res, "rescale")[1][0] >= finish["short"]
    jct = lambda f: sum(f[j.spec.job_id] - j.spec.submit_time for j in res.jobs)  # noqa: E731
    assert finish["long"] > finish_off["long"] and jct(finish) < jct(finish_off)
    # the decisions show rescales; the run's counters say which were trades (metrics.json's trades_at_launch)
    assert res.counters.get("trades_at_launch") == 1 and not res.counters.get("trades")
    assert not off.counters.get("trades_at_launch")


#: "x" (short) holds the A100s when "short" arrives, so "short" starts on the V100s (taking the A100s from a job
#: 10x shorter than itself would not pay); "long" arrives later and takes the A100s that "x" leaves
IN_FLIGHT = [job("x", "gpt__1.3B", 4000, 4, "a100", batch=10, row=1),
             job("short", "gpt__1.3B", 40000, 4, "a100", batch=10, submit=10.0, row=2),
             job("long", "gpt__1.3B", 400000, 4, "a100", batch=10, submit=900.0, row=3)]


def test_trade_gives_the_fast_gpus_to_the_short_job_without_taking_gpus_from_anyone():
    """The in-flight trade: once "short" (on the V100s) and "long" (on the A100s) both run, they swap GPUs in
    one round, both restarting; without trades "short" stays on the V100s to the end."""
    spec = cluster([("a100", 1, 4), ("v100", 1, 4)])
    off = simulate(IN_FLIGHT, TRADE_TABLE, spec, "arena", trade_margin=0.0)
    assert _actions(off, "rescale") == []
    res = simulate(IN_FLIGHT, TRADE_TABLE, spec, "arena")
    assert [(t, j) for t, j, _ in _actions(res, "launch")] == [(0.0, "x"), (300.0, "short"), (1200.0, "long")]
    rescales = _actions(res, "rescale")
    assert [(t, j) for t, j, _ in rescales[:2]] == [(1500.0, "short"), (1500.0, "long")]
    d = res.decisions
    types = {(res.jobs[j].spec.job_id, a): g for t, j, a, g in zip(d["time"], d["job_index"], d["action"], d["gpu_type"])
             if t == 1500.0}
    assert types == {("short", "rescale"): "a100", ("long", "rescale"): "v100"}
    finish = {j.spec.job_id: j.finish_time for j in res.jobs}
    finish_off = {j.spec.job_id: j.finish_time for j in off.jobs}
    # "short": 1,200 iterations on the V100s by 1,500 s, the other 38,800 at 4 it/s on the A100s
    assert finish_off["short"] == 40300.0 and finish["short"] == 1500.0 + 38800 / 4
    assert rescales[2][1:] == ("long", 4) and rescales[2][0] >= finish["short"]
    assert res.counters.get("trades") == 1 and not off.counters.get("trades")


def test_trade_needs_the_margin_and_a_shorter_job_to_gain():
    """Two jobs of the same length gain and lose the same: no trade (the second moves up once the first is done);
    a margin above the ratio of the weighted gain to the loss: none either."""
    spec = cluster([("a100", 1, 4), ("v100", 1, 4)])
    same = [job("first", "gpt__1.3B", 400000, 4, "a100", batch=10, row=1),
            job("second", "gpt__1.3B", 400000, 4, "a100", batch=10, submit=10.0, row=2)]
    assert _actions(simulate(same, TRADE_TABLE, spec, "arena"), "rescale") == [(100200.0, "second", 4)]
    jobs = [job("long", "gpt__1.3B", 400000, 4, "a100", batch=10, row=1),
            job("short", "gpt__1.3B", 40000, 4, "a100", batch=10, submit=10.0, row=2)]
    # the weighted gain is 10x the loss: a margin of 12 refuses it (at launch and in flight), 8 accepts it
    assert _actions(simulate(jobs, TRADE_TABLE, spec, "arena", trade_margin=12.0), "rescale") == []
    assert _actions(simulate(jobs, TRADE_TABLE, spec, "arena", trade_margin=8.0), "rescale")[0][:2] == (300.0, "long")
    assert _actions(simulate(IN_FLIGHT, TRADE_TABLE, spec, "arena", trade_margin=12.0), "rescale") == []


def test_a_trade_pays_both_restarts_and_neither_job_progresses_meanwhile():
    """Both traders pay checkpoint-resume and the AP search for their new configuration (300 s + 90 s here) and
    do not train meanwhile; the cluster's occupancy is unchanged (each holds the other's GPUs at once)."""
    overheads = OverheadConfig(0, 0, 0, 90, 0, 300)
    spec = cluster([("a100", 1, 4), ("v100", 1, 4)])
    res = simulate(IN_FLIGHT, TRADE_TABLE, spec, "arena", overheads=overheads)
    trade = _actions(res, "rescale")[:2]
    assert [j for _, j, _ in trade] == ["short", "long"] and trade[0][0] == trade[1][0]
    at = trade[0][0]
    short = next(j for j in res.jobs if j.spec.job_id == "short")
    # launched at 300 s, training from 390 s at 1 it/s on the V100s until the trade; from 390 s after it on the
    # A100s at 4 it/s for the rest
    done = at - 390.0
    assert short.finish_time == at + 390.0 + (40000 - done) / 4
    assert short.overhead_s == 90.0 + 390.0


def test_fairness_objective_moves_a_job_to_its_option_that_lowers_its_rho_most():
    """A job on 2 A40s (2 samples/s) may move to 1 A100 (2.5), 2 A100s (5) or 4 A40s (4). Eq. 7 helps the job
    furthest behind first, and with the option that lowers its finish-time fairness most: 2 A100s, as eq. 5
    and the JCT objective choose here. Before, every option of a job scored its rho before the move, so the
    first improving one in the options' order won (1 A100), and a second rescale was needed later."""
    import heapq

    from libarena.schedule.api import make_policy
    from libarena.schedule.config import SimulatorConfig
    from libarena.schedule.entities import JobState
    from libarena.schedule.simulator import Simulator
    from tests.schedule.helpers import workload

    spec = cluster([("a100", 1, 2), ("a40", 1, 4)])
    views = {("gpt__1.3B", "a100"): {1: 2.5, 2: 5.0}, ("gpt__1.3B", "a40"): {1: 1.0, 2: 2.0, 4: 4.0}}
    table = hand_table({k: {v: d for v in ("ap", "arena", "dp")} for k, d in views.items()})
    w = workload([job("b", "gpt__1.3B", 10**6, 2, "a40")], table, spec)
    for objective in ("fairness", "throughput", "jct"):
        policy = make_policy("arena", objective=objective, trade_margin=0.0)
        sim = Simulator(w.jobs, w.perf, w.cluster, policy, SimulatorConfig(overheads=NO_OVERHEADS))
        (b,) = sim.jobs
        b.state, sim.queued_count, sim.pending_arrivals = JobState.QUEUED, 1, 0
        assert sim.launch(b, sim.perf.type_index["a40"], 1)  # 2 A40s
        heapq.heappop(sim.heap)[-1].handle(sim)  # its start: running
        assert b.state == JobState.RUNNING
        chosen, t2, c2 = policy._best_upgrade([p.free_total for p in sim.pools], set())
        assert (chosen, sim.perf.gpu_types[t2], 1 << c2) == (b, "a100", 2), objective
