"""arena-profile: disaggregated single-device profiling into the performance table (§3.4).

Public API (the scheduler's ``perf build`` and the CLI call these)::

    from libarena.plan import read_plans
    from libarena.profile import ProfileConfig, profile_plans, write_perf_table
    result = profile_plans(read_plans("plans.parquet", require_costs=False), ProfileConfig(selection="proxy"))
    result.table          # perf_table rows (views arena / ap / dp)
    result.estimates      # PlanEstimate per profiled plan (stage breakdown, 1F1B terms, memory)
    result.summary        # timer, comm model, stages needed / profiled / skipped
    measure_estimates(planset, result)            # --measure: direct measurement side by side
    write_perf_table("perf.parquet", result, Provenance("arena-profile"))

Lower level: ``StageSpec`` + ``build_stage_executables`` / ``profile_stage`` (one worker of one stage on
one device), ``one_f_one_b`` (the pipeline model; ``HostConcurrency`` says how much devices that share a host's
cores slow each other down), ``select_timer`` (host / cupti), ``ProfileCache``. Direct measurement runs
plans through the runtime's executor (``libarena.run.measure_plan``; libarena.profile.measure). The timing
protocol for a shared host (quiet check, load and steal, XLA:CPU thread layouts) is libarena.profile.host;
``StageSession`` (profiler) and ``MeasureSession`` (measure) keep both sides alive for interleaved timing.
Importing this package does not import JAX.
"""

from libarena.profile.api import format_perf_table, measure_estimates, write_comm_table
from libarena.profile.cache import ProfileCache, default_cache_dir
from libarena.profile.comm_bench import CommBenchConfig
from libarena.profile.concurrency import HostConcurrency, host_concurrency
from libarena.profile.device import LocalDevice, RooflineSpec, local_roofline, resolve_device
from libarena.profile.pipeline import IterationEstimate, StageTimes, one_f_one_b
from libarena.profile.estimate import PlanEstimate, perf_rows
from libarena.profile.profiler import (
    SELECTIONS,
    ProfileConfig,
    ProfiledJob,
    ProfileResult,
    estimate_plan,
    profile_plans,
    profile_stage,
    write_perf_table,
)
from libarena.profile.stage import StageSpec, build_stage_executables, worker_view
from libarena.profile.timers import Timer, Timing, select_timer, timer_names

__all__ = [
    "SELECTIONS",
    "CommBenchConfig",
    "HostConcurrency",
    "IterationEstimate",
    "LocalDevice",
    "PlanEstimate",
    "ProfileCache",
    "ProfileConfig",
    "ProfileResult",
    "ProfiledJob",
    "RooflineSpec",
    "StageSpec",
    "StageTimes",
    "Timer",
    "Timing",
    "build_stage_executables",
    "default_cache_dir",
    "estimate_plan",
    "format_perf_table",
    "host_concurrency",
    "local_roofline",
    "measure_estimates",
    "one_f_one_b",
    "perf_rows",
    "profile_plans",
    "profile_stage",
    "resolve_device",
    "select_timer",
    "timer_names",
    "worker_view",
    "write_comm_table",
    "write_perf_table",
]
