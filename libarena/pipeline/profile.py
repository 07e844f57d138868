"""arena-profile's run: plans profiled on the local device into a performance table, cached by the plans, the
profiler's settings and the device they were measured on."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from libarena.artifacts import Provenance, read_table
from libarena.artifacts.io import check_table_output, refuse_overwriting_inputs
from libarena.artifacts.stage_cache import StageOutcome, cache_input, library_versions
from libarena.checks import MAX_REPEATS, check_range
from libarena.errors import ArenaError
from libarena.pipeline.cache import CacheSettings
from libarena.progress import Report, SilentReport

STAGE = "arena-profile"


@dataclass(frozen=True)
class MeasureSettings:
    """``--measure``: also run every profiled plan for real and record its time beside the estimate."""

    enabled: bool = False
    repeats: int = 3

    def __post_init__(self) -> None:
        check_range(self.repeats, "--measure-repeats", 1, MAX_REPEATS, integer=True)


def profile(plans: str, config: Any, output: str, *, comm: Path | None = None, ops: Path | None = None,
            measure: MeasureSettings = MeasureSettings(), cache: CacheSettings = CacheSettings(),
            report: Report = SilentReport()) -> tuple[StageOutcome, dict[str, Any]]:
    """``arena-profile``: profile the plans file ``plans`` (or ``-``) with ``config`` (a ProfileConfig) into
    ``output``. ``ops``: the operator table the plans must have been made from (checked by sha256)."""
    from libarena.hardware.comm import AlphaBetaCommModel, load_comm_model_input
    from libarena.plan import planset_from_artifact
    from libarena.profile import measure_estimates, profile_plans, resolve_device, write_perf_table
    from libarena.profile.timers import resolved_timer_name
    from libarena.profile.profiler import ProfiledJob, check_comm_model

    refuse_overwriting_inputs(output, {"--plans": plans, "--comm": comm, "--ops": ops})
    check_table_output(output)
    artifact = read_table(plans, "plans")
    if ops is not None:
        from libarena.plan.model import operator_table_digest

        digest = operator_table_digest(read_table(ops, "operator_table"))
        if artifact.metadata.get("operator_table_sha256") != digest:
            raise ArenaError(f"{artifact.source}: the plans were not made from the operator table {ops} (sha256 differs)")
    comm_model, comm_ref = load_comm_model_input(comm) if comm is not None else (None, None)
    # What profiling checks first, checked before the cache key (which names the resolved device): bad
    # plans, then a comm table for other hardware, then a device that is not here.
    planset = planset_from_artifact(artifact, require_costs=False)
    ProfiledJob.of(planset)
    check_comm_model(comm_model or AlphaBetaCommModel(), planset)
    local = resolve_device(config.device)
    # plans are named by the bytes decoded (a file), or by their decoded content (stdin: the bytes are gone)
    inputs = [cache_input(plans, artifact, "plans")]
    if comm_ref is not None:
        inputs.append(comm_ref)
    stage = cache.stage(STAGE, report)
    # where and how fast stages compile does not change the output
    parameters = {k: v for k, v in asdict(config).items() if k not in ("cache_dir", "compile_workers", "compile_ahead")}
    # the timer ``auto`` chooses here (cupti where cupti-python is installed and the device is a GPU, else
    # host): installing cupti-python between two runs changes the table's times
    timer = resolved_timer_name(config.timer, local.device)
    key = stage.key({**parameters, "measure": measure.enabled, "measure_repeats": measure.repeats,
                     "device_resolved": local.cache_identity(), "timer_resolved": timer},
                    [cache_input(plans, artifact), *inputs[1:]], library_versions("jax", "jaxlib", "optax"))
    summary: dict[str, Any] = {"device": local.describe()}

    def produce(path: str) -> None:
        result = profile_plans(planset, config, comm=comm_model, log=report.log, progress=report.progress)
        if measure.enabled:
            measure_estimates(planset, result, repeats=measure.repeats, log=report.log)
        s = result.summary
        summary.update(timer=s["timer"], stages_needed=s["stages_needed"], stages_profiled=s["stages_profiled"],
                       stages_skipped=s["stages_skipped"])
        report.log(
            f"{len(result.table)} rows; timer {s['timer']}; communication: {s['comm_model']}; "
            f"stages: {s['stages_needed']} needed, {s['stages_profiled']} profiled, {s['stages_skipped']} skipped (cached)"
        )
        parameters = {"device": config.device, "timer": s["timer"], "selection": config.selection,
                      "granularity": config.granularity, "statistic": config.statistic, "warmup": config.warmup,
                      "repeats": config.repeats, "burst": config.burst, "timing_budget_s": config.timing_budget_s,
                      "isolation": config.isolation, "include_dp": config.include_dp, "concurrency": config.concurrency,
                      "handoff_rounds": config.handoff_rounds, "handoff_gate": config.handoff_gate, "measure": measure.enabled}
        write_perf_table(path, result, Provenance("arena-profile", parameters, inputs))

    return stage.produce_table(key, output, produce), summary
