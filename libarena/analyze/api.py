"""arena-analyze's library entry points: AnalyzeConfig -> OperatorTable, and reading tables back."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from libarena.artifacts import Provenance, read_table, write_table
from libarena.artifacts.io import check_writable  # noqa: F401 - part of this package's API
from libarena.artifacts.registry import get_kind
from libarena.checks import MAX_BATCH, MAX_SEQ_LEN, Range, check_fields
from libarena.errors import ArenaError

KIND = "operator_table"
DEFAULT_NUM_CLUSTERS = 16

Log = Callable[[str], None]


#: Upper bounds on the sizes a step is lowered at: far above any real job, far below int64 shape overflow.
MAX_GLOBAL_BATCH = MAX_BATCH
#: Clustered operators O at most (a model has a few thousand distinct instruction shapes).
MAX_CLUSTERS = 4096


@dataclass(frozen=True)
class AnalyzeConfig:
    """What to analyze: a zoo model's full training step at a global batch, in a training dtype."""

    model: str
    global_batch: int
    #: Sequence length (image side for vision models); None = the model's own.
    seq_len: int | None = None
    dtype: str = "bf16"
    num_clusters: int = DEFAULT_NUM_CLUSTERS

    def __post_init__(self) -> None:
        """ArenaError (one line) for anything out of range; the dtype is normalised (``float32`` -> ``fp32``)."""
        from libarena.hardware.catalogue import normalize_dtype
        from libarena.models import get_model

        get_model(self.model)  # unknown family or size -> ArenaError
        # XLA shapes are int64 extents: absurd sizes would overflow inside the lowering (found by fuzzing).
        check_fields(self, {
            "global_batch": Range("--global-batch", 1, MAX_GLOBAL_BATCH, integer=True),
            "seq_len": Range("--seq-len", 1, MAX_SEQ_LEN, integer=True, optional=True),
            "num_clusters": Range("--num-clusters", 1, MAX_CLUSTERS, integer=True),
        })
        object.__setattr__(self, "dtype", normalize_dtype(str(self.dtype)))

    def parameters(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class OperatorTable:
    """An operator_table artifact in memory: one row per HLO instruction, and its metadata (the model
    record, the clustered view, XLA's module totals)."""

    table: pa.Table
    metadata: dict[str, Any]
    provenance: Provenance | None = None
    source: str = ""
    #: Wall-clock seconds per analysis step (not stored: artifacts stay deterministic).
    timings: dict[str, float] = field(default_factory=dict)

    #: The artifact kind, so consumers can treat this like a TableArtifact read from disk.
    kind = "operator_table"

    @property
    def model_name(self) -> str:
        return str(self.metadata["model"]["name"])

    @property
    def clusters(self) -> list[dict[str, Any]]:
        return list(self.metadata["clusters"])

    @property
    def units(self) -> list[dict[str, Any]]:
        return list(self.metadata.get("units", []))

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    def write(self, path: str | os.PathLike[str], provenance: Provenance | None = None) -> None:
        """Parquet to a file, an Arrow IPC stream to ``-`` (stdout); atomic."""
        prov = provenance or self.provenance or Provenance(tool="libarena.analyze", parameters={})
        write_table(path, KIND, self.table, prov, self.metadata)


def read_operator_table(path: str | os.PathLike[str]) -> OperatorTable:
    """Read an operator_table artifact (Parquet file or Arrow stream, ``-`` = stdin)."""
    from libarena.artifacts import check_columns
    from libarena.artifacts.kinds.operator_table import check_operator_metadata

    artifact = read_table(path, KIND)
    meta = artifact.metadata
    check_operator_metadata(meta, artifact.source)
    check_columns(artifact.table, artifact.source, non_null=("op_index", "name", "opcode", "phase", "shape"),
                  non_negative=("flops", "transcendentals", "bytes_read", "bytes_written", "param_bytes"))
    return OperatorTable(artifact.table, meta, artifact.provenance, artifact.source)


# --------------------------------------------------------------------------------------------------


def _unit_activations(model: Any, params: list[Any], global_batch: int, seq_len: int | None,
                      dtype: Any) -> tuple[list[tuple[int, int]], list[Any]]:
    """Per unit at the analysed batch: (input bytes, output bytes) and what it keeps for its backward pass
    (models.training.saved_activations), by shape evaluation only (through the shared layer functions the
    lowering traced, so repeated layers are not traced again)."""
    from libarena.models.training import batch_spec, saved_activations, tree_bytes, unit_outputs

    outputs = unit_outputs(model, params, batch_spec(model, global_batch, seq_len), dtype, share_traces=True)
    doubled = unit_outputs(model, params, batch_spec(model, 2 * global_batch, seq_len), dtype, share_traces=True)
    saved = saved_activations(model, params, global_batch, seq_len, dtype, outputs, doubled)
    return [(tree_bytes(outputs[i - 1]) if i else 0, tree_bytes(out)) for i, out in enumerate(outputs)], saved




def analyze_model(
    config: AnalyzeConfig | str,
    global_batch: int | None = None,
    *,
    seq_len: int | None = None,
    dtype: str = "bf16",
    num_clusters: int = DEFAULT_NUM_CLUSTERS,
    log: Log | None = None,
) -> OperatorTable:
    """Lower a model's training step abstractly and build its operator table.

    ``analyze_model(AnalyzeConfig(...))`` or, equivalently, ``analyze_model("moe__2.4B", 256, dtype=...)``.
    """
    import jax

    if isinstance(config, str):
        if global_batch is None:
            raise ArenaError(f"analyze_model({config!r}): the global batch size is missing")
        config = AnalyzeConfig(config, global_batch, seq_len, dtype, num_clusters)
    elif global_batch is not None:
        raise TypeError("analyze_model: pass either an AnalyzeConfig or a model name with its settings, not both")

    from libarena.analyze import operators, xla_cost
    from libarena.analyze.clusters import UnitRecord, balanced_partition, cluster_records
    from libarena.models import get_model
    from libarena.models.training import compute_dtype, tree_bytes

    model = get_model(config.model)
    say = log or (lambda _msg: None)
    timings: dict[str, float] = {}
    start = time.perf_counter()

    step = operators.lower_train_step(model, config.global_batch, config.seq_len, config.dtype)
    timings["lower_s"] = time.perf_counter() - start
    say(f"lowered {model.name} at global batch {config.global_batch} ({config.dtype}) in {timings['lower_s']:.1f}s")

    t = time.perf_counter()
    unit_specs = model.units
    rows, counts = operators.build_rows(step, [u.name for u in unit_specs], log=say)
    module_props = xla_cost.module_properties(step.hlo_module)
    timings["costs_s"] = time.perf_counter() - t

    t = time.perf_counter()
    params = step.params
    cdtype = compute_dtype(config.dtype)
    activations, saved = _unit_activations(model, params, config.global_batch, config.seq_len, cdtype)
    seq_len = config.seq_len or model.config.seq_len
    dispatch = model.expert_dispatch_shape(config.global_batch, seq_len)
    dispatch_bytes = model.expert_dispatch_bytes(config.global_batch, np.dtype(cdtype).itemsize, seq_len)

    unit = np.asarray(rows.unit, dtype=np.int64)
    phase = np.asarray(rows.phase)
    flops = np.asarray(rows.flops)
    moved = np.asarray(rows.bytes_read) + np.asarray(rows.bytes_written)
    num_units = len(unit_specs)

    def per_unit(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
        keep = mask & (unit >= 0)
        return np.bincount(unit[keep], weights=values[keep], minlength=num_units)

    fwd, bwd, opt = phase == "forward", phase == "backward", phase == "optimizer"
    fwd_flops, bwd_flops = per_unit(flops, fwd), per_unit(flops, bwd)
    compute_bytes, fwd_bytes = per_unit(moved, fwd | bwd), per_unit(moved, fwd)
    opt_flops, opt_bytes = per_unit(flops, opt), per_unit(moved, opt)
    num_ops = np.bincount(unit[unit >= 0], minlength=num_units)

    records = []
    for i, spec in enumerate(unit_specs):
        count = int(sum(int(np.prod(x.shape, dtype=np.int64)) for x in jax.tree.leaves(params[i])))
        in_bytes, out_bytes = activations[i]
        if spec.alltoalls and not dispatch_bytes:
            raise ValueError(f"{model.name}: unit {spec.name} has all-to-alls but the model gives no expert dispatch shape")
        records.append(
            UnitRecord(
                index=i,
                name=spec.name,
                kind=spec.kind,
                num_ops=int(num_ops[i]),
                forward_flops=float(fwd_flops[i]),
                backward_flops=float(bwd_flops[i]),
                flops=float(fwd_flops[i] + bwd_flops[i]),
                bytes=float(compute_bytes[i]),
                forward_bytes=float(fwd_bytes[i]),
                optimizer_flops=float(opt_flops[i]),
                optimizer_bytes=float(opt_bytes[i]),
                param_count=count,
                param_bytes=float(tree_bytes(params[i])),
                input_activation_bytes=float(in_bytes),
                activation_bytes=float(out_bytes),
                saved_activation_bytes=float(saved[i].per_batch),
                saved_constant_bytes=float(saved[i].constant),
                tp_allreduce_bytes=model.tp_allreduce_bytes(i, in_bytes, out_bytes, config.global_batch, np.dtype(cdtype).itemsize),
                alltoall_bytes=spec.alltoall_bytes(dispatch_bytes),
            )
        )
    ranges = balanced_partition([r.flops for r in records], config.num_clusters)
    clusters = cluster_records(records, ranges)
    cluster_of_unit = np.empty(num_units, dtype=np.int64)
    for index, (a, b) in enumerate(ranges):
        cluster_of_unit[a:b] = index
    cluster = np.where(unit >= 0, cluster_of_unit[np.maximum(unit, 0)], -1)
    unit_names = [u.name for u in unit_specs]

    n = len(unit)
    table = pa.Table.from_arrays(
        [
            pa.array(np.arange(n, dtype=np.int64)),
            pa.array(rows.name, pa.string()),
            pa.array(rows.opcode, pa.string()),
            pa.array(rows.computation, pa.string()),
            pa.array(rows.shape, pa.string()),
            pa.array(rows.operand_shapes, pa.list_(pa.string())),
            pa.array(rows.dtype, pa.string()),
            pa.array(flops, pa.float64()),
            pa.array(rows.transcendentals, pa.float64()),
            pa.array(rows.bytes_read, pa.float64()),
            pa.array(rows.bytes_written, pa.float64()),
            pa.array([unit_names[u] if u >= 0 else "" for u in rows.unit], pa.string()),
            pa.array(unit, pa.int64()),
            pa.array(cluster, pa.int64()),
            pa.array(rows.phase, pa.string()),
            pa.array(rows.is_parameter_op, pa.bool_()),
            pa.array(rows.param_bytes, pa.float64()),
        ],
        schema=get_kind(KIND).arrow_schema(),
    )
    unattributed = unit < 0
    model_record = dict(model.describe())
    model_record["param_count"] = int(sum(r.param_count for r in records))
    model_record["param_bytes"] = float(sum(r.param_bytes for r in records))
    metadata = {
        "model": model_record,
        "global_batch": config.global_batch,
        "seq_len": int(seq_len),
        "dtype": config.dtype,
        "num_clusters": len(clusters),
        "clusters": clusters,
        "units": [dict(r.as_dict(), cluster=int(cluster_of_unit[r.index])) for r in records],
        "module_cost": {
            key: float(module_props.get(key, 0.0))
            for key in (xla_cost.FLOPS, xla_cost.TRANSCENDENTALS, xla_cost.BYTES_ACCESSED, xla_cost.BYTES_WRITTEN)
        },
        "attribution": {
            "instructions": int(n),
            "unattributed_ops": int(unattributed.sum()),
            "unattributed_flops": float(flops[unattributed].sum()),
            "unattributed_bytes": float(moved[unattributed].sum()),
            "cost_probes": int(counts["cost_probes"]),
        },
        "expert_dispatch_shape": list(dispatch) if dispatch else None,
    }
    timings["assemble_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - start
    say(
        f"{n} instructions in {len(clusters)} clusters; {int(unattributed.sum())} unattributed "
        f"({float(flops[unattributed].sum()):.3g} FLOPs); total {timings['total_s']:.1f}s"
    )
    return OperatorTable(table, metadata, None, model.name, timings)
