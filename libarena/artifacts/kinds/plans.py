"""``plans``: arena-plan's output, per-grid Pareto frontiers and proxy plans."""

from typing import Any

import pyarrow as pa

from libarena.artifacts.registry import ArtifactKind, Column, Field, register_kind


def _from_version_1(table: pa.Table, metadata: dict[str, Any]) -> tuple[pa.Table, dict[str, Any]]:
    """Version 1 -> 2: no stage of a version-1 plan recomputes (remat_per_stage all 0)."""
    boundaries = table.column("stage_boundaries").to_pylist()
    remat = [[0] * len(b) if b else [] for b in boundaries]
    return table.append_column("remat_per_stage", pa.array(remat, pa.list_(pa.int64()))), metadata


PLANS = register_kind(
    ArtifactKind(
        name="plans",
        version=2,
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
            Column("num_microbatches", "int64",
                   "micro-batches B per iteration (4 x s unless fixed, lowered until B divides the global batch)"),
            Column("stage_boundaries", "list<int64>", "first cluster index of each stage"),
            Column("gpus_per_stage", "list<int64>", "GPUs assigned to each stage (powers of two summing to num_gpus)"),
            Column("dp_per_stage", "list<int64>", "data-parallel degree of each stage"),
            Column("tp_per_stage", "list<int64>", "tensor-parallel degree of each stage"),
            Column("zero_per_stage", "list<int64>", "1 where the stage shards optimizer state (ZeRO-1), else 0"),
            Column("remat_per_stage", "list<int64>", "1 where the stage recomputes its activations in the backward pass (activation recomputation), else 0"),
            Column("computation_bias", "float64", "b_comp, eq. 3: distance of the GPU assignment from load-proportional"),
            Column("communication_load", "float64", "l_comm, eq. 4, seconds"),
            Column("memory_per_gpu_bytes", "float64", "estimated peak memory of the most loaded GPU"),
            Column("is_proxy", "bool", "the grid's proxy plan"),
            Column("gpus_per_node", "int64", "GPUs per node of the grid's GPU type"),
            Column("stage_gpu_offsets", "list<int64>", "first GPU of each stage within the grid (buddy placement: a stage that fits in a node stays in one)"),
            Column("memory_per_stage_bytes", "list<float64>", "estimated peak memory per GPU of each stage"),
            Column("comm_per_microbatch_s", "list<float64>", "intra-stage communication per micro-batch of each stage (TP all-reduces, MoE all-to-all), seconds"),
            Column("grad_sync_s", "list<float64>", "once-per-iteration gradient synchronisation of each stage (DP all-reduce, or ZeRO reduce-scatter + all-gather), seconds"),
            Column("p2p_per_microbatch_s", "list<float64>", "one-direction P2P time per micro-batch across each stage boundary (s-1 entries), seconds; not part of l_comm"),
            Column("on_frontier", "bool", "on the (capped) Pareto frontier; false only for extra rows of --exhaustive output"),
            Column("plans_considered", "int64", "candidate plans the planner assessed in this grid"),
            Column("plans_out_of_memory", "int64", "candidate plans of this grid dropped because they do not fit in memory"),
            Column("comm_model", "string", "what priced the communication: alpha-beta, measured, or measured+alpha-beta"),
        ),
        fields=(
            Field("model", "dict", "the model record copied from the operator table"),
            Field("operator_table_sha256", "str", "content hash of the operator table the plans came from"),
            Field("cluster", "str", "name of the cluster spec"),
            Field("clusters", "list[dict]", "the operator table's clustered view, copied so the profiler can rebuild stages"),
            Field("global_batch", "int", "global batch size"),
            Field("seq_len", "int", "sequence length (0 when not a text model)"),
            Field("dtype", "str", "training compute dtype"),
            Field("planner", "dict", "the PlannerConfig the plans were made with"),
            Field("comm_model", "str", "description of the communication model (alpha-beta parameters or the measured table)"),
        ),
        notes=(
            "computation_bias and communication_load are NaN and the list columns empty on infeasible rows.",
            "l_comm = (B-1) * max_j comm_per_microbatch_s[j] + sum_j comm_per_microbatch_s[j] + max_j grad_sync_s[j] (eq. 4 with the per-iteration gradient sync made explicit).",
            "plan_id is derived from the grid key and the plan structure: the same plan gets the same id on every run; recomputation joins it only when a stage recomputes, so plans without it keep their ids.",
            "Version 1 files (before activation recomputation) are read with remat_per_stage all 0.",
        ),
        upgrades=((1, _from_version_1),),
    )
)
