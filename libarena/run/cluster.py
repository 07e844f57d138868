"""Running a training job on Ray: one actor per host, holding that host's devices, placed through a
placement group with one bundle per host, each asking for the host's GPUs of the job's type
(``{"GPU": d, "gpu_type:<type>": d}``; STRICT_SPREAD on a multi-node cluster, PACK on one node).

With several hosts the actors join one multi-process JAX runtime (``jax.distributed.initialize``;
actor 0 is the coordinator) and run the same executor over the global device list
(``libarena.run.distributed``); process 0 writes the checkpoints.

The driver advances the job one checkpoint interval at a time; when any actor dies (node failure, a
``ray.kill``) it stops the others, starts a new set, which resumes from the newest checkpoint: at most
one interval of completed steps is lost.

On a machine without GPUs the embedded local cluster declares the requested GPU type as a custom
resource and each actor presents host CPU devices as those GPUs
(``XLA_FLAGS=--xla_force_host_platform_device_count=d`` in the actor's environment).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlparse

from libarena.checks import Range, check_fields
from libarena.errors import ArenaError
from libarena.models.training import OptimizerConfig
from libarena.run.checkpoint import DEFAULT_CHECKPOINT_EVERY
from libarena.run.heap import heap_pages, huge_page_heap_env
from libarena.run.plan import RunPlan


def gpu_type_resource(gpu_type: str) -> str:
    return f"gpu_type:{gpu_type}"


@dataclass(frozen=True)
class LocalClusterConfig:
    """The embedded Ray cluster started when no ``--address`` is given."""

    num_cpus: int = 2
    #: Devices the local host presents as GPUs of ``gpu_type`` (host CPU devices on a machine without GPUs;
    #: 0: none, a cluster for CPU tasks such as simulations).
    num_devices: int = 8
    gpu_type: str = "a100"

    def __post_init__(self) -> None:
        check_fields(self, {"num_cpus": Range("num_cpus", 1, 4096, integer=True),
                            "num_devices": Range("--devices", 0, 4096, integer=True)})


@dataclass(frozen=True)
class JobSpec:
    """Everything a host actor needs to train (plain data: it crosses process boundaries)."""

    model: str
    plan: RunPlan
    global_batch: int
    steps: int
    checkpoint_dir: str
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY
    seed: int = 0
    data_seed: int = 0
    dtype: str = "fp32"
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    #: Present host CPU devices as the job's GPUs (the embedded cluster on a machine without accelerators; a joined
    #: cluster's nodes train on their GPUs: RunRequest.cpu_devices).
    cpu_devices: bool = True
    #: Hosts the job's devices are spread over (one actor each, ``plan.num_gpus / num_hosts`` devices per host).
    num_hosts: int = 1
    #: Extra XLA flags for the actors (e.g. tests lowering the backend optimisation level).
    extra_xla_flags: str = ""

    @property
    def devices_per_host(self) -> int:
        return self.plan.num_gpus // self.num_hosts


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
    with _own_signal_handlers():
        if address:
            _check_reachable(address)
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="error")
            except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ...
                raise ArenaError(f"cannot join the Ray cluster at {address}: {type(exc).__name__}: {exc}") from None
            return True
        resources = {gpu_type_resource(local.gpu_type): local.num_devices} if local.num_devices else None
        # address "local": a new embedded cluster, even where `ray start` recorded one (RAY_ADDRESS or
        # /tmp/ray/ray_current_cluster), which Ray would otherwise join and then refuse num_cpus / num_gpus for
        ray.init(address="local", num_cpus=local.num_cpus, num_gpus=local.num_devices, resources=resources,
                 include_dashboard=False, log_to_driver=False, logging_level="error")
        return True


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """Keep the process's SIGINT and SIGTERM handlers across ``ray.init``: Ray installs its own in the driver
    (SIGTERM exits with status 15 and a native stack dump), which would bypass the tools' interrupt path (one
    line, exit 2, temporary outputs removed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except SystemExit as exc:
        if exc.code == signal.SIGTERM:  # Ray's handler met a SIGTERM while Ray started: an interrupt
            raise KeyboardInterrupt from None
        raise
    finally:
        for signum, handler in saved.items():
            if handler is not None:
                signal.signal(signum, handler)


def ray_get(refs: Any, timeout: float | None = None) -> Any:
    """``ray.get``, with an ArenaError raised in a task or actor raised here as the same one line (Ray wraps it
    in a RayTaskError whose text is the remote traceback)."""
    import ray
    from ray.exceptions import RayTaskError

    try:
        return ray.get(refs, timeout=timeout)
    except RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, ArenaError):
            raise ArenaError(cause.message) from None
        raise


def largest_node_gpus(gpu_type: str) -> int:
    """The most GPUs of ``gpu_type`` one live node of the connected Ray cluster has."""
    import ray

    resource = gpu_type_resource(gpu_type)
    return int(max((n.get("Resources", {}).get(resource, 0) for n in ray.nodes() if n.get("Alive")), default=0))


def available_gpus(gpu_type: str) -> int:
    import ray

    return int(ray.cluster_resources().get(gpu_type_resource(gpu_type), 0))


class HostWorker:
    """The actor of one host: owns the host's devices and runs its process of the job (becomes a Ray
    actor class through ``ray.remote`` in :func:`_worker_class`)."""

    def __init__(self, spec: JobSpec, host_index: int):
        self.spec = spec
        self.host_index = host_index

    def pid(self) -> int:
        return os.getpid()

    def endpoints(self) -> tuple[str, int, int]:
        """(node IP, a free port for the coordinator, a free port for the cross-host transfer server)."""
        import ray

        from libarena.run.distributed import free_port

        ip = ray.util.get_node_ip_address()
        return ip, free_port(ip), free_port(ip)

    def join(self, group: Any) -> list[int]:
        """Join the job's multi-process JAX runtime; returns the global ids of this host's devices."""
        import jax

        from libarena.run.distributed import initialize

        initialize(group)
        local = jax.local_devices()
        if len(local) != self.spec.devices_per_host or len(jax.devices()) != self.spec.plan.num_gpus:
            raise ArenaError(f"host {self.host_index} sees {len(local)} of {len(jax.devices())} devices, "
                             f"expected {self.spec.devices_per_host} of {self.spec.plan.num_gpus}")
        return [d.id for d in local]

    def train_until(self, target_step: int) -> dict[str, Any]:
        from libarena.models import get_model
        from libarena.run.train import TrainConfig, train

        s = self.spec
        config = TrainConfig(
            global_batch=s.global_batch, steps=target_step, seed=s.seed, data_seed=s.data_seed, dtype=s.dtype,
            optimizer=s.optimizer, checkpoint_dir=s.checkpoint_dir, checkpoint_every=s.checkpoint_every,
        )
        # with what its process's heap runs on (started with huge_page_heap_env: see run_job)
        return {**train(get_model(s.model), s.plan, config).to_dict(), "heap": heap_pages()}


def ray_worker_env(cpu_devices: int | None, extra_xla_flags: str = "") -> dict[str, str]:
    """The environment a Ray worker of the job's (or the plan search's) is started with: ``cpu_devices`` host
    devices (None: the machine's accelerators, no XLA flags), this process's Ray auth mode, and its C heap on huge
    pages, as the profiler's and the measurement's children (libarena.run.heap)."""
    env: dict[str, str] = {}
    if cpu_devices is not None:
        env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={cpu_devices} {extra_xla_flags}".strip(), "JAX_PLATFORMS": "cpu"}
    env["RAY_AUTH_MODE"] = os.environ.get("RAY_AUTH_MODE", "disabled")
    return huge_page_heap_env(env)


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


#: How long a job's actors (and a search's) may take to start: placed, their process up, their imports done.
HOST_START_TIMEOUT_S = 120.0


def _single_node() -> bool:
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive")) <= 1


class _HostGroup:
    """The job's actors, one per placement-group bundle, joined into one JAX runtime when there are several."""

    def __init__(self, spec: JobSpec, group: Any, bundle: dict[str, float], env: dict[str, str], start_timeout_s: float):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        d = spec.devices_per_host
        resources = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
        self.actors = [
            _worker_class().options(
                num_cpus=bundle["CPU"], num_gpus=d, resources=resources, runtime_env={"env_vars": env},
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=h),
            ).remote(spec, h)
            for h in range(spec.num_hosts)
        ]
        self.coordinator = ""
        # Any failure while the group forms kills every actor it started: one left blocked in the JAX runtime's
        # join would hold its bundle's GPUs while the restart's actor waits for them.
        try:
            self._form(spec, start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _form(self, spec: JobSpec, start_timeout_s: float) -> None:
        # each actor answers within the start timeout: after a node is lost, a bundle that no other node can hold
        # waits to be rescheduled and its actor never starts (a restart would wait on it forever)
        ray_get([a.pid.remote() for a in self.actors], timeout=start_timeout_s)
        if spec.num_hosts > 1:
            from libarena.run.distributed import ProcessGroup

            ends = ray_get([a.endpoints.remote() for a in self.actors], timeout=start_timeout_s)
            # Actor 0 (bundle 0) hosts the coordination service; every actor runs a transfer server.
            self.coordinator = f"{ends[0][0]}:{ends[0][1]}"
            groups = [ProcessGroup(self.coordinator, spec.num_hosts, h, f"{ip}:{port}", int(start_timeout_s))
                      for h, (ip, _, port) in enumerate(ends)]
            ray_get([a.join.remote(g) for a, g in zip(self.actors, groups)], timeout=start_timeout_s)

    def run(self, target: int) -> list[Any]:
        """Submit ``train_until(target)`` to every actor (they run the same steps in lockstep)."""
        return [a.train_until.remote(target) for a in self.actors]

    @staticmethod
    def wait(refs: list[Any]) -> list[dict[str, Any]]:
        """Every actor's result; raises RayActorError as soon as any actor dies (the others may be blocked
        in a collective with it, so waiting on them in order could hang)."""
        import ray

        pending, results = list(refs), {}
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for r in ready:
                results[r] = ray_get(r)
        return [results[r] for r in refs]

    def stop(self) -> None:
        import ray

        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass


def _usable_step(store: Any, spec: JobSpec) -> int:
    """The step the job resumes from: its newest usable checkpoint's (a corrupt newer one is skipped)."""
    from libarena.models import get_model

    meta, _ = store.newest_usable(get_model(spec.model), spec.global_batch, spec.data_seed, spec.optimizer, dtype=spec.dtype)
    return 0 if meta is None else meta.step


def run_job(spec: JobSpec, max_restarts: int = 3, on_dispatch: Callable[[int, list[Any]], None] | None = None,
            start_timeout_s: float = HOST_START_TIMEOUT_S, strategy: str | None = None) -> JobReport:
    """Run ``spec`` on the connected Ray cluster, one actor per host; ``on_dispatch(chunk_index, actors)``
    is called right after each chunk is submitted (tests use it to kill an actor mid-chunk).
    ``strategy``: the placement group's; default STRICT_SPREAD on a multi-node cluster, PACK on one node."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError
    from ray.util.placement_group import placement_group, remove_placement_group

    from libarena.run.checkpoint import CheckpointStore

    t0 = time.perf_counter()
    plan = spec.plan
    n = plan.num_gpus
    if spec.num_hosts < 1 or n % spec.num_hosts:
        raise ArenaError(f"plan {plan.plan_id}'s {n} GPUs do not split evenly over {spec.num_hosts} hosts")
    resource = gpu_type_resource(plan.gpu_type)
    have = available_gpus(plan.gpu_type)
    if have < n:
        raise ArenaError(f"plan {plan.plan_id} needs {n} {plan.gpu_type} GPUs but the Ray cluster has {have}")
    d = spec.devices_per_host
    bundle = {"CPU": 1, "GPU": d, resource: d}
    if strategy is None:
        strategy = "PACK" if spec.num_hosts == 1 or _single_node() else "STRICT_SPREAD"
    group = placement_group([dict(bundle) for _ in range(spec.num_hosts)], strategy=strategy)
    try:
        ray.get(group.ready(), timeout=start_timeout_s)
        env = ray_worker_env(d if spec.cpu_devices else None, spec.extra_xla_flags)
        store = CheckpointStore(spec.checkpoint_dir)
    except GetTimeoutError:
        remove_placement_group(group)
        raise ArenaError(f"the Ray cluster could not place {spec.num_hosts} x {bundle} ({strategy}) within {start_timeout_s:.0f} s") from None
    except BaseException:  # a refused job (or an interrupt) leaves no placement group holding its GPUs
        remove_placement_group(group)
        raise

    hosts: _HostGroup | None = None
    restarts = 0
    chunks: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    history: dict[int, float] = {}
    chunk_index = 0
    try:
        done = _usable_step(store, spec)
        while done < spec.steps:
            every = spec.checkpoint_every if spec.checkpoint_every > 0 else spec.steps
            target = min(spec.steps, (done // every + 1) * every)
            try:
                if hosts is None:
                    hosts = _HostGroup(spec, group, bundle, env, start_timeout_s)
                refs = hosts.run(target)
                if on_dispatch is not None:
                    on_dispatch(chunk_index, hosts.actors)
                chunk_index += 1
                results = hosts.wait(refs)
            except (RayActorError, GetTimeoutError) as exc:
                restarts += 1
                resumed = _usable_step(store, spec)
                failures.append({"while_running_to": target, "resume_from": resumed, "error": type(exc).__name__})
                if hosts is not None:
                    hosts.stop()
                    hosts = None
                if restarts > max_restarts:
                    raise ArenaError(f"job {plan.plan_id} failed {restarts} times; last checkpoint at step {resumed}") from None
                done = resumed
                continue
            result = results[0]  # process 0's report (every process saw the same losses)
            for step, loss in result["losses"]:
                history[int(step)] = float(loss)
            chunks.append({k: result[k] for k in ("start_step", "end_step", "resumed_from", "skipped_checkpoints", "steady_step_time_s", "stage_time_s",
                                                   "stage_peak_memory_bytes", "checkpoints", "wall_s", "heap")})
            done = int(result["end_step"])
    finally:
        if hosts is not None:
            hosts.stop()
        remove_placement_group(group)
        store.close()
    return JobReport(
        completed_steps=done, restarts=restarts, losses=sorted(history.items()), chunks=chunks, failures=failures,
        wall_s=time.perf_counter() - t0,
        placement={"bundles": [dict(bundle) for _ in range(spec.num_hosts)], "strategy": strategy, "gpu_type": plan.gpu_type,
                   "num_hosts": spec.num_hosts, "devices_per_host": d},
    )
