"""``perf_table``: the performance table, the one input the scheduler needs.

Importable: a CSV or Parquet measured elsewhere with at least the required columns is accepted; missing
optional columns take the defaults below.
"""

from libarena.artifacts.registry import ArtifactKind, Column, Field, register_kind
from libarena.errors import ArenaError

VIEWS = ("arena", "dp", "ap")

PERF_TABLE = register_kind(
    ArtifactKind(
        name="perf_table",
        version=2,
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
            Column("recomputes", "bool", "the plan recomputes activations in the backward pass in at least one stage (to fit in memory, or to communicate less)", required=False, default=False),
            Column("timer", "string", "how the time was obtained: cupti, host, measured, estimated, imported", required=False, default="imported"),
            Column("estimated", "bool", "true for roofline-scaled estimates of GPU types not present", required=False, default=False),
            Column("profiling_cost_device_s", "float64", "device-seconds spent obtaining the row", required=False, default=0.0),
            Column(
                "measured_iter_time_s",
                "float64",
                "arena-profile --measure: iteration time of the same plan run for real on the local devices (null when not measured)",
                required=False,
            ),
            Column(
                "measured_cost_device_s",
                "float64",
                "arena-profile --measure: device-seconds the direct measurement took (null when not measured)",
                required=False,
            ),
        ),
        fields=(
            Field("device", "dict", "the local device profiled on (label, platform, kind, the GPU type it counts as, memory)"),
            Field("timer", "str", "timer of the stage executables: cupti (kernel time) or host (wall clock)"),
            Field("comm_model", "str", "the communication model: measured comm table (log-log interpolation) or alpha-beta"),
            Field("comm_sources", "list[str]", "per priced collective case, which model priced it"),
            Field("stages_needed", "int", "stage profiles the plans needed"),
            Field("stages_profiled", "int", "stages compiled and timed in this run"),
            Field("stages_skipped", "int", "stages served from the content-addressed cache (identical stages, earlier runs)"),
            Field("local_roofline", "dict", "peak FLOP/s and bandwidth of the local device, for roofline-scaled (estimated) rows"),
            Field("plans", "list[dict]", "per profiled plan: stages (compute, collectives, P2P, gradient sync, optimizer, memory), 1F1B breakdown, measurement"),
        ),
        notes=(
            "iter_time_s (1F1B) = sum_j T_j + (B-1) max_j (T_j - p2p_j) + max_j grad_sync_j + max_j optimizer_j, "
            "T_j = compute_j + collectives_j + p2p_j of one micro-batch.",
            "Rows with estimated = true (GPU types not present, roofline-scaled) must be kept out of accuracy figures.",
            "Version 1 files (before activation recomputation) are read with recomputes = false.",
        ),
        # version 1 lacks only the optional 'recomputes' column, which takes its default on reading
        upgrades=((1, lambda table, metadata: (table, metadata)),),
    )
)


def check_perf_table(table, source: str) -> None:
    """Values every reader relies on (one-line ArenaError naming row and column): identifiers present,
    positive batch and GPU count, a time on every row, no negative time or throughput. A perf table may
    come from outside Arena (importable), so this runs on every read, not only on Arena's own files."""
    from libarena.artifacts.io import check_columns

    if table.num_rows == 0:
        raise ArenaError(f"{source}: the performance table is empty")
    check_columns(table, source, non_null=("model", "gpu_type", "view", "iter_time_s"),
                  positive=("global_batch", "num_gpus"))
    import numpy as np

    for name in ("iter_time_s", "throughput", "profiling_cost_device_s", "measured_iter_time_s",
                 "measured_cost_device_s", "num_nodes", "pipeline_degree"):
        if name not in table.column_names:
            continue
        values = table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
        bad = values < 0  # NaN compares false: unknown values are allowed, negative ones never
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ArenaError(f"{source}: row {row + 1}, column {name!r}: negative value {values[row]!r}")
