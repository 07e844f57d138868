"""``perf_table``: the performance table, the one input the scheduler needs.

Importable: a CSV or Parquet measured elsewhere with at least the required columns is accepted; missing
optional columns take the defaults below.
"""

from libarena.artifacts.registry import ArtifactKind, Column, register_kind

VIEWS = ("arena", "dp", "ap")

PERF_TABLE = register_kind(
    ArtifactKind(
        name="perf_table",
        version=1,
        format="table",
        produced_by="arena-profile",
        importable=True,
        description="Iteration time of a model at a global batch on a number of GPUs of one type, per view.",
        columns=(
            Column("model", "string", "model identifier, family__size as the traces write it"),
            Column("global_batch", "int64", "global batch size"),
            Column("gpu_type", "string", "GPU type (hardware catalogue name)"),
            Column("num_gpus", "int64", "GPUs of one type the job runs on"),
            Column("num_nodes", "int64", "nodes the GPUs span; 0 = unspecified (fewest nodes)", required=False, default=0),
            Column("pipeline_degree", "int64", "pipeline stages of the plan", required=False, default=1),
            Column("plan_id", "string", "plan identifier within its grid", required=False, default=""),
            Column("view", "string", "arena = profiled proxy plan, dp = pure data parallel, ap = best known adaptive plan"),
            Column("iter_time_s", "float64", "seconds per training iteration"),
            Column("throughput", "float64", "samples per second (global_batch / iter_time_s when absent)", required=False),
            Column("fits_in_memory", "bool", "false when the plan does not fit the GPUs' memory", required=False, default=True),
            Column("timer", "string", "how the time was obtained: cupti, host, measured, estimated, imported", required=False, default="imported"),
            Column("estimated", "bool", "true for roofline-scaled estimates of GPU types not present", required=False, default=False),
            Column("profiling_cost_device_s", "float64", "device-seconds spent obtaining the row", required=False, default=0.0),
        ),
    )
)
