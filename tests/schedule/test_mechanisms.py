"""Issue 16's mechanisms on hand-built workloads whose answers can be worked out: FCFS's per-type queues, the
profile and plan reuse every policy gets, and Arena's JCT objective (Smith's rule) and finish-time
fairness (eq. 7) against eq. 5."""

from __future__ import annotations

import math

import pytest

from libarena.errors import ArenaError
from libarena.schedule.config import OverheadConfig
from libarena.schedule.metrics import job_records
from tests.schedule.helpers import NO_OVERHEADS, cluster, hand_table, job, simulate

TABLE = hand_table({
    ("gpt__1.3B", "a100"): {"dp": {1: 10.0, 2: 20.0, 4: 40.0}, "ap": {1: 10.0, 2: 20.0, 4: 40.0}},
    ("gpt__1.3B", "v100"): {"dp": {1: 5.0, 2: 10.0}, "ap": {1: 5.0, 2: 10.0}},
})


def _launch_times(res) -> dict[str, float]:
    d = res.decisions
    return {res.jobs[j].spec.job_id: t for t, j, a in zip(d["time"], d["job_index"], d["action"]) if a == "launch"}


def test_fcfs_queues_per_gpu_type_by_default():
    spec = cluster([("a100", 1, 4), ("v100", 1, 2)])
    # a100 is held by "big" until it ends; "blocked" (a100, 4 GPUs) waits behind it; "v" asks for v100
    jobs = [job("big", "gpt__1.3B", 40000, 4, "a100", submit=0.0, row=1),
            job("blocked", "gpt__1.3B", 4000, 4, "a100", submit=10.0, row=2),
            job("v", "gpt__1.3B", 1000, 2, "v100", submit=20.0, row=3)]
    per_type = _launch_times(simulate(jobs, TABLE, spec, "fcfs"))
    single = _launch_times(simulate(jobs, TABLE, spec, "fcfs", per_type_queues=False))
    big_end = 40000 * 256 / 40.0
    assert per_type["v"] < 1000 and per_type["blocked"] >= big_end  # v100's queue is not held up
    assert single["v"] >= big_end and single["blocked"] >= big_end  # one queue: the a100 job blocks it


def test_reused_profiles_and_plans_are_paid_once_per_pair_and_configuration():
    spec = cluster([("a100", 1, 4)])
    overheads = OverheadConfig(grid_profiling_s=500, full_profiling_s=800, bootstrap_profiling_s=200,
                               pruned_ap_search_s=60, full_ap_search_s=300, checkpoint_resume_s=100)
    jobs = [job(f"j{i}", "gpt__1.3B", 1000, 4, "a100", submit=20000.0 * i, row=i + 1) for i in range(3)]

    def paid(policy: str, options: dict | None = None, **flags) -> list[float]:
        opts = {"elastic": False, "view": "ap", **(options or {})} if policy == "arena" else {}
        res = simulate(jobs, TABLE, spec, policy, overheads=OverheadConfig(**{**overheads.__dict__, **flags}), **opts)
        return job_records(res).column("overhead_s").to_pylist()

    # the first job of the pair profiles; the next ones reuse its profile (default) and search again
    assert paid("arena") == [560, 60, 60]
    # the §5.6 ablations: without runtime pruning every job searches the whole space; without the disaggregated
    # profiler the first job of the pair profiles it whole
    assert paid("arena", {"pruning": False}) == [800, 300, 300]
    assert paid("arena", {"profiler": False}) == [860, 60, 60]
    assert paid("sia") == [500, 300, 300]
    assert paid("arena", reuse_profiles=False) == [560, 560, 560]
    # with searched plans reused too, a later job on the same configuration pays nothing before it trains
    assert paid("arena", reuse_plans=True) == [560, 0, 0]
    assert paid("gavel", reuse_plans=True) == [1100, 0, 0]
    assert paid("fcfs") == [300, 300, 300]  # FCFS profiles nothing
    # a reused plan does not spare a job its own profiling where profiles are not reused
    assert paid("arena", reuse_profiles=False, reuse_plans=True) == [560, 500, 500]
    assert paid("gavel", reuse_profiles=False, reuse_plans=True) == [1100, 800, 800]


@pytest.mark.parametrize("reuse_plans", [False, True])
def test_a_job_launched_while_its_pair_is_profiled_waits_for_the_profile(reuse_plans):
    """Reuse counts from when a profile (or plan) is ready, not from when its job launched: j1 arrives while j0
    still profiles the same (model, batch), so it trains no earlier than j0's profile plus a search."""
    spec = cluster([("a100", 2, 4)])
    overheads = OverheadConfig(grid_profiling_s=500, full_profiling_s=800, bootstrap_profiling_s=200,
                               pruned_ap_search_s=60, full_ap_search_s=300, checkpoint_resume_s=100,
                               reuse_plans=reuse_plans)
    jobs = [job("j0", "gpt__1.3B", 100000, 4, "a100", submit=0.0, row=1),
            job("j1", "gpt__1.3B", 100000, 4, "a100", submit=300.0, row=2)]
    res = simulate(jobs, TABLE, spec, "arena", overheads=overheads, elastic=False, view="ap")
    launched = _launch_times(res)
    paid = dict(zip(["j0", "j1"], job_records(res).column("overhead_s").to_pylist()))
    assert launched["j0"] == 0.0 and paid["j0"] == 560
    assert 300 <= launched["j1"] < 500
    # j0's profile is ready at 500 and its plan at 560: j1 trains from 560 either way (own search after the
    # profile, or j0's plan), where a flag set at launch would have let it start 60 s after its launch
    assert launched["j1"] + paid["j1"] == pytest.approx(560)


def test_overhead_flags_parse_and_reject():
    cfg = OverheadConfig.from_assignments(["reuse_plans=true", "reuse_profiles=off", "checkpoint_resume_s=60"])
    assert cfg.reuse_plans is True and cfg.reuse_profiles is False and cfg.checkpoint_resume_s == 60
    with pytest.raises(ArenaError, match="not true or false"):
        OverheadConfig.from_assignments(["reuse_plans=maybe"])


def test_jct_objective_gives_contended_gpus_to_the_shorter_job():
    # four jobs arrive together and get 2 A100 each; the two short ones finish first, and the two GPUs each
    # frees go to a scale-up: both survivors gain the same samples/s from doubling, so eq. 5's greedy (ties by
    # launch order) grows the long job, the JCT objective the short one.
    spec = cluster([("a100", 1, 8)])
    table = hand_table({(m, "a100"): {"ap": {2: 20.0, 4: 40.0}} for m in ("gpt__1.3B", "gpt__2.6B")})
    jobs = [job("long", "gpt__1.3B", 100000, 2, "a100", row=1), job("short", "gpt__2.6B", 5000, 2, "a100", row=2),
            job("hold", "gpt__1.3B", 1000, 2, "a100", row=3), job("hold2", "gpt__2.6B", 1000, 2, "a100", row=4)]

    def grown(objective: str) -> str:
        res = simulate(jobs, table, spec, "arena", objective=objective, view="ap", search_depth=1)
        d = res.decisions
        # the first scale-up (the launch handler's halvings to admit the short jobs come before)
        ups = [res.jobs[j].spec.job_id for j, a, n in zip(d["job_index"], d["action"], d["num_gpus"])
               if a == "rescale" and n == 4]
        return ups[0]

    assert grown("jct") == "short"
    assert grown("throughput") == "long"


def test_fairness_objective_halves_the_job_that_has_waited_least():
    """eq. 7 on a worked case: "waited" (submitted at 0) queues behind a 4-GPU holder until 6,600 s (the tick
    after the holder ends), "fresh" is submitted at 7,200 s; both then run the same model on 2 GPUs. A job
    arriving at 9,000 s needs one GPU of them: halving either costs the same throughput and JCT weight (eq. 5
    and Smith's rule tie, and take the first job), but finish-time fairness rho = (finish - submission) /
    isolated time is higher for the job that has waited, so the fairness objective halves the fresh one."""
    spec = cluster([("a100", 1, 4)])
    table = hand_table({("gpt__2.6B", "a100"): {"ap": {4: 40.0}},  # the holder cannot be halved
                        ("gpt__1.3B", "a100"): {"ap": {1: 10.0, 2: 20.0}}})
    jobs = [job("holder", "gpt__2.6B", 1000, 4, "a100", submit=0.0, row=1),  # 6,400 s on its 4 GPUs
            job("waited", "gpt__1.3B", 20000, 2, "a100", submit=0.0, row=2),
            job("fresh", "gpt__1.3B", 20000, 2, "a100", submit=7200.0, row=3),
            job("late", "gpt__1.3B", 100, 1, "a100", submit=9000.0, row=4)]

    def halved(objective: str) -> list[str]:
        res = simulate(jobs, table, spec, "arena", objective=objective, view="ap")
        d = res.decisions
        assert _launch_times(res) == {"holder": 0.0, "waited": 6600.0, "fresh": 7200.0, "late": 9000.0}
        return [res.jobs[j].spec.job_id for j, a, n, t in zip(d["job_index"], d["action"], d["num_gpus"], d["time"])
                if a == "rescale" and n == 1 and t == 9000.0]

    assert halved("fairness") == ["fresh"]
    assert halved("throughput") == halved("jct") == ["waited"]


def test_a_solver_policys_moves_happen_whatever_their_order_in_the_list():
    """Sia's and Gavel's ILP chooses a round's moves together; a move into GPUs that another move of the same
    list vacates is retried after it, so "b" (listed first) reaches the A40s that "a" leaves for the A100s. A
    cycle (each into the other's full type) is made at once: the two jobs swap GPUs, each restarting once."""
    from libarena.schedule.api import make_policy
    from libarena.schedule.config import SimulatorConfig
    from libarena.schedule.perf import PerfLookup
    from libarena.schedule.simulator import Simulator

    table = hand_table({(m, t): {"dp": {4: thr}} for m in ("gpt__1.3B",) for t, thr in
                        (("a100", 40.0), ("a40", 20.0), ("v100", 10.0))})
    spec = cluster([("a100", 1, 4), ("a40", 1, 4), ("v100", 1, 4)])
    jobs = [job("a", "gpt__1.3B", 100000, 4, "a40", row=1), job("b", "gpt__1.3B", 100000, 4, "v100", row=2)]
    for name in ("sia", "gavel"):
        sim = Simulator(jobs, PerfLookup(table, spec), spec, make_policy(name), SimulatorConfig(overheads=NO_OVERHEADS))
        types = {t: i for i, t in enumerate(sim.perf.gpu_types)}
        a, b = sim.jobs
        for j, t in ((a, "a40"), (b, "v100")):
            sim.arrive(j)
            assert sim.launch(j, types[t], 2)
            sim.start_training(j)
        sim.policy.apply_moves([(a, types["v100"], 2), (b, types["a40"], 2)])  # a cycle: neither fits alone
        assert (a.alloc.type_index, b.alloc.type_index, a.version, b.version) == (types["v100"], types["a40"], 2, 2)
        assert (a.reschedules, b.reschedules) == (1, 1)
        sim.policy.apply_moves([(b, types["a40"], 2), (a, types["a100"], 2)])
        assert (a.alloc.type_index, b.alloc.type_index) == (types["a100"], types["a40"]), name
        assert {sim.perf.gpu_types[i]: p.capacity - p.free_total for i, p in enumerate(sim.pools)} == {"a100": 4, "a40": 4, "v100": 0}


def test_moves_that_fit_only_together_are_made_together_and_the_rest_left():
    """Simulator.reassign: the moves' GPUs are given back first, so two jobs may swap types; a move that does not
    fit even then (8 GPUs on a 4-GPU type) is left out, and nothing of it changes, while the others are made."""
    from libarena.schedule.api import make_policy
    from libarena.schedule.config import SimulatorConfig
    from libarena.schedule.perf import PerfLookup
    from libarena.schedule.simulator import Simulator

    table = hand_table({(m, t): {"dp": {4: 10.0, 8: 20.0}} for m in ("gpt__1.3B",) for t in ("a100", "v100")})
    spec = cluster([("a100", 1, 4), ("v100", 2, 4)])
    jobs = [job(name, "gpt__1.3B", 100000, 4, "a100", row=k + 1) for k, name in enumerate("abc")]
    sim = Simulator(jobs, PerfLookup(table, spec), spec, make_policy("sia"), SimulatorConfig(overheads=NO_OVERHEADS))
    types = {t: i for i, t in enumerate(sim.perf.gpu_types)}
    a, b, c = sim.jobs
    for j, t in ((a, "a100"), (b, "v100"), (c, "v100")):
        sim.arrive(j)
        assert sim.launch(j, types[t], 2)
        sim.start_training(j)
    held = {j.spec.job_id: j.alloc for j in (a, b, c)}
    left = sim.reassign([(a, types["v100"], 2), (b, types["a100"], 2), (c, types["a100"], 3)])
    assert [(j.spec.job_id, t, n) for j, t, n in left] == [("c", types["a100"], 3)]
    assert (a.alloc.type_index, b.alloc.type_index) == (types["v100"], types["a100"])
    assert c.alloc == held["c"] and c.version == 1 and (a.version, b.version) == (2, 2)
    assert sum(p.capacity - p.free_total for p in sim.pools) == 12  # every GPU held once


def test_solver_baselines_swap_running_jobs_between_gpu_types():
    """A job that is 10x faster on A100s waits on V100s while one that runs nearly as fast on either holds the
    A100s: Sia's program and Gavel's both choose the swap, and it is made (the moves free each other's GPUs). It
    was never made: each move alone found its target held, and the fast job stayed on V100s until the other ended."""
    from libarena.schedule.config import OverheadConfig

    spec = cluster([("a100", 1, 4), ("v100", 1, 4)])
    table = hand_table({
        ("gpt__1.3B", "a100"): {"dp": {4: 11.0}, "ap": {4: 11.0}}, ("gpt__1.3B", "v100"): {"dp": {4: 10.0}, "ap": {4: 10.0}},
        ("gpt__2.6B", "a100"): {"dp": {4: 100.0}, "ap": {4: 100.0}}, ("gpt__2.6B", "v100"): {"dp": {4: 10.0}, "ap": {4: 10.0}},
    })
    overheads = OverheadConfig(grid_profiling_s=0, full_profiling_s=0, bootstrap_profiling_s=400, pruned_ap_search_s=0,
                               full_ap_search_s=0, checkpoint_resume_s=10)
    jobs = [job("slow-anywhere", "gpt__1.3B", 200000, 4, "a100", submit=0.0, row=1),
            job("fast-on-a100", "gpt__2.6B", 200000, 4, "v100", submit=100.0, row=2),
            job("late", "gpt__1.3B", 100, 4, "v100", submit=900.0, row=3)]
    alone_on_a100 = 200000 * 256 / 100.0
    for policy in ("sia", "gavel"):
        res = simulate(jobs, table, spec, policy, overheads=overheads)
        finish = {j.spec.job_id: j.finish_time for j in res.jobs}
        assert finish["fast-on-a100"] < 100.0 + 2000 + alone_on_a100, (policy, finish)


def test_sia_moves_a_running_job_to_a_slower_type_to_admit_one_that_needs_its_gpus():
    """Sia's program weighs every job's configurations, slower types included: "resident" runs almost as fast on
    the V100s, "newcomer" fits only the A100s, so the program moves "resident" down and admits "newcomer" at
    once instead of leaving it queued until "resident" ends (about a week)."""
    table = hand_table({
        ("gpt__1.3B", "a100"): {"dp": {1: 10.0, 2: 20.0, 4: 40.0}, "ap": {1: 10.0, 2: 20.0, 4: 40.0}},
        ("gpt__1.3B", "v100"): {"dp": {1: 9.0, 2: 18.0, 4: 36.0}, "ap": {1: 9.0, 2: 18.0, 4: 36.0}},
        ("bert__760M", "a100"): {"dp": {1: 10.0, 2: 20.0, 4: 40.0}, "ap": {1: 10.0, 2: 20.0, 4: 40.0}},
    })
    spec = cluster([("a100", 1, 4), ("v100", 1, 4)])
    jobs = [job("resident", "gpt__1.3B", 100000, 4, "a100", submit=0.0, row=1),
            job("newcomer", "bert__760M", 1000, 4, "a100", submit=1000.0, row=2)]
    res = simulate(jobs, table, spec, "sia")
    launched = _launch_times(res)
    assert launched["resident"] < 1000 and launched["newcomer"] < 2000
    d = res.decisions
    moves = [(g, n) for j, a, g, n in zip(d["job_index"], d["action"], d["gpu_type"], d["num_gpus"])
             if a == "rescale" and res.jobs[j].spec.job_id == "resident"]
    assert moves and moves[0] == ("v100", 4)


@pytest.mark.parametrize("horizon,advice", [(None, "a larger --tick or a --horizon"),
                                            (3000.0, "a larger --tick or a shorter --horizon")])
def test_the_tick_bound_advises_what_was_not_given(horizon, advice):
    """A workload over --max-ticks is refused before it runs, and the advice fits the options given."""
    from libarena.schedule.api import make_policy, run_policy
    from libarena.schedule.config import SimulatorConfig
    from tests.schedule.helpers import workload

    spec = cluster([("a100", 1, 8)])
    table = hand_table({("gpt__1.3B", "a100"): {"ap": {8: 1.0}, "arena": {8: 1.0}}})
    w = workload([job("long", "gpt__1.3B", 10_000, 8, "a100")], table, spec)
    with pytest.raises(ArenaError, match="needs at least") as err:
        run_policy(w, make_policy("fcfs"), SimulatorConfig(tick_s=300.0, horizon_s=horizon, max_ticks=5,
                                                           overheads=NO_OVERHEADS))
    assert advice in str(err.value)


def test_elasticflow_shrinks_running_jobs_only_when_the_freed_gpus_place_the_admitted_job():
    """Two running jobs fill both 4-GPU nodes; a job admitted for 4 GPUs by its deadline fits by count once both
    halve, but their freed halves are two GPUs on each node: no 4-GPU block. The shrinks would cost both jobs
    half their speed (and a rescale) for nothing, so ElasticFlow does not make them; the job launches when a
    node frees up."""
    spec = cluster([("a100", 2, 4)])
    table = hand_table({("gpt__1.3B", "a100"): {"dp": {2: 20.0, 4: 40.0}, "ap": {2: 20.0, 4: 40.0}}})
    jobs = [job("r1", "gpt__1.3B", 20000, 4, "a100", submit=0.0, row=1),
            job("r2", "gpt__1.3B", 40000, 4, "a100", submit=0.0, row=2),
            # 1,000 iterations: 12,800 s on 2 GPUs, 6,400 s on 4: admitted for 4 GPUs by its deadline
            job("late", "gpt__1.3B", 1000, 4, "a100", submit=1000.0, deadline=1000.0 + 10000.0, row=3)]
    res = simulate(jobs, table, spec, "elasticflow")
    d = res.decisions
    ids = [res.jobs[j].spec.job_id for j in d["job_index"]]
    shrinks = [(i, n) for i, a, n in zip(ids, d["action"], d["num_gpus"]) if a == "rescale" and n == 2 and i in ("r1", "r2")]
    assert not shrinks
    finish = {r["job_id"]: r["finish_time_s"] for r in job_records(res).to_pylist()}
    launched = _launch_times(res)
    assert launched["late"] >= finish["r1"] and finish["r1"] == pytest.approx(20000 * 256 / 40.0)


def test_the_seed_draws_the_priorities_of_jobs_without_one():
    """A trace without a priority column gets a hash of each job id spread over Arena's queues: seed 0 hashes
    the id alone (as before seeds drew priorities), another seed draws another assignment, so a sweep over
    seeds on a trace that is not adapted does not repeat one simulation. A priority in the trace is kept."""
    import zlib

    from libarena.schedule.api import make_policy
    from libarena.schedule.config import SimulatorConfig
    from libarena.schedule.simulator import Simulator
    from tests.schedule.helpers import workload

    spec = cluster([("a100", 1, 4)])
    jobs = [job(f"job-{i}", "gpt__1.3B", 10, 1, "a100", submit=float(i), row=i + 1, priority=None) for i in range(40)]
    jobs.append(job("given", "gpt__1.3B", 10, 1, "a100", submit=50.0, row=41, priority=2))

    def priorities(seed: int) -> dict[str, int]:
        w = workload(jobs, TABLE, spec)  # the priorities jobs enter with (Arena's queues promote them as they wait)
        sim = Simulator(w.jobs, w.perf, w.cluster, make_policy("arena", view="ap"), SimulatorConfig(seed=seed))
        return {j.spec.job_id: j.priority for j in sim.jobs}

    zero, one, again = priorities(0), priorities(1), priorities(1)
    assert zero == {**{f"job-{i}": zlib.crc32(f"job-{i}".encode()) % 3 + 1 for i in range(40)}, "given": 2}
    assert one == again and one["given"] == 2
    assert sum(zero[k] != one[k] for k in zero) >= 10


def test_a_job_moved_before_it_starts_still_waits_for_its_profiles():
    """A job migrated or rescaled in the round it launched, while its profiling runs: it starts no sooner than
    planned (a migration), or than its profiles plus a search on the new configuration (a rescale), and the
    pair's profiles count as ready when that profiling ends, not at the move, for every later job of the pair."""
    from libarena.schedule.api import make_policy
    from libarena.schedule.config import SimulatorConfig
    from libarena.schedule.entities import JobState
    from libarena.schedule.simulator import Simulator
    from tests.schedule.helpers import workload

    overheads = OverheadConfig(grid_profiling_s=500, full_profiling_s=800, bootstrap_profiling_s=200,
                               pruned_ap_search_s=60, full_ap_search_s=300, checkpoint_resume_s=100)
    w = workload([job("j0", "gpt__1.3B", 1000, 2, "a100", row=1)], TABLE, cluster([("a100", 1, 8)]))
    sim = Simulator(w.jobs, w.perf, w.cluster, make_policy("arena", view="ap"), SimulatorConfig(overheads=overheads))
    (j0,) = sim.jobs
    j0.state = JobState.QUEUED  # as on its arrival
    sim.queued_count += 1
    assert sim.launch(j0, 0, 1)  # profiling 500 s, then the search 60 s
    assert (j0.profiles_at, j0.starts_at, j0.overhead_s) == (500, 560, 560)
    sim.migrate(j0, sim.pools[0].place(2))
    assert j0.state == JobState.STARTING and j0.starts_at == 560  # not checkpoint-resume (100 s) from now
    assert sim.rescale(j0, 0, 2)
    assert j0.starts_at == 100 + 560 and sim.profiles_ready[("gpt__1.3B", 256)] == 500
    assert j0.overhead_s == 660  # the start-up it waits for once, not the launch's, the migration's and this one's


def test_elasticflow_counts_admitted_launches_before_best_effort_ones():
    """Shrinking R from 4 GPUs to 1 places it afresh on node 1, which frees node 0 for the admitted 4-GPU job A
    but leaves no room for the best-effort B that fits without the shrink: one launch either way, and the admitted
    one wins. The trial leaves the pool as it was."""
    import functools
    import types

    from libarena.schedule.entities import TypePool
    from libarena.schedule.policies.elasticflow import ElasticFlowPolicy
    from libarena.schedule.simulator import Simulator

    pool = TypePool(0, "a100", 2, 4)
    sim = types.SimpleNamespace(pools=[pool])  # the simulator's placement rule on this one pool
    sim.place_resized = functools.partial(Simulator.place_resized, sim)
    sim.unplace_resized = functools.partial(Simulator.unplace_resized, sim)
    pool.occupy(((0, 0b1111),))  # R
    pool.occupy(((1, 0b0011),))  # another running job, not shrinking
    before = list(pool.masks)

    def job(index, count_index=None, blocks=None, admitted=None):
        alloc = None if blocks is None else types.SimpleNamespace(type_index=0, count_index=count_index, blocks=blocks)
        return types.SimpleNamespace(index=index, alloc=alloc, policy_state={} if admitted is None else {"admitted": admitted})

    r, a, b = job(0, 2, ((0, 0b1111),)), job(1, admitted=True), job(2, admitted=False)
    target = {r.index: 0, a.index: 2, b.index: 1}
    assert ElasticFlowPolicy._shrinks_place_more(sim, pool, [r], [a, b], target)
    assert list(pool.masks) == before
    b.policy_state["admitted"] = True  # two admitted jobs: one placed either way, the shrink buys nothing
    assert not ElasticFlowPolicy._shrinks_place_more(sim, pool, [r], [a, b], target)
    assert list(pool.masks) == before


def test_elasticflow_launches_admitted_jobs_before_best_effort_ones_when_blocks_are_scarce():
    """ElasticFlow gives admitted jobs their shares first (by deadline), then best-effort ones; the launches
    follow that order, so a best-effort job that arrived earlier does not take the one aligned block an admitted
    job's share was given (three 2-GPU nodes; after the short jobs end only node A has two GPUs together)."""
    spec = cluster([("a100", 3, 2)])
    table = hand_table({("gpt__1.3B", "a100"): {"dp": {1: 256.0}, "ap": {1: 256.0}},  # 1 iteration/s, 1 GPU only
                        ("moe__2.4B", "a100"): {"dp": {2: 256.0}, "ap": {2: 256.0}}})  # 2 GPUs only
    ones = [job(f"r{i}", "gpt__1.3B", iters, 1, "a100", row=i)  # placed in order: r1 r2 on A, r3 r4 on B, r5 r6 on C
            for i, iters in enumerate((1000, 1000, 100, 100_000, 100, 100_000), start=1)]
    late = job("best-effort", "moe__2.4B", 5000, 2, "a100", submit=200.0, deadline=None, row=7)  # no deadline
    admitted = job("admitted", "moe__2.4B", 5000, 2, "a100", submit=250.0, deadline=1e6, row=8)
    res = simulate(ones + [late, admitted], table, spec, "elasticflow")
    launches = _launch_times(res)
    assert launches["admitted"] < launches["best-effort"]
    assert 1000.0 <= launches["admitted"] <= 1200.0


def test_arena_without_count_scaling_never_halves_a_running_job():
    """The §5.6 "w/o elastic" ablation (--no-elastic): a queued job that does not fit waits; the launch handler
    does not halve the running job for it (which the in-flight handler would then grow back)."""
    spec = cluster([("a100", 1, 4)])
    jobs = [job("holder", "gpt__1.3B", 20000, 4, "a100", submit=0.0, row=1),
            job("late", "gpt__1.3B", 2000, 2, "a100", submit=1000.0, row=2)]

    def holder_allocations(**opts) -> list[tuple[str, int]]:
        res = simulate(jobs, TABLE, spec, "arena", view="ap", **opts)
        d = res.decisions
        return [(a, n) for j, a, n in zip(d["job_index"], d["action"], d["num_gpus"])
                if res.jobs[j].spec.job_id == "holder" and a != "finish"]

    assert ("rescale", 2) in holder_allocations()  # by default the holder is halved for the late job
    assert holder_allocations(elastic=False) == [("launch", 4)]


def test_job_records_give_the_queue_each_job_was_submitted_to():
    """The records' priority is the queue at submission (clamped to the P queues, as the simulator uses it), not
    the queue Arena's promotions left the job in, so every policy's records agree on it."""
    spec = cluster([("a100", 1, 4)])
    jobs = [job("holder", "gpt__1.3B", 40000, 4, "a100", submit=0.0, row=1, priority=1),
            job("waits", "gpt__1.3B", 1000, 4, "a100", submit=10.0, row=2, priority=3),
            job("beyond", "gpt__1.3B", 1000, 4, "a100", submit=20.0, row=3, priority=7)]
    arena = simulate(jobs, TABLE, spec, "arena", view="ap", elastic=False)  # the late jobs wait for the holder
    fcfs = simulate(jobs, TABLE, spec, "fcfs")
    assert arena.jobs[1].priority == 1  # promoted twice while it waited
    for res in (arena, fcfs):
        assert job_records(res).column("priority").to_pylist() == [1, 3, 3], res.policy


def test_a_run_starts_at_its_first_submission_or_earlier_where_told():
    """--start puts the window and the tick grid where runs of a larger trace had them (a sub-trace without that
    trace's first job compared with its runs); a start after the first submission is refused."""
    from libarena.schedule.api import make_policy, run_policy
    from libarena.schedule.config import SimulatorConfig
    from tests.schedule.helpers import workload

    spec = cluster([("a100", 1, 4)])
    jobs = [job("a", "gpt__1.3B", 1000, 4, "a100", submit=1000.0, row=1),
            job("b", "gpt__1.3B", 1000, 4, "a100", submit=1100.0, row=2)]

    def run(**config):
        return run_policy(workload(jobs, TABLE, spec), make_policy("fcfs"),
                          SimulatorConfig(tick_s=300.0, overheads=NO_OVERHEADS, **config))

    default, earlier = run(), run(start_s=0.0)
    assert default.start_time == 1000.0 and _launch_times(default)["a"] == 1000.0  # a tick at the first submission
    assert earlier.start_time == 0.0 and _launch_times(earlier)["a"] == 1200.0  # the grid of multiples of 300 s
    with pytest.raises(ArenaError, match=r"--start 1001 s is after the trace's first submission \(1000 s\)"):
        run(start_s=1001.0)
    # a window that no job arrives in would report every metric as 0 (an average JCT of 0 h): refused
    with pytest.raises(ArenaError, match=r"no job is submitted within the simulated window \(--start 0 s, --horizon "
                                         r"600 s; the first submission is at 1000 s\)"):
        run(start_s=0.0, horizon_s=600.0)
    assert run(start_s=0.0, horizon_s=1000.0).start_time == 0.0  # one arriving at the window's end is in it
    # a window in which jobs arrive but none finishes has no average JCT of finished jobs: null, not 0 h
    from libarena.schedule.metrics import summarize

    short = summarize(run(horizon_s=60.0))
    assert short["finished_jobs"] == 0 and short["submitted_jobs"] >= 1 and math.isnan(short["avg_jct_finished_s"])
    from libarena.schedule.api import run_parameters  # what the outputs' provenance records

    assert run_parameters(make_policy("fcfs"), SimulatorConfig(start_s=0.0))["start_s"] == 0.0


def test_a_job_arriving_in_a_lower_queue_sets_arenas_next_promotion_and_a_withdrawal_leaves_it():
    """Arena's rounds run for a promotion only when one is due (``needs_schedule``): a job that arrives in queue
    3 brings the next promotion to its own due time at once; withdrawing a queued job only forgets it."""
    from libarena.schedule.api import make_policy
    from libarena.schedule.config import SimulatorConfig
    from libarena.schedule.simulator import Simulator
    from tests.schedule.helpers import workload

    spec = cluster([("a100", 1, 4)])
    jobs = [job("low", "gpt__1.3B", 1000, 4, "a100", priority=3), job("top", "gpt__1.3B", 1000, 4, "a100", row=2)]
    w = workload(jobs, TABLE, spec)
    policy = make_policy("arena", view="ap", promotion_time_s=600.0)
    sim = Simulator(w.jobs, w.perf, w.cluster, policy, SimulatorConfig(overheads=NO_OVERHEADS))
    low, top = sim.jobs
    low.queue_since = top.queue_since = 100.0
    policy.on_arrival(top)
    assert policy.next_promotion == float("inf")  # queue 1: never promoted
    policy.on_arrival(low)
    assert policy.next_promotion == 700.0
    policy.withdraw(top)
    assert policy.queue == [low] and policy.next_promotion == 700.0


def test_a_window_of_exactly_max_ticks_ticks_runs_and_one_more_is_refused_before_it_starts():
    """Ticks fall at the run's start and every tick_s up to the horizon: a 2,700 s window of 300 s ticks has 10.
    With --max-ticks 10 it runs to its horizon (before, its last tick raised the limit's error); a 3,000 s
    window has 11 and is refused up front (before, it passed that check and failed at its end)."""
    from libarena.schedule.api import make_policy, run_policy
    from libarena.schedule.config import SimulatorConfig
    from tests.schedule.helpers import workload

    spec = cluster([("a100", 1, 8)])
    table = hand_table({("gpt__1.3B", "a100"): {v: {8: 8.0} for v in ("ap", "arena", "dp")}})
    w = workload([job("long", "gpt__1.3B", 100_000, 8, "a100")], table, spec)

    def config(horizon: float) -> SimulatorConfig:
        return SimulatorConfig(tick_s=300.0, horizon_s=horizon, max_ticks=10, overheads=NO_OVERHEADS)

    res = run_policy(w, make_policy("fcfs"), config(2700.0))
    assert res.stopped_by == "horizon" and len(res.ts_time) == 10 and res.end_time == 2700.0
    with pytest.raises(ArenaError, match="needs at least 11 scheduling ticks"):
        run_policy(w, make_policy("fcfs"), config(3000.0))


def test_a_run_whose_last_arrival_is_never_placeable_ends_at_that_arrival():
    """The last job arrives at 200 s and fits no configuration of the cluster; the other ended at 100 s. The run
    ends at 200 s, as it ends at a last completion, not at the next tick (300 s)."""
    import dataclasses

    from libarena.schedule.metrics import summarize

    spec = cluster([("a100", 1, 8)])
    table = hand_table({("gpt__1.3B", "a100"): {v: {1: 256.0} for v in ("ap", "arena", "dp")},
                        ("gpt__2.6B", "a100"): {v: {16: 256.0} for v in ("ap", "arena", "dp")}})  # 16 GPUs only
    never = dataclasses.replace(job("never", "gpt__1.3B", 1, 1, "a100", row=2), model="gpt__2.6B", submit_time=200.0)
    res = simulate([job("ok", "gpt__1.3B", 100, 1, "a100", submit=0.0, row=1), never], table, spec, "fcfs",
                   overheads=NO_OVERHEADS)
    assert [bool(j.unschedulable) for j in res.jobs] == [False, True]
    assert res.end_time == 200.0 and summarize(res)["makespan_s"] == 200.0


def test_elasticflow_admits_a_job_that_meets_its_deadline_by_starting_when_another_ends():
    """8 GPUs, three jobs of 3,200 s on 4 GPUs each (their only count), due in a day. The first two take all the
    GPUs; the third cannot start now but meets its deadline once one ends. ElasticFlow's admission plans over
    time (the artifact's time slots), so it admits the third job and runs it then; before, admission asked
    whether its share fitted now and dropped it."""
    spec = cluster([("a100", 2, 4)])
    table = hand_table({("gpt__1.3B", "a100"): {v: {4: 8.0} for v in ("ap", "arena", "dp")}})
    jobs = [job(f"j{i}", "gpt__1.3B", 100, 4, "a100", submit=10.0 * i, deadline=86400.0, row=i + 1) for i in range(3)]
    for policy in ("elasticflow", "elasticflow-ls"):
        res = simulate(jobs, table, spec, policy, overheads=NO_OVERHEADS)
        rec = job_records(res).to_pydict()
        assert rec["status"] == ["finished"] * 3 and all(rec["met_deadline"]), policy
        assert all(j.policy_state["admitted"] for j in res.jobs), policy  # not run as best effort
        assert max(rec["finish_time_s"]) == pytest.approx(6400.0, abs=300.0)


def test_elasticflow_refuses_a_job_whose_deadline_falls_before_the_gpus_it_waits_for_are_free():
    """As above, but the third job is due 5,000 s after it arrives: it would finish at 6,400 s at the earliest
    (planned after one of the first two ends, 3,200 s, with nothing faster on 8 GPUs free only then), so
    ElasticFlow drops it and ElasticFlow-LS (every deadline 10^9 s after submission, the artifact's
    elasticflow-l) admits it."""
    spec = cluster([("a100", 2, 4)])
    table = hand_table({("gpt__1.3B", "a100"): {v: {4: 8.0} for v in ("ap", "arena", "dp")}})
    jobs = [job(f"j{i}", "gpt__1.3B", 100, 4, "a100", submit=10.0 * i, deadline=86400.0, row=i + 1) for i in range(2)]
    jobs.append(job("j2", "gpt__1.3B", 100, 4, "a100", submit=20.0, deadline=5020.0, row=3))
    ef = job_records(simulate(jobs, table, spec, "elasticflow", overheads=NO_OVERHEADS)).to_pydict()
    assert ef["status"] == ["finished", "finished", "dropped"]
    res = simulate(jobs, table, spec, "elasticflow-ls", overheads=NO_OVERHEADS)
    ls = job_records(res).to_pydict()
    assert ls["status"] == ["finished"] * 3 and ls["finish_time_s"][2] == pytest.approx(6400.0, abs=300.0)
    assert res.jobs[2].policy_state["admitted"]  # admitted on its loosened deadline, not run as best effort
    # the trace's deadlines are not read: a job without one is admitted too (the artifact gives every job one)
    undated = [job(f"u{i}", "gpt__1.3B", 100, 4, "a100", submit=10.0 * i, row=i + 1) for i in range(3)]
    res = simulate(undated, table, spec, "elasticflow-ls", overheads=NO_OVERHEADS)
    assert all(j.policy_state["admitted"] for j in res.jobs)
    assert all(j.policy_state["admitted"] is False for j in simulate(undated, table, spec, "elasticflow",
                                                                     overheads=NO_OVERHEADS).jobs)


def test_elasticflow_runs_jobs_without_a_deadline_as_best_effort():
    """A job without a deadline has none to miss: ElasticFlow never drops it, and it holds no admitted share, so
    a job with a deadline that arrives after it is admitted on GPUs it would otherwise have counted as taken.
    Before, such a job was admitted with its smallest share and dropped when that did not fit (free2), and
    admitted shares of deadline-free jobs made the deadline job look infeasible (ddl)."""
    spec = cluster([("a100", 2, 4)])
    table = hand_table({("gpt__1.3B", "a100"): {v: {4: 4.0, 8: 8.0} for v in ("ap", "arena", "dp")}})
    free = [job(f"free{i}", "gpt__1.3B", 100, 4, "a100", submit=0.0, row=i + 1) for i in range(3)]
    rec = job_records(simulate(free, table, spec, "elasticflow", overheads=NO_OVERHEADS)).to_pydict()
    assert rec["status"] == ["finished"] * 3
    mixed = [job("free", "gpt__1.3B", 100, 8, "a100", submit=0.0, row=1),
             job("free-b", "gpt__1.3B", 100, 4, "a100", submit=0.0, row=2),
             job("ddl", "gpt__1.3B", 100, 4, "a100", submit=10.0, deadline=86400.0, row=3)]
    rec = job_records(simulate(mixed, table, spec, "elasticflow", overheads=NO_OVERHEADS)).to_pydict()
    assert rec["status"] == ["finished"] * 3 and rec["met_deadline"][2]
    # what running best-effort jobs hold is not free: a job due before either ends (6,400 s) cannot be admitted
    tight = [*mixed[:2], job("ddl", "gpt__1.3B", 50, 4, "a100", submit=10.0, deadline=5010.0, row=3)]
    rec = job_records(simulate(tight, table, spec, "elasticflow", overheads=NO_OVERHEADS)).to_pydict()
    assert rec["status"] == ["finished", "finished", "dropped"]


def test_a_run_that_ends_by_completion_within_exactly_max_ticks_ticks_runs():
    """A job of 2,750 s alone on a 300 s tick needs the ticks at 0, 300, ..., 2,700 s: 10. With --max-ticks 10 it
    finishes, with or without a horizon far beyond it (before, its tenth tick raised the limit's error); with
    9 it is refused up front."""
    from libarena.schedule.api import make_policy, run_policy
    from libarena.schedule.config import SimulatorConfig
    from tests.schedule.helpers import workload

    spec = cluster([("a100", 1, 8)])
    table = hand_table({("gpt__1.3B", "a100"): {v: {8: 256.0} for v in ("ap", "arena", "dp")}})  # 1 iteration/s
    w = workload([job("j", "gpt__1.3B", 2750, 8, "a100")], table, spec)
    for horizon in (None, 1e6):
        res = run_policy(w, make_policy("fcfs"), SimulatorConfig(tick_s=300.0, horizon_s=horizon, max_ticks=10,
                                                                 overheads=NO_OVERHEADS))
        assert res.jobs[0].finish_time == 2750.0 and len(res.ts_time) == 10
    with pytest.raises(ArenaError, match="needs at least 10 scheduling ticks"):
        run_policy(w, make_policy("fcfs"), SimulatorConfig(tick_s=300.0, max_ticks=9, overheads=NO_OVERHEADS))


def test_sia_values_a_config_by_its_normalised_goodput_which_counts_the_fewest_gpus_a_job_needs():
    """Sia's goodput of a config is N_min x its throughput / the throughput of the job's smallest config (its
    paper's normalisation, also the Arena artifact's): a job that needs 4 GPUs at least is worth sqrt(4) on them,
    more than a 1-GPU job scaling to 4 GPUs at 3x (sqrt(3)); without N_min (as before) 1 against sqrt(3), and
    the small job took the GPUs."""
    spec = cluster([("a100", 1, 4)])
    table = hand_table({("gpt__1.3B", "a100"): {"dp": {1: 256.0, 2: 460.8, 4: 768.0}, "ap": {1: 256.0, 2: 460.8, 4: 768.0}},
                        ("moe__2.4B", "a100"): {"dp": {4: 256.0}, "ap": {4: 256.0}}})
    jobs = [job("small", "gpt__1.3B", 2000, 1, "a100", row=1), job("big", "moe__2.4B", 2000, 4, "a100", row=2)]
    res = simulate(jobs, table, spec, "sia", view="dp")
    d = res.decisions
    first = [(res.jobs[j].spec.job_id, a, n) for t, j, a, n in zip(d["time"], d["job_index"], d["action"], d["num_gpus"])
             if t == 0.0]
    assert first == [("big", "launch", 4)]


def test_gavel_maximises_the_sum_of_throughputs_as_its_max_sum_throughput_policy():
    """Gavel's objective (max_sum_throughput.py, and the Arena artifact's Gavel) is the sum of the jobs' raw
    throughputs: "y" (1,000 samples/s on A100s, 600 on V100s) gets the A100s, "x" (100 / 50) the V100s, 1,050 in all
    against 700. Before, each throughput was divided by the job's best, and x (0.5 of its best on V100s against
    y's 0.6) got the A100s."""
    spec = cluster([("a100", 1, 2), ("v100", 1, 2)])
    rates = {("gpt__1.3B", "a100"): 100.0, ("gpt__1.3B", "v100"): 50.0,
             ("moe__2.4B", "a100"): 1000.0, ("moe__2.4B", "v100"): 600.0}
    table = hand_table({key: {view: {2: rate} for view in ("dp", "ap")} for key, rate in rates.items()})
    jobs = [job("x", "gpt__1.3B", 2000, 2, "a100", row=1), job("y", "moe__2.4B", 2000, 2, "a100", row=2)]
    res = simulate(jobs, table, spec, "gavel")
    d = res.decisions
    placed = {res.jobs[j].spec.job_id: g for t, j, a, g in zip(d["time"], d["job_index"], d["action"], d["gpu_type"])
              if t == 0.0 and a == "launch"}
    assert placed == {"x": "v100", "y": "a100"}
