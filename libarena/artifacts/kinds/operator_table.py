"""``operator_table``: arena-analyze's output, one row per HLO instruction of the training step.

The layer-clustered view the planner consumes travels in the same file, in the ``clusters`` metadata
entry (one record per clustered operator, see CLUSTER_FIELDS), so a single artifact flows down the pipe.
"""

import math
from typing import Any

from libarena.artifacts.registry import ArtifactKind, Column, Field, register_kind
from libarena.errors import ArenaError

#: the phases an operator row belongs to (arena-analyze writes them; the planner reads them)
PHASES = ("forward", "backward", "optimizer")

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
    Field("saved_activation_bytes", "float", "activations kept for the backward pass that grow with the batch (its units' vjp residuals)"),
    Field("saved_constant_bytes", "float", "what the units keep for the backward pass that does not grow with the batch (compute-dtype copies of parameters)"),
    Field("input_activation_bytes", "float", "sum of its units' input activations: what a recomputing stage keeps per in-flight micro-batch"),
    Field("max_unit_saved_activation_bytes", "float", "the largest single unit's saved_activation_bytes (alive during that unit's backward when recomputing)"),
    Field("max_unit_saved_constant_bytes", "float", "the largest single unit's saved_constant_bytes"),
    Field("forward_flops", "float", "forward FLOPs: what a recomputation repeats"),
    Field("forward_bytes", "float", "forward bytes read and written: what a recomputation repeats"),
    Field("tp_allreduce_bytes", "float", "bytes all-reduced per step (fwd+bwd) under Megatron-style tensor parallelism"),
    Field("alltoall_bytes", "float", "expert all-to-all bytes per step (fwd+bwd); 0 for dense models"),
)

def _from_version_1(table: Any, metadata: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Version 1 -> 2: the recomputation fields of units and clusters, from the units' records and the rows."""
    import numpy as np

    units = [dict(u) for u in metadata["units"]]
    phase = np.asarray(table.column("phase").to_pylist(), dtype=object)
    unit_index = np.asarray(table.column("unit_index").to_pylist(), dtype=np.int64)
    moved = np.asarray(table.column("bytes_read").to_pylist(), dtype=np.float64) + np.asarray(
        table.column("bytes_written").to_pylist(), dtype=np.float64)
    # Check the range before np.bincount: an index near 2**63 overflows its size computation and corrupts
    # the heap instead of raising (numpy 2.x), so a hostile table would crash the reader at exit.
    if unit_index.size and (unit_index.min() < -1 or unit_index.max() >= len(units)):
        raise ValueError(f"unit_index outside -1..{len(units) - 1}")
    if any(not isinstance(u.get("index"), int) or not 0 <= u["index"] < len(units) for u in units):
        raise ValueError("a unit's index is outside its table")
    forward = (phase == "forward") & (unit_index >= 0)
    forward_bytes = np.bincount(unit_index[forward], weights=moved[forward], minlength=len(units))
    for u in units:
        u.setdefault("forward_bytes", float(forward_bytes[u["index"]]))
        u.setdefault("saved_constant_bytes", 0.0)
    by_name = {u["name"]: u for u in units}
    clusters = []
    for rec in metadata["clusters"]:
        members = [by_name[name] for name in rec["units"]]
        clusters.append({
            **rec,
            "saved_constant_bytes": 0.0,
            "input_activation_bytes": float(sum(u["input_activation_bytes"] for u in members)),
            "max_unit_saved_activation_bytes": float(max(u["saved_activation_bytes"] for u in members)),
            "max_unit_saved_constant_bytes": 0.0,
            "forward_flops": float(sum(u["forward_flops"] for u in members)),
            "forward_bytes": float(sum(u["forward_bytes"] for u in members)),
        })
    return table, {**metadata, "units": units, "clusters": clusters}


OPERATOR_TABLE = register_kind(
    ArtifactKind(
        name="operator_table",
        version=2,
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
            Column("layer", "string", "model unit (layer) the instruction belongs to, from its named scope ('' if unattributed)"),
            Column("unit_index", "int64", "index of that unit in model order (-1 if unattributed)"),
            Column("cluster", "int64", "clustered-operator index the unit belongs to (-1 if unattributed)"),
            Column("phase", "string", "forward, backward or optimizer"),
            Column("is_parameter_op", "bool", "reads or updates parameters / optimizer state"),
            Column("param_bytes", "float64", "bytes a fused kernel still moves at the instruction: parameter and optimizer-state buffers it reads directly or writes as the step's new state, and the gradients an optimizer instruction reads"),
        ),
        fields=(
            Field("model", "dict", "model identifier, family, size, nominal and actual parameter counts, config"),
            Field("global_batch", "int", "global batch size the step was built for"),
            Field("seq_len", "int", "sequence length (transformers)"),
            Field("dtype", "str", "training compute dtype"),
            Field("num_clusters", "int", "O, the number of clustered operators"),
            Field("clusters", "list[dict]", "the layer-clustered view, fields: " + ", ".join(f.name for f in CLUSTER_FIELDS)),
            Field("module_cost", "dict", "XLA's module-level cost_analysis() totals, XLA's keys: flops, transcendentals, 'bytes accessed', 'bytes accessedout{}' (bytes written)"),
            Field("units", "list[dict]", "per-unit totals the clusters are summed from: index, name, kind, cluster, num_ops, forward_flops, backward_flops, flops, bytes, forward_bytes, optimizer_flops, optimizer_bytes, param_count, param_bytes, input_activation_bytes, activation_bytes, saved_activation_bytes, saved_constant_bytes, tp_allreduce_bytes, alltoall_bytes"),
            Field("attribution", "dict", "instructions, unattributed_ops, unattributed_flops, unattributed_bytes (instructions with no unit: a constant shared by several units, the root tuple), cost_probes"),
            Field("expert_dispatch_shape", "list[int] | None", "shape of the tensor one expert all-to-all moves (MoE), [experts, groups, capacity, hidden]"),
        ),
        notes=(
            "Rows: every instruction of the entry computation with `call`s expanded in place (their bodies' instructions become rows named '<call>/<instruction>', once per call site; the call itself and the bodies' parameters give no row); computations applied by reduce/scatter/reduce-window/select-and-scatter/sort give no rows, their cost is in the applying instruction's row. So per-row costs sum to XLA's module totals.",
            "Costs are XLA's HloCostAnalysis of each instruction (a probe module per distinct instruction), at the global batch, before any fusion or optimisation.",
            "Phase: backward = under transpose(...) in the op_name path, optimizer = under the 'optimizer' named scope, otherwise forward; unscoped instructions take the latest phase of their operands.",
            "Cluster records: flops/bytes are forward + backward; activation_bytes is the cluster's last unit's output at the global batch (the loss scalar for the last cluster); saved_activation_bytes + saved_constant_bytes are the units' vjp residuals as JAX keeps them for the backward pass (the parameters and batch entries they merely reference left out), split into the part that grows with the batch and the part that does not, both at the global batch; tp_allreduce_bytes = sum over units of their forward and backward all-reduces x the unit's output bytes (its input for an output layer: a vocabulary-parallel embedding reduces its output forward only, an output layer its input gradient backward only, a block twice each way); alltoall_bytes = sum over units of alltoalls x 2 x expert-dispatch tensor bytes.",
            "Version 1 tables (no recomputation fields; saved_activation_bytes from the unoptimized HLO's forward results read by the backward) are read with the new fields derived from their per-unit records and rows (saved_constant_bytes 0).",
        ),
        upgrades=((1, _from_version_1),),
    )
)


def check_cluster_records(meta: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """The metadata's cluster records, checked as a non-empty list of records with every CLUSTER_FIELDS
    entry, in model order, agreeing with ``num_clusters`` (one-line ArenaError otherwise)."""
    clusters = meta["clusters"]
    if not isinstance(clusters, list) or not clusters:
        raise ArenaError(f"{source}: operator table has no clusters (metadata 'clusters' is empty)")
    declared = meta.get("num_clusters", len(clusters))
    if declared != len(clusters):
        raise ArenaError(f"{source}: num_clusters is {declared!r} but 'clusters' has {len(clusters)} records")
    for i, rec in enumerate(clusters):
        where = f"{source}: clusters[{i}]"
        if not isinstance(rec, dict):
            raise ArenaError(f"{where}: expected a record")
        missing = [f.name for f in CLUSTER_FIELDS if f.name not in rec]
        if missing:
            raise ArenaError(f"{where}: missing field(s) {', '.join(missing)}")
        if rec["index"] != i or isinstance(rec["index"], bool):
            raise ArenaError(f"{where}: index is {rec['index']!r}, expected {i} (clusters must be in model order)")
    return clusters


def check_operator_metadata(meta: Any, source: str) -> None:
    """Validate the metadata every reader of an operator table relies on (one-line ArenaError otherwise)."""
    if not isinstance(meta, dict):
        raise ArenaError(f"{source}: operator table metadata is not a mapping")
    for key in ("model", "clusters", "global_batch", "dtype"):
        if key not in meta:
            raise ArenaError(f"{source}: operator table metadata has no {key!r} entry")
    model = meta["model"]
    if not isinstance(model, dict) or not isinstance(model.get("name"), str) or not model["name"]:
        raise ArenaError(f"{source}: operator table metadata 'model' must be a record with a 'name'")
    batch = meta["global_batch"]
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        raise ArenaError(f"{source}: global_batch must be a positive integer, got {batch!r}")
    if not isinstance(meta["dtype"], str):
        raise ArenaError(f"{source}: dtype must be a string, got {meta['dtype']!r}")
    seq_len = meta.get("seq_len")
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0):
        raise ArenaError(f"{source}: seq_len must be a positive integer, got {seq_len!r}")
    for key in ("module_cost", "attribution"):
        if key in meta and not isinstance(meta[key], dict):
            raise ArenaError(f"{source}: operator table metadata {key!r} must be a mapping")
    # the numbers the readers show and add (arena-analyze show's summary): finite and non-negative where given
    attribution = meta.get("attribution") or {}
    numbers = [("model", k, model[k]) for k in ("param_count", "nominal_params") if k in model]
    module_cost = meta.get("module_cost") or {}
    numbers += [("module_cost", k, module_cost[k]) for k in ("flops", "bytes accessed") if k in module_cost]
    numbers += [("attribution", k, attribution[k]) for k in ("instructions", "unattributed_ops", "unattributed_flops",
                                                             "unattributed_bytes") if k in attribution]
    for record, key, value in numbers:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ArenaError(f"{source}: operator table metadata {record}.{key}: expected a non-negative number, got "
                             f"{value!r:.80}")
    for i, rec in enumerate(check_cluster_records(meta, source)):
        where = f"{source}: clusters[{i}]"
        units = rec["units"]
        if not isinstance(units, list) or not units or not all(isinstance(u, str) for u in units):
            raise ArenaError(f"{where}.units: expected a non-empty list of unit names, got {units!r}")
        for f in CLUSTER_FIELDS:
            if f.type not in ("int", "float") or f.name == "index":
                continue
            value = rec[f.name]
            ok = not isinstance(value, bool) and (isinstance(value, int) if f.type == "int" else isinstance(value, (int, float)))
            if not ok or not math.isfinite(value) or value < 0:
                raise ArenaError(f"{where}.{f.name}: expected a non-negative {f.type}, got {value!r}")
