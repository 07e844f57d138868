"""Hand-made operator tables for planner tests (arena-analyze's real tables come from JAX lowering).

``operator_table(clusters)`` turns per-cluster numbers into a valid ``operator_table`` artifact: op rows
(a forward, a backward and an optimizer instruction per cluster, plus a zero-FLOP copy) whose sums match
the cluster records, and the ``clusters`` metadata entry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from libarena.artifacts import Provenance, TableArtifact, write_table
from libarena.artifacts.registry import get_kind

BF16 = 2


def cluster_record(
    index: int,
    flops: float,
    bytes_: float,
    param_count: float = 0.0,
    param_bytes: float | None = None,
    activation_bytes: float = 0.0,
    saved_activation_bytes: float = 0.0,
    tp_allreduce_bytes: float = 0.0,
    alltoall_bytes: float = 0.0,
    input_activation_bytes: float | None = None,
) -> dict[str, Any]:
    """One cluster of one unit (so its largest unit is itself); its input is the previous cluster's output,
    taken to be as large as its own unless given."""
    param_count = int(param_count)
    param_bytes = float(4 * param_count if param_bytes is None else param_bytes)
    return {
        "index": index,
        "units": [f"layer{index}"],
        "num_ops": 4,
        "flops": float(flops),
        "bytes": float(bytes_),
        "optimizer_flops": float(10 * param_count),
        "optimizer_bytes": float(16 * param_count),
        "param_count": param_count,
        "param_bytes": param_bytes,
        "activation_bytes": float(activation_bytes),
        "saved_activation_bytes": float(saved_activation_bytes),
        "saved_constant_bytes": 0.0,
        "input_activation_bytes": float(activation_bytes if input_activation_bytes is None else input_activation_bytes),
        "max_unit_saved_activation_bytes": float(saved_activation_bytes),
        "max_unit_saved_constant_bytes": 0.0,
        "forward_flops": float(flops) / 3,
        "forward_bytes": float(bytes_) / 3 * 0.9,
        "tp_allreduce_bytes": float(tp_allreduce_bytes),
        "alltoall_bytes": float(alltoall_bytes),
    }


def transformer_cluster(index: int, hidden: int, seq_len: int, batch: int, layers: int = 1, moe_experts: int = 0) -> dict[str, Any]:
    """A cluster of ``layers`` GPT-style blocks at the global batch (Megatron's standard counts)."""
    tokens = batch * seq_len
    params = 12 * hidden * hidden * layers * (max(moe_experts, 1) if moe_experts else 1)
    fwd = (24 * tokens * hidden * hidden + 4 * tokens * seq_len * hidden) * layers
    act = tokens * hidden * BF16
    return cluster_record(
        index,
        flops=3 * fwd,
        bytes_=3 * (4 * params + 20 * act * layers),
        param_count=params,
        activation_bytes=act,
        saved_activation_bytes=17 * act * layers,
        tp_allreduce_bytes=4 * act * layers,
        alltoall_bytes=4 * act * layers if moe_experts else 0.0,
    )


def operator_rows(clusters: list[dict[str, Any]]) -> pa.Table:
    rows = []
    for rec in clusters:
        i = rec["index"]
        f, b = rec["flops"], rec["bytes"]
        parts = [
            ("dot", "forward", f / 3, b / 3 * 0.9),
            ("dot", "backward", 2 * f / 3, 2 * b / 3 * 0.9),
            ("copy", "backward", 0.0, b * 0.1),  # zero-FLOP instruction: charged bytes / bandwidth
            ("add", "optimizer", rec["optimizer_flops"], rec["optimizer_bytes"]),
        ]
        for opcode, phase, flops, moved in parts:
            rows.append(
                {
                    "op_index": len(rows),
                    "name": f"{opcode}.{len(rows)}",
                    "opcode": opcode,
                    "computation": "main",
                    "shape": "bf16[1]",
                    "operand_shapes": ["bf16[1]"],
                    "dtype": "bf16",
                    "flops": float(flops),
                    "transcendentals": 0.0,
                    "bytes_read": float(moved) * 0.5,
                    "bytes_written": float(moved) * 0.5,
                    "layer": f"layer{i}",
                    "unit_index": i,
                    "cluster": i,
                    "phase": phase,
                    "is_parameter_op": phase == "optimizer",
                    "param_bytes": rec["param_bytes"] if phase == "optimizer" else 0.0,
                }
            )
    return pa.Table.from_pylist(rows, schema=get_kind("operator_table").arrow_schema())


def metadata(clusters: list[dict[str, Any]], name: str = "test__model", global_batch: int = 256, seq_len: int = 1024, dtype: str = "bf16") -> dict[str, Any]:
    params = sum(c["param_count"] for c in clusters)
    return {
        "model": {"name": name, "family": name.split("__")[0], "param_count": params},
        "global_batch": global_batch,
        "seq_len": seq_len,
        "dtype": dtype,
        "num_clusters": len(clusters),
        "clusters": clusters,
        "module_cost": {"flops": sum(c["flops"] for c in clusters), "bytes accessed": sum(c["bytes"] for c in clusters)},
    }


def operator_table(clusters: list[dict[str, Any]], **meta: Any) -> TableArtifact:
    """An in-memory operator_table artifact (what read_table would return)."""
    return TableArtifact("operator_table", operator_rows(clusters), Provenance(tool="tests"), metadata(clusters, **meta), 2, "test-ops")


def write_operator_table(path: str | Path, clusters: list[dict[str, Any]], **meta: Any) -> Path:
    write_table(path, "operator_table", operator_rows(clusters), Provenance(tool="tests"), metadata(clusters, **meta))
    return Path(path)


def gpt_like(num_clusters: int = 16, hidden: int = 2048, seq_len: int = 1024, batch: int = 256, layers_per_cluster: int = 1, name: str = "gpt3__test") -> TableArtifact:
    clusters = [transformer_cluster(i, hidden, seq_len, batch, layers_per_cluster) for i in range(num_clusters)]
    return operator_table(clusters, name=name, global_batch=batch, seq_len=seq_len)
