"""Typed GPU catalogue: vendor peak figures (dense, no sparsity), each with its public source.

GPU types are registered by name (``register_gpu``); the rest of the code looks them up with
``get_gpu`` and never switches on type strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from libarena.errors import ArenaError
from libarena.hardware.roofline import roofline_seconds
from libarena.registry import Registry

TERA = 1e12
GIGA = 1e9

#: Training dtypes the catalogue knows peak rates for.
DTYPES = ("fp32", "tf32", "bf16", "fp16")


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model. Bandwidths are bytes/s; link and network figures are per direction."""

    name: str
    full_name: str
    architecture: str
    memory_bytes: float
    hbm_bandwidth: float
    #: Peak dense FLOP/s per training dtype; dtypes without tensor-core support fall back to fp32.
    peak_flops: dict[str, float]
    intra_node_link: str
    intra_node_bandwidth: float
    inter_node_network: str
    inter_node_bandwidth: float
    default_gpus_per_node: int
    source: str
    aliases: tuple[str, ...] = field(default=())

    def peak(self, dtype: str) -> float:
        key = normalize_dtype(dtype)
        return self.peak_flops.get(key, self.peak_flops["fp32"])

    def roofline(self, intensity: float, dtype: str) -> float:
        """Attainable FLOP/s at arithmetic intensity ``intensity`` (FLOPs per byte)."""
        return min(self.peak(dtype), intensity * self.hbm_bandwidth)

    def ridge_point(self, dtype: str) -> float:
        return self.peak(dtype) / self.hbm_bandwidth

    def roofline_seconds(self, flops: Any, bytes_moved: Any, dtype: str) -> Any:
        """Roofline time (eq. 2) of operators on this GPU; scalars or arrays (see hardware.roofline)."""
        return roofline_seconds(flops, bytes_moved, self.peak(dtype), self.hbm_bandwidth)


def normalize_dtype(dtype: str) -> str:
    aliases = {"float32": "fp32", "f32": "fp32", "bfloat16": "bf16", "float16": "fp16", "f16": "fp16", "half": "fp16"}
    key = aliases.get(dtype.lower(), dtype.lower())
    if key not in DTYPES:
        raise ArenaError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    return key


#: GPU types by name; aliases and look-ups are case-insensitive ("A100" finds "a100").
GPUS: Registry[GPUSpec] = Registry("GPU type", case_sensitive=False)


def register_gpu(spec: GPUSpec) -> GPUSpec:
    return GPUS.register(spec.name, spec, spec.aliases)


def get_gpu(name: str) -> GPUSpec:
    return GPUS.get(name)


def gpu_names() -> list[str]:
    return GPUS.names()


# PCIe and network figures per direction: PCIe 4.0 x16 = 32 GB/s (the paper quotes 64 GB/s both ways),
# PCIe 3.0 x16 = 16 GB/s; ConnectX-5 = 100 Gb/s, ConnectX-6 = 200 Gb/s; NVLink as per-GPU total / 2.
PCIE3 = 16 * GIGA
PCIE4 = 32 * GIGA
CX5 = 100e9 / 8
CX6 = 200e9 / 8

register_gpu(
    GPUSpec(
        name="h100",
        full_name="NVIDIA H100 SXM5 80GB",
        architecture="Hopper",
        memory_bytes=80 * GIGA,
        hbm_bandwidth=3.35e12,
        peak_flops={"fp32": 67 * TERA, "tf32": 494.5 * TERA, "bf16": 989.5 * TERA, "fp16": 989.5 * TERA},
        intra_node_link="NVLink 4 (900 GB/s total)",
        intra_node_bandwidth=450 * GIGA,
        inter_node_network="ConnectX-6 200 Gb/s",
        inter_node_bandwidth=CX6,
        default_gpus_per_node=8,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5; sparsity figures halved to dense)",
        aliases=("h100-80gb", "h100-sxm"),
    )
)
# The H100's chip with more and faster memory (HBM3e): its arithmetic rates and NVLink, 1.4x the bandwidth.
register_gpu(
    replace(
        get_gpu("h100"),
        peak_flops=dict(get_gpu("h100").peak_flops),  # its own copy: specs share nothing mutable
        name="h200",
        full_name="NVIDIA H200 SXM 141GB",
        memory_bytes=141 * GIGA,
        hbm_bandwidth=4.8e12,
        inter_node_network="ConnectX-7 400 Gb/s",
        inter_node_bandwidth=400e9 / 8,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM; sparsity figures halved to dense)",
        aliases=("h200-141gb", "h200-sxm"),
    )
)
register_gpu(
    GPUSpec(
        name="a100",
        full_name="NVIDIA A100 SXM4 40GB",
        architecture="Ampere",
        memory_bytes=40 * GIGA,
        hbm_bandwidth=1.555e12,
        peak_flops={"fp32": 19.5 * TERA, "tf32": 156 * TERA, "bf16": 312 * TERA, "fp16": 312 * TERA},
        intra_node_link="NVLink 3 (600 GB/s total)",
        intra_node_bandwidth=300 * GIGA,
        inter_node_network="ConnectX-5 100 Gb/s",
        inter_node_bandwidth=CX5,
        default_gpus_per_node=4,
        source="NVIDIA A100 Tensor Core GPU datasheet (40GB SXM)",
        aliases=("a100-40gb",),
    )
)
register_gpu(
    GPUSpec(
        name="a100-80gb",
        full_name="NVIDIA A100 SXM4 80GB",
        architecture="Ampere",
        memory_bytes=80 * GIGA,
        hbm_bandwidth=2.039e12,
        peak_flops={"fp32": 19.5 * TERA, "tf32": 156 * TERA, "bf16": 312 * TERA, "fp16": 312 * TERA},
        intra_node_link="NVLink 3 (600 GB/s total)",
        intra_node_bandwidth=300 * GIGA,
        inter_node_network="ConnectX-6 200 Gb/s",
        inter_node_bandwidth=CX6,
        default_gpus_per_node=8,
        source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)",
    )
)
register_gpu(
    GPUSpec(
        name="a40",
        full_name="NVIDIA A40",
        architecture="Ampere",
        memory_bytes=48 * GIGA,
        hbm_bandwidth=696e9,
        peak_flops={"fp32": 37.4 * TERA, "tf32": 74.8 * TERA, "bf16": 149.7 * TERA, "fp16": 149.7 * TERA},
        intra_node_link="PCIe 4.0 x16",
        intra_node_bandwidth=PCIE4,
        inter_node_network="ConnectX-5 100 Gb/s",
        inter_node_bandwidth=CX5,
        default_gpus_per_node=2,
        source="NVIDIA A40 datasheet (GDDR6 696 GB/s; sparsity figures halved to dense)",
    )
)
register_gpu(
    GPUSpec(
        name="a10",
        full_name="NVIDIA A10",
        architecture="Ampere",
        memory_bytes=24 * GIGA,
        hbm_bandwidth=600e9,
        peak_flops={"fp32": 31.2 * TERA, "tf32": 62.5 * TERA, "bf16": 125 * TERA, "fp16": 125 * TERA},
        intra_node_link="PCIe 4.0 x16",
        intra_node_bandwidth=PCIE4,
        inter_node_network="ConnectX-6 200 Gb/s",
        inter_node_bandwidth=CX6,
        default_gpus_per_node=2,
        source="NVIDIA A10 Tensor Core GPU datasheet (sparsity figures halved to dense)",
    )
)
register_gpu(
    GPUSpec(
        name="v100",
        full_name="NVIDIA V100 SXM2 32GB",
        architecture="Volta",
        memory_bytes=32 * GIGA,
        hbm_bandwidth=900e9,
        # No bf16 tensor cores on Volta: bf16 runs at the fp32 rate (peak() falls back to fp32).
        peak_flops={"fp32": 15.7 * TERA, "fp16": 125 * TERA},
        intra_node_link="NVLink 2 (300 GB/s total)",
        intra_node_bandwidth=150 * GIGA,
        inter_node_network="ConnectX-5 100 Gb/s",
        inter_node_bandwidth=CX5,
        default_gpus_per_node=16,
        source="NVIDIA Tesla V100 datasheet (SXM2 32GB)",
    )
)
register_gpu(
    GPUSpec(
        name="l20",
        full_name="NVIDIA L20",
        architecture="Ada Lovelace",
        memory_bytes=48 * GIGA,
        hbm_bandwidth=864e9,
        peak_flops={"fp32": 59.8 * TERA, "tf32": 59.8 * TERA, "bf16": 119.5 * TERA, "fp16": 119.5 * TERA},
        intra_node_link="PCIe 4.0 x16",
        intra_node_bandwidth=PCIE4,
        inter_node_network="ConnectX-6 200 Gb/s",
        inter_node_bandwidth=CX6,
        default_gpus_per_node=16,
        source="NVIDIA L20 product brief (GDDR6 864 GB/s; dense tensor figures)",
    )
)
register_gpu(
    GPUSpec(
        name="l4",
        full_name="NVIDIA L4",
        architecture="Ada Lovelace",
        memory_bytes=24 * GIGA,
        hbm_bandwidth=300e9,
        peak_flops={"fp32": 30.3 * TERA, "tf32": 60 * TERA, "bf16": 121 * TERA, "fp16": 121 * TERA},
        intra_node_link="PCIe 4.0 x16",
        intra_node_bandwidth=PCIE4,
        inter_node_network="ConnectX-6 200 Gb/s",
        inter_node_bandwidth=CX6,
        default_gpus_per_node=8,
        source="NVIDIA L4 Tensor Core GPU datasheet (sparsity figures halved to dense)",
    )
)
register_gpu(
    GPUSpec(
        name="t4",
        full_name="NVIDIA T4",
        architecture="Turing",
        memory_bytes=16 * GIGA,
        hbm_bandwidth=320e9,
        # Turing has fp16 tensor cores but no bf16: bf16 falls back to the fp32 rate.
        peak_flops={"fp32": 8.1 * TERA, "fp16": 65 * TERA},
        intra_node_link="PCIe 3.0 x16",
        intra_node_bandwidth=PCIE3,
        inter_node_network="ConnectX-5 100 Gb/s",
        inter_node_bandwidth=CX5,
        default_gpus_per_node=4,
        source="NVIDIA T4 Tensor Core GPU datasheet",
    )
)
