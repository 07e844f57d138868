"""arena-plan's run: an operator table (a file, stdin, or a model analyzed on the way) planned on a cluster."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from libarena.artifacts import Provenance, input_ref, read_table
from libarena.artifacts.io import refuse_overwriting_inputs
from libarena.artifacts.stage_cache import StageOutcome, cache_input, library_versions
from libarena.errors import ArenaError
from libarena.pipeline.cache import CacheSettings
from libarena.plan import PlannerConfig
from libarena.progress import Report, SilentReport

STAGE = "arena-plan"


@dataclass(frozen=True)
class PlanStep:
    """What arena-plan plans an operator table on: the cluster, the planner's settings, the comm model."""

    cluster: Path
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    #: a measured comm_table (arena-profile comm) instead of the alpha-beta model
    comm: Path | None = None
    #: a GPU type the comm table does not cover is an error (else: alpha-beta for it)
    comm_required: bool = False

    def __post_init__(self) -> None:
        if self.comm_required and self.comm is None:
            raise ArenaError("--comm-required needs --comm")


def plan(ops: str, step: PlanStep, output: str, cache: CacheSettings = CacheSettings(),
         report: Report = SilentReport()) -> tuple[StageOutcome, dict[str, Any]]:
    """``arena-plan``: plan the operator table ``ops`` (a file, or ``-`` for stdin) into ``output``."""
    from libarena.plan import load_model_profile

    refuse_overwriting_inputs(output, {"--ops": ops, "--cluster": step.cluster, "--comm": step.comm})
    artifact = read_table(ops, "operator_table")
    profile = load_model_profile(artifact)
    # named by the bytes decoded (a file), or by its decoded content (stdin)
    source = input_ref(ops, "operator_table", digest=profile.digest if ops == "-" else artifact.content_sha256)
    return _plan(profile, source, cache_input(ops, artifact), step, output, cache, report)


def plan_model(analysis: Any, step: PlanStep, output: str, cache: CacheSettings = CacheSettings(),
               report: Report = SilentReport()) -> tuple[StageOutcome, dict[str, Any]]:
    """``arena-plan --model``: analyze (an AnalyzeConfig; served from the analyze stage's cache when it is
    there) and plan into ``output``."""
    from libarena.pipeline.analyze import operator_table
    from libarena.plan import load_model_profile

    refuse_overwriting_inputs(output, {"--cluster": step.cluster, "--comm": step.comm})
    profile = load_model_profile(operator_table(analysis, cache.reuse(), report))
    # The table is named by what it was analyzed from (its cache entry may not outlive the run).
    source = {"path": f"arena-analyze {' '.join(f'{k}={v}' for k, v in analysis.parameters().items())}",
              "kind": "operator_table", "sha256": profile.digest}
    return _plan(profile, source, source, step, output, cache, report)


def _plan(profile: Any, source: dict[str, Any], key_source: dict[str, Any], step: PlanStep, output: str,
          cache: CacheSettings, report: Report) -> tuple[StageOutcome, dict[str, Any]]:
    from libarena.hardware import load_cluster_input
    from libarena.hardware.comm import load_comm_model_input
    from libarena.plan import plan_job, write_plans

    spec, cluster_ref = load_cluster_input(step.cluster)
    comm_model, comm_ref = load_comm_model_input(step.comm) if step.comm is not None else (None, None)
    inputs = [source, cluster_ref]
    if comm_ref is not None:
        inputs.append(comm_ref)
    where = "stdout" if output == "-" else output
    stage = cache.stage(STAGE, report)
    key = stage.key({"planner": asdict(step.planner), "comm_required": step.comm_required}, [key_source, *inputs[1:]],
                    library_versions())
    summary: dict[str, Any] = {}

    def produce(path: str) -> None:
        planset = plan_job(profile, spec, step.planner, comm=comm_model, require_measured_comm=step.comm_required)
        if not planset.grids:
            raise ArenaError(f"cluster {spec.name!r} offers no grid for this job (check --gpu-type, --num-gpus, --stages, --max-gpus)")
        write_plans(path, planset, Provenance(tool="arena-plan", parameters=dict(planset.planner), inputs=inputs))
        feasible = [r for r in planset.grids if r.feasible]
        summary.update(model=planset.model_name, grids=len(planset.grids), feasible_grids=len(feasible),
                       plans=sum(len(r.plans) for r in feasible))
        if not feasible:
            report.warn(f"{planset.model_name} fits in no grid of {spec.name}; every grid is listed as infeasible")
        else:
            report.log(f"{planset.model_name}: {len(feasible)} of {len(planset.grids)} grids feasible, "
                       f"{summary['plans']} plans written to {where}")
        if comm_model is not None:
            for name in sorted({r.grid.gpu_type for r in planset.grids if not comm_model.covers(r.grid.gpu_type)}):
                report.log(f"note: {step.comm} has no measurements for {name}; priced with the alpha-beta model")

    return stage.produce_table(key, output, produce), summary
