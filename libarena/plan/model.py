"""The planner's view of a model: the operator table's clustered operators, validated, as numpy arrays.

Roofline loads (eq. 2, libarena.hardware.roofline) are computed per HLO instruction and summed per
cluster. Every phase counts (forward, backward and optimizer update all run on the stage's GPUs).

The operator table is XLA's HLO *before* fusion, so eq. 2 charges every elementwise instruction its own
round trip to memory. That is the paper's planner load and stays as it is (it ranks partitions); the
execution-free performance estimate (profile/roofline.py) instead uses :meth:`ModelProfile.fused_loads`,
where only what reaches device memory after XLA's fusion passes is charged bytes: the operands and results
of the instructions fusion does not dissolve (dot, convolution, reduce, gather, scatter, copies...), and
the parameter and optimizer-state buffers every instruction reads or writes directly.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from libarena.artifacts import TableArtifact
from libarena.artifacts import check_columns
from libarena.artifacts.kinds.operator_table import CLUSTER_FIELDS, PHASES, check_cluster_records
from libarena.checks import MAX_BATCH, MAX_SEQ_LEN, brief
from libarena.errors import ArenaError
from libarena.hardware import GPUSpec, normalize_dtype
from libarena.plan.layout import StageLayout

#: Cluster-record fields the planner reads, as float arrays.
_NUMERIC_FIELDS = tuple(f.name for f in CLUSTER_FIELDS if f.type in ("int", "float") and f.name not in ("index", "num_ops"))


def operator_table_digest(artifact: TableArtifact) -> str:
    """sha256 of the table's canonical Arrow IPC serialisation plus its metadata (as sorted JSON).

    The same whether the table came from a Parquet file or was piped as an Arrow stream, so plans made
    from either name the same operator table.
    """
    table = artifact.table.replace_schema_metadata(None)
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    h = hashlib.sha256(sink.getvalue())
    h.update(json.dumps(artifact.metadata, sort_keys=True, default=str).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class ModelProfile:
    """The clustered model, one entry per clustered operator (O of them), in model order."""

    name: str
    model: dict[str, Any]
    global_batch: int
    seq_len: int
    dtype: str
    clusters: tuple[dict[str, Any], ...]
    #: Per-cluster arrays (length O) of every numeric CLUSTER_FIELDS entry.
    arrays: dict[str, np.ndarray]
    #: Per-instruction FLOPs, bytes moved and cluster index, for roofline loads.
    op_flops: np.ndarray
    op_bytes: np.ndarray
    op_cluster: np.ndarray
    #: Per-instruction bytes that reach device memory once XLA has fused elementwise chains, and whether
    #: the instruction belongs to the optimizer update (see fused_loads).
    op_fused_bytes: np.ndarray
    op_is_optimizer: np.ndarray
    #: the instruction belongs to the forward pass (what activation recomputation repeats)
    op_is_forward: np.ndarray
    digest: str
    source: str

    @property
    def num_clusters(self) -> int:
        return len(self.clusters)

    def loads(self, gpu: GPUSpec) -> np.ndarray:
        """Roofline load (seconds on one GPU) of each cluster, eq. 2, summed over its instructions."""
        per_op = gpu.roofline_seconds(self.op_flops, self.op_bytes, self.dtype)
        return _cluster_sums(per_op, self.op_cluster, self.num_clusters)

    def fused_loads(self, gpu: GPUSpec) -> tuple[np.ndarray, np.ndarray]:
        """Per-cluster roofline seconds on one GPU after fusion: (forward + backward, optimizer update)."""
        per_op = gpu.roofline_seconds(self.op_flops, self.op_fused_bytes, self.dtype)
        optimizer = np.where(self.op_is_optimizer, per_op, 0.0)
        return (
            _cluster_sums(per_op - optimizer, self.op_cluster, self.num_clusters),
            _cluster_sums(optimizer, self.op_cluster, self.num_clusters),
        )

    def forward_loads(self, gpu: GPUSpec) -> np.ndarray:
        """Roofline load (eq. 2) of each cluster's forward instructions: what recomputing it adds to its load."""
        per_op = gpu.roofline_seconds(self.op_flops, self.op_bytes, self.dtype)
        return _cluster_sums(np.where(self.op_is_forward, per_op, 0.0), self.op_cluster, self.num_clusters)

    def fused_forward_loads(self, gpu: GPUSpec) -> np.ndarray:
        """Per-cluster roofline seconds of the forward pass on one GPU after fusion (a recomputation's time)."""
        per_op = gpu.roofline_seconds(self.op_flops, self.op_fused_bytes, self.dtype)
        return _cluster_sums(np.where(self.op_is_forward, per_op, 0.0), self.op_cluster, self.num_clusters)

    @property
    def param_bytes_per_param(self) -> float:
        count = float(self.arrays["param_count"].sum())
        return float(self.arrays["param_bytes"].sum()) / count if count > 0 else 4.0


def _cluster_sums(values: np.ndarray, cluster: np.ndarray, num_clusters: int) -> np.ndarray:
    """Sum per cluster; instructions not attributed to a cluster (index -1: step-global glue such as the
    loss scaling) are charged to clusters in proportion to their attributed share."""
    attributed = cluster >= 0
    sums = np.bincount(cluster[attributed], weights=values[attributed], minlength=num_clusters).astype(np.float64)
    glue = float(values[~attributed].sum())
    total = float(sums.sum())
    if glue > 0:
        sums += glue * (sums / total) if total > 0 else glue / num_clusters
    return sums


#: Instructions XLA's fusion passes dissolve into a consumer (elementwise arithmetic, type conversion,
#: broadcasts, reshapes and other views): their intermediate results never round-trip through memory.
FUSIBLE_OPCODES = frozenset({
    "abs", "add", "and", "atan2", "bitcast", "bitcast-convert", "broadcast", "cbrt", "ceil", "clamp", "compare",
    "complex", "constant", "convert", "cosine", "divide", "erf", "exponential", "exponential-minus-one", "floor",
    "get-tuple-element", "imag", "iota", "is-finite", "log", "log-plus-one", "logistic", "maximum", "minimum",
    "multiply", "negate", "not", "or", "parameter", "popcnt", "power", "real", "reduce-precision", "remainder",
    "reshape", "round-nearest-afz", "round-nearest-even", "rsqrt", "select", "shift-left", "shift-right-arithmetic",
    "shift-right-logical", "sign", "sine", "slice", "sqrt", "subtract", "tan", "tanh", "tuple", "xor",
})


def fused_bytes(opcode: np.ndarray, moved: np.ndarray, param_bytes: np.ndarray) -> np.ndarray:
    """Bytes each instruction moves through device memory once elementwise chains are fused: all of them
    for an instruction fusion keeps (its operands are read and its result written), only the parameter /
    optimizer-state buffers it touches directly for a fusible one."""
    fusible = np.isin(opcode, list(FUSIBLE_OPCODES))
    return np.where(fusible, np.minimum(param_bytes, moved), moved)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ArenaError(f"{where}: expected a non-negative number, got {value!r}")
    return float(value)


def _column(table: pa.Table, name: str, source: str) -> np.ndarray:
    arr = table.column(name).to_numpy(zero_copy_only=False)
    if arr.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
        if bad.size:
            raise ArenaError(f"{source}: row {int(bad[0]) + 1}, column {name!r}: expected a non-negative number, "
                             f"got {float(arr[bad[0]])!r}")
    return arr


def load_model_profile(artifact: TableArtifact) -> ModelProfile:
    """Validate an operator_table artifact and turn it into a :class:`ModelProfile`."""
    source = artifact.source
    if artifact.kind != "operator_table":
        raise ArenaError(f"{source}: is a {artifact.kind} artifact, expected operator_table")
    table = artifact.table
    if table.num_rows == 0:
        raise ArenaError(f"{source}: the operator table is empty (no instructions)")
    meta = artifact.metadata
    for key in ("model", "global_batch", "clusters", "dtype"):
        if key not in meta:
            raise ArenaError(f"{source}: operator table metadata has no {key!r} entry")
    model = meta["model"]
    if not isinstance(model, dict) or not model.get("name"):
        raise ArenaError(f"{source}: operator table metadata 'model' must be a record with a 'name'")
    global_batch = meta["global_batch"]
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or not 0 < global_batch <= MAX_BATCH:
        raise ArenaError(f"{source}: global_batch must be an integer in [1, {MAX_BATCH}], got {brief(global_batch)}")
    seq_len = meta.get("seq_len")
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 0 <= seq_len <= MAX_SEQ_LEN):
        raise ArenaError(f"{source}: seq_len must be an integer in [0, {MAX_SEQ_LEN}], got {brief(seq_len)}")
    try:
        dtype = normalize_dtype(str(meta["dtype"]))
    except ArenaError as exc:
        raise ArenaError(f"{source}: {exc}") from None
    clusters_raw = check_cluster_records(meta, source)
    # the plans file carries the records on: what its readers refuse is refused here (units name the stages)
    StageLayout.from_cluster_records(clusters_raw, f"{source}: operator table metadata")
    num_clusters = len(clusters_raw)
    arrays = {name: np.zeros(num_clusters) for name in _NUMERIC_FIELDS}
    clusters = []
    for i, rec in enumerate(clusters_raw):
        where = f"{source}: clusters[{i}]"
        for name in _NUMERIC_FIELDS:
            arrays[name][i] = _number(rec[name], f"{where}.{name}")
        clusters.append(dict(rec))

    flops = _column(table, "flops", source).astype(np.float64)
    moved = _column(table, "bytes_read", source).astype(np.float64) + _column(table, "bytes_written", source).astype(np.float64)
    cluster_column = table.column("cluster")  # int64 (read_table casts): nulls would read as NaN
    if cluster_column.null_count:
        row = int(np.flatnonzero(cluster_column.is_null().to_numpy(zero_copy_only=False))[0])
        raise ArenaError(f"{source}: row {row + 1}, column 'cluster': a missing value is not a cluster index")
    cluster = cluster_column.to_numpy(zero_copy_only=False).astype(np.int64)
    bad = np.flatnonzero((cluster < -1) | (cluster >= num_clusters))
    if bad.size:
        raise ArenaError(
            f"{source}: row {int(bad[0]) + 1}, column 'cluster': {int(cluster[bad[0]])} is not a cluster index (0..{num_clusters - 1})"
        )
    if float(flops.sum()) <= 0 and float(moved.sum()) <= 0:
        raise ArenaError(f"{source}: the operator table has no FLOPs and no bytes: nothing to plan")
    check_columns(table, source, non_null=("name", "opcode", "phase"))  # as arena-analyze show reads them
    opcode = table.column("opcode").to_numpy(zero_copy_only=False).astype(str)
    param_bytes = _column(table, "param_bytes", source).astype(np.float64)
    phase = table.column("phase").to_numpy(zero_copy_only=False).astype(str)
    bad = np.flatnonzero(~np.isin(phase, PHASES))
    if bad.size:  # an unknown phase would count as backward work nowhere and as no optimizer or forward op
        raise ArenaError(f"{source}: row {int(bad[0]) + 1}, column 'phase': {brief(str(phase[bad[0]]))} is not one of "
                         f"{', '.join(PHASES)}")
    return ModelProfile(
        name=str(model["name"]),
        model=dict(model),
        global_batch=int(global_batch),
        seq_len=int(seq_len or 0),
        dtype=dtype,
        clusters=tuple(clusters),
        arrays=arrays,
        op_flops=flops,
        op_bytes=moved,
        op_cluster=cluster,
        op_fused_bytes=fused_bytes(opcode, moved, param_bytes),
        op_is_optimizer=phase == "optimizer",
        op_is_forward=phase == "forward",
        digest=operator_table_digest(artifact),
        source=source,
    )
