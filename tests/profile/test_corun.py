"""Co-run profiling: stages timed in a process laid out as the plan's host devices, alone and all busy, and
the 1F1B composition that uses the two times."""

from __future__ import annotations

import pytest

from libarena.errors import ArenaError
from libarena.profile.pipeline import StageTimes, one_f_one_b


def test_a_multi_worker_stage_runs_at_its_all_busy_time():
    dp = [StageTimes(0.010, workers=2, alone_s=0.007, together_s=0.016)]
    est = one_f_one_b(dp, 3, host_cores=2)
    assert est.first_microbatch_s == pytest.approx(0.016)
    assert est.steady_state_s == pytest.approx(2 * 0.016)



def test_a_stage_timed_as_one_spmd_executable_keeps_its_update_time_whatever_the_hosts_cores():
    """The update of a stage timed as the runtime's SPMD executable over both devices already holds what the
    devices cost each other: a host measured with one core's worth for two devices (a busy host) must not slow
    it again (it read twice its time), while a stage timed per worker still is."""
    spmd = StageTimes(0.010, optimizer_s=0.004, workers=2, alone_s=0.012, together_s=0.012, timed_as_spmd=True)
    assert one_f_one_b([spmd], 3, host_cores=1.0).optimizer_s == pytest.approx(0.004)
    assert one_f_one_b([spmd], 3, host_cores=2.0).optimizer_s == pytest.approx(0.004)
    per_worker = StageTimes(0.010, optimizer_s=0.004, workers=2, alone_s=0.012, together_s=0.012)
    assert one_f_one_b([per_worker], 3, host_cores=1.0).optimizer_s == pytest.approx(0.008)

def test_pipeline_period_interpolates_between_alone_and_all_busy():
    # the bottleneck (together 0.08) works alone while its short partner (together 0.02) idles
    stages = [StageTimes(0.019, p2p_s=0.001, alone_s=0.015, together_s=0.020),
              StageTimes(0.077, p2p_s=0.001, alone_s=0.055, together_s=0.080)]
    est = one_f_one_b(stages, 5, host_cores=2)
    period = 0.020 + 0.055 * (1 - 0.020 / 0.080)
    assert est.bottleneck_stage == 1
    # on a host the bottleneck also takes its hand-offs: it sends 0.001 and receives as much per micro-batch
    assert est.steady_state_s == pytest.approx(4 * (period + 2 * 0.001))
    assert est.handoff_s == pytest.approx(4 * 2 * 0.001)
    assert est.first_microbatch_s == pytest.approx(0.015 + 0.001 + 0.055 + 0.001)  # one stage busy at a time
    assert 0.055 < period < 0.080
    # equal stages always overlap: the all-busy time; without a partner: the alone time
    equal = [StageTimes(0.05, alone_s=0.04, together_s=0.06)] * 2
    assert one_f_one_b(equal, 3).steady_state_s == pytest.approx(2 * 0.06)
    lone = [StageTimes(0.05, alone_s=0.04, together_s=0.06)]
    assert one_f_one_b(lone, 3).steady_state_s == pytest.approx(2 * 0.04)


def test_a_hosts_pipeline_hand_offs_are_not_overlapped_but_a_gpus_are():
    """Between host devices a hand-off is a copy the shared cores make and the receiving call waits for
    (bench/results/handoff.json); between GPUs a copy engine moves it while the stages compute."""
    gpus = [StageTimes(0.019, p2p_s=0.002), StageTimes(0.077, p2p_s=0.002)]
    separate = one_f_one_b(gpus, 5)
    assert separate.steady_state_s == pytest.approx(4 * 0.077) and separate.handoff_s == 0.0
    # the same stages on a host, by each host model: the bottleneck's sends and receives (2 x 0.002) per
    # micro-batch after the first, on top of what the same model gives without hand-offs
    quiet = [StageTimes(0.019), StageTimes(0.077)]
    for model in ({"host_cores": 2}, {"slowdown": lambda k: 1.2}):
        shared, without = one_f_one_b(gpus, 5, **model), one_f_one_b(quiet, 5, **model)
        assert shared.handoff_s == pytest.approx(4 * 2 * 0.002)
        assert shared.steady_state_s == pytest.approx(without.steady_state_s + 4 * 2 * 0.002)
    corun = [StageTimes(0.019, p2p_s=0.002, alone_s=0.015, together_s=0.020), StageTimes(0.077, p2p_s=0.002, alone_s=0.055, together_s=0.080)]
    assert one_f_one_b(corun, 5).handoff_s == pytest.approx(4 * 2 * 0.002)
    # the first micro-batch already waits for every send on its way: unchanged
    assert one_f_one_b(corun, 1).handoff_s == 0.0
    # one stage hands nothing off
    assert one_f_one_b([StageTimes(0.05, alone_s=0.04, together_s=0.06)], 3).handoff_s == 0.0


def test_the_dispatching_thread_keeps_the_bottlenecks_partner_core_busy():
    # the runtime's one thread issues every stage's calls and the sends beside the bottleneck; what it issued
    # while the bottleneck was timed (its own calls, 0.006 s) is in the bottleneck's times already: once alone,
    # and in the all-busy time (issued for the partner device too) over the part of the period overlapped
    stages = [StageTimes(0.019, alone_s=0.015, together_s=0.020, dispatch_s=0.004, send_dispatch_s=0.001),
              StageTimes(0.077, alone_s=0.055, together_s=0.080, dispatch_s=0.009, send_dispatch_s=0.001,
                         timed_dispatch_s=0.006)]
    est = one_f_one_b(stages, 5, host_cores=2)
    overlapped = 0.020 + (0.004 + 0.001 + 0.009 + 0.001 - 0.006 * (1 + 0.020 / 0.080))
    assert est.steady_state_s == pytest.approx(4 * (overlapped + 0.055 * (1 - overlapped / 0.080)))
    quiet = [StageTimes(0.019, alone_s=0.015, together_s=0.020), StageTimes(0.077, alone_s=0.055, together_s=0.080)]
    assert est.steady_state_s > one_f_one_b(quiet, 5, host_cores=2).steady_state_s
    # never longer than the bottleneck overlapped the whole period
    busy = [StageTimes(0.019, alone_s=0.015, together_s=0.020, dispatch_s=0.2), stages[1]]
    assert one_f_one_b(busy, 5, host_cores=2).steady_state_s == pytest.approx(4 * 0.080)
    # without a record of what was issued beside it, its own calls stand in; never less than no dispatch at all
    untracked = [stages[0], StageTimes(0.077, alone_s=0.055, together_s=0.080, dispatch_s=0.009, send_dispatch_s=0.001)]
    overlapped = 0.020 + (0.004 + 0.001 + 0.009 + 0.001 - 0.009 * (1 + 0.020 / 0.080))
    assert one_f_one_b(untracked, 5, host_cores=2).steady_state_s == pytest.approx(4 * (overlapped + 0.055 * (1 - overlapped / 0.080)))
    cheap = [stages[0], StageTimes(0.077, alone_s=0.055, together_s=0.080, timed_dispatch_s=0.5)]
    assert one_f_one_b(cheap, 5, host_cores=2).steady_state_s == pytest.approx(one_f_one_b(quiet, 5, host_cores=2).steady_state_s)
    # one stage: nothing beside it (its own calls are in its times); the sends count in the dispatch bound
    lone = [StageTimes(0.05, alone_s=0.04, together_s=0.06, dispatch_s=0.01)]
    assert one_f_one_b(lone, 3).steady_state_s == pytest.approx(2 * 0.04)
    assert est.dispatch_s == pytest.approx(5 * (0.004 + 0.001 + 0.009 + 0.001))


def test_issuing_the_bottlenecks_timings_already_held_is_not_counted_again():
    # the all-busy timing's thread issued the bottleneck on every device; a step that issues no more than the
    # timings held (its calls alone, and its partner's copy over the overlapped part) adds nothing beside it
    quiet = [StageTimes(0.019, alone_s=0.015, together_s=0.020), StageTimes(0.077, alone_s=0.055, together_s=0.080)]
    held = 0.006 * (1 + 0.020 / 0.080)
    matched = [StageTimes(0.019, alone_s=0.015, together_s=0.020, dispatch_s=held / 2),
               StageTimes(0.077, alone_s=0.055, together_s=0.080, dispatch_s=held / 2, timed_dispatch_s=0.006)]
    assert one_f_one_b(matched, 5, host_cores=2).steady_state_s == pytest.approx(one_f_one_b(quiet, 5, host_cores=2).steady_state_s)
    more = [matched[0], StageTimes(0.077, alone_s=0.055, together_s=0.080, dispatch_s=held / 2 + 0.002, timed_dispatch_s=0.006)]
    overlapped = 0.020 + 0.002
    assert one_f_one_b(more, 5, host_cores=2).steady_state_s == pytest.approx(4 * (overlapped + 0.055 * (1 - overlapped / 0.080)))
    # three devices (a two-worker stage beside it): its all-busy timing ran it on all three, two partners
    wide = [StageTimes(0.019, workers=2, alone_s=0.020, together_s=0.020, dispatch_s=0.010),
            StageTimes(0.077, alone_s=0.055, together_s=0.080, dispatch_s=0.005, timed_dispatch_s=0.004)]
    overlapped = 0.020 + (0.015 - 0.004 * (1 + 2 * 0.020 / 0.080))
    assert one_f_one_b(wide, 5, host_cores=3).steady_state_s == pytest.approx(4 * (overlapped + 0.055 * (1 - overlapped / 0.080)))


def test_stages_without_corun_times_keep_the_cpu_time_model():
    plain = [StageTimes(0.010, workers=2, cores=1.0)]
    mixed = [StageTimes(0.010, workers=1, cores=1.0), StageTimes(0.010, workers=1, alone_s=0.001, together_s=0.001)]
    assert one_f_one_b(plain, 2, host_cores=2).iter_time_s == pytest.approx(0.020)
    # all stages or none: a partly co-run pipeline is composed from the one-device times
    assert one_f_one_b(mixed, 2, host_cores=2).iter_time_s == pytest.approx(one_f_one_b(
        [StageTimes(0.010), StageTimes(0.010)], 2, host_cores=2).iter_time_s)


@pytest.mark.multidevice
def test_corun_session_times_a_real_stage_alone_and_all_busy():
    from libarena.profile.corun import CoRunSession
    from libarena.profile.host import XLA_THREADING
    from libarena.profile.stage import StageSpec

    spec = StageSpec("gpt__tiny", 0, 3, 2)
    with CoRunSession(2, XLA_THREADING.get("eigen-single"), burst=2) as session:
        with pytest.raises(ArenaError, match="no co-run samples"):
            session.build(spec)
            session.timing(spec, "median")
        session.time(spec, 1, 3)
        session.time(spec, 0, 2)  # chunks pool into one record
        timing = session.timing(spec, "q1")
        assert timing.num_devices == 2
        assert len(timing.alone_samples_s) == len(timing.together_samples_s) == 5
        # one time call's samples alone, in order
        first, second = session.timing(spec, "q1", 0), session.timing(spec, "q1", 1)
        assert first.alone_samples_s + second.alone_samples_s == timing.alone_samples_s
        assert len(second.together_samples_s) == 2 and second.runtime_dispatch_s > 0
        with pytest.raises(ArenaError, match="no co-run chunk 2"):
            session.timing(spec, "q1", 2)
        assert 0 < timing.alone_s <= max(timing.alone_samples_s) and timing.together_s > 0
        # two devices computing at once on the host's cores never finish sooner than one alone, give or take noise:
        # the samples are interleaved, so each pair shares the host's moment (a model that divided the stage's time
        # by the devices would read about 0.5)
        import statistics

        pairs = zip(timing.alone_samples_s, timing.together_samples_s, strict=True)
        assert statistics.median(t / a for a, t in pairs) > 0.6
        assert timing.device_s > 0
        # also issued as the runtime issues it: its calls and its one send (the first stage sends its output on)
        assert 0 < timing.runtime_dispatch_s < max(timing.alone_samples_s)
        assert 0 < timing.alone_dispatch_s < max(timing.alone_samples_s)
        assert 0 < timing.send_dispatch_s < timing.runtime_dispatch_s
        session.release(spec)
        middle = StageSpec("gpt__tiny", 1, 3, 2)  # sends its output on and its input gradient back
        session.time(middle, 1, 3)
        assert session.timing(middle, "q1").send_dispatch_s > 0
        tensor = StageSpec("gpt__tiny", 0, 3, 2, tp=2)  # a worker's shard: not the runtime's stage on one device
        session.time(tensor, 0, 2)
        assert session.timing(tensor, "q1").runtime_dispatch_s is None
        with pytest.raises(ArenaError, match="co-run profiling failed"):
            session.ask({"op": "nonsense"})
    assert session._proc.poll() == 0


@pytest.mark.multidevice
def test_corun_session_times_a_whole_grid_stage_as_the_runtimes_spmd_executable():
    from libarena.profile.corun import CoRunSession, SpmdStage, update_in_step
    from libarena.profile.host import XLA_THREADING

    data_parallel = SpmdStage("gpt__tiny", 0, 6, dp=2, tp=1, microbatch=4, step_microbatches=3)
    tensor_parallel_tail = SpmdStage("gpt__tiny", 2, 6, dp=1, tp=2, microbatch=4, remat=True, step_microbatches=1)
    with CoRunSession(2, XLA_THREADING.get("eigen-single"), burst=2) as session:
        for item in (data_parallel, tensor_parallel_tail):
            session.time(item, 1, 3)
            timing = session.timing(item, "q1")
            assert timing.spmd and timing.num_devices == 2
            # its own devices are all busy: one time for both phases
            assert timing.alone_s == timing.together_s > 0
            assert len(timing.alone_samples_s) == 3
            assert timing.update_s > 0 and timing.input_put_s > 0 and timing.update_alone_s > 0
            # the update as the step runs it: right behind the step's micro-batches (its count, not the burst's)
            regions = session._chunks[item][0][0]  # its one time call's samples per region
            assert len(regions["microbatches_update"]) == 3
            assert timing.update_s == update_in_step(tuple(regions["microbatch"]), tuple(regions["microbatches_update"]),
                                                     item.step_microbatches, "q1", timing.update_alone_s)
            session.release(item)
        with pytest.raises(ArenaError, match="needs 4 devices, the child has 2"):
            session.time(SpmdStage("gpt__tiny", 0, 6, dp=4, tp=1, microbatch=4), 0, 1)


def test_the_spmd_update_is_what_it_adds_behind_the_micro_batches():
    from libarena.profile.corun import update_in_step
    from libarena.profile.timers import lower_quartile

    microbatch = (0.010, 0.012, 0.011, 0.020, 0.011)  # per micro-batch, from bursts of 4
    behind = (0.046, 0.055, 0.050, 0.090, 0.049)  # 4 micro-batches and the update, issued back to back
    # the region's statistic less 4 micro-batches at theirs (medians: 50 - 44 ms), not the update timed on its own
    assert update_in_step(microbatch, behind, 4, "median", 0.003) == pytest.approx(0.006)
    # composed again with the micro-batches, the update gives the region's own statistic
    q1 = update_in_step(microbatch, behind, 4, "q1", 0.003)
    assert 4 * lower_quartile(microbatch) + q1 == pytest.approx(lower_quartile(behind)) and q1 > 0.003
    # noise that swamps the difference, or nothing timed behind: the update timed on its own stands in
    assert update_in_step(microbatch, (0.040, 0.045, 0.044, 0.080, 0.041), 4, "median", 0.003) == 0.003
    assert update_in_step(microbatch, (), 4, "q1", 0.003) == 0.003


def test_only_stages_that_hold_the_whole_grid_are_timed_as_spmd():
    from libarena.plan import Grid, make_plan
    from libarena.profile.corun import SpmdStage
    from libarena.profile.profiler import corun_item
    from libarena.profile.stage import StageSpec

    spec = StageSpec("gpt__tiny", 0, 6, 4)
    whole = make_plan(Grid("gpt__tiny", 16, "cpu", 2, 1, 2, 1), [0], [2], [2], [1], None, num_microbatches=2, num_clusters=2)
    item = corun_item(whole, 0, spec)
    assert isinstance(item, SpmdStage)
    assert (item.dp, item.tp, item.microbatch, item.start, item.stop, item.step_microbatches) == (2, 1, 8, 0, 6, 2)
    # single-worker pipeline stages keep the per-worker alone / all-busy timing
    pipeline = make_plan(Grid("gpt__tiny", 16, "cpu", 2, 1, 2, 2), [0, 1], [1, 1], [1, 1], [1, 1], None,
                         num_microbatches=2, num_clusters=2)
    assert corun_item(pipeline, 0, spec) is spec
    # a one-device plan's one stage holds its whole grid: the runtime's stage on that device
    single = make_plan(Grid("gpt__tiny", 16, "cpu", 1, 1, 1, 1), [0], [1], [1], [1], None, num_microbatches=4, num_clusters=2)
    item = corun_item(single, 0, spec)
    assert isinstance(item, SpmdStage) and (item.dp, item.tp, item.microbatch, item.step_microbatches) == (1, 1, 4, 4)


@pytest.fixture(scope="module")
def two_device_profile(tmp_path_factory):
    """gpt__tiny's two-stage pipelines, its data-parallel 2-device plan and its 1-device plans, profiled with
    co-run timings: (plans path, plan set, config, result, log messages, progress updates)."""
    from libarena.plan import read_plans
    from libarena.profile import ProfileConfig, profile_plans
    from libarena.profile.local_plans import enumerate_grid_plans, model_clusters, write_plans_table

    tmp_path = tmp_path_factory.mktemp("two-device")
    two_device = enumerate_grid_plans("gpt__tiny", 8, 2, "cpu", 2)
    rows = [p for p in two_device if p.pipeline_degree == 2]
    rows += [next(p for p in two_device if p.pipeline_degree == 1 and p.stages[0].dp == 2)]
    rows += enumerate_grid_plans("gpt__tiny", 8, 1, "cpu", 2)
    path = tmp_path / "plans.parquet"
    write_plans_table(str(path), "gpt__tiny", 8, rows, model_clusters("gpt__tiny", 8, num_clusters=2))
    planset = read_plans(path, require_costs=False)
    from tests.profile.test_profile import _cpu_comm

    # every plan, not only each allocation's proxy: the pipeline is no allocation's proxy
    config = ProfileConfig(cache_dir=tmp_path / "cache", warmup=1, repeats=3, include_dp=False, xla_threading="eigen-single",
                           selection="exhaustive", handoff_rounds=2, handoff_gate=0.0)
    messages: list[str] = []
    updates: list = []
    result = profile_plans(planset, config, comm=_cpu_comm(), log=messages.append, progress=updates.append)
    assert {e.plan.plan_id for e in result.estimates} == {p.plan_id for p in planset.plans()}
    return path, planset, config, result, messages, updates


@pytest.mark.multidevice
@pytest.mark.slow
def test_profiler_times_two_device_plans_co_run_and_caches_them(two_device_profile):
    from libarena.profile import ProfileConfig, profile_plans
    from tests.profile.test_profile import _cpu_comm

    _, planset, config, result, messages, updates = two_device_profile
    two = [e for e in result.estimates if e.resources.num_gpus == 2]
    one = [e for e in result.estimates if e.resources.num_gpus == 1]
    assert one and {e.plan.pipeline_degree for e in two} == {1, 2}
    for e in two:  # every stage of the 2-device plans was timed in a 2-device process
        assert all(st["alone_s"] > 0 and st["together_s"] > 0 for st in e.stages)
    for e in one:  # the one stage as the runtime runs it on one device: its inputs' placement and update inside
        assert all(st["timed_as_spmd"] and st["workers"] == 1 and st["alone_s"] > 0 and st["optimizer_s"] > 0 and st["setup_s"] > 0
                   for st in e.stages)
    # the data-parallel stage over both devices as the runtime's SPMD executable: collectives and the replicas'
    # gradient reduction inside its timings, none priced on top
    spmd = [st for e in two for st in e.stages if st["timed_as_spmd"]]
    assert len(spmd) == 1 and spmd[0]["workers"] == 2
    assert spmd[0]["comm_s"] == spmd[0]["grad_sync_s"] == 0 and spmd[0]["optimizer_s"] > 0
    assert spmd[0]["compute_s"] == spmd[0]["alone_s"] == spmd[0]["together_s"]
    assert all(not st["timed_as_spmd"] for e in two if e.plan.pipeline_degree == 2 for st in e.stages)
    # one co-run record per distinct (devices, stage, and for a whole-grid stage its step's micro-batch count)
    assert result.summary["host_concurrency"]["co_run_stages"] == len(
        {(e.resources.num_gpus, st["key"], st["timed_as_spmd"] and e.plan.num_microbatches) for e in result.estimates for st in e.stages})
    assert any(m.startswith("co-run gpt__tiny") for m in messages)
    assert sum(e.profiling_cost_device_s for e in two) > 0
    # with the gate at 0 every two-stage plan of one-device stages has its hand-offs measured, each boundary timed
    # (and logged) once
    measured = [e for e in result.estimates if e.iteration.handoff_measured]
    assert measured and result.summary["handoffs_measured"] == len(measured)
    assert {id(e) for e in measured} == {id(e) for e in two if e.plan.pipeline_degree == 2}
    boundaries = len({(e.plan.num_microbatches, e.stages[0]["units"][1], tuple(st["key"] for st in e.stages)) for e in measured})
    assert len([m for m in messages if m.startswith("hand-offs of gpt__tiny")]) == boundaries
    # the progress bar moves once per device count's hand-off child (one here: the 2-device plans)
    handoff_updates = [(u.completed, u.total, u.detail) for u in updates if u.task == "timing two-stage plans' hand-offs"]
    assert handoff_updates == [(0, 1, ""), (1, 1, f"{boundaries} boundaries on 2 devices")]
    # a second run reads the co-run timings from the cache: no child, the same estimates
    again: list[str] = []
    second = profile_plans(planset, config, comm=_cpu_comm(), log=again.append)
    assert not any(m.startswith(("co-run", "hand-offs of")) for m in again)
    assert [e.iter_time_s for e in second.estimates] == [e.iter_time_s for e in result.estimates]
    assert [e.profiling_cost_device_s for e in second.estimates] == [e.profiling_cost_device_s for e in result.estimates]
    assert second.summary["co_run_wall_s"] == {}  # what this run spent co-running: nothing
    # the CPU-time model asked for: no co-run timings
    cpu_time = profile_plans(planset, ProfileConfig(cache_dir=config.cache_dir, warmup=1, repeats=3, include_dp=False, selection="exhaustive",
                                                    concurrency="cpu-time"), comm=_cpu_comm())
    assert all(st["alone_s"] is None for e in cpu_time.estimates for st in e.stages)



@pytest.mark.multidevice
@pytest.mark.slow
def test_a_two_stage_pipelines_estimate_is_the_1f1b_composition_of_its_stage_timings(two_device_profile):
    """Real two-stage plans (not one stage, which cannot show a composition error): the estimate is built from
    the two stages' own co-run timings as the 1F1B model says, and lands near a direct measurement."""
    from libarena.profile.measure import measure_in_subprocess

    path, _, _, result, _, _ = two_device_profile
    pipelines = [e for e in result.estimates if e.plan.pipeline_degree == 2]
    assert pipelines
    for e in pipelines:
        it, rows, B = e.iteration, e.stages, e.plan.num_microbatches
        assert B > 1 and len(rows) == 2 and all(r["workers"] == 1 for r in rows)
        # each stage hands its activation on (or its gradient back) over the comm table's p2p link
        assert all(r["p2p_s"] > 0 and r["alone_s"] > 0 and r["together_s"] > 0 for r in rows)
        # the first micro-batch passes one stage at a time, each alone on the host, in the plan's stage order
        assert it.first_microbatch_s == pytest.approx(sum(r["alone_s"] + r["comm_s"] + r["p2p_s"] for r in rows))
        # B - 1 periods of the bottleneck, each between its alone and all-busy time, plus its hand-offs (the step's
        # measured wait for its producers)
        b = rows[it.bottleneck_stage]
        assert it.handoff_measured and it.handoff_s >= 0  # the fixture's gate is 0: every pipeline's boundary is timed
        period = (it.steady_state_s - it.handoff_s) / (B - 1)
        lo, hi = sorted((b["alone_s"], b["together_s"] + b["comm_s"]))
        assert lo * (1 - 1e-9) <= period <= hi * (1 + 1e-9)
        assert it.bottleneck_stage == max(range(2), key=lambda j: rows[j]["together_s"] + rows[j]["comm_s"])
        assert it.composed_s == pytest.approx(it.setup_s + it.first_microbatch_s + it.steady_state_s + it.grad_sync_s + it.optimizer_s)
        assert it.setup_s == pytest.approx(sum(r["setup_s"] for r in rows)) and it.optimizer_s > 0
        assert e.iter_time_s == pytest.approx(max(it.composed_s, it.dispatch_s))
    # the runtime's step of the first pipeline: a composition that lost micro-batches, a stage or the steady
    # state would be several times off (loose bounds: make test-slow runs two tests at once)
    first = pipelines[0]
    grid = {"model": "gpt__tiny", "global_batch": 8, "gpu_type": "cpu", "num_gpus": 2, "num_nodes": 1}
    (measured,) = measure_in_subprocess(path, [(grid, first.plan.plan_id)], 2, warmup=2, repeats=5)
    assert 1 / 3 < measured["iter_time_s"] / first.iter_time_s < 3

def test_co_run_timings_are_claimed_like_stage_profiles(monkeypatch, tmp_path):
    """Two runs sharing a cache do not co-run the same stage twice: one finding the other timing it waits, says
    so, and takes the other's timing; what nobody else times it times itself. (The child is a stand-in: what is
    tested is the claim around it.)"""
    import threading
    import time

    from libarena.profile import corun
    from libarena.profile.cache import ProfileCache

    timed, sessions = [], []

    class StandInSession:
        def __init__(self, *args):
            sessions.append(args)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def time(self, item, warmup, repeats):
            timed.append(item)

        def timing(self, item, statistic):
            return corun.CoRunTiming(2, 1.0, 1.0)

        def release(self, item):
            pass

    monkeypatch.setattr(corun, "CoRunSession", StandInSession)
    a, b = corun.SpmdStage("gpt__tiny", 0, 1, 2, 1, 4), corun.SpmdStage("gpt__tiny", 1, 2, 2, 1, 4)
    items = {("ka", a): a, ("kb", b): b}
    holder = ProfileCache(tmp_path)

    def while_another_run_times_a(alone_s: float, fresh_child: bool):
        """profile_corun in a thread while the test holds a's claim; the test stores its timing of a, then leaves."""
        key_a = corun.corun_cache_key("ka", 2, "default", a, fresh_child)
        notes: list[str] = []
        result: dict = {}
        with holder.claim(key_a):
            worker = threading.Thread(target=lambda: result.update(out=corun.profile_corun(
                items, 2, None, ProfileCache(tmp_path), warmup=0, repeats=1, statistic="min",
                fresh_child=fresh_child, log=notes.append)))
            worker.start()
            end = time.monotonic() + 30
            while not notes and time.monotonic() < end:
                time.sleep(0.02)
            holder.put(key_a, corun.CoRunTiming(2, alone_s, alone_s).to_dict())
        worker.join(30)
        return result["out"][0], notes

    out, notes = while_another_run_times_a(7.0, fresh_child=False)
    assert notes[0] == ("waiting for another run sharing the cache, which is co-running gpt__tiny units [0, 1) "
                        "dp 2 x tp 1 SPMD on 2 host devices")
    assert timed == [b]
    assert out[("ka", a)].alone_s == 7.0 and out[("kb", b)].alone_s == 1.0
    # each in a child of its own: no child is started for the stage the other run timed while this one waited
    sessions.clear()
    out, _ = while_another_run_times_a(5.0, fresh_child=True)
    assert len(sessions) == 1 and out[("ka", a)].alone_s == 5.0 and out[("kb", b)].alone_s == 1.0
