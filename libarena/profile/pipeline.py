"""End-to-end 1F1B iteration time from per-stage times (§3.4, Fig. 8).

For stage j of s with B micro-batches: ``compute_j`` is one micro-batch's forward + backward on one
worker, ``comm_j`` its sequential intra-stage collectives per micro-batch (TP all-reduces, MoE
all-to-all), ``p2p_j`` its activation send forward plus gradient send backward. Then

    T_j  = compute_j + comm_j + p2p_j
    T    = sum_j T_j                              (the first micro-batch through every stage)
         + (B - 1) * max_j (T_j - p2p_j)          (steady state of the slowest stage; P2P overlapped)
         + max_j grad_sync_j                      (DP gradient all-reduce / ZeRO reduce-scatter + all-gather)
         + max_j optimizer_j                      (the optimizer step, stages in parallel)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class StageTimes:
    compute_s: float
    comm_s: float = 0.0
    p2p_s: float = 0.0
    grad_sync_s: float = 0.0
    optimizer_s: float = 0.0

    @property
    def per_microbatch_s(self) -> float:
        return self.compute_s + self.comm_s + self.p2p_s


@dataclass(frozen=True)
class IterationEstimate:
    iter_time_s: float
    first_microbatch_s: float
    steady_state_s: float
    grad_sync_s: float
    optimizer_s: float
    bottleneck_stage: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def one_f_one_b(stages: Sequence[StageTimes], num_microbatches: int) -> IterationEstimate:
    if not stages:
        raise ValueError("a pipeline needs at least one stage")
    if num_microbatches < 1:
        raise ValueError("num_microbatches must be >= 1")
    first = sum(st.per_microbatch_s for st in stages)
    steady = [st.per_microbatch_s - st.p2p_s for st in stages]
    bottleneck = max(range(len(stages)), key=lambda j: steady[j])
    steady_total = (num_microbatches - 1) * steady[bottleneck]
    grad = max(st.grad_sync_s for st in stages)
    opt = max(st.optimizer_s for st in stages)
    return IterationEstimate(first + steady_total + grad + opt, first, steady_total, grad, opt, bottleneck)
