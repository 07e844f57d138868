"""arena-run's library entry point: plans file + grid -> chosen plan (proxy, a plan id, or a pruned/full
search) -> checkpointed training, in-process or on Ray."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libarena.checks import MAX_BATCH, MAX_SEED, MAX_STEPS, Range, check_fields
from libarena.errors import ArenaError
from libarena.hardware import normalize_dtype
from libarena.models.training import OptimizerConfig
from libarena.run.checkpoint import DEFAULT_CHECKPOINT_EVERY
from libarena.run.cluster import JobSpec, LocalClusterConfig
from libarena.run.plan import RunPlan
from libarena.run.search import SearchConfig, SearchSpace

SELECTIONS = ("proxy", "pruned", "full")


@dataclass(frozen=True)
class GridSpec:
    gpu_type: str
    num_gpus: int
    pipeline_degree: int | None = None


def parse_grid(text: str) -> GridSpec:
    """'a100,8,2' -> (GPU type, GPU count, pipeline degree); the pipeline degree may be left out."""
    from libarena.hardware import get_gpu

    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) not in (2, 3) or not all(parts):
        raise ArenaError(f"--grid {text!r}: expected GPU_TYPE,NUM_GPUS[,PIPELINE_DEGREE], e.g. a100,8,2")
    try:
        numbers = [int(p) for p in parts[1:]]
    except ValueError:
        raise ArenaError(f"--grid {text!r}: GPU count and pipeline degree must be integers") from None
    if any(v < 1 for v in numbers):
        raise ArenaError(f"--grid {text!r}: GPU count and pipeline degree must be at least 1")
    return GridSpec(get_gpu(parts[0]).name, numbers[0], numbers[1] if len(numbers) > 1 else None)


def load_plans(path: str, model: str, global_batch: int) -> Any:
    """The plans artifact as an arena-plan PlanSet, checked against the job (its model, global batch and the
    sequence length the runtime trains at)."""
    from libarena.models import get_model
    from libarena.plan import read_plans

    planset = read_plans(path, require_costs=False)  # the runtime runs a plan's structure, not its estimates
    if planset.model_name != model:
        raise ArenaError(f"{path} holds plans for model {planset.model_name!r}, not {model!r}")
    if planset.global_batch != global_batch:
        raise ArenaError(f"{path} was planned for global batch {planset.global_batch}, not {global_batch}")
    definition = get_model(model)
    if planset.seq_len and definition.batch_shapes(1, planset.seq_len) != definition.batch_shapes(1, None):
        raise ArenaError(f"{path} was planned at sequence length {planset.seq_len}; the runtime trains {model} at its "
                         f"own: analyze it again without --seq-len")
    return planset


def run_dtype(request: RunRequest, planset: Any, checkpoint_dtype: str | None) -> tuple[str, str | None]:
    """The run's compute dtype and, where it is not the plans', why. A new job trains in the dtype its plans were
    analysed and priced in (another would hold other memory and take other times than its plan promised:
    refused), fp32 for plans that record none; a job resumed from a checkpoint keeps the checkpoint's dtype (a
    job checkpointed before arena-run followed its plans' dtype goes on as it was trained)."""
    planned = normalize_dtype(planset.dtype) if planset.dtype else "fp32"
    resumed = None if checkpoint_dtype is None else normalize_dtype(checkpoint_dtype)
    if request.dtype is not None and request.dtype not in (planned, resumed):
        raise ArenaError(f"{request.plans_path} was planned for {planned}, not --dtype {request.dtype}: leave --dtype out, "
                         f"or make plans in {request.dtype} (arena-analyze --dtype {request.dtype}, then arena-plan)")
    dtype = request.dtype or resumed or planned
    if dtype == planned:
        return dtype, None
    return dtype, (f"resuming in {dtype}, the dtype the checkpoint was trained in; the plans were priced in {planned} "
                   f"(their memory and times are for {planned})")


def select_plan(planset: Any, grid: GridSpec | None, plan_id: str | None) -> Any:
    """A ParallelPlan: ``plan_id`` if given, else the proxy plan of the grid."""
    if plan_id:
        try:
            plan = planset.plan(plan_id)
        except KeyError:
            raise ArenaError(f"no plan {plan_id!r} in the plans file") from None
        if grid is not None and (plan.grid.gpu_type, plan.grid.num_gpus) != (grid.gpu_type, grid.num_gpus):
            raise ArenaError(f"plan {plan_id} is for {plan.grid.gpu_type} x{plan.grid.num_gpus}, not the grid {grid.gpu_type} x{grid.num_gpus}")
        if grid is not None and grid.pipeline_degree is not None and plan.pipeline_degree != grid.pipeline_degree:
            raise ArenaError(f"plan {plan_id} has {plan.pipeline_degree} stages, not the grid's {grid.pipeline_degree}")
        return plan
    if grid is None:
        raise ArenaError("give --grid GPU_TYPE,NUM_GPUS,PIPELINE_DEGREE or --plan-id")
    if grid.pipeline_degree is None:
        raise ArenaError("--grid needs a pipeline degree (GPU_TYPE,NUM_GPUS,S) to run its proxy plan; or use --search")
    try:
        result = planset.grid(grid.gpu_type, grid.num_gpus, grid.pipeline_degree)
    except KeyError:
        raise ArenaError(f"the plans file has no grid {grid.gpu_type} x{grid.num_gpus} with {grid.pipeline_degree} stages") from None
    if not result.feasible:
        raise ArenaError(f"grid {result.grid.label} is infeasible: {result.infeasible_reason}")
    if result.proxy is None:  # a plans file written elsewhere need not mark one (is_proxy)
        raise ArenaError(f"grid {result.grid.label} has no proxy plan in the plans file: give --plan-id, or --search")
    return result.proxy


@dataclass(frozen=True)
class RunRequest:
    plans_path: str
    model: str
    global_batch: int
    steps: int
    checkpoint_dir: str
    grid: GridSpec | None = None
    plan_id: str | None = None
    #: "proxy" (zero search), "pruned" or "full" (runtime search before training).
    selection: str = "proxy"
    search: SearchConfig = field(default_factory=SearchConfig)
    #: Ray: None = embedded local cluster; "host:port" / "ray://host:port" joins one; use_ray=False runs in-process.
    address: str | None = None
    use_ray: bool = True
    local: LocalClusterConfig = field(default_factory=LocalClusterConfig)
    #: Hosts (Ray actors, one JAX process each) the job's devices are spread over; 0 = one on the embedded
    #: cluster, the nodes needed on a joined cluster (of its largest node of the GPU type).
    num_hosts: int = 0
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY
    seed: int = 0
    data_seed: int = 0
    #: the compute dtype; None: the plans file's (plans are priced for the dtype they were analysed in)
    dtype: str | None = None
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    #: train on host CPU devices standing in for the GPUs (None: on the embedded cluster, whose machine may have
    #: no accelerator; a joined cluster's nodes train on their GPUs)
    cpu_devices: bool | None = None

    @property
    def on_cpu_devices(self) -> bool:
        return self.cpu_devices if self.cpu_devices is not None else self.address is None

    def __post_init__(self) -> None:
        check_fields(self, {
            "global_batch": Range("--global-batch", 1, MAX_BATCH, integer=True),
            "steps": Range("--steps", 1, MAX_STEPS, integer=True),
            "num_hosts": Range("--hosts", 0, 4096, integer=True),
            "checkpoint_every": Range("--checkpoint-every", 0, MAX_STEPS, integer=True),
            "seed": Range("--seed", 0, MAX_SEED, integer=True),
            "data_seed": Range("--data-seed", 0, MAX_SEED, integer=True),
        })
        if self.selection not in SELECTIONS:
            raise ArenaError(f"--search: unknown selection {self.selection!r} (one of {', '.join(SELECTIONS)})")
        try:  # checked here, not first on a Ray worker; one spelling, the one a checkpoint records
            if self.dtype is not None:
                object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        except ArenaError as exc:
            raise ArenaError(f"--dtype: {exc}") from None
        if not self.use_ray and self.address:
            raise ArenaError("--no-ray runs in this process: drop --address")
        if not self.use_ray and self.num_hosts:
            raise ArenaError("--no-ray runs in this process, on one host: drop --hosts")
        if self.plan_id and self.selection != "proxy":
            raise ArenaError("--plan-id and --search exclude each other (the search chooses the plan)")
        if self.local.num_devices < 1:
            raise ArenaError(f"--devices: a run needs at least 1 device, got {self.local.num_devices}")
        # only the checkpoint directory itself is created: a mistyped parent is an error, not a new tree
        checkpoint_dir = Path(self.checkpoint_dir)
        if not checkpoint_dir.exists() and not checkpoint_dir.absolute().parent.is_dir():
            raise ArenaError(f"--checkpoint-dir {self.checkpoint_dir}: directory {checkpoint_dir.absolute().parent} "
                             f"does not exist (only the checkpoint directory itself is created)")


def ensure_host_devices(count: int) -> list[Any]:
    """This process's JAX devices, presenting ``count`` host CPU devices when JAX is not started yet and
    no accelerator is configured: XLA reads its flags once, at JAX's start, so this (a run's process, or the
    worker Ray started for it) is the one place that adds the device count to XLA_FLAGS."""
    if "jax" not in sys.modules:
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
    import jax

    return list(jax.devices())


def _prepare(request: RunRequest) -> tuple[Any, Any, GridSpec | None]:
    from libarena.models import get_model

    model = get_model(request.model)
    planset = load_plans(request.plans_path, request.model, request.global_batch)
    return model, planset, request.grid


def _check_checkpoint(request: RunRequest, model: Any, planset: Any) -> tuple[Any, list[dict[str, Any]], str, str | None]:
    """Validate the checkpoints before anything runs, in one read of --checkpoint-dir: the newest usable one (its
    metadata, None when there is none), the newer ones skipped (corrupt, empty) with why, and the run's compute
    dtype with its note (:func:`run_dtype`), which the checkpoint must have been trained in. A checkpoint of
    another job, or one already past --steps, is a one-line error and is left untouched."""
    from libarena.run.checkpoint import CheckpointStore
    from libarena.run.train import check_target

    store = CheckpointStore(request.checkpoint_dir)
    try:
        meta, skipped = store.newest_usable(model, request.global_batch, request.data_seed, request.optimizer)
        check_target(meta, request.steps, store)
        dtype, dtype_note = run_dtype(request, planset, None if meta is None else meta.dtype)
        if meta is not None:
            store.check_compatible(meta, model, request.global_batch, request.data_seed, request.optimizer, dtype)
    finally:
        store.close()
    return meta, skipped, dtype, dtype_note


def check_checkpoint_writable(directory: str) -> None:
    """A checkpoint directory that cannot be written fails the first save, after training up to it (after the
    whole run with --checkpoint-every 0): found before anything trains, by writing a probe file where the
    checkpoints will go (permissions do not show a read-only mount)."""
    from libarena.artifacts.io import creation_refused

    target = Path(directory)
    where = target if target.is_dir() else target.absolute().parent  # (a file there: CheckpointStore refuses it)
    refused = creation_refused(where, ".arena-run-probe-")
    if refused:
        raise ArenaError(f"--checkpoint-dir {directory}: cannot write in {where} ({refused})")


def run(request: RunRequest) -> dict[str, Any]:
    """Choose the plan and train; returns the run report (JSON-able)."""
    from libarena.run.cluster import available_gpus, connect, largest_node_gpus, run_job
    from libarena.run.search import full_search, measure_in_process, pruned_search, runnable_plan

    if not request.use_ray:
        ensure_host_devices(request.local.num_devices)  # before anything imports JAX
    model, planset, grid = _prepare(request)
    newest, skipped, dtype, dtype_note = _check_checkpoint(request, model, planset)
    request = dataclasses.replace(request, dtype=dtype)
    resumed_from = None if newest is None else newest.step
    searching = request.selection in ("pruned", "full")
    if searching and grid is None:
        raise ArenaError("--search needs --grid GPU_TYPE,NUM_GPUS[,S]: the allocated resources")
    chosen = None if searching else RunPlan.from_plan(runnable_plan(select_plan(planset, grid, request.plan_id), request.global_batch),
                                                      planset.layout, model)
    gpu_type = chosen.gpu_type if chosen else grid.gpu_type
    need = chosen.num_gpus if chosen else grid.num_gpus
    started_ray = False
    report: dict[str, Any] = {"model": model.name, "global_batch": request.global_batch, "selection": request.selection,
                              "steps": request.steps, "dtype": request.dtype, "resumed_from": resumed_from,
                              "skipped_checkpoints": skipped}
    if dtype_note:
        report["dtype_note"] = dtype_note
    if resumed_from is not None and resumed_from >= request.steps:
        # the job is done: no Ray, no search (rerunning a finished job's command, as a restarted scheduler may,
        # costs nothing); a plan only where it was given, not searched for
        report["plan"] = None if chosen is None else chosen.describe()
        return report
    check_checkpoint_writable(request.checkpoint_dir)
    try:
        if request.use_ray:
            hosts = job_hosts(request, gpu_type, need if chosen else None)
            local = LocalClusterConfig(max(request.local.num_cpus, hosts), request.local.num_devices, gpu_type)
            started_ray = connect(request.address, local)
            have = available_gpus(gpu_type)
            if need > have:
                raise ArenaError(f"the job needs {need} {gpu_type} GPUs but the Ray cluster has {have}")
        elif need > request.local.num_devices:
            raise ArenaError(f"the job needs {need} {gpu_type} GPUs but only {request.local.num_devices} devices exist")
        if searching:
            space_devices = None if request.use_ray else ensure_host_devices(request.local.num_devices)
            if request.use_ray:
                result = _search_on_ray(request, gpu_type, need)
            else:
                space = SearchSpace(model, request.global_batch, gpu_type, need, tuple(planset.clusters), request.dtype)
                measure = measure_in_process(model, request.search, request.dtype, space_devices)
                if request.selection == "full":
                    result = full_search(space, measure, request.search)
                else:
                    result = pruned_search(space, planset, measure, request.search, grid.pipeline_degree)
            chosen = result.best.plan
            report["search"] = result.to_dict()
        report["plan"] = chosen.describe()
        if request.use_ray:
            spec = JobSpec(model.name, chosen, request.global_batch, request.steps, os.path.abspath(request.checkpoint_dir),
                           request.checkpoint_every, request.seed, request.data_seed, request.dtype, request.optimizer,
                           cpu_devices=request.on_cpu_devices,
                           num_hosts=job_hosts(request, gpu_type, chosen.num_gpus,
                                               largest_node_gpus(gpu_type) if request.address is not None else None))
            report["job"] = run_job(spec).to_dict()
            chunks = report["job"]["chunks"]
            if chunks:  # where training really resumed (a checkpoint may fail to restore and be skipped)
                report["resumed_from"] = chunks[0]["resumed_from"]
        else:
            from libarena.run.train import TrainConfig, train

            devices = ensure_host_devices(request.local.num_devices)
            if len(devices) < chosen.num_gpus:
                raise ArenaError(f"plan {chosen.plan_id} needs {chosen.num_gpus} devices but this process has {len(devices)}")
            config = TrainConfig(request.global_batch, request.steps, request.seed, request.data_seed, request.dtype, request.optimizer,
                                 request.checkpoint_dir, request.checkpoint_every)
            report["train"] = train(model, chosen, config, devices).to_dict()
            report["resumed_from"] = report["train"]["resumed_from"]
    finally:
        if started_ray:
            import ray

            ray.shutdown()
    return report


def job_hosts(request: RunRequest, gpu_type: str, num_gpus: int | None, per_node: int | None = None) -> int:
    """Hosts (actors) of the job: ``--hosts``, else 1 on the embedded cluster, else the nodes the GPUs fill,
    of ``per_node`` GPUs (the joined cluster's largest node of the type; the catalogue's default size when not
    known yet)."""
    from libarena.hardware import get_gpu

    if num_gpus is None:
        return max(1, request.num_hosts)
    hosts = request.num_hosts
    if hosts == 0:
        per_node = per_node if per_node and per_node > 0 else get_gpu(gpu_type).default_gpus_per_node
        hosts = 1 if request.address is None or num_gpus <= per_node else -(-num_gpus // per_node)
    if hosts < 1 or num_gpus % hosts:
        raise ArenaError(f"the job's {num_gpus} GPUs do not split evenly over {hosts} hosts (--hosts)")
    return hosts


class _Searcher:
    """The search's process on Ray: an actor, so that its start can be waited for with a bound."""

    def ready(self) -> bool:
        return True

    def search(self, req: dict[str, Any], gpu_type: str, num_gpus: int) -> Any:
        return _search_task(req, gpu_type, num_gpus)


def _search_on_ray(request: RunRequest, gpu_type: str, num_gpus: int, start_timeout_s: float | None = None) -> Any:
    """Run the search inside one actor holding the allocated devices."""
    import ray
    from ray.exceptions import GetTimeoutError

    from libarena.run.cluster import (HOST_START_TIMEOUT_S, gpu_type_resource, largest_node_gpus, ray_get,
                                      ray_worker_env)

    # the searcher holds the whole allocation in one process: a node must have that many GPUs of the type (else
    # Ray would keep the task pending for ever)
    per_node = largest_node_gpus(gpu_type)
    if per_node < num_gpus:
        raise ArenaError(f"--search measures the candidates in one process, which needs {num_gpus} {gpu_type} GPUs on "
                         f"one node; the largest node has {per_node}: give a plan (--plan-id or the grid's proxy) instead")
    # the searcher times candidate plans on the devices the job's workers would have
    env = ray_worker_env(num_gpus if request.on_cpu_devices else None)
    searcher = ray.remote(_Searcher).options(
        num_cpus=1, num_gpus=num_gpus, resources={gpu_type_resource(gpu_type): num_gpus}, runtime_env={"env_vars": env},
        max_restarts=0, max_task_retries=0,
    ).remote()
    timeout = HOST_START_TIMEOUT_S if start_timeout_s is None else start_timeout_s
    try:
        # a node that had the GPUs when they were counted may be gone by now, and Ray keeps a request that no
        # live node can hold pending for ever: its start is waited for as the job's actors' is
        try:
            ray_get(searcher.ready.remote(), timeout=timeout)
        except GetTimeoutError:
            raise ArenaError(f"no node started the search ({num_gpus} {gpu_type} GPUs in one process) within "
                             f"{timeout:.0f} s") from None
        return ray_get(searcher.search.remote(asdict_request(request), gpu_type, num_gpus))
    finally:
        with contextlib.suppress(Exception):  # (an error here must not hide the search's own)
            ray.kill(searcher, no_restart=True)


def asdict_request(request: RunRequest) -> dict[str, Any]:
    return {"plans_path": os.path.abspath(request.plans_path), "model": request.model, "global_batch": request.global_batch,
            "selection": request.selection, "search": request.search, "dtype": request.dtype,
            "pipeline_degree": request.grid.pipeline_degree if request.grid else None}


def _search_task(req: dict[str, Any], gpu_type: str, num_gpus: int) -> Any:
    from libarena.models import get_model
    from libarena.run.search import full_search, measure_in_process, pruned_search

    model = get_model(req["model"])
    planset = load_plans(req["plans_path"], req["model"], req["global_batch"])
    space = SearchSpace(model, req["global_batch"], gpu_type, num_gpus, tuple(planset.clusters), req["dtype"])
    measure = measure_in_process(model, req["search"], req["dtype"])
    if req["selection"] == "full":
        return full_search(space, measure, req["search"])
    return pruned_search(space, planset, measure, req["search"], req["pipeline_degree"])


def skipped_checkpoints(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every checkpoint a run (its report) could not resume from, once each: found before the run (unreadable
    metadata) or while restoring (unreadable arrays), in-process or on Ray, with where the run set it aside."""
    by_step: dict[int, dict[str, Any]] = {}
    run = result.get("train") or {}
    chunks = (result.get("job") or {}).get("chunks") or []
    for entry in [*result.get("skipped_checkpoints", []), *run.get("skipped_checkpoints", []),
                  *(e for c in chunks for e in c.get("skipped_checkpoints", []))]:
        first = by_step.setdefault(entry["step"], dict(entry))  # the first reason found; a later report moved it
        if entry.get("set_aside_as") and not first.get("set_aside_as"):
            first["set_aside_as"] = entry["set_aside_as"]
    return list(by_step.values())

