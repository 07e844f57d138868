"""Per-GPU-type node pools with buddy allocation inside nodes.

A request of n GPUs (a power of two) takes an aligned block of n GPUs on one node when n <= GPUs per node
(best fit: the fullest node that has such a block, keeping large blocks intact), or n / gpn whole free
nodes otherwise. Every choice is deterministic (ties go to the lowest node index and offset).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from libarena.errors import ArenaError
from libarena.hardware import ClusterSpec
from libarena.schedule.entities.allocation import Allocation


@lru_cache(maxsize=1 << 16)
def _largest_free_block(mask: int, gpn: int) -> int:
    size = gpn
    while size >= 1:
        block = (1 << size) - 1
        for off in range(0, gpn, size):
            if (mask >> off) & block == 0:
                return size
        size >>= 1
    return 0


@lru_cache(maxsize=1 << 16)
def _pick_offset(mask: int, gpn: int, n: int) -> int:
    """Aligned free offset for n GPUs, preferring blocks whose buddy is in use (keeps big blocks whole)."""
    block = (1 << n) - 1
    first = -1
    for off in range(0, gpn, n):
        if (mask >> off) & block == 0:
            if n == gpn:
                return off
            buddy = off ^ n
            if (mask >> buddy) & block != 0:
                return off
            if first < 0:
                first = off
    return first


class TypePool:
    def __init__(self, type_index: int, name: str, nodes: int, gpus_per_node: int):
        if gpus_per_node & (gpus_per_node - 1):
            raise ArenaError(f"{name}: {gpus_per_node} GPUs per node is not a power of two (buddy allocation needs one)")
        self.type_index = type_index
        self.name = name
        self.gpn = gpus_per_node
        self.num_nodes = nodes
        self.capacity = nodes * gpus_per_node
        self.masks = [0] * nodes
        self.free = np.full(nodes, gpus_per_node, dtype=np.int64)
        self.max_block = np.full(nodes, gpus_per_node, dtype=np.int64)
        self.free_total = self.capacity
        self.free_nodes = nodes
        self._largest = gpus_per_node

    def _update(self, node: int) -> None:
        mask = self.masks[node]
        old = int(self.free[node])
        new = self.gpn - mask.bit_count()
        was_free = old == self.gpn
        self.free[node] = new
        self.free_total += new - old
        self.max_block[node] = _largest_free_block(mask, self.gpn)
        is_free = new == self.gpn
        self.free_nodes += int(is_free) - int(was_free)
        self._largest = -1

    @property
    def largest_block(self) -> int:
        if self._largest < 0:
            self._largest = int(self.max_block.max()) if self.num_nodes else 0
        return self._largest

    def can_place(self, n: int) -> bool:
        if n <= self.gpn:
            return self.largest_block >= n
        return self.free_nodes * self.gpn >= n

    def place(self, n: int) -> tuple[tuple[int, int], ...] | None:
        if not self.can_place(n):
            return None
        if n <= self.gpn:
            cand = np.flatnonzero(self.max_block >= n)
            node = int(cand[np.argmin(self.free[cand])])
            off = _pick_offset(self.masks[node], self.gpn, n)
            blk = ((1 << n) - 1) << off
            self.masks[node] |= blk
            self._update(node)
            return ((node, blk),)
        k = n // self.gpn
        nodes = np.flatnonzero(self.free == self.gpn)[:k]
        full = (1 << self.gpn) - 1
        out = []
        for node in nodes.tolist():
            self.masks[node] = full
            self._update(node)
            out.append((node, full))
        return tuple(out)

    def release(self, blocks: tuple[tuple[int, int], ...]) -> None:
        for node, blk in blocks:
            if self.masks[node] & blk != blk:
                raise AssertionError(f"{self.name}: releasing GPUs that are not allocated (node {node})")
            self.masks[node] &= ~blk
            self._update(node)

    def occupy(self, blocks: tuple[tuple[int, int], ...]) -> None:
        for node, blk in blocks:
            if self.masks[node] & blk:
                raise AssertionError(f"{self.name}: GPUs allocated twice (node {node})")
            self.masks[node] |= blk
            self._update(node)

    def try_grow_in_place(self, blocks: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...] | None:
        """Double a single-node block by taking its free buddy, if that keeps it on one node."""
        if len(blocks) != 1:
            return None
        node, blk = blocks[0]
        n = blk.bit_count()
        if 2 * n > self.gpn:
            return None
        off = (blk & -blk).bit_length() - 1
        buddy = (((1 << n) - 1) << (off ^ n))
        if self.masks[node] & buddy:
            return None
        self.masks[node] |= buddy
        self._update(node)
        return ((node, blk | buddy),)

    @staticmethod
    def shrink_blocks(blocks: tuple[tuple[int, int], ...]) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
        """Split an allocation into the half it keeps and the half it frees (in place, no migration)."""
        if len(blocks) >= 2:
            half = len(blocks) // 2
            return blocks[:half], blocks[half:]
        node, blk = blocks[0]
        n = blk.bit_count()
        low = blk & -blk
        off = low.bit_length() - 1
        keep = ((1 << (n // 2)) - 1) << off
        return ((node, keep),), ((node, blk & ~keep),)


class ClusterState:
    def __init__(self, cluster: ClusterSpec, gpu_types: list[str]):
        self.pools: list[TypePool] = []
        for i, t in enumerate(gpu_types):
            self.pools.append(TypePool(i, t, sum(g.nodes for g in cluster.groups_of(t)), cluster.gpus_per_node(t)))

    @property
    def free_gpus(self) -> int:
        return sum(p.free_total for p in self.pools)

    @property
    def total_gpus(self) -> int:
        return sum(p.capacity for p in self.pools)

    def allocation(self, type_index: int, count_index: int) -> Allocation | None:
        blocks = self.pools[type_index].place(1 << count_index)
        return None if blocks is None else Allocation(type_index, count_index, blocks)

    def release(self, alloc: Allocation) -> None:
        self.pools[alloc.type_index].release(alloc.blocks)

    def occupy(self, alloc: Allocation) -> None:
        self.pools[alloc.type_index].occupy(alloc.blocks)
