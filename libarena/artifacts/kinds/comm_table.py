"""``comm_table``: measured collective latencies, the planner's and profiler's communication model.

Produced by ``arena-profile comm``; importable, so nccl-tests results converted to CSV with these
columns work too. ``bytes`` follows nccl-tests' ``size`` convention (see libarena.hardware.comm).
"""

from libarena.artifacts.registry import ArtifactKind, Column, Field, register_kind

COMM_TABLE = register_kind(
    ArtifactKind(
        name="comm_table",
        version=1,
        format="table",
        produced_by="arena-profile comm",
        importable=True,
        description=(
            "One row per measured collective: primitive, GPU type, group size, whether the group spans nodes, "
            "volume and latency. Consumers interpolate latency log-log by volume within one "
            "(primitive, gpu_type, num_devices, crosses_nodes) curve and fall back to the alpha-beta model elsewhere."
        ),
        columns=(
            Column("primitive", "string", "all-reduce, all-gather, reduce-scatter, all-to-all or p2p"),
            Column("gpu_type", "string", "GPU type (hardware catalogue name or alias)"),
            Column("num_devices", "int64", "devices in the communication group"),
            Column("crosses_nodes", "bool", "true when the group spans more than one node"),
            Column("bytes", "float64", "volume per device, nccl-tests 'size' convention"),
            Column("latency_s", "float64", "measured seconds for one collective (mean over repeats)"),
            Column("num_nodes", "int64", "nodes the group spans (0 = unspecified)", required=False, default=0),
            Column("repeats", "int64", "timed repetitions behind latency_s", required=False, default=1),
            Column("timer", "string", "how the latency was measured: cuda-events, host, imported", required=False, default="imported"),
        ),
        fields=(
            Field("hardware", "dict", "where the measurements were taken (cluster name, interconnect)"),
        ),
    )
)
