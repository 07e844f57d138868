"""``job_records``: arena-schedule's per-job outcome of one simulation."""

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from libarena.artifacts.registry import ArtifactKind, Column, Field, register_kind

#: What a version-1 table (which had no reasons) says for its unschedulable jobs.
REASON_NOT_RECORDED = "not recorded (job_records version 1)"


def _add_unschedulable_reason(table: pa.Table, metadata: dict[str, Any]) -> tuple[pa.Table, dict[str, Any]]:
    unschedulable = pc.equal(table.column("status"), "unschedulable")
    reasons = pc.if_else(unschedulable, REASON_NOT_RECORDED, "")
    return table.append_column("unschedulable_reason", reasons.cast(pa.string())), metadata


JOB_RECORDS = register_kind(
    ArtifactKind(
        name="job_records",
        version=2,
        format="table",
        produced_by="arena-schedule",
        description="One row per submitted job of a simulated (or live) schedule: what it asked for and what it got.",
        max_rows=2_000_000,  # trace scale's MAX_SCALED_JOBS
        columns=(
            Column("job_id", "string", "job identifier from the trace"),
            Column("trace_row", "int64", "1-based data row of the job in the trace"),
            Column("model", "string", "model, family__size"),
            Column("global_batch", "int64", "global batch size"),
            Column("num_iterations", "int64", "iterations the job asked for"),
            Column("completed_iterations", "float64", "iterations done by the end of the run"),
            Column("requested_gpus", "int64", "GPU count the user asked for"),
            Column("requested_gpu_type", "string", "GPU type the user asked for"),
            Column("priority", "int64", "priority queue at submission (1 = highest)"),
            Column("submit_time_s", "float64", "submission time, trace clock"),
            Column("deadline_s", "float64", "absolute deadline, trace clock (NaN when none)"),
            Column("status", "string", "finished, unfinished (at the horizon), dropped (deadline admission) or unschedulable"),
            Column("start_time_s", "float64", "first launch (NaN if never launched)"),
            Column("finish_time_s", "float64", "completion or drop time (NaN if unfinished)"),
            Column("jct_s", "float64", "finish - submit; for unfinished jobs, end of run - submit"),
            Column("queuing_s", "float64", "first launch - submit; end of run - submit if never launched"),
            Column("met_deadline", "bool", "finished by its deadline (false when it has none)"),
            Column("reschedules", "int64", "rescales and migrations after the first launch"),
            Column("overhead_s", "float64", "seconds spent on profiling, AP search and checkpoint-resume"),
            Column("final_gpu_type", "string", "GPU type of the last allocation (empty if never launched)"),
            Column("final_num_gpus", "int64", "GPU count of the last allocation (0 if never launched)"),
            Column("unschedulable_reason", "string", "why the policy can never place the job (empty unless unschedulable)"),
        ),
        fields=(
            Field("policy", "str", "scheduling policy"),
            Field("view", "str", "the policy's decision view"),
            Field("cluster", "str", "cluster name"),
            Field("metrics", "dict", "the run's summary metrics (as in metrics.json)"),
        ),
        notes=("Version 1 files (before unschedulable_reason) are read with that column empty, and "
               f"{REASON_NOT_RECORDED!r} for their unschedulable jobs.",),
        upgrades=((1, _add_unschedulable_reason),),
    )
)
