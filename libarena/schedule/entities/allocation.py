"""An allocation: GPUs of one type (a job is always homogeneous), as buddy blocks on nodes."""

from __future__ import annotations

from dataclasses import dataclass


def count_index(num_gpus: int) -> int:
    """c with 2 ** c = ``num_gpus`` (a power of two): allocations and performance tables index GPU counts by it."""
    return int(num_gpus).bit_length() - 1


def count_index_at_least(num_gpus: int) -> int:
    """The smallest c with 2 ** c >= ``num_gpus``: a request of ``num_gpus`` rounded up to a buddy block."""
    return max(0, (int(num_gpus) - 1).bit_length())


@dataclass(frozen=True, slots=True)
class Allocation:
    type_index: int
    count_index: int  # num_gpus = 2 ** count_index
    #: (node index, bitmask of the node's GPUs) per node used
    blocks: tuple[tuple[int, int], ...]

    @property
    def num_gpus(self) -> int:
        return 1 << self.count_index

    @property
    def num_nodes(self) -> int:
        return len(self.blocks)
