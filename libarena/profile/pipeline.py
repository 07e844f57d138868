"""End-to-end 1F1B iteration time from per-stage times (§3.4, Fig. 8).

For stage j of s with B micro-batches: ``compute_j`` is one micro-batch's forward + backward on one
worker, ``comm_j`` its sequential intra-stage collectives per micro-batch (TP all-reduces, MoE
all-to-all), ``p2p_j`` its activation send forward plus gradient send backward. Then

    T_j  = compute_j + comm_j + p2p_j
    T    = setup                                  (the runtime's per-step host work: gradient-buffer
                                                   reset, input placement; sum over stages, one host thread)
         + sum_j T_j                              (the first micro-batch through every stage)
         + (B - 1) * max_j (T_j - p2p_j)          (steady state of the slowest stage; P2P overlapped)
         + max_j grad_sync_j                      (DP gradient all-reduce / ZeRO reduce-scatter + all-gather)
         + max_j optimizer_j                      (the optimizer step, stages in parallel)

Devices that share compute. The model above assumes every device is its own hardware (GPUs). When they
are not -- several XLA host devices on one CPU share its cores -- k devices busy at once each run
``slowdown(k)`` times slower than one alone (measured by libarena.profile.concurrency; 1 for GPUs). Then
stage j's k_j workers slow each other by slowdown(k_j), and phases where all N devices work at once (the
steady state, the optimizer step) cannot go faster than the host's capacity: their solo work
``sum_j k_j * x_j`` at ``N / slowdown(N)`` devices' worth of throughput. With slowdown = 1 this bound
never binds (``sum_j k_j x_j / N <= max_j x_j``), so the GPU model is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class StageTimes:
    compute_s: float
    comm_s: float = 0.0
    p2p_s: float = 0.0
    grad_sync_s: float = 0.0
    optimizer_s: float = 0.0
    #: devices of the stage (dp x tp): how many run its computation at once
    workers: int = 1
    #: per-step host work of the runtime for this stage (gradient-buffer reset, input placement)
    setup_s: float = 0.0

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
    setup_s: float = 0.0
    #: slowdown(N) applied for devices sharing compute (1.0: independent devices)
    host_slowdown: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def one_f_one_b(
    stages: Sequence[StageTimes], num_microbatches: int, slowdown: Callable[[int], float] | None = None
) -> IterationEstimate:
    if not stages:
        raise ValueError("a pipeline needs at least one stage")
    if num_microbatches < 1:
        raise ValueError("num_microbatches must be >= 1")
    slow = slowdown or (lambda k: 1.0)
    total = sum(max(1, st.workers) for st in stages)
    shared = max(1.0, float(slow(total)))

    def alone(st: StageTimes) -> float:
        return max(1.0, float(slow(max(1, st.workers))))

    def capacity_bound(work: Sequence[float]) -> float:
        """Seconds the whole host needs for per-stage solo times ``work`` when all devices are busy."""
        return shared * sum(max(1, st.workers) * w for st, w in zip(stages, work, strict=True)) / total

    per_mb = [st.compute_s * alone(st) + st.comm_s + st.p2p_s for st in stages]
    first = sum(per_mb)
    steady = [t - st.p2p_s for t, st in zip(per_mb, stages, strict=True)]
    bottleneck = max(range(len(stages)), key=lambda j: steady[j])
    period = max(steady[bottleneck], capacity_bound([st.compute_s + st.comm_s for st in stages]))
    steady_total = (num_microbatches - 1) * period
    grad = max(st.grad_sync_s for st in stages)
    opt = max(max(st.optimizer_s * alone(st) for st in stages), capacity_bound([st.optimizer_s for st in stages]))
    setup = sum(st.setup_s for st in stages)
    return IterationEstimate(setup + first + steady_total + grad + opt, first, steady_total, grad, opt, bottleneck, setup, shared)
