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
            Column("profiling_cost_device_s", "float64", "device-seconds that profiling the row's plan took (each distinct stage charged to the first plan that needs it, whether profiled for this table or served from the cache; an ap row, the search over every plan of its allocation, sums theirs)", required=False, default=0.0),
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


#: The columns that identify a row: rows that agree on all of them must agree on their values.
KEY_COLUMNS = ("model", "global_batch", "gpu_type", "num_gpus", "num_nodes", "view", "pipeline_degree", "plan_id")
VALUE_COLUMNS = ("iter_time_s", "throughput", "fits_in_memory")


#: how far a row's throughput may stray from global_batch / iter_time_s (rounding in a table written elsewhere)
THROUGHPUT_TOLERANCE = 0.01


def check_perf_table(table, source: str) -> None:
    """Values every reader relies on (one-line ArenaError naming row, column and the allowed range): identifiers
    present, the view one of VIEWS; batch, GPU count, nodes (at most the GPUs) and pipeline degree (1 to the
    GPUs) integers in range; on rows that fit in memory, a finite
    iteration time in (0, 1 day] (``throughput``, where given, must imply the same bound); no negative cost; no
    two rows with the same key (KEY_COLUMNS) and different values; ``throughput``, where given, within
    THROUGHPUT_TOLERANCE of global_batch / iter_time_s. A perf table may come from outside Arena
    (importable), so this runs on every read, not only on Arena's own files. Rows that do not fit in memory
    are never used: their times may be unknown (NaN or infinite), never negative."""
    import numpy as np

    from libarena.artifacts.io import check_columns
    from libarena.checks import MAX_BATCH, MAX_GPUS, MAX_ITERATION_S, MAX_SECONDS, range_problem

    if table.num_rows == 0:
        raise ArenaError(f"{source}: the performance table is empty")
    check_columns(table, source, non_null=("model", "gpu_type", "view", "iter_time_s"))

    def column(name: str):
        if name not in table.column_names:
            return None
        return table.column(name).to_numpy(zero_copy_only=False)

    def fail(row: int, name: str, problem: str) -> None:
        raise ArenaError(f"{source}: row {row + 1}, column {name!r}: {problem}")

    for name, lo, hi in (("global_batch", 1, MAX_BATCH), ("num_gpus", 1, MAX_GPUS), ("num_nodes", 0, MAX_GPUS),
                         ("pipeline_degree", 1, 4096)):
        values = column(name)
        if values is None:
            continue
        values = values.astype(np.float64)  # nulls read as NaN
        bad = ~((values >= lo) & (values <= hi))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            fail(row, name, range_problem(float(values[row]), lo, hi, integer=True) or "missing value")
    views = table.column("view").to_pylist()
    unknown = [i for i, view in enumerate(views) if view not in VIEWS]
    if unknown:
        fail(unknown[0], "view", f"unknown view {str(views[unknown[0]])[:40]!r} (known: {', '.join(VIEWS)})")
    degree, gpus, nodes = column("pipeline_degree"), column("num_gpus"), column("num_nodes")
    if nodes is not None and gpus is not None:
        bad = np.flatnonzero(nodes.astype(np.float64) > gpus.astype(np.float64))  # a node holds a GPU at least
        if bad.size:
            row = int(bad[0])
            fail(row, "num_nodes", f"{int(nodes[row])} nodes for {int(gpus[row])} GPUs")
    if degree is not None and gpus is not None:
        bad = np.flatnonzero(degree.astype(np.float64) > gpus.astype(np.float64))  # a stage holds a GPU at least
        if bad.size:
            row = int(bad[0])
            fail(row, "pipeline_degree", f"{int(degree[row])} stages on {int(gpus[row])} GPUs")
    if "fits_in_memory" in table.column_names:
        flags = table.column("fits_in_memory").to_pylist()
        if None in flags:  # neither fitting nor not: show and simulate read it differently
            fail(flags.index(None), "fits_in_memory", "missing value")
        fits = np.array(flags, bool)
    else:
        fits = np.ones(table.num_rows, bool)
    iter_time = column("iter_time_s").astype(np.float64)
    bad = np.flatnonzero(fits & ~((iter_time > 0) & (iter_time <= MAX_ITERATION_S)))
    if bad.size:
        row = int(bad[0])
        fail(row, "iter_time_s", range_problem(float(iter_time[row]), 0, MAX_ITERATION_S, lo_open=True)
             or "out of range")
    throughput = column("throughput")
    if throughput is not None:
        throughput = throughput.astype(np.float64)
        batch = column("global_batch").astype(np.float64)
        given = ~np.isnan(throughput)
        with np.errstate(all="ignore"):  # (a zero, tiny or NaN throughput is reported below)
            implied = batch / throughput
        bad = np.flatnonzero(fits & given & ~((throughput > 0) & np.isfinite(throughput) & (implied <= MAX_ITERATION_S)))
        if bad.size:
            row = int(bad[0])
            fail(row, "throughput", f"{float(throughput[row])!r} samples/s is not a finite number > 0 giving an iteration "
                                    f"time of at most {MAX_ITERATION_S} s (global_batch / throughput)")
        # both describe one iteration: where they disagree, which one to believe would be a guess
        with np.errstate(all="ignore"):  # (rows that do not fit may hold any time: they are masked out)
            from_time = batch / iter_time
            apart = np.abs(throughput - from_time) > THROUGHPUT_TOLERANCE * np.maximum(throughput, from_time)
        bad = np.flatnonzero(fits & given & apart)
        if bad.size:
            row = int(bad[0])
            fail(row, "throughput", f"{throughput[row]:.6g} samples/s disagrees with global_batch / iter_time_s = "
                                    f"{from_time[row]:.6g}")
    for name in ("iter_time_s", "throughput", "profiling_cost_device_s", "measured_iter_time_s",
                 "measured_cost_device_s"):
        values = column(name)
        if values is None:
            continue
        values = values.astype(np.float64)
        bad = values < 0  # NaN compares false: unknown values are allowed, negative ones never
        if name not in ("iter_time_s", "throughput"):
            bad |= values > MAX_SECONDS
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            fail(row, name, range_problem(float(values[row]), 0, MAX_SECONDS) or f"negative value {float(values[row])!r}")
    _check_conflicting_duplicates(table, source)


def _check_conflicting_duplicates(table, source: str) -> None:
    """Two rows with the same key must say the same thing: which one would win is otherwise arbitrary."""
    import math

    keys = [c for c in KEY_COLUMNS if c in table.column_names]
    values = [c for c in VALUE_COLUMNS if c in table.column_names]
    key_cols = [table.column(c).to_pylist() for c in keys]
    value_cols = [table.column(c).to_pylist() for c in values]
    seen: dict[tuple, tuple[int, tuple]] = {}

    def norm(v):
        return None if isinstance(v, float) and math.isnan(v) else v

    for row in range(table.num_rows):
        key = tuple(col[row] for col in key_cols)
        value = tuple(norm(col[row]) for col in value_cols)
        first = seen.setdefault(key, (row, value))
        if first[1] != value:
            differ = next(c for c, a, b in zip(values, first[1], value) if a != b)
            where = ", ".join(f"{k}={v}" for k, v in zip(keys, key) if k in ("model", "global_batch", "gpu_type",
                                                                               "num_gpus", "view"))
            raise ArenaError(f"{source}: row {row + 1}, column {differ!r}: conflicts with row {first[0] + 1} "
                             f"({where}: {first[1][values.index(differ)]!r} against {value[values.index(differ)]!r}); "
                             f"rows of several plans need distinct plan_id or pipeline_degree")
