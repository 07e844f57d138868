"""The job on Ray: a host actor holding the devices (GPU type as a Ray resource, placement group);
killing the actor mid-run restarts the job from its last checkpoint without losing more steps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from libarena.models import get_model
from libarena.run.plan import simple_plan

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture()
def local_ray():
    import ray

    from libarena.run.cluster import LocalClusterConfig, connect

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = connect(None, LocalClusterConfig(num_cpus=2, num_devices=2, gpu_type="a100"))
    yield
    if started:
        ray.shutdown()


def test_killed_actor_restarts_from_last_checkpoint(tmp_path: Path, local_ray) -> None:
    import ray

    from libarena.errors import ArenaError
    from libarena.run.cluster import JobSpec, available_gpus, run_job
    from libarena.run.train import TrainConfig, train

    assert available_gpus("a100") == 2
    model = get_model("gpt__tiny")
    plan = simple_plan(model, 8, [0], [2], [1], 2, gpu_type="a100")
    spec = JobSpec(model.name, plan, 8, 6, str(tmp_path / "ckpt"), checkpoint_every=2)
    killed = []

    def kill_second_chunk(chunk: int, actor) -> None:
        if chunk == 1:  # steps 3-4 in flight; the checkpoint of step 2 exists
            ray.kill(actor, no_restart=True)
            killed.append(chunk)

    report = run_job(spec, on_dispatch=kill_second_chunk)
    assert killed == [1]
    assert report.restarts == 1 and report.completed_steps == 6
    assert report.failures[0]["resume_from"] == 2  # lost at most one checkpoint interval
    assert [s for s, _ in report.losses] == [1, 2, 3, 4, 5, 6]
    assert report.placement["bundles"][0]["gpu_type:a100"] == 2

    # The same 6 steps uninterrupted, in this process on one device: identical losses.
    reference = train(model, simple_plan(model, 8, [0], [1], [1], 2), TrainConfig(8, 6, profile_step=0))
    for (step, loss), (ref_step, ref_loss) in zip(report.losses, reference.losses):
        assert step == ref_step and loss == pytest.approx(ref_loss, rel=1e-5)

    # A plan larger than the cluster: one-line error before anything runs.
    big = simple_plan(model, 8, [0], [4], [1], 1, gpu_type="a100")
    with pytest.raises(ArenaError, match="needs 4 a100 GPUs but the Ray cluster has 2"):
        run_job(JobSpec(model.name, big, 8, 2, str(tmp_path / "other")))
