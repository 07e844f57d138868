"""arena-analyze: a zoo model's training step -> HLO operator table (per-instruction XLA costs, units,
phases) and the layer-clustered view the planner consumes.

    from libarena.analyze import AnalyzeConfig, analyze_model, read_operator_table
    ops = analyze_model(AnalyzeConfig(model="moe__2.4B", global_batch=256))
    ops.write("ops.parquet", Provenance(tool="arena-analyze", parameters=...))
    ops = read_operator_table("ops.parquet")   # .table, .metadata, .clusters, .units

Importing this package does not import JAX; analyze_model does.
"""

from libarena.analyze.api import (
    DEFAULT_NUM_CLUSTERS,
    AnalyzeConfig,
    OperatorTable,
    analyze_model,
    check_writable,
    read_operator_table,
)

__all__ = [
    "DEFAULT_NUM_CLUSTERS",
    "AnalyzeConfig",
    "OperatorTable",
    "analyze_model",
    "check_writable",
    "read_operator_table",
]
