"""``comparison``: policies run on one workload, relative to a reference (compare.json)."""

from libarena.artifacts.kinds.run_metrics import SUMMARY_MAX_BYTES
from libarena.artifacts.registry import ArtifactKind, Field, register_kind

COMPARISON = register_kind(
    ArtifactKind(
        name="comparison",
        version=1,
        format="json",
        produced_by="arena-schedule compare (or sweep)",
        description="Several policies on the same workload: each one's metrics, and its JCT over the jobs both it "
                    "and the reference policy finished.",
        max_bytes=SUMMARY_MAX_BYTES,
        headerless_fields=("reference", "policies"),
        notes=(
            "The provenance gathers the runs': each policy's parameters and every input once (a sweep's spec first).",
            "The fair comparison is vs_reference: an average over each policy's own finished jobs rewards leaving "
            "the hard jobs unfinished.",
        ),
        fields=(
            Field("reference", "str", "the policy the others are measured against (Arena when it is compared)"),
            Field("policies", "dict[str, dict]",
                  "per policy: avg_jct_s, avg_throughput, peak_throughput, finished_jobs, unfinished_jobs, dropped_jobs, "
                  "avg_queuing_s, p90_jct_s, deadline_satisfaction_ratio, reschedules_per_job, "
                  "decision_time_per_tick_median_s, submitted_jobs, simulation_wall_s (as in run_metrics), and for "
                  "every policy but the reference vs_reference: {jobs, reference: {avg_jct_s, p50_jct_s, p90_jct_s}, "
                  "policy: {the same}} over the jobs both finished"),
        ),
    )
)
