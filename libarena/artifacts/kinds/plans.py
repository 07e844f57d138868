"""``plans``: arena-plan's output, per-grid Pareto frontiers and proxy plans."""

from libarena.artifacts.registry import ArtifactKind, Column, Field, register_kind

PLANS = register_kind(
    ArtifactKind(
        name="plans",
        version=1,
        format="table",
        produced_by="arena-plan",
        description=(
            "One row per Pareto-frontier plan of each grid (model, global batch, GPU type, GPU count, pipeline "
            "degree), plus one row per grid with no feasible plan (feasible = false, with the reason)."
        ),
        columns=(
            Column("model", "string", "model identifier, family__size"),
            Column("global_batch", "int64", "global batch size"),
            Column("gpu_type", "string", "GPU type (hardware catalogue name)"),
            Column("num_gpus", "int64", "GPUs of the grid"),
            Column("num_nodes", "int64", "nodes the GPUs span"),
            Column("pipeline_degree", "int64", "number of pipeline stages s"),
            Column("plan_id", "string", "stable identifier of the plan within its grid"),
            Column("feasible", "bool", "false for a grid with no plan that fits in memory"),
            Column("infeasible_reason", "string", "why the grid has no plan (empty when feasible)"),
            Column("num_microbatches", "int64", "micro-batches B per iteration (default 4 x s)"),
            Column("stage_boundaries", "list<int64>", "first cluster index of each stage"),
            Column("gpus_per_stage", "list<int64>", "GPUs assigned to each stage (powers of two summing to num_gpus)"),
            Column("dp_per_stage", "list<int64>", "data-parallel degree of each stage"),
            Column("tp_per_stage", "list<int64>", "tensor-parallel degree of each stage"),
            Column("zero_per_stage", "list<int64>", "1 where the stage shards optimizer state (ZeRO-1), else 0"),
            Column("computation_bias", "float64", "b_comp, eq. 3: distance of the GPU assignment from load-proportional"),
            Column("communication_load", "float64", "l_comm, eq. 4, seconds"),
            Column("memory_per_gpu_bytes", "float64", "estimated peak memory of the most loaded GPU"),
            Column("is_proxy", "bool", "the grid's proxy plan"),
        ),
        fields=(
            Field("model", "dict", "the model record copied from the operator table"),
            Field("operator_table_sha256", "str", "content hash of the operator table the plans came from"),
            Field("cluster", "str", "name of the cluster spec"),
            Field("clusters", "list[dict]", "the operator table's clustered view, copied so the profiler can rebuild stages"),
        ),
    )
)
