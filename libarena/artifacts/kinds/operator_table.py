"""``operator_table``: arena-analyze's output, one row per HLO instruction of the training step.

The layer-clustered view the planner consumes travels in the same file, in the ``clusters`` metadata
entry (one record per clustered operator, see CLUSTER_FIELDS), so a single artifact flows down the pipe.
"""

from libarena.artifacts.registry import ArtifactKind, Column, Field, register_kind

#: Fields of one record of the ``clusters`` metadata entry. All sizes are for one training step at the
#: global batch on one device (no parallelism); the planner divides by micro-batches, dp and tp.
CLUSTER_FIELDS = (
    Field("index", "int", "cluster number, 0..O-1, in model order"),
    Field("units", "list[str]", "model units (layers) in the cluster, in order"),
    Field("num_ops", "int", "HLO instructions assigned to the cluster"),
    Field("flops", "float", "forward + backward FLOPs"),
    Field("bytes", "float", "forward + backward bytes read and written"),
    Field("optimizer_flops", "float", "optimizer-update FLOPs for the cluster's parameters"),
    Field("optimizer_bytes", "float", "optimizer-update bytes for the cluster's parameters"),
    Field("param_count", "int", "number of parameters"),
    Field("param_bytes", "float", "parameter bytes (parameter dtype)"),
    Field("activation_bytes", "float", "bytes of the activation leaving the cluster (P2P volume forward)"),
    Field("saved_activation_bytes", "float", "forward activations kept for the backward pass"),
    Field("tp_allreduce_bytes", "float", "bytes all-reduced per step (fwd+bwd) under Megatron-style tensor parallelism"),
    Field("alltoall_bytes", "float", "expert all-to-all bytes per step (fwd+bwd); 0 for dense models"),
)

OPERATOR_TABLE = register_kind(
    ArtifactKind(
        name="operator_table",
        version=1,
        format="table",
        produced_by="arena-analyze",
        description="One row per HLO instruction of a model's unoptimized training step (forward, backward, optimizer).",
        columns=(
            Column("op_index", "int64", "position of the instruction in the module (post-order)"),
            Column("name", "string", "HLO instruction name"),
            Column("opcode", "string", "HLO opcode (dot, convolution, add, all-to-all, ...)"),
            Column("computation", "string", "HLO computation holding the instruction"),
            Column("shape", "string", "result shape with dtype, e.g. bf16[8,1024,768]"),
            Column("operand_shapes", "list<string>", "operand shapes with dtypes"),
            Column("dtype", "string", "result element type"),
            Column("flops", "float64", "FLOPs of the instruction (XLA cost analysis)"),
            Column("transcendentals", "float64", "transcendental operations (XLA cost analysis)"),
            Column("bytes_read", "float64", "bytes read by the instruction (XLA cost analysis)"),
            Column("bytes_written", "float64", "bytes written by the instruction (XLA cost analysis)"),
            Column("layer", "string", "model unit (layer) the instruction belongs to, from its named scope"),
            Column("unit_index", "int64", "index of that unit in model order (-1 if unattributed)"),
            Column("cluster", "int64", "clustered-operator index the unit belongs to"),
            Column("phase", "string", "forward, backward or optimizer"),
            Column("is_parameter_op", "bool", "reads or updates parameters / optimizer state"),
            Column("param_bytes", "float64", "parameter bytes the instruction touches"),
        ),
        fields=(
            Field("model", "dict", "model identifier, family, size, nominal and actual parameter counts, config"),
            Field("global_batch", "int", "global batch size the step was built for"),
            Field("seq_len", "int", "sequence length (transformers)"),
            Field("dtype", "str", "training compute dtype"),
            Field("num_clusters", "int", "O, the number of clustered operators"),
            Field("clusters", "list[dict]", "the layer-clustered view, fields: " + ", ".join(f.name for f in CLUSTER_FIELDS)),
            Field("module_cost", "dict", "XLA's module-level cost_analysis() totals (flops, bytes accessed)"),
        ),
    )
)
