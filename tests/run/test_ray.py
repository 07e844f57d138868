"""The job on Ray: one actor per host holding that host's devices (GPU type as a Ray resource, one
placement-group bundle per host), the actors joined into one multi-process JAX runtime; killing an
actor mid-run restarts the job from its last checkpoint without losing more steps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from libarena.models import get_model
from libarena.run.plan import simple_plan

pytestmark = [pytest.mark.ray, pytest.mark.slow]

#: The test machine's cluster: 4 host CPU devices presented as A100s.
NUM_DEVICES = 4


@pytest.fixture(scope="module")
def local_ray():
    import ray

    from libarena.run.cluster import LocalClusterConfig, connect

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = connect(None, LocalClusterConfig(num_cpus=2, num_devices=NUM_DEVICES, gpu_type="a100"))
    yield
    if started:
        ray.shutdown()


def test_two_host_job_survives_a_killed_coordinator(tmp_path: Path, local_ray) -> None:
    """2 hosts x 2 devices. Stage 1 spans both hosts (its gradient all-reduce crosses processes); the
    activations cross from host 0 to the spanning stage to host 1 and back. Host 0's actor (the JAX
    coordinator) is killed while steps 3-4 run: every actor is replaced, the job resumes from step 2,
    and the losses equal one uninterrupted single-device run."""
    import ray

    from libarena.run.cluster import JobSpec, available_gpus, run_job
    from libarena.run.train import TrainConfig, train

    assert available_gpus("a100") == NUM_DEVICES
    model = get_model("gpt__tiny")
    plan = simple_plan(model, 8, [0, 2, 4], [1, 2, 1], [1, 1, 1], 2, gpu_type="a100")  # devices: [h0d0] [h0d1 h1d0] [h1d1]
    spec = JobSpec(model.name, plan, 8, 4, str(tmp_path / "ckpt"), checkpoint_every=2, num_hosts=2,
                   extra_xla_flags="--xla_backend_optimization_level=0")
    killed = []

    def kill_coordinator_in_second_chunk(chunk: int, actors) -> None:
        assert len(actors) == 2
        if chunk == 1:  # steps 3-4 in flight; the checkpoint of step 2 exists
            ray.kill(actors[0], no_restart=True)
            killed.append(chunk)

    report = run_job(spec, on_dispatch=kill_coordinator_in_second_chunk)
    assert killed == [1]
    assert report.restarts == 1 and report.completed_steps == 4
    assert report.failures[0]["resume_from"] == 2  # lost at most one checkpoint interval
    assert [s for s, _ in report.losses] == [1, 2, 3, 4]
    assert report.placement["num_hosts"] == 2 and report.placement["strategy"] == "PACK"
    assert [b["gpu_type:a100"] for b in report.placement["bundles"]] == [2, 2]
    # Every stage was measured, including the ones living on host 1 only.
    assert all(m > 0 for m in report.chunks[0]["stage_peak_memory_bytes"]) and len(report.chunks[0]["stage_time_s"]) == 3
    # the workers were started with their C heap on huge pages (libarena.run.heap), as the profiler's children
    assert "glibc.malloc.hugetlb=1" in report.chunks[0]["heap"]["glibc_tunables"].split(":")

    reference = train(model, simple_plan(model, 8, [0], [1], [1], 2), TrainConfig(8, 4, profile_step=0))
    for (step, loss), (ref_step, ref_loss) in zip(report.losses, reference.losses):
        assert step == ref_step and loss == pytest.approx(ref_loss, rel=1e-5)


def test_job_larger_than_the_cluster_or_uneven_hosts(tmp_path: Path, local_ray) -> None:
    from libarena.errors import ArenaError
    from libarena.run.cluster import JobSpec, run_job

    model = get_model("gpt__tiny")
    big = simple_plan(model, 8, [0], [8], [1], 1, gpu_type="a100")
    with pytest.raises(ArenaError, match=f"needs 8 a100 GPUs but the Ray cluster has {NUM_DEVICES}"):
        run_job(JobSpec(model.name, big, 8, 2, str(tmp_path / "big")))
    uneven = simple_plan(model, 8, [0], [2], [1], 1, gpu_type="a100")
    with pytest.raises(ArenaError, match="do not split evenly over 4 hosts"):
        run_job(JobSpec(model.name, uneven, 8, 2, str(tmp_path / "uneven"), num_hosts=4))
    assert not (tmp_path / "big").exists() and not (tmp_path / "uneven").exists()


def test_an_error_in_a_task_is_one_line_and_a_refused_job_leaves_no_placement_group(tmp_path: Path, local_ray) -> None:
    """An ArenaError raised on a worker reaches the driver as itself (Ray wraps it in a RayTaskError whose text
    is the remote traceback); a job refused after its GPUs were reserved (another job's checkpoint in its
    directory) gives the reservation back."""
    import ray
    from ray.util import placement_group_table

    from libarena.errors import ArenaError
    from libarena.run.cluster import JobSpec, ray_get, run_job
    from libarena.run.train import TrainConfig, train

    @ray.remote(num_cpus=0)
    def refuse() -> None:
        raise ArenaError("the job's input is bad")

    with pytest.raises(ArenaError) as caught:
        ray_get(refuse.remote())
    assert type(caught.value) is ArenaError and str(caught.value) == "the job's input is bad"

    model = get_model("gpt__tiny")
    other_batch = tmp_path / "ckpt"
    train(model, simple_plan(model, 4, [0], [1], [1], 1), TrainConfig(4, 1, checkpoint_dir=str(other_batch)))
    plan = simple_plan(model, 8, [0], [1], [1], 1, gpu_type="a100")
    with pytest.raises(ArenaError, match="global batch 4, not 8"):
        run_job(JobSpec(model.name, plan, 8, 2, str(other_batch)))
    assert all(group["state"] == "REMOVED" for group in placement_group_table().values())
    # refused before its checkpoint store could be opened (its directory is a file): the group goes too
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("x")
    with pytest.raises(ArenaError, match="is not a directory"):
        run_job(JobSpec(model.name, plan, 8, 2, str(not_a_directory)))
    assert all(group["state"] == "REMOVED" for group in placement_group_table().values())


def test_a_restart_whose_actor_never_starts_fails_the_job_instead_of_hanging(tmp_path: Path, local_ray, monkeypatch) -> None:
    """After a node loss, a bundle that no live node can hold keeps the restarted host's actor pending for ever;
    a one-host job waited on it with no bound (fixed in 801c375). The loss is stood in for on one node: as the
    first chunk runs, the host's actor is killed and a squatter takes its bundle's GPUs, so no replacement can
    start. Each start is waited for within the start timeout and counted as a restart, and the job fails."""
    import contextlib
    import importlib
    import threading

    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from libarena.errors import ArenaError
    from libarena.run.cluster import JobSpec, run_job

    # ray.util re-exports the function under the module's name: patch the module, which run_job imports from
    pg_module = importlib.import_module("ray.util.placement_group")
    groups, real = [], pg_module.placement_group

    def recording(*args, **kwargs):
        groups.append(real(*args, **kwargs))
        return groups[-1]

    monkeypatch.setattr(pg_module, "placement_group", recording)

    @ray.remote(num_cpus=0)
    class Squatter:
        def ready(self) -> bool:
            return True

    squatters = []

    def lose_the_host(chunk: int, actors) -> None:
        if chunk != 0:
            return
        squatter = Squatter.options(num_gpus=2, scheduling_strategy=PlacementGroupSchedulingStrategy(
            groups[0], placement_group_bundle_index=0)).remote()  # pending while the host's actor holds the GPUs
        squatters.append(squatter)
        ray.kill(actors[0], no_restart=True)  # the host is lost ...
        ray.get(squatter.ready.remote(), timeout=60)  # ... and its bundle's GPUs are taken

    model = get_model("gpt__tiny")
    plan = simple_plan(model, 8, [0], [2], [1], 1, gpu_type="a100")  # one host, 2 devices
    spec = JobSpec(model.name, plan, 8, 2, str(tmp_path / "ckpt"), checkpoint_every=2,
                   extra_xla_flags="--xla_backend_optimization_level=0")
    outcome: dict = {}

    def job() -> None:
        try:
            outcome["report"] = run_job(spec, max_restarts=1, on_dispatch=lose_the_host, start_timeout_s=20)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            outcome["error"] = exc

    runner = threading.Thread(target=job, daemon=True)
    runner.start()
    runner.join(timeout=240)
    hung = runner.is_alive()
    for squatter in squatters:  # frees the bundle, so a hung job goes on and leaves the module's cluster usable
        with contextlib.suppress(Exception):
            ray.kill(squatter, no_restart=True)
    if hung:
        runner.join(timeout=300)
    assert not hung, "run_job waited for ever on a host actor that could never start"
    assert isinstance(outcome.get("error"), ArenaError), outcome
    assert "failed 2 times" in str(outcome["error"])


def test_a_search_whose_node_is_gone_is_refused_within_the_start_timeout(local_ray, monkeypatch) -> None:
    """The search's node was counted when arena-run started, and is lost before the search's process is placed:
    Ray would keep it pending for ever, so its start is waited for within the start timeout, in one line."""
    from libarena.errors import ArenaError
    from libarena.run import cluster
    from libarena.run.api import RunRequest, _search_on_ray

    monkeypatch.setattr(cluster, "largest_node_gpus", lambda gpu_type: 8)  # as counted before the loss
    request = RunRequest("p.parquet", "gpt__tiny", 8, 1, "ckpt", selection="pruned")
    with pytest.raises(ArenaError, match=r"no node started the search \(8 a100 GPUs in one process\) within 10 s"):
        _search_on_ray(request, "a100", 8, start_timeout_s=10)
