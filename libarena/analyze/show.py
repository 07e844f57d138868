"""Human (rich) and JSON views of an operator table and of the model zoo, for ``arena-analyze``."""

from __future__ import annotations

from typing import Any

import numpy as np

from libarena.analyze.api import OperatorTable


def _si(value: float, unit: str = "") -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def _bytes(value: float) -> str:
    for scale, prefix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}"
    return f"{value:.0f} B"


def top_ops(ops: OperatorTable, top: int) -> list[dict[str, Any]]:
    """The ``top`` instructions by FLOPs (ties: by bytes moved, then table order)."""
    t = ops.table
    flops = t.column("flops").to_numpy()
    moved = t.column("bytes_read").to_numpy() + t.column("bytes_written").to_numpy()
    order = np.lexsort((np.arange(len(flops)), -moved, -flops))[: max(top, 0)]
    columns = ("op_index", "name", "opcode", "layer", "phase", "shape", "flops", "bytes_read", "bytes_written")
    data = {c: t.column(c).to_pylist() for c in columns}
    return [{c: data[c][int(i)] for c in columns} for i in order]


def summary(ops: OperatorTable, top: int = 15) -> dict[str, Any]:
    meta = ops.metadata
    t = ops.table
    flops = float(np.sum(t.column("flops").to_numpy()))
    moved = float(np.sum(t.column("bytes_read").to_numpy()) + np.sum(t.column("bytes_written").to_numpy()))
    phases = {}
    phase = np.asarray(t.column("phase").to_pylist())
    per_op = t.column("flops").to_numpy()
    for name in ("forward", "backward", "optimizer"):
        phases[name] = float(per_op[phase == name].sum())
    return {
        "model": meta["model"],
        "global_batch": meta["global_batch"],
        "seq_len": meta.get("seq_len"),
        "dtype": meta["dtype"],
        "num_clusters": meta.get("num_clusters", len(meta["clusters"])),
        "instructions": t.num_rows,
        "flops": flops,
        "bytes": moved,
        "flops_by_phase": phases,
        "module_cost": meta.get("module_cost", {}),
        "attribution": meta.get("attribution", {}),
        "top_ops": top_ops(ops, top),
        "clusters": meta["clusters"],
    }


def render(ops: OperatorTable, console: Any, top: int = 15) -> None:
    from rich.table import Table

    info = summary(ops, top)
    model = info["model"]
    module = info["module_cost"]
    attribution = info["attribution"]
    console.print(
        f"[bold]{model['name']}[/bold]  {model.get('family', '')}  params {_si(model.get('param_count', 0))} "
        f"(nominal {_si(model.get('nominal_params', 0))})  global batch {info['global_batch']}  "
        f"seq_len {info['seq_len']}  {info['dtype']}"
    )
    phases = info["flops_by_phase"]
    console.print(
        f"{info['instructions']} instructions: {_si(info['flops'], 'FLOP')} "
        f"(forward {_si(phases['forward'])}, backward {_si(phases['backward'])}, optimizer {_si(phases['optimizer'])}), "
        f"{_bytes(info['bytes'])} moved; XLA module: {_si(module.get('flops', 0), 'FLOP')}, "
        f"{_bytes(module.get('bytes accessed', 0))}"
    )
    if attribution:
        console.print(
            f"unattributed: {attribution.get('unattributed_ops', 0)} instructions, "
            f"{_si(attribution.get('unattributed_flops', 0), 'FLOP')}, {_bytes(attribution.get('unattributed_bytes', 0))}"
        )
    ops_table = Table(title=f"top {len(info['top_ops'])} instructions by FLOPs", title_justify="left")
    for col, justify in (("#", "right"), ("name", "left"), ("opcode", "left"), ("layer", "left"), ("phase", "left"),
                         ("shape", "left"), ("FLOPs", "right"), ("bytes", "right")):
        ops_table.add_column(col, justify=justify)
    for row in info["top_ops"]:
        ops_table.add_row(
            str(row["op_index"]), row["name"], row["opcode"], row["layer"] or "-", row["phase"], row["shape"],
            _si(row["flops"]), _bytes(row["bytes_read"] + row["bytes_written"]),
        )
    console.print(ops_table)
    # a cluster's FLOPs and bytes are its units' forward and backward work; its ops count their optimizer
    # instructions too (the optimizer's FLOPs are the header's total less the clusters')
    clusters = Table(title=f"{len(info['clusters'])} clustered operators (FLOPs and bytes: forward + backward; "
                           f"ops: with the optimizer's)", title_justify="left")
    for col in ("#", "units", "ops", "FLOPs", "bytes", "params", "param bytes", "act. out", "saved act.", "TP all-reduce", "all-to-all"):
        clusters.add_column(col, justify="left" if col == "units" else "right")
    for c in info["clusters"]:
        units = c["units"]
        label = units[0] if len(units) == 1 else f"{units[0]} .. {units[-1]} ({len(units)})"
        clusters.add_row(
            str(c["index"]), label, str(c["num_ops"]), _si(c["flops"]), _bytes(c["bytes"]), _si(c["param_count"]),
            _bytes(c["param_bytes"]), _bytes(c["activation_bytes"]), _bytes(c["saved_activation_bytes"]),
            _bytes(c["tp_allreduce_bytes"]), _bytes(c["alltoall_bytes"]),
        )
    console.print(clusters)


def zoo_rows() -> list[dict[str, Any]]:
    """Every zoo model with its nominal and actual parameter count (shape evaluation only)."""
    from libarena.models import get_model, list_models
    from libarena.models.training import param_count

    rows = []
    for entry in list_models():
        model = get_model(entry.name)
        rows.append(
            {
                "name": entry.name,
                "family": entry.family,
                "size": entry.size,
                "paper_size": entry.paper_size,
                "nominal_params": float(entry.config.nominal_params),
                "param_count": int(param_count(model)),
                "num_units": len(model.units),
            }
        )
    return rows


def render_zoo(rows: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    table = Table(title="model zoo", title_justify="left")
    for col, justify in (("model", "left"), ("family", "left"), ("nominal", "right"), ("actual params", "right"),
                         ("actual/nominal", "right"), ("units", "right"), ("", "left")):
        table.add_column(col, justify=justify)
    for r in rows:
        ratio = r["param_count"] / r["nominal_params"] if r["nominal_params"] else float("nan")
        table.add_row(
            r["name"], r["family"], _si(r["nominal_params"]), f"{r['param_count']:,}", f"{ratio:.3f}",
            str(r["num_units"]), "" if r["paper_size"] else "test size",
        )
    console.print(table)
