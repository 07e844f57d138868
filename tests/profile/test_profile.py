"""End-to-end profiling of tiny plans: stage executables, cache reuse across grids, views, estimates,
and the arena-profile CLI (bad input: one line, exit 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from libarena.artifacts import read_table
from libarena.plan import read_plans
from libarena.errors import ArenaError

from tests.profile.stage_costs import check_stage_costs

MODEL = "gpt__tiny"
BATCH = 8


def _cpu_comm():
    from libarena.hardware.comm import MeasuredCommModel

    rows = [
        (p, "cpu", 2, False, float(b), 2e-5 + b / 4e9)
        for p in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "p2p")
        for b in (1e3, 1e5, 1e7)
    ]
    return MeasuredCommModel.from_rows(rows, source_name="test comm table")


@pytest.fixture(scope="module")
def plans_path(tmp_path_factory):
    """One-GPU grids on the local CPU and on an A100 (same stages: the A100 rows reuse the profiles)."""
    from libarena.profile.local_plans import enumerate_grid_plans, model_clusters, write_plans_table

    rows = enumerate_grid_plans(MODEL, BATCH, 1, "cpu", 2) + enumerate_grid_plans(MODEL, BATCH, 1, "a100", 2)
    path = tmp_path_factory.mktemp("plans") / "plans.parquet"
    write_plans_table(str(path), MODEL, BATCH, rows, model_clusters(MODEL, BATCH, num_clusters=2))
    return path


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("profile-cache")


@pytest.fixture(scope="module")
def first_run(plans_path, cache_dir):
    from libarena.profile import ProfileConfig, profile_plans

    config = ProfileConfig(cache_dir=cache_dir, warmup=1, repeats=3, granularity="unit")
    messages: list[str] = []
    result = profile_plans(read_plans(plans_path, require_costs=False), config, comm=_cpu_comm(), log=messages.append)
    result.log_messages = messages
    return result


def test_profile_rows_views_and_timer(first_run):
    rows = first_run.table.to_pylist()
    local = [r for r in rows if r["gpu_type"] == "cpu"]
    assert sorted(r["view"] for r in local) == ["ap", "arena", "dp"]
    for r in local:
        assert r["timer"] == "host" and not r["estimated"] and r["fits_in_memory"]
        assert r["iter_time_s"] > 0 and r["throughput"] == pytest.approx(BATCH / r["iter_time_s"])
    arena = next(r for r in local if r["view"] == "arena")
    assert arena["plan_id"] == "s1-b0-g1-1x1" and arena["profiling_cost_device_s"] > 0
    dp = next(r for r in local if r["view"] == "dp")
    assert dp["plan_id"] == "dp" and dp["pipeline_degree"] == 1
    assert first_run.summary["timer"] == "host"


def test_identical_stages_across_grids_are_profiled_once(first_run):
    s = first_run.summary
    # Unit granularity: 4 plans (proxy and dp, on the cpu and a100 grids) x 6 units. Only 3 units are
    # distinct (embed, the 4 identical blocks, head), at 2 micro-batch sizes (proxy 2, dp 8): 6 profiled.
    assert s["granularity"] == "unit"
    assert s["stages_needed"] == 24 and s["stages_profiled"] == 6 and s["stages_skipped"] == 18
    # ... and only those 6 were compiled (ahead of timing, on threads): identical layers not again.
    compiled = [int(m.split()[1]) for m in first_run.log_messages if m.startswith("compiled ")]
    assert sum(compiled) == 6
    # where the profiling time went, one entry per profiled unit: compiling, timed runs, the rest fixed
    check_stage_costs(s)



def test_other_gpu_types_are_roofline_scaled_estimates(first_run):
    rows = first_run.table.to_pylist()
    a100 = {r["view"]: r for r in rows if r["gpu_type"] == "a100"}
    cpu = {r["view"]: r for r in rows if r["gpu_type"] == "cpu"}
    assert set(a100) == {"arena", "ap", "dp"}
    for view, r in a100.items():
        assert r["estimated"] and r["timer"] == "estimated"
        assert r["iter_time_s"] < cpu[view]["iter_time_s"]
    # An A100 is far faster than one host core: its device work must be much smaller. The runtime's per-step
    # host work (gradient reset, input placement) is host time on either, not scaled by the roofline.
    by_type = {(e.plan.grid.gpu_type, e.plan.plan_id): e.iteration for e in first_run.estimates}
    for (gpu_type, plan_id), it in by_type.items():
        if gpu_type == "a100":
            host_it = by_type[("cpu", plan_id)]
            assert it.setup_s == pytest.approx(host_it.setup_s)
            assert it.iter_time_s - it.setup_s < (host_it.iter_time_s - host_it.setup_s) / 5
    assert first_run.summary["local_roofline"]["peak_flops"] > 0


def test_stage_breakdown_follows_the_1f1b_model(first_run):
    from libarena.profile.pipeline import StageTimes, one_f_one_b

    estimate = next(e for e in first_run.estimates if e.plan.plan_id == "s1-b0-g1-1x1" and not e.estimated)
    (stage,) = estimate.stages
    times = StageTimes(stage["compute_s"], stage["comm_s"], stage["p2p_s"], stage["grad_sync_s"], stage["optimizer_s"],
                       stage["workers"], stage["setup_s"], dispatch_s=stage["dispatch_s"], optimizer_dispatch_s=stage["optimizer_dispatch_s"])
    assert estimate.iter_time_s == pytest.approx(one_f_one_b([times], 4).iter_time_s)
    # a stage timed unit by unit prices no dispatch bound: the runtime issues the fused stage's calls, not the units'
    assert stage["dispatch_s"] == 0 and estimate.iteration.dispatch_s == pytest.approx(stage["setup_s"])
    assert stage["compute_s"] > 0 and stage["optimizer_s"] > 0 and stage["p2p_s"] == 0
    # The runtime's per-step host work is priced: 4 micro-batch input placements.
    assert stage["workers"] == 1 and stage["setup_s"] > 0
    assert estimate.iteration.setup_s == pytest.approx(stage["setup_s"])


def test_second_run_is_served_from_the_cache(plans_path, cache_dir, first_run):
    from libarena.profile import ProfileConfig, profile_plans

    config = ProfileConfig(cache_dir=cache_dir, warmup=1, repeats=3, granularity="unit")  # timed as first_run
    again = profile_plans(read_plans(plans_path, require_costs=False), config, comm=_cpu_comm())
    assert again.summary["stages_profiled"] == 0 and again.summary["stages_skipped"] == 24
    # a profile of 3 timed runs is not served to a run that asks for 7
    more = ProfileConfig(cache_dir=cache_dir, warmup=1, repeats=7, granularity="unit")
    assert profile_plans(read_plans(plans_path, require_costs=False), more, comm=_cpu_comm()).summary["stages_skipped"] < 24
    before = {(r["gpu_type"], r["view"]): r["iter_time_s"] for r in first_run.table.to_pylist()}
    after = {(r["gpu_type"], r["view"]): r["iter_time_s"] for r in again.table.to_pylist()}
    assert before == pytest.approx(after)
    # the cost of profiling each row is what its stages cost when they were profiled, not what this run paid
    # (nothing): a table rebuilt from the cache is the same table
    cost = {(r["gpu_type"], r["view"]): r["profiling_cost_device_s"] for r in first_run.table.to_pylist()}
    assert cost == {(r["gpu_type"], r["view"]): r["profiling_cost_device_s"] for r in again.table.to_pylist()}
    assert sum(cost.values()) > 0


def test_cpu_plans_without_a_comm_table_need_one(tmp_path, cache_dir):
    """The alpha-beta model knows catalogue GPUs only: a 2-device CPU plan without --comm is an error."""
    from libarena.hardware.comm import AlphaBetaCommModel
    from libarena.profile.local_plans import enumerate_grid_plans, model_clusters, write_plans_table
    from libarena.profile.profiler import ProfiledJob, stage_communication

    plans = enumerate_grid_plans(MODEL, BATCH, 2, "cpu", 2)
    path = tmp_path / "p.parquet"
    write_plans_table(str(path), MODEL, BATCH, plans, model_clusters(MODEL, BATCH, num_clusters=2))
    job = ProfiledJob.of(read_plans(path, require_costs=False))
    plan = job.planset.plans()[0]  # dp 2
    fake = [{"activation_out_bytes": 0.0, "activation_in_bytes": 0.0, "param_bytes": 1e6, "grad_sync_bytes": 1e6}]
    with pytest.raises(ArenaError, match="arena-profile comm"):
        stage_communication(job, plan, 0, fake, AlphaBetaCommModel(), [])
    used: list[str] = []
    seconds = stage_communication(job, plan, 0, fake, _cpu_comm(), used)[2]
    assert seconds > 0 and used == ["all-reduce/2xcpu: measured"]


def test_plans_that_cannot_be_priced_are_refused_before_anything_is_profiled(tmp_path, cache_dir, monkeypatch):
    """A 2-device CPU plan without --comm, or a GPU type neither local nor in the catalogue, used to be found
    only when the estimates were composed, after minutes of profiling: now before the first stage."""
    import pyarrow as pa

    from libarena.artifacts import TableArtifact
    from libarena.plan.io import planset_from_artifact
    from libarena.profile import ProfileConfig, profile_plans
    from libarena.profile import profiler
    from libarena.profile.local_plans import enumerate_grid_plans, model_clusters, write_plans_table

    def never(*args, **kwargs):
        raise AssertionError("profiled before the plans were checked")

    monkeypatch.setattr(profiler, "profile_stage", never)
    monkeypatch.setattr(profiler, "profile_corun", never)
    path = tmp_path / "p.parquet"
    write_plans_table(str(path), MODEL, BATCH, enumerate_grid_plans(MODEL, BATCH, 2, "cpu", 2),
                      model_clusters(MODEL, BATCH, num_clusters=2))
    config = ProfileConfig(cache_dir=cache_dir, warmup=1, repeats=3)
    with pytest.raises(ArenaError, match=r"no communication cost for the 2 x cpu plans: .*arena-profile comm"):
        profile_plans(read_plans(path, require_costs=False), config)
    art = read_table(path, "plans")
    renamed = art.table.set_column(art.table.column_names.index("gpu_type"), "gpu_type",
                                   pa.array(["tpu9"] * art.table.num_rows))
    planset = planset_from_artifact(TableArtifact("plans", renamed, art.provenance, art.metadata, art.schema_version,
                                                  str(path)), require_costs=False)
    with pytest.raises(ArenaError, match=r"GPU type 'tpu9' is neither the local device \(cpu\) nor in the hardware catalogue"):
        profile_plans(planset, config)


def test_a_recomputing_stage_repeats_its_forward_collectives(tmp_path):
    """As in the planner (plan.costs.RECOMPUTE_COMM_FACTOR): recomputation runs the forward pass's TP
    all-reduces again, 1.5 x a micro-batch's collectives; P2P and the gradient sync are unchanged."""
    from dataclasses import replace

    from libarena.profile.local_plans import enumerate_grid_plans, model_clusters, write_plans_table
    from libarena.profile.profiler import ProfiledJob, stage_communication

    plans = enumerate_grid_plans(MODEL, BATCH, 2, "cpu", 2)
    path = tmp_path / "p.parquet"
    write_plans_table(str(path), MODEL, BATCH, plans, model_clusters(MODEL, BATCH, num_clusters=2))
    job = ProfiledJob.of(read_plans(path, require_costs=False))
    plan = next(p for p in job.planset.plans() if p.pipeline_degree == 1 and p.stages[0].tp == 2 and not p.stages[0].remat)
    recomputing = replace(plan, stages=(replace(plan.stages[0], remat=True),))
    fake = [{"activation_out_bytes": 0.0, "activation_in_bytes": 0.0, "param_bytes": 1e6, "grad_sync_bytes": 1e6}]
    plain = stage_communication(job, plan, 0, fake, _cpu_comm(), [])
    again = stage_communication(job, recomputing, 0, fake, _cpu_comm(), [])
    assert plain[0] > 0 and again[0] == pytest.approx(1.5 * plain[0]) and again[1:] == plain[1:]


def test_stages_across_nodes_share_the_node_adapters(tmp_path):
    """The profiler prices a stage's collectives and hand-offs as the planner does (CommModel.collective_time,
    boundary_time): a dp 2 x tp 2 stage on nodes of 2 runs two gradient rings through each node's adapter, and a
    stage of two replicas on one node sends both replicas' activations through its adapter."""
    from dataclasses import replace

    from libarena.hardware.comm import AlphaBetaCommModel
    from libarena.profile.local_plans import enumerate_grid_plans, model_clusters, write_plans_table
    from libarena.profile.profiler import ProfiledJob, stage_communication

    path = tmp_path / "p.parquet"
    write_plans_table(str(path), MODEL, BATCH, enumerate_grid_plans(MODEL, BATCH, 4, "a100", 2),
                      model_clusters(MODEL, BATCH, num_clusters=2))
    job = ProfiledJob.of(read_plans(path, require_costs=False))
    comm = AlphaBetaCommModel()
    volume = 1e8
    fake = [{"activation_out_bytes": 1e6, "activation_in_bytes": 1e6, "param_bytes": volume, "grad_sync_bytes": volume}] * 2

    def on_nodes_of(plan, g):
        return replace(plan, grid=replace(plan.grid, gpus_per_node=g, num_nodes=plan.grid.num_gpus // g))

    plan = next(p for p in job.planset.plans() if p.pipeline_degree == 1 and p.stages[0].tp == 2 and not p.stages[0].zero
                and not p.stages[0].remat)
    one_node = stage_communication(job, plan, 0, fake, comm, [])[2]
    assert one_node == pytest.approx(comm.time("all-reduce", volume, 2, "a100", False))
    two_nodes = stage_communication(job, on_nodes_of(plan, 2), 0, fake, comm, [])[2]
    assert two_nodes == pytest.approx(comm.time("all-reduce", 2 * volume, 2, "a100", True))
    pipeline = next(p for p in job.planset.plans() if p.pipeline_degree == 2)
    pipeline = replace(pipeline, stages=tuple(replace(st, dp=2, tp=1) for st in pipeline.stages))  # two replicas a stage
    assert stage_communication(job, pipeline, 0, fake, comm, [])[1] == pytest.approx(comm.time("p2p", 1e6, 2, "a100", False))
    assert stage_communication(job, on_nodes_of(pipeline, 2), 0, fake, comm, [])[1] == pytest.approx(
        comm.time("p2p", 2e6, 2, "a100", True))
    # the second stage receives it and sends the gradient back the same way
    assert stage_communication(job, on_nodes_of(pipeline, 2), 1, fake, comm, [])[1] == pytest.approx(
        comm.time("p2p", 2e6, 2, "a100", True))
    # a one-replica neighbour on the same node takes (sends) the whole activation over one link
    narrow = replace(pipeline, stages=(pipeline.stages[0], replace(pipeline.stages[1], dp=1, tp=2)))
    assert stage_communication(job, narrow, 0, fake, comm, [])[1] == pytest.approx(comm.time("p2p", 2e6, 2, "a100", False))


# -- CLI ----------------------------------------------------------------------------------------------


def _cli(*args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "arena_profile.main", *map(str, args)], input=stdin, capture_output=True, timeout=300
    )


def _one_line_error(proc):
    err = proc.stderr.decode().strip()
    assert proc.returncode == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("arena-profile: error:"), err
    return err


@pytest.fixture(scope="module")
def comm_table_path(tmp_path_factory):
    import pyarrow as pa

    from libarena.artifacts import Provenance, write_table
    from libarena.artifacts.registry import get_kind

    rows = [
        {"primitive": p, "gpu_type": "cpu", "num_devices": 2, "crosses_nodes": False, "bytes": b, "latency_s": 1e-5 + b / 4e9}
        for p in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "p2p")
        for b in (1e3, 1e6)
    ]
    kind = get_kind("comm_table")
    table = pa.Table.from_pylist([{c.name: r.get(c.name, c.default) for c in kind.columns} for r in rows], schema=kind.arrow_schema())
    path = tmp_path_factory.mktemp("comm") / "comm.parquet"
    write_table(path, "comm_table", table, Provenance("test"), {"hardware": {}})
    return path


def test_cli_stdin_plans_to_perf_table_and_show(plans_path, cache_dir, comm_table_path, tmp_path, first_run):
    out = tmp_path / "perf.parquet"
    proc = _cli("--device", "local", "--granularity", "unit", "--warmup", "1", "--repeats", "3", "--cache-dir", cache_dir,
                "--comm", comm_table_path, "-o", out, stdin=plans_path.read_bytes())
    assert proc.returncode == 0, proc.stderr.decode()
    log = proc.stderr.decode()
    assert "timer host" in log and "24 skipped" in log and "measured" in log
    perf = read_table(out, "perf_table")
    assert perf.metadata["stages_skipped"] == 24 and len(perf.table) == 6
    shown = _cli("show", out)
    assert shown.returncode == 0 and "arena" in shown.stdout.decode() and "estimated" in shown.stdout.decode()


def test_cli_bad_device(plans_path, cache_dir):
    err = _one_line_error(_cli("-i", plans_path, "--device", "gpu:3", "--cache-dir", cache_dir, "-o", "/dev/null"))
    assert "does not exist" in err



def test_cli_without_plans_on_a_terminal_says_so(tmp_path):
    """--plans defaults to stdin: on a terminal that is a wait for a stream nobody types, so it is refused."""
    import os
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "arena_profile.main", "-o", str(tmp_path / "x.parquet")],
                              stdin=follower, capture_output=True, timeout=120)
    finally:
        os.close(leader)
        os.close(follower)
    assert "no plans: pipe them from arena-plan, or pass --plans FILE" in _one_line_error(proc)
    assert not (tmp_path / "x.parquet").exists()

def test_cli_bad_burst_is_one_line(plans_path, cache_dir, tmp_path):
    err = _one_line_error(_cli("-i", plans_path, "--burst", "0", "--cache-dir", cache_dir, "-o", tmp_path / "x.parquet"))
    assert "burst" in err and not (tmp_path / "x.parquet").exists()


def test_cli_bad_timing_budget_is_one_line(plans_path, cache_dir, tmp_path):
    err = _one_line_error(_cli("-i", plans_path, "--timing-budget", "-1", "--cache-dir", cache_dir, "-o", tmp_path / "x.parquet"))
    assert "--timing-budget: -1 is out of range" in err and not (tmp_path / "x.parquet").exists()


def test_host_timer_stops_at_its_budget_with_enough_samples():
    """A region that runs for a long time stops being repeated once the budget is spent, but never with
    fewer than MIN_SAMPLES samples (or ``repeats`` when that is fewer); without a budget every repeat runs."""
    import time

    from libarena.profile.timers import MIN_SAMPLES, HostTimer

    calls = []

    def region():
        calls.append(1)
        time.sleep(0.02)

    timing = HostTimer().time(region, 1, 30, budget_s=0.05)
    assert len(timing.samples) == MIN_SAMPLES and len(calls) == 1 + MIN_SAMPLES  # 5 x 20 ms > 50 ms
    assert len(HostTimer().time(region, 0, 3, budget_s=0.001).samples) == 3
    assert len(HostTimer().time(region, 0, 8).samples) == 8
    assert len(HostTimer().time(region, 0, 8, budget_s=60.0).samples) == 8


def test_cli_comm_table_for_other_hardware(plans_path, cache_dir, tmp_path):
    import pyarrow.csv as pacsv
    import pyarrow as pa

    other = tmp_path / "nccl.csv"
    pacsv.write_csv(
        pa.table({"primitive": ["all-reduce"], "gpu_type": ["v100"], "num_devices": [2], "crosses_nodes": [False], "bytes": [1e6], "latency_s": [1e-4]}),
        other,
    )
    err = _one_line_error(_cli("-i", plans_path, "--comm", other, "--cache-dir", cache_dir, "-o", tmp_path / "x.parquet"))
    assert "v100" in err and not (tmp_path / "x.parquet").exists()


def test_cli_plans_without_matching_operator_table(tmp_path, cache_dir):
    from libarena.profile.local_plans import enumerate_grid_plans, write_plans_table

    path = tmp_path / "noclusters.parquet"
    write_plans_table(str(path), MODEL, BATCH, enumerate_grid_plans(MODEL, BATCH, 1, "cpu", 2), [])
    err = _one_line_error(_cli("-i", path, "--cache-dir", cache_dir, "-o", tmp_path / "perf.parquet"))
    assert "operator table" in err


def test_stage_granularity_profiles_whole_stages(plans_path, cache_dir):
    """--granularity stage: one executable per stage; the cpu and a100 grids still share them."""
    from libarena.profile import ProfileConfig, profile_plans

    config = ProfileConfig(cache_dir=cache_dir, warmup=1, repeats=3, granularity="stage", include_dp=False)
    result = profile_plans(read_plans(plans_path, require_costs=False), config, comm=_cpu_comm())
    s = result.summary
    assert s["stages_needed"] == 2 and s["stages_profiled"] + s["stages_skipped"] == 2 and s["stages_skipped"] >= 1
    local = next(e for e in result.estimates if not e.estimated)
    (stage,) = local.stages
    assert stage["units"] == [0, 6] and stage["compute_s"] > 0
    # the stage's issuing is timed with it: less than running it on a CPU (the dispatch bound does not bind there)
    assert 0 < stage["dispatch_s"] < stage["compute_s"] and 0 < stage["optimizer_dispatch_s"]
    assert 0 < local.iteration.dispatch_s < local.iter_time_s and not local.iteration.dispatch_bound
    # another device's rows are roofline-scaled: this host's launches are not theirs
    assert all(st["dispatch_s"] == 0 for e in result.estimates if e.estimated for st in e.stages)


def test_memory_check_against_the_device(plans_path, cache_dir, first_run):
    """Same (cached) profiles, a device budget too small for the stage's state: rows do not fit."""
    from libarena.profile import ProfileConfig, profile_plans

    tight = profile_plans(read_plans(plans_path, require_costs=False), ProfileConfig(cache_dir=cache_dir, warmup=1, repeats=3, memory_fraction=1e-9, granularity="unit"),
                          comm=_cpu_comm())
    assert tight.summary["stages_profiled"] == 0
    assert not any(r["fits_in_memory"] for r in tight.table.to_pylist())
    est = next(e for e in first_run.estimates if not e.estimated)
    # weights + gradient buffer + Adam state of the whole tiny GPT at least
    assert est.memory_per_stage_bytes[0] > 4 * 4 * 0.2e6


def test_cli_sigterm_mid_run_exits_2_keeps_the_cache_valid_and_a_rerun_resumes(plans_path, tmp_path):
    """A profiling run killed with SIGTERM mid-way: exit 2 with one line, no output file, only whole cache
    entries; the rerun serves the entries finished before the kill from the cache."""
    import json
    import signal
    import time

    cache, out = tmp_path / "cache", tmp_path / "perf.parquet"
    # Two distinct stages (the proxy's and the dp plan's micro-batch), each timed long enough that the kill
    # lands after the first stage's entry and before the run ends.
    args = [sys.executable, "-m", "arena_profile.main", "-i", str(plans_path), "--cache-dir", str(cache),
            "--repeats", "300", "--timing-budget", "0", "-o", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def stage_entries() -> list:
        entries = [json.loads(path.read_text()) for path in cache.glob("*/*.json")]  # atomic: always whole
        return [e for e in entries if "spec" in e["value"]]

    deadline = time.monotonic() + 240
    while not stage_entries() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    err = err.decode().strip().splitlines()
    assert proc.returncode == 2 and err[-1] == "arena-profile: error: interrupted", err
    assert not out.exists()
    assert not list(cache.glob("*/.*.tmp"))
    for path in cache.glob("*/*.json"):
        entry = json.loads(path.read_text())
        assert entry["key"] == path.stem and "value" in entry
    finished = stage_entries()
    assert finished
    rerun = _cli("-i", plans_path, "--cache-dir", cache, "--no-dp", "--repeats", "300", "--timing-budget", "0", "-o", out)
    assert rerun.returncode == 0, rerun.stderr.decode()
    meta = read_table(out, "perf_table").metadata
    # Every unit profile finished before the kill is reused, not profiled again.
    assert meta["stages_profiled"] <= meta["unique_stages"] - len(finished)


@pytest.mark.slow
def test_cli_measure_runs_the_plan_with_the_runtime_executor(plans_path, cache_dir, first_run, tmp_path):
    """--measure: the local plan runs through libarena.run.measure_plan; estimate and truth side by side,
    the A100 rows (not here) stay unmeasured."""
    out = tmp_path / "measured.parquet"
    proc = _cli("-i", plans_path, "--cache-dir", cache_dir, "--no-dp", "--measure", "--measure-repeats", "2", "-o", out)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "runtime's executor" in proc.stderr.decode()
    perf = read_table(out, "perf_table")
    rows = perf.table.to_pylist()
    for r in rows:
        if r["gpu_type"] == "cpu":
            assert r["measured_iter_time_s"] > 0 and r["measured_cost_device_s"] > r["measured_iter_time_s"]
        else:
            assert r["measured_iter_time_s"] is None
    (plan,) = [p for p in perf.metadata["plans"] if "measured" in p]
    measured = plan["measured"]
    assert measured["runner"] == "libarena.run.measure_plan" and len(measured["samples_s"]) == 2
    assert measured["dispatch_wait_s"] is None or 0 <= measured["dispatch_wait_s"] <= max(measured["samples_s"])
    assert perf.metadata["measured_plans"] == 1
    assert perf.metadata["mean_abs_error"] == pytest.approx(
        abs(plan["iter_time_s"] - measured["iter_time_s"]) / measured["iter_time_s"])


def test_stages_compiled_ahead_on_threads_run_like_stages_built_one_at_a_time():
    """compile_ahead: lowered here, compiled on 2 threads; the executables compute what a stage built
    directly computes, only the first stage of an optimizer shape compiles the optimizer, and the wall
    time is shared out in full."""
    import jax
    import numpy as np

    from libarena.profile.profiler import compile_ahead
    from libarena.profile.stage import StageSpec, build_stage_executables

    first, second = StageSpec(MODEL, 0, 3, 2), StageSpec(MODEL, 3, 6, 2)
    compiled, shares = compile_ahead([(first, True), (second, False)], workers=2, log=lambda m: None)
    assert compiled[first].optimizer is not None and compiled[second].optimizer is None
    assert all(s > 0 for s in shares.values())
    ahead = build_stage_executables(second, seed=3, compiled=compiled[second])
    direct = build_stage_executables(second, seed=3, with_optimizer=False)
    x = ahead.inputs
    out_ahead = ahead.forward(x["params"], x["carry_in"], x["batch"])[0]
    y = direct.inputs
    out_direct = direct.forward(y["params"], y["carry_in"], y["batch"])[0]
    np.testing.assert_allclose(np.asarray(out_ahead), np.asarray(out_direct), rtol=1e-6)
    grads_ahead = jax.tree.leaves(ahead.run_microbatch())
    grads_direct = jax.tree.leaves(direct.run_microbatch())
    for a, b in zip(grads_ahead, grads_direct, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    opt = build_stage_executables(first, seed=3, compiled=compiled[first])
    before = np.asarray(opt.inputs["opt_params"][0]).copy()
    jax.block_until_ready(opt.run_optimizer())
    assert not np.allclose(np.asarray(opt.inputs["opt_params"][0]), before)


def test_burst_timing_reports_per_run_times():
    """Each timed region dispatches ``burst`` runs back to back; samples are per run."""
    from libarena.profile.profiler import _time_burst
    from libarena.profile.timers import Timer

    calls = []

    class CountingTimer(Timer):
        name = "counting"

        def sample(self, region):
            before = len(calls)
            region()
            return float(len(calls) - before)

    timing = _time_burst(CountingTimer(), lambda: calls.append(1), warmup=1, repeats=3, burst=4)
    assert timing.samples == (1.0, 1.0, 1.0) and len(calls) == 16
    assert _time_burst(CountingTimer(), lambda: calls.append(1), 0, 2, 1).samples == (1.0, 1.0)


def test_a_run_waits_for_a_stage_another_run_is_profiling(tmp_path):
    """Two runs sharing a cache do not time the same stage side by side: the second waits on the first's claim
    and then reads its entry (here the claim is held by the test, which writes the entry before leaving it)."""
    import json
    import time

    from libarena.profile.cache import ProfileCache

    code = ("import json, sys, time\n"
            "from libarena.profile.cache import ProfileCache\n"
            "from libarena.profile.device import resolve_device\n"
            "from libarena.profile.profiler import profile_stage, stage_cache_key\n"
            "from libarena.profile.stage import StageSpec\n"
            "from libarena.profile.timers import HostTimer\n"
            "local, spec, timer = resolve_device('cpu'), StageSpec('gpt__tiny', 0, 2, 2), HostTimer()\n"
            "print(stage_cache_key(spec, local, timer.name, burst=4), flush=True)\n"
            "sys.stdin.readline()\n"
            f"record, cached = profile_stage(spec, local, timer, ProfileCache({str(tmp_path)!r}), warmup=0, repeats=1,\n"
            "                               log=lambda m: print(m, file=sys.stderr, flush=True))\n"
            "print(json.dumps({'cached': cached, 'record': record, 'done_at': time.monotonic()}), flush=True)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        key = child.stdout.readline().strip()
        cache = ProfileCache(tmp_path)
        with cache.claim(key):
            child.stdin.write("go\n")
            child.stdin.flush()
            time.sleep(1.0)  # the child is blocked on the claim (it would otherwise be profiling by now)
            cache.put(key, {"key": key, "profiled_by": "the other run"})
            released = time.monotonic()  # CLOCK_MONOTONIC, one clock for every process; before the claim is left
        out = json.loads(child.stdout.readline())
        assert child.wait(timeout=120) == 0
    finally:
        child.kill()
    assert out["cached"] is True and out["record"] == {"key": key, "profiled_by": "the other run"}
    assert out["done_at"] >= released  # it went on only once the claim was left, however slowly it woke
    assert "waiting for another run sharing the cache, which is profiling gpt__tiny units [0, 2)" in child.stderr.read()


def test_a_claim_held_too_long_is_given_up(tmp_path):
    """A run waiting on a claim whose holder does not leave (stopped with Ctrl-Z, a hung device) goes on
    unclaimed after the limit, says so, and the key is profiled by it."""
    import time

    from libarena.profile.cache import ProfileCache

    cache = ProfileCache(tmp_path)
    key = "cd" + "0" * 62
    notes = []
    with cache.claim(key):  # the holder (another open file description conflicts like another process)
        t0 = time.monotonic()
        with cache.claim(key, on_wait=lambda: notes.append("wait"), max_wait_s=0.5,
                         on_give_up=lambda: notes.append("gave up")):
            waited = time.monotonic() - t0
            notes.append("body")
    assert notes == ["wait", "gave up", "body"] and 0.45 <= waited < 5
    with cache.claim(key):  # a give-up note that fails is the error seen, not a TypeError of the claim's own

        def fails():
            raise ValueError("note failed")

        with pytest.raises(ValueError, match="note failed"):
            with cache.claim(key, max_wait_s=0.1, on_give_up=fails):
                pass
    with cache.claim(key, max_wait_s=0.5, on_give_up=lambda: notes.append("again")):
        pass  # free now: taken at once
    assert notes[-1] == "body"


def test_a_claim_needs_no_write_access_and_falls_back_without_a_lock(tmp_path):
    """A shared cache's lock file may belong to someone else (read access is enough for flock); where no lock
    file can be made at all, the claim holds nothing and the body still runs."""
    import os

    from libarena.profile.cache import ProfileCache

    cache = ProfileCache(tmp_path / "c")
    key = "ab" + "0" * 62
    with cache.claim(key):
        pass
    lock = tmp_path / "c" / "ab" / f".{key}.lock"
    lock.chmod(0o444)
    with cache.claim(key):
        pass
    os.chmod(tmp_path / "c" / "ab", 0o555)
    try:
        other = "ab" + "1" * 62
        ran = []
        with cache.claim(other):  # cannot create its lock file (for a non-root user): unclaimed, not an error
            ran.append(True)
        assert ran == [True]
    finally:
        os.chmod(tmp_path / "c" / "ab", 0o755)


@pytest.mark.parametrize("name", ["", " ", ":0", "cpu:x", "cpu:-1", "tpu"])
def test_a_bad_device_name_is_refused_in_one_line(name):
    """An empty platform name is not JAX's default device: ``--device ''`` is refused like any other bad name."""
    from libarena.errors import ArenaError
    from libarena.profile.device import resolve_device

    with pytest.raises(ArenaError, match=r"^(bad device|device) '.*'"):
        resolve_device(name)


def test_a_stage_profile_is_keyed_by_how_it_was_timed_and_on_cpu_by_the_host(monkeypatch):
    """A profile timed in bursts of 4 is not served to a run that times single runs, and on CPU (the host's cores
    are the device) a cache shared between hosts does not serve one host's times to another."""
    import platform

    from libarena.profile.device import resolve_device
    from libarena.profile.profiler import stage_cache_key
    from libarena.profile.stage import StageSpec

    local, spec = resolve_device("cpu"), StageSpec("gpt__tiny", 0, 2, 2)
    four = stage_cache_key(spec, local, "host", burst=4)
    assert four == stage_cache_key(spec, local, "host", burst=4)
    assert four != stage_cache_key(spec, local, "host", burst=1)
    assert four != stage_cache_key(StageSpec("gpt__tiny", 0, 2, 2, remat=True), local, "host", burst=4)
    monkeypatch.setattr(platform, "node", lambda: "another-host")
    assert four != stage_cache_key(spec, local, "host", burst=4)


def test_cpu_timings_are_keyed_by_the_cores_and_xla_flags_the_process_runs_with(monkeypatch):
    """A run pinned to fewer cores (taskset) or under other XLA threading flags times stages differently: a shared
    cache does not serve its records to another. The device count alone does not separate them (the co-run
    records key it themselves; the stage profile times one device)."""
    from libarena.profile import host
    from libarena.profile.device import resolve_device
    from libarena.profile.profiler import stage_cache_key
    from libarena.profile.stage import StageSpec

    local, spec = resolve_device("cpu"), StageSpec("gpt__tiny", 0, 2, 2)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    here = stage_cache_key(spec, local, "host", burst=4)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    assert stage_cache_key(spec, local, "host", burst=4) == here
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false")
    flagged = stage_cache_key(spec, local, "host", burst=4)
    assert flagged != here
    assert local.host()[2]["xla_flags"] == ["--xla_cpu_multi_thread_eigen=false"]
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    monkeypatch.setattr(host, "STARTING_CORES", [*host.STARTING_CORES, max(host.STARTING_CORES) + 1])
    assert stage_cache_key(spec, local, "host", burst=4) not in (here, flagged)
    assert resolve_device("cpu").cache_identity()["host"] == local.host()


def test_a_device_measurement_is_keyed_by_its_machine(monkeypatch):
    """The roofline and dispatch-overhead records are keyed by the machine: on CPU the host (cores and flags
    included), on a GPU, whose host() is empty, the node's name, so two machines' GPUs of one kind do not share one."""
    import dataclasses
    import platform

    from libarena.profile.device import resolve_device

    cpu = resolve_device("cpu")
    assert cpu.machine() == cpu.host() and cpu.host()
    gpu = dataclasses.replace(cpu, platform="gpu", kind="NVIDIA H100 80GB HBM3", gpu_type="h100")
    assert gpu.host() == []
    monkeypatch.setattr(platform, "node", lambda: "node-a")
    assert gpu.machine() == "node-a"
    monkeypatch.setattr(platform, "node", lambda: "node-b")
    assert gpu.machine() == "node-b"


def test_the_optimizer_profile_is_keyed_by_the_host_and_a_stage_by_its_micro_batch(monkeypatch):
    """A shared cache does not serve one host's optimizer times to another (its stage keys already hold the
    host); and a batch-equivalent tensor-parallel worker (wide_resnet at tp 2 runs ceil(micro-batch / 2)
    samples) of micro-batch 3 is not served the record of micro-batch 4, whose activations hand off larger."""
    import platform

    from libarena.profile.device import resolve_device
    from libarena.profile.profiler import optimizer_cache_key, stage_cache_key
    from libarena.profile.stage import StageSpec, worker_view

    local = resolve_device("cpu")
    three, four = StageSpec("wide_resnet__tiny", 0, 2, 3, tp=2), StageSpec("wide_resnet__tiny", 0, 2, 4, tp=2)
    assert worker_view(three).local_batch == worker_view(four).local_batch == 2  # built alike ...
    assert stage_cache_key(three, local, "host", burst=4) != stage_cache_key(four, local, "host", burst=4)  # ... kept apart
    here = optimizer_cache_key(three, local, "host")
    assert here == optimizer_cache_key(four, local, "host")  # the update does not depend on the micro-batch
    monkeypatch.setattr(platform, "node", lambda: "another-host")
    assert here != optimizer_cache_key(three, local, "host")


def test_the_gradients_a_stage_reduces_are_its_workers_parameters_as_the_runtime_shards_them():
    """A batch-equivalent tensor-parallel worker (wide_resnet) is built with whole layers; its data-parallel
    gradient reduction is of the layers as the runtime shards them over tp (conv_out), not of the whole ones."""
    import jax
    import numpy as np

    from libarena.profile.profiler import _grad_sync_bytes
    from libarena.profile.stage import VIEW_BATCH_EQUIVALENT, VIEW_SHARDED, StageSpec, worker_view

    def whole(view):
        return sum(np.prod(s.shape) * np.dtype(s.dtype).itemsize for s in jax.tree.leaves(view.params))

    wide = worker_view(StageSpec("wide_resnet__tiny", 0, 3, 4, tp=2))
    assert wide.tp_view == VIEW_BATCH_EQUIVALENT
    assert whole(wide) == whole(worker_view(StageSpec("wide_resnet__tiny", 0, 3, 4)))  # whole layers
    assert 0.45 * whole(wide) < _grad_sync_bytes(wide) < 0.6 * whole(wide)  # most of them split in two
    gpt = worker_view(StageSpec("gpt__tiny", 0, 3, 4, tp=2))
    assert gpt.tp_view == VIEW_SHARDED and _grad_sync_bytes(gpt) == whole(gpt)  # already the worker's shards


def test_cli_comm_refuses_an_output_it_cannot_write_before_benchmarking(tmp_path):
    """The communication benchmark takes seconds: a missing output directory is refused before anything of it
    runs, its own checks included (here 1,024 devices, which its memory check would refuse; before, that was the
    error, and with a feasible setting the benchmark ran and then found it could not write)."""
    proc = _cli("comm", "-o", tmp_path / "no" / "comm.parquet", "--devices", "1024")
    _one_line_error(proc)
    assert "cannot write" in proc.stderr.decode() and "does not exist" in proc.stderr.decode()
    assert not (tmp_path / "no").exists()


def test_the_comm_memory_check_counts_the_volumes_measured_not_the_option(monkeypatch):
    """Volumes are multiples of 4 x devices^2 bytes: on 1,024 devices --max-bytes 4 measures 4 MiB per device,
    about 16 GiB in all. The check counted the 4 bytes asked for, and the benchmark ran out of memory."""
    import libarena.profile.comm_bench as comm_bench
    from libarena.profile import CommBenchConfig

    monkeypatch.setattr(comm_bench, "_host_memory_bytes", lambda: 24 << 30)
    assert CommBenchConfig(num_devices=1024, min_bytes=4, max_bytes=4, points=1, platform="gpu").sizes() == [4 << 20]
    with pytest.raises(ArenaError, match=r"--max-bytes 4 \(measured as 4194304: volumes are multiples of 4 x "
                                         r"devices\^2\) on 1024 host devices needs about 16.0 GiB"):
        CommBenchConfig(num_devices=1024, min_bytes=4, max_bytes=4, points=1)
    CommBenchConfig(num_devices=8, min_bytes=4, max_bytes=4, points=1)  # 256 bytes per device: fine


def test_a_child_past_its_time_limit_is_a_one_line_error():
    """subprocess.run's TimeoutExpired went up as an internal error (the comm benchmark, --measure, the host's
    calibration all run a child with a limit)."""
    from libarena.profile.subprocess_devices import run_module_with_devices

    with pytest.raises(ArenaError, match=r"^the test child failed: no result within 0.01 s \(child stopped\)$"):
        run_module_with_devices("libarena.profile.comm_bench", {}, platform="cpu", num_devices=1, timeout_s=0.01,
                                what="the test child")


def test_show_json_prints_strict_json_for_a_row_of_unknown_time(tmp_path):
    """An imported row that does not fit may have an infinite time; `show --json` printed the token Infinity,
    which strict JSON parsers refuse. Every tool's JSON output goes through libarena.cli.strict_json now."""
    import json

    table = tmp_path / "perf.csv"
    table.write_text("model,global_batch,gpu_type,num_gpus,iter_time_s,view,fits_in_memory\n"
                     "gpt__tiny,16,a40,1,inf,arena,false\ngpt__tiny,16,a40,2,0.5,arena,true\n")
    proc = _cli("show", table, "--json")
    assert proc.returncode == 0, proc.stderr.decode()

    def refuse(token):
        raise ValueError(token)

    rows = json.loads(proc.stdout, parse_constant=refuse)
    assert [r["iter_time_s"] for r in rows] == [None, 0.5]


def test_the_timer_auto_chooses_names_the_output_in_the_cache(monkeypatch):
    """The output cache keyed ``timer: auto`` as typed: a table timed with the host timer was served after
    cupti-python was installed on a GPU host. The key now holds the timer auto resolves to."""
    import jax

    from libarena.profile.timers import CuptiTimer, HostTimer, resolved_timer_name, select_timer

    device = jax.devices()[0]
    assert resolved_timer_name("auto", device) == "host" and isinstance(select_timer("auto", device), HostTimer)
    monkeypatch.setattr(CuptiTimer, "usable", classmethod(lambda cls, device: True))
    assert resolved_timer_name("auto", device) == "cupti"
    assert resolved_timer_name("host", device) == "host"


@pytest.mark.parametrize("failure", [MemoryError("Unable to allocate 36.0 MiB"),
                                     RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 2 GiB")])
def test_a_stage_beyond_the_devices_memory_is_a_one_line_error(monkeypatch, failure):
    """A plan of a paper-size model profiled on a laptop's CPU ran out of host memory building its stage: an
    internal error (numpy's MemoryError, or XLA's RESOURCE_EXHAUSTED on a GPU) instead of a one-line error."""
    import libarena.profile.profiler as profiler
    from libarena.profile import resolve_device
    from libarena.profile.stage import StageSpec
    from libarena.profile.timers import HostTimer

    def build(*args, **kwargs):
        raise failure

    monkeypatch.setattr(profiler, "build_stage_executables", build)
    with pytest.raises(ArenaError, match=r"does not fit in the memory of .* estimate this one with `arena-schedule "
                                         r"perf build --mode roofline`"):
        profiler.profile_stage(StageSpec("gpt__tiny", 0, 2, 2), resolve_device("cpu"), HostTimer())
    monkeypatch.setattr(profiler, "build_stage_executables", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="other"):  # any other failure is not named a memory problem
        profiler.profile_stage(StageSpec("gpt__tiny", 0, 2, 2), resolve_device("cpu"), HostTimer())
