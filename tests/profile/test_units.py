"""Fast tests of the profiler's pieces: 1F1B model, cache, plan parsing, worker shapes, timers, import."""

from __future__ import annotations

import json
import sys
import types

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from libarena.artifacts import read_table
from libarena.errors import ArenaError
from libarena.profile.cache import ProfileCache
from libarena.profile.pipeline import StageTimes, one_f_one_b


# -- 1F1B model ---------------------------------------------------------------------------------------


def test_one_stage_pipeline_is_gradient_accumulation():
    est = one_f_one_b([StageTimes(compute_s=0.1, comm_s=0.02, grad_sync_s=0.3, optimizer_s=0.05)], 4)
    assert est.iter_time_s == pytest.approx(4 * 0.12 + 0.3 + 0.05)
    assert est.bottleneck_stage == 0


def test_pipeline_first_microbatch_plus_slowest_stage_minus_overlapped_p2p():
    # The paper's Fig. 8 shape: T1..T4, stage 3 the slowest; P2P overlapped in the steady state.
    stages = [StageTimes(1.0, p2p_s=0.1), StageTimes(1.5, p2p_s=0.2), StageTimes(3.0, p2p_s=0.2), StageTimes(2.0, p2p_s=0.1)]
    est = one_f_one_b(stages, 8)
    first = 1.1 + 1.7 + 3.2 + 2.1
    assert est.first_microbatch_s == pytest.approx(first)
    assert est.iter_time_s == pytest.approx(first + 7 * 3.0)
    assert est.bottleneck_stage == 2


def test_the_step_takes_at_least_its_dispatching_threads_cpu_time():
    """One thread issues every call of a step: where issuing a micro-batch's calls takes longer than running
    them (kernels that outrun their launches), the dispatch bound gives the step time; elsewhere it changes nothing."""
    stages = [StageTimes(1.0, p2p_s=0.1, optimizer_s=0.2, setup_s=0.05, dispatch_s=0.3, optimizer_dispatch_s=0.1),
              StageTimes(2.0, p2p_s=0.1, optimizer_s=0.3, dispatch_s=0.4, optimizer_dispatch_s=0.1)]
    composed = one_f_one_b(stages, 4)
    assert composed.iter_time_s == pytest.approx(0.05 + 3.2 + 3 * 2.0 + 0.3) == pytest.approx(composed.composed_s)
    assert composed.dispatch_s == pytest.approx(0.05 + 4 * 0.7 + 0.2) and not composed.dispatch_bound
    launch_bound = [StageTimes(0.1, optimizer_s=0.02, setup_s=0.05, dispatch_s=0.5, optimizer_dispatch_s=0.1)]
    est = one_f_one_b(launch_bound, 4)
    assert est.dispatch_bound and est.iter_time_s == pytest.approx(0.05 + 4 * 0.5 + 0.1)
    assert est.composed_s == pytest.approx(0.05 + 4 * 0.1 + 0.02)
    # without a recorded dispatch (roofline rows, old records) the composition alone
    assert one_f_one_b([StageTimes(0.1, optimizer_s=0.02)], 4).dispatch_s == 0.0


def test_host_timer_records_the_calling_threads_cpu_to_issue_each_run():
    """dispatch_samples: the thread's CPU inside the region (busy issuing), not the wall time it waits."""
    import time

    from libarena.profile.timers import HostTimer

    def spin(seconds):
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    busy = HostTimer().time(lambda: spin(0.004), 1, 6)
    idle = HostTimer().time(lambda: time.sleep(0.004), 1, 6)
    assert len(busy.dispatch_samples) == len(busy.samples) == 6
    assert 0.003 < busy.dispatch <= max(busy.samples)
    assert idle.dispatch < 0.002 <= min(idle.samples)
    assert busy.to_dict()["dispatch_cpu_s"] == busy.dispatch and busy.scaled(0.5).dispatch == pytest.approx(busy.dispatch / 2)


def test_an_instrumenting_timer_takes_the_issuing_cpu_from_plain_runs():
    """CUPTI hooks every kernel launch, which slows the issuing it would record: a timer that instruments the
    issuing times it in as many plain runs after its timed ones."""
    import time

    from libarena.profile.timers import Timer

    class Instrumenting(Timer):
        name = "instrumenting"
        instruments_issuing = True

        def sample(self, region):
            end = time.thread_time() + 0.004  # the timer's own hooks: CPU the plain issuing does not pay
            while time.thread_time() < end:
                pass
            t0 = time.perf_counter()
            region()
            return time.perf_counter() - t0

    runs = []
    timing = Instrumenting().time(lambda: runs.append(1), 2, 5)
    assert len(runs) == 2 + 5 + 5 and len(timing.dispatch_samples) == 5
    assert timing.dispatch < 0.001


def test_devices_sharing_a_host_slow_each_other_down():
    """slowdown(k): k devices busy at once each run slowdown(k)x slower (host devices share the cores)."""
    from libarena.profile.concurrency import HostConcurrency

    shared = HostConcurrency(((2, 2.0),), "test").slowdown  # two devices at once: no gain at all
    # Pure data parallelism on 2 devices: each replica does half the work, but at half the speed.
    dp = [StageTimes(compute_s=0.1, optimizer_s=0.02, workers=2, setup_s=0.01)]
    assert one_f_one_b(dp, 4).iter_time_s == pytest.approx(0.01 + 4 * 0.1 + 0.02)
    assert one_f_one_b(dp, 4, shared).iter_time_s == pytest.approx(0.01 + 4 * 0.2 + 0.04)
    # Two 1-device stages: the steady state is bounded by the host's capacity (both stages' work in turn).
    two = [StageTimes(1.0, optimizer_s=0.1), StageTimes(3.0, optimizer_s=0.3)]
    independent = one_f_one_b(two, 8)
    assert independent.iter_time_s == pytest.approx(4.0 + 7 * 3.0 + 0.3) and independent.host_slowdown == 1.0
    est = one_f_one_b(two, 8, shared)
    assert est.first_microbatch_s == pytest.approx(4.0)  # one stage at a time: no contention
    assert est.iter_time_s == pytest.approx(4.0 + 7 * 4.0 + 0.4) and est.host_slowdown == 2.0
    # Identity when devices do not share (GPUs): the bound never binds.
    assert one_f_one_b(two, 8, HostConcurrency().slowdown) == independent


def test_host_concurrency_interpolates_between_measured_points():
    from libarena.profile.concurrency import HostConcurrency

    hc = HostConcurrency(((2, 1.8), (4, 3.0)))
    assert hc.slowdown(1) == 1.0 and hc.slowdown(2) == pytest.approx(1.8) and hc.slowdown(3) == pytest.approx(2.4)
    assert hc.slowdown(8) == pytest.approx(5.4) and hc.slowdown(100) <= 100
    assert HostConcurrency().slowdown(8) == 1.0


# -- cache --------------------------------------------------------------------------------------------


def test_cache_round_trip_and_corrupt_entries_are_misses(tmp_path):
    cache = ProfileCache(tmp_path)
    assert cache.get("ab" * 32) is None
    cache.put("ab" * 32, {"x": 1.5})
    fresh = ProfileCache(tmp_path)
    assert fresh.get("ab" * 32) == {"x": 1.5}
    # A truncated entry (e.g. from a killed writer without atomic rename) is a miss, not a crash.
    path = fresh.path("cd" * 32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"format": 1, "key": "cdcd')
    assert fresh.get("cd" * 32) is None
    # An entry stored under the wrong key is rejected too.
    path.write_text(json.dumps({"format": 1, "key": "ef", "value": {}}))
    assert fresh.get("cd" * 32) is None


def test_interrupted_cache_write_leaves_no_entry(tmp_path):
    cache = ProfileCache(tmp_path)
    with pytest.raises(TypeError):
        cache.put("12" * 32, {"value": object()})  # not JSON-serialisable: fails mid-write
    assert not cache.path("12" * 32).exists()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    assert ProfileCache(tmp_path).get("12" * 32) is None


def test_stale_temp_files_of_killed_writers_are_ignored_and_removed(tmp_path):
    """SIGKILL between a temp write and its rename leaves ``.<key>.json.<pid>.<rand>.tmp``: never read as an
    entry; removed when its writer is dead (or, without a pid, once old); a live writer's file is kept."""
    import os
    import subprocess
    import sys

    cache = ProfileCache(tmp_path)
    cache.put("ab" * 32, {"x": 1.0})
    folder = cache.path("ab" * 32).parent
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)  # exited: nobody owns its temp file any more
    stale = folder / f".{'ab' * 32}.json.{dead_pid}.0a1b2c3d.tmp"
    live = folder / f".{'ab' * 32}.json.{os.getppid()}.0a1b2c3d.tmp"  # our parent is alive: still writing
    old_anonymous = folder / f".{'ab' * 32}.json.k2j3h4.tmp"  # a pid-less temp file (atomic_output style)
    young_anonymous = folder / f".{'ab' * 32}.json.zz9988.tmp"
    for path in (stale, live, old_anonymous, young_anonymous):
        path.write_text('{"format": 1, "key": "ab')  # half-written
    os.utime(old_anonymous, (0, 0))
    assert cache.entries() == [cache.path("ab" * 32)]  # temp files are not entries
    fresh = ProfileCache(tmp_path)
    assert fresh.stale_removed == 2
    assert not stale.exists() and not old_anonymous.exists() and live.exists() and young_anonymous.exists()
    assert fresh.get("ab" * 32) == {"x": 1.0}
    assert fresh.entries() == [fresh.path("ab" * 32)]


# -- perf table import --------------------------------------------------------------------------------


def _foreign_rows():
    return {
        "model": ["gpt__1.3B", "gpt__1.3B"],
        "global_batch": [128, 128],
        "gpu_type": ["a100", "a100"],
        "num_gpus": [4, 4],
        "iter_time_s": [1.25, 2.0],
        "view": ["arena", "dp"],
    }


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_perf_table_measured_elsewhere_imports_with_defaults(tmp_path, fmt):
    table = pa.table(_foreign_rows())
    path = tmp_path / f"perf.{fmt}"
    if fmt == "csv":
        pacsv.write_csv(table, path)
    else:
        pq.write_table(table, path)
    art = read_table(path, "perf_table")
    assert not art.native
    rows = art.table.to_pylist()
    assert rows[0]["num_nodes"] == 0 and rows[0]["fits_in_memory"] is True and rows[0]["timer"] == "imported"
    assert rows[1]["iter_time_s"] == 2.0 and rows[1]["estimated"] is False
    assert rows[0]["measured_iter_time_s"] is None


def test_perf_table_import_missing_required_column_is_an_error(tmp_path):
    rows = _foreign_rows()
    del rows["iter_time_s"]
    path = tmp_path / "perf.csv"
    pacsv.write_csv(pa.table(rows), path)
    with pytest.raises(ArenaError, match="iter_time_s"):
        read_table(path, "perf_table")


# -- plans input --------------------------------------------------------------------------------------


def _plans(tmp_path, clusters=None, model="gpt__tiny"):
    """The two-device plans of gpt__tiny as a plans artifact (rows relabelled as ``model``)."""
    import pyarrow as pa

    from libarena.artifacts import write_table
    from libarena.profile.local_plans import enumerate_grid_plans, model_clusters, write_plans_table

    plans = enumerate_grid_plans("gpt__tiny", 8, 2, "cpu", 2)
    path = tmp_path / "plans.parquet"
    write_plans_table(str(path), "gpt__tiny", 8, plans, model_clusters("gpt__tiny", 8, num_clusters=2) if clusters is None else clusters)
    art = read_table(path, "plans")
    if model != "gpt__tiny":
        table = art.table.set_column(art.table.schema.get_field_index("model"), "model", pa.array([model] * art.table.num_rows))
        meta = {**art.metadata, "model": {**art.metadata["model"], "name": model}}
        write_table(path, "plans", table, art.provenance, meta)
    return path


def test_plans_parse_into_stage_specs(tmp_path):
    from libarena.plan import data_parallel_plan, read_plans
    from libarena.profile.profiler import ProfiledJob

    job = ProfiledJob.of(read_plans(_plans(tmp_path), require_costs=False))
    plans = job.planset.plans()
    assert [p.plan_id for p in plans] == ["s1-b0-g2-2x1", "s1-b0-g2-1x2", "s2-b0.1-g1.1-1x1.1x1"]
    specs = job.stage_specs(plans[2])
    assert [(s.start, s.stop) for s in specs] == [(0, 3), (3, 6)]
    assert all(s.micro_batch == 1 for s in specs)  # 8 samples / (4 x 2 micro-batches)
    tp_plan = job.stage_specs(plans[1])[0]
    assert (tp_plan.tp, tp_plan.micro_batch) == (2, 2)
    dp = data_parallel_plan(plans[0].grid, job.layout.num_clusters)
    assert job.stage_specs(dp)[0].micro_batch == 4


def test_plans_without_clusters_or_with_foreign_units_are_rejected(tmp_path):
    from libarena.plan import read_plans
    from libarena.profile.profiler import ProfiledJob

    with pytest.raises(ArenaError, match="clusters"):
        read_plans(_plans(tmp_path, clusters=[]), require_costs=False)
    bad = [{"index": 0, "units": ["layer0"]}, {"index": 1, "units": ["layer1"]}]
    with pytest.raises(ArenaError, match="does not have"):
        ProfiledJob.of(read_plans(_plans(tmp_path, clusters=bad), require_costs=False))


def test_plans_for_an_unknown_model_are_rejected(tmp_path):
    from libarena.plan import read_plans
    from libarena.profile.profiler import ProfiledJob

    with pytest.raises(ArenaError, match="unknown"):
        ProfiledJob.of(read_plans(_plans(tmp_path, model="gpt__nonexistent"), require_costs=False))


def test_every_plan_of_a_two_device_grid_is_enumerated():
    from libarena.profile.local_plans import enumerate_grid_plans

    plans = enumerate_grid_plans("gpt__tiny", 16, 2, "cpu", 3)
    # s=1: dp2, tp2; s=2: two cut points x (1, 1) GPUs.
    assert len(plans) == 4 and sum(p.is_proxy for p in plans) == 1
    assert {tuple(p.stage_boundaries) for p in plans if p.pipeline_degree == 2} == {(0, 1), (0, 2)}


# -- per-worker shapes --------------------------------------------------------------------------------


def test_tensor_parallel_worker_shapes_divide_sharded_axes():
    from libarena.profile.stage import VIEW_SHARDED, StageSpec, worker_view

    full = worker_view(StageSpec("gpt__tiny", 1, 6, 4))
    half = worker_view(StageSpec("gpt__tiny", 1, 6, 4, tp=2))
    assert half.tp_view == VIEW_SHARDED
    assert full.params[0]["w_qkv"].shape == (64, 3, 4, 16) and half.params[0]["w_qkv"].shape == (64, 3, 2, 16)
    assert half.params[0]["w_mlp_in"].shape == (64, 128)
    assert half.params[-1]["w_out"].shape == (64, 128)  # vocab 256 / 2
    assert half.int_modulo == 128 and half.carry_in.shape == (4, 32, 64)
    assert sum(half.optimizer_elements) < sum(full.optimizer_elements)


def test_convolutions_fall_back_to_the_batch_equivalent_view():
    from libarena.profile.stage import VIEW_BATCH_EQUIVALENT, StageSpec, worker_view

    view = worker_view(StageSpec("wide_resnet__tiny", 1, 4, 4, tp=2))
    assert view.tp_view == VIEW_BATCH_EQUIVALENT and view.local_batch == 2


def test_expert_and_zero_sharding_shrink_the_optimizer_shard():
    from libarena.profile.stage import StageSpec, worker_view

    base = worker_view(StageSpec("moe__tiny", 1, 2, 4))
    ep = worker_view(StageSpec("moe__tiny", 1, 2, 4, ep=2))
    zero = worker_view(StageSpec("moe__tiny", 1, 2, 4, zero_shards=2))
    assert sum(ep.optimizer_elements) < sum(base.optimizer_elements)
    assert sum(zero.optimizer_elements) == pytest.approx(sum(base.optimizer_elements) / 2, rel=0.01)
    # Identical blocks of a model share one signature (profiled once).
    from libarena.models import get_model

    m = get_model("moe__tiny")
    assert worker_view(StageSpec("moe__tiny", 2, 3, 4)).signature(m) == base.signature(m)


# -- timers and CUPTI ---------------------------------------------------------------------------------


def test_timer_selection_on_a_host():
    import jax

    import arena_cupti.activity as arena_cupti
    from libarena.profile.timers import HostTimer, select_timer

    cpu = jax.devices("cpu")[0]
    assert isinstance(select_timer("auto", cpu), HostTimer)
    assert not arena_cupti.available()
    with pytest.raises(ArenaError, match="cupti"):
        select_timer("cupti", cpu)
    with pytest.raises(ArenaError, match="unknown timer"):
        select_timer("stopwatch", cpu)


def test_the_repositorys_cupti_folder_does_not_hide_nvidias_cupti_module(tmp_path):
    """Run from the repository root (``python -m bench gpu``), the folder cupti/ (our arena_cupti) is on sys.path
    before site-packages; it must not be the ``cupti`` that ``from cupti import cupti`` finds (seen on an H100)."""
    import os
    import subprocess
    from pathlib import Path

    site = tmp_path / "site" / "cupti"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("")
    (site / "cupti.py").write_text("STAND_IN = 'cupti-python'\n")
    repo = Path(__file__).resolve().parents[2]
    code = "from cupti import cupti; import arena_cupti.activity as a; print(cupti.STAND_IN, a.available())"
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site.parent), os.environ.get("PYTHONPATH")]))})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cupti-python", "True"]


def test_cupti_recorder_sums_kernel_activity_records(monkeypatch):
    """The recorder against a stand-in of cupti-python's activity API (the real one needs a GPU)."""
    import arena_cupti.activity as arena_cupti

    class Kind:
        CONCURRENT_KERNEL = 10
        MEMCPY = 1

    calls = []

    def rec(kind, start, end, name="k"):
        return types.SimpleNamespace(kind=kind, start=start, end=end, name=name, device_id=0, stream_id=7)

    class FakeCupti:
        ActivityKind = Kind

        def activity_register_callbacks(self, requested, completed):
            calls.append("register")
            self.completed = completed
            assert requested() == (arena_cupti.BUFFER_BYTES, 0)

        def activity_enable(self, kind):
            calls.append(("enable", kind))

        def activity_flush_all(self, flag):
            calls.append(("flush", flag))
            self.completed([rec(10, 1000, 4000), rec(1, 0, 10**9), rec(10, 5000, 6000, "gemm")])

        def activity_disable(self, kind):
            calls.append(("disable", kind))

    fake = FakeCupti()
    monkeypatch.setattr(arena_cupti, "_load", lambda: fake)
    monkeypatch.setattr(arena_cupti.KernelActivityRecorder, "_registered", False)
    recorder = arena_cupti.KernelActivityRecorder()
    recorder.start()
    kernels = recorder.stop()
    assert [k.name for k in kernels] == ["k", "gemm"]
    assert arena_cupti.kernel_seconds(kernels) == pytest.approx(4e-6)
    assert calls == ["register", ("enable", 10), ("flush", 1), ("disable", 10)]


def test_profile_package_does_not_import_jax():
    import subprocess

    code = "import sys, libarena.profile, arena_cupti.activity; assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plan_selection_proxy_frontier_exhaustive(tmp_path):
    from dataclasses import replace

    from libarena.plan import read_plans
    from libarena.profile.profiler import select_plans

    planset = read_plans(_plans(tmp_path), require_costs=False)
    # mark one plan off the frontier (an --exhaustive extra row)
    grid = next(i for i, g in enumerate(planset.grids) if g.grid.pipeline_degree == 2)
    planset.grids[grid] = replace(planset.grids[grid], plans=(replace(planset.grids[grid].plans[0], on_frontier=False),))
    assert [p.plan_id for p in select_plans(planset, "proxy")] == ["s1-b0-g2-2x1"]
    assert [p.plan_id for p in select_plans(planset, "frontier")] == ["s1-b0-g2-2x1", "s1-b0-g2-1x2"]
    assert len(select_plans(planset, "exhaustive")) == 3


def test_recomputing_stage_executables_keep_less_and_profile_apart():
    """A recomputing stage's executables run (forward keeps the units' inputs, backward rebuilds the rest), give
    the same gradients, keep less per micro-batch, and are profiled under their own cache key."""
    import jax
    import numpy as np

    from libarena.models import get_model
    from libarena.profile.stage import StageSpec, build_stage_executables, worker_view

    plain_spec = StageSpec("gpt__tiny", 1, 5, 4)
    remat_spec = StageSpec("gpt__tiny", 1, 5, 4, remat=True)
    assert worker_view(plain_spec).signature(get_model("gpt__tiny")) != worker_view(remat_spec).signature(get_model("gpt__tiny"))
    plain = build_stage_executables(plain_spec, with_optimizer=False)
    remat = build_stage_executables(remat_spec, with_optimizer=False)
    grads = [jax.device_get(e.run_microbatch()) for e in (plain, remat)]
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1]), strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-5, atol=1e-7)
    assert remat.memory["forward"]["output"] < 0.2 * plain.memory["forward"]["output"]


def test_a_stage_the_model_cannot_build_at_the_plans_sequence_length_is_a_one_line_error():
    """A plans file whose sequence length is past the model's positions (gpt__tiny has 32): the stage's view is
    an error naming the model, micro-batch and length, as arena-analyze names it, not an internal TypeError."""
    from libarena.profile.stage import StageSpec, worker_view

    with pytest.raises(ArenaError, match=r"gpt__tiny cannot be built at micro-batch 4, seq_len 1048576 \(units 0-2\)"):
        worker_view(StageSpec("gpt__tiny", 0, 2, 4, seq_len=1 << 20))
