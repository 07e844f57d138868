"""``timeseries``: arena-schedule's cluster state at every scheduling tick."""

from libarena.artifacts.registry import ArtifactKind, Column, Field, register_kind

TIMESERIES = register_kind(
    ArtifactKind(
        name="timeseries",
        version=1,
        format="table",
        produced_by="arena-schedule",
        description="Cluster state after the scheduling decisions of each tick of a simulation.",
        max_rows=100_000_000,  # the simulator's --max-ticks ceiling (100 x MAX_TICKS); MAX_DECODED_BYTES bounds it first
        columns=(
            Column("time_s", "float64", "tick time, trace clock"),
            Column("cluster_throughput", "float64", "sum of running jobs' samples/s (execution truth)"),
            Column("busy_gpus", "int64", "GPUs allocated (training or paying overheads)"),
            Column("running_jobs", "int64", "jobs training"),
            Column("starting_jobs", "int64", "jobs holding GPUs while paying profiling, AP search or checkpoint-resume"),
            Column("queued_jobs", "int64", "submitted jobs waiting for a first launch"),
            Column("scheduled", "bool", "the policy ran at this tick (ticks with no change are skipped)"),
            Column("decision_time_s", "float64", "wall time of the policy's decisions at this tick"),
        ),
        fields=(
            Field("policy", "str", "scheduling policy"),
            Field("tick_s", "float", "scheduling interval"),
            Field("total_gpus", "int", "GPUs in the cluster"),
        ),
    )
)
