"""``decisions``: every scheduling action of a run, as a msgpack document of parallel arrays."""

from libarena.artifacts.registry import ArtifactKind, Field, register_kind

DECISIONS = register_kind(
    ArtifactKind(
        name="decisions",
        version=1,
        format="msgpack",
        produced_by="arena-schedule",
        description="The actions a policy took (launch, rescale, migrate, drop) and completions, in time order.",
        fields=(
            Field("policy", "str", "scheduling policy"),
            Field("view", "str", "the policy's decision view"),
            Field("gpu_types", "list[str]", "GPU types of the cluster"),
            Field("job_ids", "list[str]", "job ids, indexed by job_index below"),
            Field("time", "list[float]", "when, trace clock"),
            Field("job_index", "list[int]", "which job"),
            Field("action", "list[str]", "launch, rescale, migrate, finish or drop"),
            Field("gpu_type", "list[str]", "GPU type of the new allocation ('' for drop)"),
            Field("num_gpus", "list[int]", "GPU count of the new allocation (for finish: the one released)"),
            Field("num_nodes", "list[int]", "nodes the allocation spans"),
            Field("view_throughput", "list[float]", "samples/s the policy expected (its view)"),
            Field("true_throughput", "list[float]", "samples/s the job runs at (execution truth)"),
        ),
    )
)
