"""arena-run: real training under a plan (§3.6) -- JAX shardings per pipeline stage, a 1F1B schedule,
plan-independent checkpoints, Ray actors, and the runtime pruning of the AP search.

The API other stages use (``arena-profile --measure`` calls ``measure_plan``)::

    from libarena.run import RunPlan, measure_plan, train, TrainConfig
    plan = RunPlan.from_plan(planset.plan(plan_id), planset.layout, get_model(name))
    m = measure_plan(get_model(name), plan, warmup=1, steps=3)   # step_time_s, stage_time_s, stage_peak_memory_bytes
    report = train(model, plan, TrainConfig(global_batch=32, steps=50, checkpoint_dir="ckpt"))

On Ray (``libarena.run.cluster.run_job``) a job runs as one actor per host; with several hosts the actors
form one multi-process JAX runtime (``libarena.run.distributed``) and run the same executor over the
global device list.

Importing this package does not import JAX (the executor imports it when used).
"""

from libarena.run.executor import PipelineExecutor, StepStats, one_f_one_b
from libarena.run.plan import RunPlan, simple_plan
from libarena.run.search import SearchConfig, SearchResult, SearchSpace, full_search, pruned_search
from libarena.run.train import PlanMeasurement, TrainConfig, TrainReport, batch_for_step, measure_plan, train

__all__ = [
    "PipelineExecutor",
    "PlanMeasurement",
    "RunPlan",
    "SearchConfig",
    "SearchResult",
    "SearchSpace",
    "StepStats",
    "TrainConfig",
    "TrainReport",
    "batch_for_step",
    "full_search",
    "measure_plan",
    "one_f_one_b",
    "pruned_search",
    "simple_plan",
    "train",
]
