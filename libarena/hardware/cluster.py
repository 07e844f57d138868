"""Cluster spec files: node groups, each of one GPU type and a node count (YAML or TOML).

```yaml
name: cluster-a
node_groups:
  - {gpu_type: a40, nodes: 16, gpus_per_node: 2}
  - {gpu_type: a10, nodes: 16}          # gpus_per_node defaults to the catalogue's
```
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libarena.artifacts.untrusted import MAX_SPEC_BYTES, check_keys, is_toml, parse_spec_bytes, read_bounded
from libarena.checks import MAX_GPUS, MAX_GPUS_PER_NODE, brief, range_problem
from libarena.errors import ArenaError
from libarena.hardware.catalogue import GPUSpec, get_gpu


@dataclass(frozen=True)
class NodeGroup:
    gpu_type: str
    nodes: int
    gpus_per_node: int

    @property
    def gpu(self) -> GPUSpec:
        return get_gpu(self.gpu_type)

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    node_groups: tuple[NodeGroup, ...]
    source: str = ""

    @property
    def gpu_types(self) -> list[str]:
        seen: list[str] = []
        for group in self.node_groups:
            if group.gpu_type not in seen:
                seen.append(group.gpu_type)
        return seen

    @property
    def total_gpus(self) -> int:
        return sum(g.num_gpus for g in self.node_groups)

    def groups_of(self, gpu_type: str) -> list[NodeGroup]:
        name = get_gpu(gpu_type).name
        return [g for g in self.node_groups if g.gpu_type == name]

    def num_gpus(self, gpu_type: str) -> int:
        return sum(g.num_gpus for g in self.groups_of(gpu_type))

    def num_nodes(self, gpu_type: str) -> int:
        return sum(g.nodes for g in self.groups_of(gpu_type))

    def gpus_per_node(self, gpu_type: str) -> int:
        """GPUs per node of a type. Every node of a type must have as many: grids of whole nodes (the planner)
        and the scheduler's buddy placement take one node size per type."""
        groups = self.groups_of(gpu_type)
        if not groups:
            raise ArenaError(f"cluster {self.name!r} has no {gpu_type} GPUs")
        sizes = sorted({g.gpus_per_node for g in groups})
        if len(sizes) > 1:
            raise ArenaError(f"cluster {self.name!r}: node groups of {gpu_type} differ in GPUs per node "
                             f"({', '.join(map(str, sizes))}); give each its own GPU type")
        return sizes[0]

    def scaled(self, factor: int) -> ClusterSpec:
        """The cluster replicated ``factor`` times: every node group has ``factor`` times its nodes, of the same
        GPU type and shape (so a performance table of the cluster serves the larger one)."""
        if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
            raise ArenaError(f"a cluster scale factor must be a positive integer, got {factor!r}")
        groups = tuple(NodeGroup(g.gpu_type, g.nodes * factor, g.gpus_per_node) for g in self.node_groups)
        scaled = ClusterSpec(self.name if factor == 1 else f"{self.name}-x{factor}", groups, self.source)
        # checked as a cluster file is: a spec no tool would read back is refused here, not written
        cluster_from_dict(scaled.to_dict(), f"{self.name} scaled {factor} times")
        return scaled

    def to_yaml(self) -> str:
        """The spec as a cluster file (what load_cluster reads)."""
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "node_groups": [
                {"gpu_type": g.gpu_type, "nodes": g.nodes, "gpus_per_node": g.gpus_per_node} for g in self.node_groups
            ],
        }


#: The keys of a cluster spec and of one node group.
CLUSTER_KEYS = ("name", "node_groups")
GROUP_KEYS = ("gpu_type", "nodes", "gpus_per_node")


def _count(value: Any, what: str, hi: int, where: str) -> int:
    problem = range_problem(value, 1, hi, integer=True)
    if problem is not None or not isinstance(value, int):
        raise ArenaError(f"{where}: {what}: {problem or f'{brief(value)} is not an integer'}")
    return value


def cluster_from_dict(data: Any, source: str = "cluster spec") -> ClusterSpec:
    """A ClusterSpec from parsed YAML/TOML: unknown keys (a typo would silently take a default), counts out
    of range (``nodes`` and ``gpus_per_node`` integers, at most MAX_GPUS_PER_NODE per node and MAX_GPUS in
    the cluster) and unknown GPU types are one-line errors naming the file and the node group."""
    if not isinstance(data, dict):
        raise ArenaError(f"{source}: expected a mapping with 'name' and 'node_groups'")
    check_keys(data, CLUSTER_KEYS, source)
    groups_raw = data.get("node_groups")
    if not isinstance(groups_raw, list) or not groups_raw:
        raise ArenaError(f"{source}: the cluster has no nodes ('node_groups' is missing or empty)")
    groups = []
    total = 0
    for i, raw in enumerate(groups_raw):
        where = f"{source}: node_groups[{i}]"
        if isinstance(raw, dict):
            check_keys(raw, GROUP_KEYS, where)
        if not isinstance(raw, dict) or "gpu_type" not in raw:
            raise ArenaError(f"{where}: expected a mapping with 'gpu_type' and 'nodes'")
        if not isinstance(raw["gpu_type"], str):
            raise ArenaError(f"{where}: gpu_type: expected a GPU type name, got {brief(raw['gpu_type'])}")
        try:
            gpu = get_gpu(raw["gpu_type"])
        except ArenaError as exc:
            raise ArenaError(f"{where}: {exc}") from None
        nodes = _count(raw.get("nodes"), "nodes", MAX_GPUS, where)
        per_node = _count(raw.get("gpus_per_node", gpu.default_gpus_per_node), "gpus_per_node", MAX_GPUS_PER_NODE, where)
        total += nodes * per_node
        if total > MAX_GPUS:
            raise ArenaError(f"{where}: the cluster would have more than {MAX_GPUS} GPUs")
        groups.append(NodeGroup(gpu.name, nodes, per_node))
    name = data.get("name")
    if name is not None and not isinstance(name, (str, int, float)):
        raise ArenaError(f"{source}: name: expected a string, got {brief(name)}")
    name = str(name or Path(source).stem)
    return ClusterSpec(name=name, node_groups=tuple(groups), source=source)


def load_cluster(path: str | os.PathLike[str]) -> ClusterSpec:
    """A cluster spec file (YAML, or TOML by suffix), read as untrusted input (libarena.artifacts.untrusted)."""
    p = Path(path)
    return cluster_from_bytes(read_bounded(p, MAX_SPEC_BYTES, "cluster spec"), p)


def load_cluster_input(path: str | os.PathLike[str]) -> tuple[ClusterSpec, dict[str, Any]]:
    """:func:`load_cluster`, with the spec's provenance entry named by the bytes that were parsed."""
    from libarena.artifacts.io import read_input_ref

    raw = read_bounded(Path(path), MAX_SPEC_BYTES, "cluster spec")
    return cluster_from_bytes(raw, path), read_input_ref(path, raw)


def cluster_from_bytes(raw: bytes, source: str | os.PathLike[str]) -> ClusterSpec:
    """A cluster spec from the bytes of its file (read once by a caller that also hashes them), YAML or TOML
    by the file's suffix."""
    data = parse_spec_bytes(raw, str(source), "cluster spec", toml=is_toml(source))
    return cluster_from_dict(data, source=str(source))


def write_scaled_cluster(source: str | os.PathLike[str], output: str | os.PathLike[str], factor: int) -> ClusterSpec:
    """``arena-schedule cluster scale``: the cluster spec ``source`` replicated ``factor`` times, written to
    ``output`` (YAML, atomically; ``-``: stdout); returns the scaled spec."""
    from libarena.artifacts import write_bytes

    from libarena.artifacts.io import refuse_overwriting_inputs

    from libarena.artifacts.untrusted import is_toml

    refuse_overwriting_inputs(output, {"cluster spec": source})
    if str(output) != "-" and is_toml(output):  # load_cluster would read the YAML written as TOML, and refuse it
        raise ArenaError(f"-o {output}: a scaled cluster is written as YAML; name the output .yaml")
    scaled = load_cluster(source).scaled(factor)
    write_bytes(output, scaled.to_yaml().encode())
    return scaled
