"""Running a training job on Ray: one actor per host, holding that host's devices, placed through a
placement group whose bundles ask for GPUs of the job's type (``{"GPU": n, "gpu_type:<type>": n}``).

The driver advances the job one checkpoint interval at a time; when an actor dies (node failure, a
``ray.kill``) it starts a new one, which resumes from the newest checkpoint: at most one interval of
completed steps is lost.

On a machine without GPUs the embedded local cluster declares the requested GPU type as a custom
resource and each actor presents host CPU devices as those GPUs
(``XLA_FLAGS=--xla_force_host_platform_device_count=n`` in the actor's environment).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlparse

from libarena.errors import ArenaError
from libarena.models.training import OptimizerConfig
from libarena.run.plan import RunPlan, RunStage


def gpu_type_resource(gpu_type: str) -> str:
    return f"gpu_type:{gpu_type}"


@dataclass(frozen=True)
class LocalClusterConfig:
    """The embedded Ray cluster started when no ``--address`` is given."""

    num_cpus: int = 2
    #: Devices the local host presents as GPUs of ``gpu_type`` (host CPU devices on a machine without GPUs).
    num_devices: int = 8
    gpu_type: str = "a100"


@dataclass(frozen=True)
class JobSpec:
    """Everything a host actor needs to train (plain data: it crosses process boundaries)."""

    model: str
    plan: RunPlan
    global_batch: int
    steps: int
    checkpoint_dir: str
    checkpoint_every: int = 10
    seed: int = 0
    data_seed: int = 0
    dtype: str = "fp32"
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    #: Present host CPU devices as the job's GPUs (no accelerator on the host).
    cpu_devices: bool = True


def _check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """Fail fast (one line) on an address nobody listens at, instead of Ray's long connection retries."""
    if address in ("auto", "local"):
        return
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    host, port = parsed.hostname, parsed.port
    if not host or not port:
        raise ArenaError(f"Ray address {address!r} is not host:port or ray://host:port")
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ArenaError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from None


def connect(address: str | None, local: LocalClusterConfig) -> bool:
    """Join the cluster at ``address`` or start the embedded local one. Returns True when this call
    started Ray (the caller shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # the embedded cluster is local to this user
    if address:
        _check_reachable(address)
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="error")
        except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ...
            raise ArenaError(f"cannot join the Ray cluster at {address}: {type(exc).__name__}: {exc}") from None
        return True
    ray.init(
        num_cpus=local.num_cpus, num_gpus=local.num_devices, resources={gpu_type_resource(local.gpu_type): local.num_devices},
        include_dashboard=False, log_to_driver=False, logging_level="error",
    )
    return True


def available_gpus(gpu_type: str) -> int:
    import ray

    return int(ray.cluster_resources().get(gpu_type_resource(gpu_type), 0))


class HostWorker:
    """The actor of one host: trains its share of the job on the host's devices (becomes a Ray actor
    class through ``ray.remote`` in :func:`_worker_class`)."""

    def __init__(self, spec: JobSpec):
        self.spec = spec

    def pid(self) -> int:
        return os.getpid()

    def train_until(self, target_step: int) -> dict[str, Any]:
        from libarena.models import get_model
        from libarena.run.train import TrainConfig, train

        s = self.spec
        config = TrainConfig(
            global_batch=s.global_batch, steps=target_step, seed=s.seed, data_seed=s.data_seed, dtype=s.dtype,
            optimizer=s.optimizer, checkpoint_dir=s.checkpoint_dir, checkpoint_every=s.checkpoint_every,
        )
        return train(get_model(s.model), s.plan, config).to_dict()


_WORKER_CLASS: Any = None


def _worker_class() -> Any:
    global _WORKER_CLASS
    if _WORKER_CLASS is None:
        import ray

        _WORKER_CLASS = ray.remote(max_restarts=0, max_task_retries=0)(HostWorker)
    return _WORKER_CLASS


@dataclass
class JobReport:
    completed_steps: int
    restarts: int
    #: (step, loss) of every completed step, in order (steps re-run after a restart replace lost ones).
    losses: list[tuple[int, float]]
    chunks: list[dict[str, Any]]
    #: Steps that were run but lost to a failure (completed after the last checkpoint before it).
    failures: list[dict[str, Any]]
    wall_s: float
    placement: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_job(spec: JobSpec, max_restarts: int = 3, on_dispatch: Callable[[int, Any], None] | None = None,
            start_timeout_s: float = 120.0) -> JobReport:
    """Run ``spec`` on the connected Ray cluster; ``on_dispatch(chunk_index, actor)`` is called right
    after each chunk is submitted (tests use it to kill the actor mid-chunk)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from libarena.run.checkpoint import CheckpointStore

    t0 = time.perf_counter()
    plan = spec.plan
    n = plan.num_gpus
    resource = gpu_type_resource(plan.gpu_type)
    have = available_gpus(plan.gpu_type)
    if have < n:
        raise ArenaError(f"plan {plan.plan_id} needs {n} {plan.gpu_type} GPUs but the Ray cluster has {have}")
    # One host actor holds all of the job's devices: a single JAX controller per host; grids spanning
    # several nodes would need one actor per node joined by jax.distributed (not done here).
    bundle = {"CPU": 1, "GPU": n, resource: n}
    group = placement_group([bundle], strategy="STRICT_PACK")
    try:
        ray.get(group.ready(), timeout=start_timeout_s)
    except GetTimeoutError:
        remove_placement_group(group)
        raise ArenaError(f"the Ray cluster could not place {bundle} within {start_timeout_s:.0f} s") from None
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={n}", "JAX_PLATFORMS": "cpu"} if spec.cpu_devices else {}
    env["RAY_AUTH_MODE"] = os.environ.get("RAY_AUTH_MODE", "disabled")

    def start_actor() -> Any:
        return _worker_class().options(
            num_cpus=1, num_gpus=n, resources={resource: n}, runtime_env={"env_vars": env},
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
        ).remote(spec)

    store = CheckpointStore(spec.checkpoint_dir)
    actor = start_actor()
    restarts = 0
    chunks: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    history: dict[int, float] = {}
    done = store.latest_step() or 0
    chunk_index = 0
    try:
        while done < spec.steps:
            every = spec.checkpoint_every if spec.checkpoint_every > 0 else spec.steps
            target = min(spec.steps, (done // every + 1) * every)
            ref = actor.train_until.remote(target)
            if on_dispatch is not None:
                on_dispatch(chunk_index, actor)
            chunk_index += 1
            try:
                result = ray.get(ref)
            except RayActorError as exc:
                restarts += 1
                resumed = store.latest_step() or 0
                failures.append({"while_running_to": target, "resume_from": resumed, "error": type(exc).__name__})
                if restarts > max_restarts:
                    raise ArenaError(f"job {plan.plan_id} failed {restarts} times; last checkpoint at step {resumed}") from None
                actor = start_actor()
                done = resumed
                continue
            for step, loss in result["losses"]:
                history[int(step)] = float(loss)
            chunks.append({k: result[k] for k in ("start_step", "end_step", "resumed_from", "steady_step_time_s", "stage_time_s",
                                                   "stage_peak_memory_bytes", "checkpoints", "wall_s")})
            done = int(result["end_step"])
    finally:
        try:
            ray.kill(actor)
        except Exception:  # noqa: BLE001 - already dead
            pass
        remove_placement_group(group)
    return JobReport(
        completed_steps=done, restarts=restarts, losses=sorted(history.items()), chunks=chunks, failures=failures,
        wall_s=time.perf_counter() - t0, placement={"bundles": [bundle], "strategy": "STRICT_PACK", "gpu_type": plan.gpu_type},
    )
