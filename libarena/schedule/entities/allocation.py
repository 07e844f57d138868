"""An allocation: GPUs of one type (a job is always homogeneous), as buddy blocks on nodes."""

from __future__ import annotations

from dataclasses import dataclass


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
