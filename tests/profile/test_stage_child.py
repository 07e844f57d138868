"""Stages built and timed in a fresh child of their own (ProfileConfig.isolation = "child",
libarena.profile.stage_child), on gpt__tiny's one-device plans."""

from __future__ import annotations

import pytest

from libarena.errors import ArenaError
from libarena.plan import read_plans

from tests.profile.stage_costs import check_stage_costs

MODEL = "gpt__tiny"
BATCH = 8


@pytest.fixture(scope="module")
def plans_path(tmp_path_factory):
    from libarena.profile.local_plans import enumerate_grid_plans, model_clusters, write_plans_table

    path = tmp_path_factory.mktemp("plans") / "plans.parquet"
    write_plans_table(str(path), MODEL, BATCH, enumerate_grid_plans(MODEL, BATCH, 1, "cpu", 2),
                      model_clusters(MODEL, BATCH, num_clusters=2))
    return path


def test_a_stage_profiled_in_a_child_has_the_in_process_records_identity_and_sizes(plans_path):
    from libarena.profile import resolve_device
    from libarena.profile.profiler import ProfiledJob, StageSession
    from libarena.profile.stage_child import StageChildren
    from libarena.profile.timers import HostTimer

    planset = read_plans(plans_path, require_costs=False)
    job = ProfiledJob.of(planset)
    spec = job.stage_specs(next(p for p in planset.plans() if p.pipeline_degree == 1))[0]
    session = StageSession(resolve_device("local"), HostTimer())
    session.time(spec, 1, 3)
    here = session.record(spec)
    with StageChildren("host") as children:
        children.time(spec, 1, 3)
        children.time(spec, 0, 2)
        there, first_turn = children.record(spec), children.record(spec, 0)
        with pytest.raises(ArenaError, match="no timed chunk 2"):
            children.record(spec, 2)
    # the same stage: the key plans and co-run timings look it up by, and what it holds and moves
    for field in ("key", "spec", "local_batch", "optimizer_key", "state_bytes", "param_bytes", "activation_out_bytes", "cost"):
        assert there[field] == here[field], field
    assert len(there["microbatch"]["samples_s"]) == 5 and len(first_turn["microbatch"]["samples_s"]) == 3
    assert all(t > 0 for t in there["microbatch"]["samples_s"] + there["optimizer"]["samples_s"])
    # the child's start and build are the stage's device time
    assert there["device_s"] > there["compile_s"] > 0
    with pytest.raises(ArenaError, match="not been timed"):
        StageChildren("host").record(spec)
    # a child under a layout's XLA flags keys the stage as this process does (its own cache keys hold its flags)
    from libarena.profile.host import XLA_THREADING

    with StageChildren("host", threading=XLA_THREADING.get("eigen-single")) as flagged:
        flagged.time(spec, 0, 2)
        record = flagged.record(spec)
    assert (record["key"], record["optimizer_key"]) == (here["key"], here["optimizer_key"])


def test_profiling_with_child_isolation_caches_apart_from_the_in_process_profile(plans_path, tmp_path):
    from libarena.profile import ProfileConfig, profile_plans

    planset = read_plans(plans_path, require_costs=False)

    def run(isolation: str):
        return profile_plans(planset, ProfileConfig(cache_dir=tmp_path, warmup=1, repeats=3, isolation=isolation))

    first = run("child")
    s = first.summary
    assert s["stages_profiled"] >= 1 and s["stages_skipped"] == s["stages_needed"] - s["stages_profiled"]
    check_stage_costs(s)  # the child's timed runs are counted as in process; its start is in the fixed rest
    rows = first.table.to_pylist()
    assert sorted(r["view"] for r in rows) == ["ap", "arena", "dp"]
    assert all(r["iter_time_s"] > 0 and r["profiling_cost_device_s"] >= 0 for r in rows)
    assert any(r["profiling_cost_device_s"] > 0 for r in rows)
    again = run("child")
    assert again.summary["stages_profiled"] == 0
    assert [r["iter_time_s"] for r in again.table.to_pylist()] == [r["iter_time_s"] for r in rows]
    # a one-device plan's stage is timed as the runtime runs it (its inputs and update inside)
    assert all(st["timed_as_spmd"] and st["setup_s"] > 0 and st["optimizer_s"] > 0 for e in first.estimates for st in e.stages)
    # an in-process profile is not served from the child's records (nor the other way round); its one-device
    # plans' stages are timed as the runtime's too (in a co-run child shared by the run's stages)
    in_process = run("process")
    assert in_process.summary["stages_profiled"] == s["stages_profiled"]
    assert all(st["timed_as_spmd"] for e in in_process.estimates for st in e.stages)


@pytest.mark.parametrize("fields, message", [({"isolation": "thread"}, "unknown stage isolation 'thread'"),
                                             ({"isolation": "child", "granularity": "unit"}, "needs granularity 'stage'")])
def test_bad_isolation_settings_are_one_line_errors(fields, message):
    from libarena.profile import ProfileConfig

    with pytest.raises(ArenaError, match=message):
        ProfileConfig(**fields)


@pytest.mark.multidevice
def test_child_isolation_times_each_co_run_stage_in_a_child_of_its_own(monkeypatch, tmp_path):
    from libarena.profile import corun
    from libarena.profile.cache import ProfileCache
    from libarena.profile.host import XLA_THREADING
    from libarena.profile.stage import StageSpec

    started = []

    class CountedSession(corun.CoRunSession):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(corun, "CoRunSession", CountedSession)
    first, second = StageSpec(MODEL, 0, 3, 2), StageSpec(MODEL, 3, 6, 2)
    items = {("first-key", first): first, ("second-key", second): second}
    cache = ProfileCache(tmp_path)

    def run(chosen, fresh_child):
        return corun.profile_corun(chosen, 2, XLA_THREADING.get("eigen-single"), cache, warmup=1, repeats=2,
                                   statistic="median", burst=2, fresh_child=fresh_child)

    timings, spent = run(items, True)
    assert len(started) == 2 and spent > 0  # one child per stage
    assert set(timings) == set(items) and all(t.alone_s > 0 and t.together_s > 0 for t in timings.values())
    again, spent_again = run(items, True)
    assert spent_again == 0 and len(started) == 2 and again == timings  # from the cache
    # records timed in one shared child are kept apart from those timed in a child of their own
    _, spent_shared = run(items, False)
    assert spent_shared > 0 and len(started) == 3


def test_a_gpu_stage_child_sees_only_the_gpu_it_profiles(monkeypatch):
    """``--device gpu:1 --isolation child`` timed every stage on GPU 0: the child resolved its default device and
    saw every GPU. It now runs with CUDA_VISIBLE_DEVICES naming the profiled GPU alone (mapped through this
    process's own list), and the parent keys its records by that device."""
    from libarena.profile import profiler, stage_child, subprocess_devices
    from libarena.profile.device import LocalDevice
    from libarena.profile.stage import StageSpec
    from libarena.profile.subprocess_devices import device_env, visible_device
    from libarena.profile.timers import HostTimer

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert device_env("gpu", 1, device_index=1).env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in device_env("gpu", 1).env  # (the comm benchmark's children see every GPU)
    assert "CUDA_VISIBLE_DEVICES" not in device_env("cpu", 1, device_index=1).env
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert device_env("gpu", 1, device_index=1).env["CUDA_VISIBLE_DEVICES"] == "3"
    assert visible_device("GPU-5f1c,GPU-77aa", 0) == "GPU-5f1c" and visible_device("", 4) == "4"
    with pytest.raises(ArenaError, match=r"GPU 2 is not among this process's visible devices \(CUDA_VISIBLE_DEVICES=2, 3\)"):
        device_env("gpu", 1, device_index=2)

    seen = []

    class Started(Exception):
        pass

    def fake_env(platform, num_devices, threading=None, device_index=None):
        seen.append((platform, num_devices, device_index))
        raise Started

    monkeypatch.setattr(subprocess_devices, "device_env", fake_env)
    spec = StageSpec(MODEL, 0, 1, BATCH)
    gpu1 = LocalDevice(None, "gpu:1", "gpu", "NVIDIA H100 80GB HBM3", "h100", 80e9)
    with pytest.raises(Started):
        profiler.profile_stage_in_child(spec, gpu1, HostTimer(), None, 0, 1, 0, 4)
    with pytest.raises(Started):
        stage_child.StageChild(spec, "host", device="cpu:1")
    assert seen == [("gpu", 1, 1), ("cpu", 1, None)]
