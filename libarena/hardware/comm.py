"""Communication cost model shared by the planner (l_comm, eq. 4) and the profiler (stage latencies).

A :class:`CommModel` answers one question: how long does one collective take, given its primitive, the
buffer size per device, the group size, the GPU type and whether the group spans several nodes.

Volume convention (the one nccl-tests prints as ``size``, so measured tables can be imported as is):

* ``all-reduce``: the buffer every device holds before and after (the full tensor);
* ``all-gather``: the full gathered output per device; ``reduce-scatter``: the full input per device;
* ``all-to-all``: the total a device sends (its whole send buffer, including the part it keeps);
* ``p2p``: the bytes sent from one device to its peer.

Two implementations:

* :class:`AlphaBetaCommModel`: latency alpha per step plus ring bandwidth terms from the GPU catalogue
  (intra-node link inside a node, the node's network adapter across nodes). Always available.
* :class:`MeasuredCommModel`: a ``comm_table`` artifact (``arena-profile comm``, or an imported CSV from
  nccl-tests) interpolated log-log by volume for the same primitive, GPU type, group size and node
  crossing; anything the table does not cover falls back to an alpha-beta model and the fallback is
  recorded (:meth:`MeasuredCommModel.sources`), so callers can say which model priced what.

Both accept scalar or numpy-array volumes (the planner prices thousands of candidate stages at once).

A stage's collectives run in every group of their axis at once (the tp ranks' data-parallel rings, the dp
replicas' pipeline sends), and the groups that cross nodes share each node's network adapter.
:meth:`CommModel.collective_time` and :meth:`CommModel.boundary_time` price that: the groups sharing an
adapter are priced as one group moving their summed bytes (the adapter's bandwidth is the bottleneck; their
latency steps overlap). :meth:`CommModel.time` prices one group that has the adapters to itself.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from libarena.checks import MAX_COMM_BYTES, MAX_GPUS, MAX_ITERATION_S, range_problem
from libarena.errors import ArenaError
from libarena.hardware.catalogue import get_gpu

#: The collectives Arena prices, in nccl-tests' naming.
PRIMITIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "p2p")

_PRIMITIVE_ALIASES = {
    "allreduce": "all-reduce",
    "all_reduce": "all-reduce",
    "allgather": "all-gather",
    "all_gather": "all-gather",
    "reducescatter": "reduce-scatter",
    "reduce_scatter": "reduce-scatter",
    "alltoall": "all-to-all",
    "all_to_all": "all-to-all",
    "sendrecv": "p2p",
    "send-recv": "p2p",
    "send_recv": "p2p",
}

SOURCE_ALPHA_BETA = "alpha-beta"
SOURCE_MEASURED = "measured"


def normalize_primitive(name: str) -> str:
    key = str(name).strip().lower()
    key = _PRIMITIVE_ALIASES.get(key, key)
    if key not in PRIMITIVES:
        raise ArenaError(f"unknown communication primitive {name!r} (known: {', '.join(PRIMITIVES)})")
    return key


def normalize_gpu_type(name: str) -> str:
    """Catalogue name for a known GPU type; other names (hardware Arena has no figures for) lower-cased."""
    try:
        return get_gpu(name).name
    except ArenaError:
        return str(name).strip().lower()


@dataclass(frozen=True)
class GroupPlacement:
    """Where the groups of one collective of a stage sit on its nodes.

    A stage's ``dp x tp`` devices are numbered tp innermost on consecutive devices of nodes of ``gpus_per_node``:
    a tp group is ``tp`` adjacent devices (``stride`` 1), a dp group ``dp`` devices ``tp`` apart, and every group
    of the axis runs the collective at the same time.
    """

    size: int
    stride: int
    gpus_per_node: int

    @classmethod
    def tensor_parallel(cls, tp: int, gpus_per_node: int) -> GroupPlacement:
        return cls(int(tp), 1, int(gpus_per_node))

    @classmethod
    def data_parallel(cls, dp: int, tp: int, gpus_per_node: int) -> GroupPlacement:
        return cls(int(dp), int(tp), int(gpus_per_node))

    @property
    def crosses_nodes(self) -> bool:
        return self.size * self.stride > self.gpus_per_node

    @property
    def members_per_node(self) -> int:
        """Devices of one group on each node the group spans."""
        return max(1, min(self.size, self.gpus_per_node // self.stride))

    @property
    def groups_per_node(self) -> int:
        """Groups with members on one node: each sends through that node's adapter when the groups cross nodes."""
        return max(1, min(self.stride, self.gpus_per_node))

    def adapter_load(self, primitive: str) -> float:
        """Bytes through each node's adapter per direction when every group runs the collective at once, in units
        of one device's ring share with the adapter to itself (what the alpha-beta price of one group moves)."""
        if not self.crosses_nodes:
            return 1.0
        return self.groups_per_node * _group_load(primitive, self.size, self.members_per_node)

    @property
    def measured_members_per_node(self) -> int:
        """Members per node of the layout a measured table's node-crossing row of this group size is taken to
        have: the group alone on as few nodes as it spans (a node's worth of devices on each), or half of it on
        each of two nodes where it would fit in one, as nccl-tests runs it."""
        return self.gpus_per_node if self.size > self.gpus_per_node else max(1, self.size // 2)


def _group_load(primitive: str, p: int, m: int) -> float:
    """One group's bytes through a node's adapter, in units of one device's ring share: a ring crosses it once per
    direction; an all-to-all sends (p - m) / p of the bytes of each of its m members on the node off the node, where
    one group's price counts (p - 1) / p of one device's."""
    if normalize_primitive(primitive) == "all-to-all" and p > 1:
        return m * (p - m) / (p - 1)
    return 1.0


class CommModel(ABC):
    """Seconds one collective takes; ``bytes_per_device`` may be a scalar or a numpy array."""

    @abstractmethod
    def time(
        self,
        primitive: str,
        bytes_per_device: Any,
        group_size: int,
        gpu_type: str,
        crosses_nodes: bool,
    ) -> Any: ...

    @abstractmethod
    def source(self, primitive: str, group_size: int, gpu_type: str, crosses_nodes: bool) -> str:
        """Which model prices this case: ``alpha-beta`` or ``measured``."""

    def describe(self) -> str:
        return type(self).__name__

    def adapter_share(self, primitive: str, placement: GroupPlacement, gpu_type: str) -> float:
        """How many times the bytes :meth:`time` prices for one group pass each node's adapter when all the
        placement's groups run at once across nodes. Here :meth:`time` is taken to be a measurement of one group
        alone (``GroupPlacement.measured_members_per_node``), which includes its own members' sharing of the
        adapter: the share is the placement's adapter load over that group's. (AlphaBetaCommModel prices one
        device's ring share: its share is the whole load.)"""
        if not placement.crosses_nodes:
            return 1.0
        alone = _group_load(primitive, placement.size, placement.measured_members_per_node)
        return placement.adapter_load(primitive) / alone

    def collective_time(self, primitive: str, bytes_per_device: Any, placement: GroupPlacement, gpu_type: str) -> Any:
        """Seconds of one collective that every group of ``placement`` runs at the same time."""
        crosses = placement.crosses_nodes
        share = self.adapter_share(primitive, placement, gpu_type) if crosses else 1.0
        volume = np.asarray(bytes_per_device, dtype=np.float64) * share
        return self.time(primitive, volume if volume.ndim else float(volume), placement.size, gpu_type, crosses)

    def boundary_time(self, boundary_bytes: Any, dp_from: int, dp_to: int, gpus_from: int, gpus_to: int, crosses_nodes: bool,
                      gpus_per_node: int, gpu_type: str) -> Any:
        """Seconds of a pipeline hand-off of ``boundary_bytes`` (one micro-batch's activation, or its gradient back)
        between two stages of ``dp_from`` and ``dp_to`` replicas. Inside a node the replicas' pairs share it out over
        their own links, min(dp_from, dp_to) at once (the side with fewer replicas sends or receives more each);
        across nodes it passes the adapters of the fewer nodes either stage spans. The same both ways."""
        volume = np.asarray(boundary_bytes, dtype=np.float64)
        if crosses_nodes:
            g = max(1, int(gpus_per_node))
            ways = min(-(-int(gpus_from) // g), -(-int(gpus_to) // g))
        else:
            ways = min(int(dp_from), int(dp_to))
        volume = volume / max(1, ways)
        return self.time("p2p", volume if volume.ndim else float(volume), 2, gpu_type, crosses_nodes)


def _ring_steps(primitive: str, p: int) -> tuple[float, float]:
    """(number of latency-bound steps, bandwidth factor on the volume) of the ring algorithm on p devices."""
    if primitive == "all-reduce":  # reduce-scatter then all-gather
        return 2.0 * (p - 1), 2.0 * (p - 1) / p
    if primitive in ("all-gather", "reduce-scatter"):
        return float(p - 1), (p - 1) / p
    if primitive == "all-to-all":  # pairwise exchange: (p-1) messages of volume/p
        return float(p - 1), (p - 1) / p
    return 1.0, 1.0  # p2p


@dataclass(frozen=True)
class AlphaBetaCommModel(CommModel):
    """Ring collectives: ``steps * alpha + factor * bytes / bandwidth``.

    Bandwidths come from the GPU catalogue (per direction): the intra-node link (NVLink or PCIe) for a
    group inside one node, the node's network adapter (ConnectX) when the group crosses nodes (a ring
    crosses each node boundary once per direction, so one adapter's bandwidth is the bottleneck). The
    alphas are typical NCCL per-step latencies (a few microseconds on a local link, ~10 us over RDMA).
    """

    intra_node_latency_s: float = 5e-6
    inter_node_latency_s: float = 1e-5

    def time(self, primitive, bytes_per_device, group_size, gpu_type, crosses_nodes):
        primitive = normalize_primitive(primitive)
        volume = np.asarray(bytes_per_device, dtype=np.float64)
        p = int(group_size)
        if p <= 1 and primitive != "p2p":
            out = np.zeros_like(volume)
            return out if out.ndim else float(out)
        gpu = get_gpu(gpu_type)
        bandwidth = gpu.inter_node_bandwidth if crosses_nodes else gpu.intra_node_bandwidth
        alpha = self.inter_node_latency_s if crosses_nodes else self.intra_node_latency_s
        steps, factor = _ring_steps(primitive, max(p, 2))
        out = np.where(volume > 0, steps * alpha + factor * volume / bandwidth, 0.0)
        return out if out.ndim else float(out)

    def source(self, primitive, group_size, gpu_type, crosses_nodes):
        return SOURCE_ALPHA_BETA

    def adapter_share(self, primitive, placement, gpu_type):
        """One group's price here is one device's share with the adapter to itself: the share is the whole load."""
        return placement.adapter_load(primitive)

    def describe(self) -> str:
        return f"alpha-beta (alpha {self.intra_node_latency_s * 1e6:g} us intra-node, {self.inter_node_latency_s * 1e6:g} us inter-node)"


@dataclass
class _Curve:
    log_bytes: np.ndarray
    log_latency: np.ndarray
    max_bytes: float
    max_latency: float

    def __post_init__(self) -> None:
        # seconds per byte above the measured range: the slope through the last two points (latency = a + b V,
        # what a collective's cost is), or the last point's latency per byte where that slope is not positive
        # (noise): proportional scaling alone folds the last point's latency term into its bandwidth, which
        # priced 1 GB at 2.4x a table measured up to 4 MiB that follows a + b V exactly
        if self.log_bytes.size >= 2:
            v1, v2 = np.exp(self.log_bytes[-2:])
            l1, l2 = np.exp(self.log_latency[-2:])
            slope = (l2 - l1) / (v2 - v1) if v2 > v1 else 0.0
        else:
            slope = 0.0
        self.slope = float(slope) if slope > 0 else self.max_latency / self.max_bytes

    def __call__(self, volume: np.ndarray) -> np.ndarray:
        positive = np.maximum(volume, 1.0)
        lv = np.log(positive)
        # Inside the measured range: log-log interpolation; below it the smallest measured latency (the
        # latency floor); above it, linear in the volume from the last point.
        inside = np.exp(np.interp(lv, self.log_bytes, self.log_latency))
        above = self.max_latency + self.slope * (positive - self.max_bytes)
        return np.where(volume <= 0, 0.0, np.where(positive > self.max_bytes, above, inside))


@dataclass
class MeasuredCommModel(CommModel):
    """Latencies interpolated from a measured ``comm_table``; uncovered cases priced by ``fallback``."""

    curves: dict[tuple[str, str, int, bool], _Curve]
    fallback: CommModel = field(default_factory=AlphaBetaCommModel)
    source_name: str = "comm table"
    #: (primitive, gpu_type, group_size, crosses_nodes) -> source, for every case priced so far.
    _used: dict[tuple[str, str, int, bool], str] = field(default_factory=dict)

    @classmethod
    def from_rows(
        cls,
        rows: Iterable[tuple[str, str, int, bool, float, float]],
        fallback: CommModel | None = None,
        source_name: str = "comm table",
    ) -> MeasuredCommModel:
        """Build from (primitive, gpu_type, num_devices, crosses_nodes, bytes, latency_s) rows.

        Repeated measurements of one volume are averaged (geometric mean, matching the log-log fit).
        """
        points: dict[tuple[str, str, int, bool], dict[float, list[float]]] = {}
        for i, (primitive, gpu_type, devices, crosses, volume, latency) in enumerate(rows):
            where = f"{source_name}: row {i + 1}"
            try:
                prim = normalize_primitive(primitive)
            except ArenaError as exc:
                raise ArenaError(f"{where}: {exc}") from None
            if volume is None or latency is None or crosses is None:
                raise ArenaError(f"{where}: missing value (bytes, latency_s and crosses_nodes are required)")
            problem = range_problem(devices, 1, MAX_GPUS, integer=True)
            if problem:
                raise ArenaError(f"{where}, column 'num_devices': {problem}")
            problem = range_problem(volume, 1, MAX_COMM_BYTES)
            if problem:
                raise ArenaError(f"{where}, column 'bytes': {problem}")
            problem = range_problem(latency, 0, MAX_ITERATION_S, lo_open=True)
            if problem:
                raise ArenaError(f"{where}, column 'latency_s': {problem}")
            key = (prim, normalize_gpu_type(gpu_type), int(devices), bool(crosses))
            points.setdefault(key, {}).setdefault(float(volume), []).append(float(latency))
        if not points:
            raise ArenaError(f"{source_name}: the communication table is empty")
        curves = {}
        for key, by_volume in points.items():
            volumes = np.array(sorted(by_volume), dtype=np.float64)
            lat = np.array([math.exp(np.mean(np.log(by_volume[v]))) for v in volumes])
            curves[key] = _Curve(np.log(volumes), np.log(lat), float(volumes[-1]), float(lat[-1]))
        return cls(curves=curves, fallback=fallback or AlphaBetaCommModel(), source_name=source_name)

    @property
    def gpu_types(self) -> list[str]:
        return sorted({key[1] for key in self.curves})

    def covers(self, gpu_type: str) -> bool:
        return normalize_gpu_type(gpu_type) in self.gpu_types

    def time(self, primitive, bytes_per_device, group_size, gpu_type, crosses_nodes):
        primitive = normalize_primitive(primitive)
        p = int(group_size)
        key = (primitive, normalize_gpu_type(gpu_type), p, bool(crosses_nodes))
        if p <= 1 and primitive != "p2p":
            return self.fallback.time(primitive, bytes_per_device, p, gpu_type, crosses_nodes)
        curve = self.curves.get(key)
        if curve is None:
            self._used[key] = SOURCE_ALPHA_BETA
            return self.fallback.time(primitive, bytes_per_device, p, gpu_type, crosses_nodes)
        self._used[key] = SOURCE_MEASURED
        out = curve(np.asarray(bytes_per_device, dtype=np.float64))
        return out if out.ndim else float(out)

    def source(self, primitive, group_size, gpu_type, crosses_nodes):
        key = (normalize_primitive(primitive), normalize_gpu_type(gpu_type), int(group_size), bool(crosses_nodes))
        return SOURCE_MEASURED if key in self.curves else SOURCE_ALPHA_BETA

    def adapter_share(self, primitive, placement, gpu_type):
        if self.source(primitive, placement.size, gpu_type, placement.crosses_nodes) == SOURCE_MEASURED:
            return super().adapter_share(primitive, placement, gpu_type)
        return self.fallback.adapter_share(primitive, placement, gpu_type)

    def sources(self) -> dict[tuple[str, str, int, bool], str]:
        """Every case priced so far and the model that priced it."""
        return dict(self._used)

    def describe(self) -> str:
        return f"measured ({self.source_name}: {', '.join(self.gpu_types)}), else {self.fallback.describe()}"


def _check_num_nodes(table: Any, source_name: str) -> None:
    """The optional ``num_nodes`` column (0 = unspecified) is not priced, but a value it holds must agree with its
    row: at most one node per device, and more than one node exactly where the group crosses nodes."""
    if "num_nodes" not in table.column_names:
        return
    rows = zip(table.column("num_nodes").to_pylist(), table.column("num_devices").to_pylist(),
               table.column("crosses_nodes").to_pylist(), strict=True)
    for i, (nodes, devices, crosses) in enumerate(rows):
        if nodes is None:
            continue
        where = f"{source_name}: row {i + 1}, column 'num_nodes'"
        most = devices if isinstance(devices, int) and 1 <= devices <= MAX_GPUS else MAX_GPUS
        problem = range_problem(nodes, 0, most, integer=True)
        if problem:
            raise ArenaError(f"{where}: {problem}")
        if nodes and crosses is not None and bool(crosses) != (nodes > 1):
            raise ArenaError(f"{where}: {nodes} node(s) but crosses_nodes is {str(bool(crosses)).lower()}")


def comm_model_from_table(artifact: Any, fallback: CommModel | None = None) -> MeasuredCommModel:
    """A :class:`MeasuredCommModel` from a ``comm_table`` TableArtifact (see libarena.artifacts)."""
    t = artifact.table
    _check_num_nodes(t, artifact.source)
    rows = zip(
        t.column("primitive").to_pylist(),
        t.column("gpu_type").to_pylist(),
        t.column("num_devices").to_pylist(),
        t.column("crosses_nodes").to_pylist(),
        t.column("bytes").to_pylist(),
        t.column("latency_s").to_pylist(),
        strict=True,
    )
    return MeasuredCommModel.from_rows(rows, fallback=fallback, source_name=artifact.source)


def load_comm_model(path: str, fallback: CommModel | None = None) -> MeasuredCommModel:
    return load_comm_model_input(path, fallback)[0]


def load_comm_model_input(path: str | os.PathLike[str],
                          fallback: CommModel | None = None) -> tuple[MeasuredCommModel, dict[str, Any]]:
    """:func:`load_comm_model`, with the table's provenance entry named by the bytes that were decoded."""
    from libarena.artifacts import read_table
    from libarena.artifacts.stage_cache import cache_input

    artifact = read_table(path, "comm_table")
    return comm_model_from_table(artifact, fallback=fallback), cache_input(path, artifact, "comm_table")
