"""Hardware: the typed GPU catalogue and cluster spec files."""

from libarena.hardware.catalogue import DTYPES, GPUSpec, get_gpu, gpu_names, normalize_dtype, register_gpu
from libarena.hardware.cluster import (
    ClusterSpec,
    NodeGroup,
    cluster_from_bytes,
    cluster_from_dict,
    load_cluster,
    load_cluster_input,
    write_scaled_cluster,
)
from libarena.hardware.comm import GroupPlacement

__all__ = [
    "DTYPES",
    "ClusterSpec",
    "GPUSpec",
    "GroupPlacement",
    "NodeGroup",
    "cluster_from_bytes",
    "cluster_from_dict",
    "get_gpu",
    "gpu_names",
    "load_cluster",
    "load_cluster_input",
    "normalize_dtype",
    "register_gpu",
    "write_scaled_cluster",
]
