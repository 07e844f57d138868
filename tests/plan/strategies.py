"""Hypothesis strategies: random operator tables and small clusters for planner property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from libarena.hardware import cluster_from_dict
from tests.plan.optables import cluster_record, operator_table

GPU_TYPES = ("a100", "v100", "a40", "a10", "h100", "t4")


@st.composite
def cluster_records(draw, min_clusters: int = 2, max_clusters: int = 8):
    count = draw(st.integers(min_clusters, max_clusters))
    records = []
    for i in range(count):
        params = draw(st.integers(0, 2_000_000_000))
        act = draw(st.floats(0, 4e9, allow_nan=False))
        records.append(
            cluster_record(
                i,
                flops=draw(st.floats(0, 5e15, allow_nan=False)),
                bytes_=draw(st.floats(1e6, 5e12, allow_nan=False)),
                param_count=params,
                param_bytes=draw(st.sampled_from([2, 4])) * params,
                activation_bytes=act,
                saved_activation_bytes=draw(st.floats(0, 20)) * act,
                tp_allreduce_bytes=draw(st.floats(0, 8)) * act,
                alltoall_bytes=draw(st.sampled_from([0.0, 1.0, 4.0])) * act,
            )
        )
    return records


@st.composite
def operator_tables(draw, min_clusters: int = 2, max_clusters: int = 8):
    records = draw(cluster_records(min_clusters, max_clusters))
    batch = draw(st.sampled_from([8, 12, 40, 64, 256, 1024]))  # 12 and 40: 4 x s does not always divide them
    return operator_table(records, name="rand__model", global_batch=batch)


@st.composite
def clusters(draw):
    groups = []
    for gpu_type in draw(st.lists(st.sampled_from(GPU_TYPES), min_size=1, max_size=2, unique=True)):
        groups.append(
            {"gpu_type": gpu_type, "nodes": draw(st.integers(1, 4)), "gpus_per_node": draw(st.sampled_from([1, 2, 4, 8]))}
        )
    return cluster_from_dict({"name": "rand", "node_groups": groups})
