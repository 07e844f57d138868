"""``run_metrics``: a simulation's summary metrics (metrics.json beside its tables)."""

from libarena.artifacts.registry import ArtifactKind, Field, register_kind

#: a summary is a few kilobytes: anything much larger is not one, and is refused unread
SUMMARY_MAX_BYTES = 16 << 20

RUN_METRICS = register_kind(
    ArtifactKind(
        name="run_metrics",
        version=1,
        format="json",
        produced_by="arena-schedule simulate (or compare, sweep)",
        description="One simulation's summary metrics (§5): JCT, queuing, throughput, utilisation, decision time.",
        max_bytes=SUMMARY_MAX_BYTES,
        # what the one-line summary and the comparison table read, all in every metrics.json before the header
        headerless_fields=("policy", "submitted_jobs", "finished_jobs", "unfinished_jobs", "dropped_jobs", "avg_jct_s",
                           "avg_queuing_s", "avg_throughput", "peak_throughput", "reschedules_per_job",
                           "decision_time_per_tick_median_s", "simulation_wall_s"),
        notes=(
            "Average JCT counts every submitted job: an unfinished one with its time so far, a dropped one with its "
            "time until it was dropped.",
            "A float that is undefined (NaN: deadline_satisfaction_ratio without deadlines, avg_jct_finished_s when no "
            "job finished) is null.",
        ),
        fields=(
            Field("policy", "str", "scheduling policy"),
            Field("view", "str", "the policy's decision view"),
            Field("submitted_jobs", "int", "jobs submitted within the horizon"),
            Field("finished_jobs", "int", "jobs that finished"),
            Field("unfinished_jobs", "int", "jobs still queued or running at the end (unschedulable ones included)"),
            Field("unschedulable_jobs", "int", "jobs the policy could never place"),
            Field("dropped_jobs", "int", "jobs the policy dropped"),
            Field("avg_jct_s", "float", "average JCT over every submitted job, seconds"),
            Field("avg_jct_finished_s", "float", "average JCT over the finished jobs (null when none finished)"),
            Field("p50_jct_s", "float", "median JCT over every submitted job"),
            Field("p90_jct_s", "float", "90th percentile JCT"),
            Field("p99_jct_s", "float", "99th percentile JCT"),
            Field("avg_queuing_s", "float", "average time from submission to first start"),
            Field("p90_queuing_s", "float", "90th percentile of that"),
            Field("avg_throughput", "float", "samples trained over the run (execution truth) per second of its makespan"),
            Field("peak_throughput", "float", "the cluster's largest samples/s at a tick"),
            Field("avg_gpu_utilization", "float", "GPU-seconds held by jobs (starting or training) over all GPUs x the makespan"),
            Field("deadline_satisfaction_ratio", "float", "jobs finished by their deadline over jobs with one"),
            Field("reschedules_per_job", "float", "reschedules per started job"),
            Field("decision_time_per_tick_median_s", "float", "the policy's wall time per scheduling tick, median"),
            Field("decision_time_per_tick_p99_s", "float", "... its 99th percentile"),
            Field("decision_time_per_tick_max_s", "float", "... its largest"),
            Field("decision_time_per_job_s", "float", "all decision time over submitted jobs"),
            Field("scheduled_ticks", "int", "ticks at which the policy decided"),
            Field("ticks", "int", "ticks simulated"),
            Field("makespan_s", "float", "first submission to the end of the run"),
            Field("stopped_by", "str", "what ended the run (all done, the horizon, the tick limit)"),
            Field("simulation_wall_s", "float", "wall time of the simulation"),
            Field("ilp_time_limit_hits", "int", "ILP solves stopped at their time limit (their decisions depend on the host)"),
            Field("trades", "int", "arena: pairs of running jobs that swapped their GPUs (each side a rescale in the "
                                   "decisions and in reschedules_per_job)"),
            Field("trades_at_launch", "int", "arena: launches that took a running job's GPUs, that job restarting on "
                                             "the free GPUs (its restart a rescale in the decisions)"),
            Field("skipped_rows", "int", "trace rows skipped as malformed (--skip-bad-rows)"),
        ),
    )
)
