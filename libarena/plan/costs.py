"""Intra-stage cost model: memory per GPU and communication time of one stage under (dp, tp, zero).

A stage is the clusters [a, b) on ``c = dp * tp`` GPUs. Within a stage tensor-parallel ranks are adjacent
(tp innermost), so a tp group crosses nodes only when tp exceeds the node size, and the data-parallel
group crosses nodes when the stage does.

Memory per GPU (mixed-precision Adam, Megatron-style TP dividing weights and activations by tp):

* weights and gradients in the parameter dtype: ``2 * param_bytes / tp``;
* Adam state (m and v in fp32, plus an fp32 master copy when parameters are stored in 16 bits):
  ``(8 or 12) * param_count / tp``, divided by dp too under ZeRO-1;
* saved activations of the 1F1B in-flight micro-batches (stage j of s holds min(s - j, B) of them): what the
  units keep for their backward pass, ``inflight * (saved_activation_bytes / (B * dp * tp) + saved_constant_bytes / tp)``
  (the second term: compute-dtype copies of the weights, which do not shrink with the micro-batch);
* with activation recomputation (``remat``) a micro-batch in flight keeps only its units' input activations,
  ``inflight * input_activation_bytes / (B * dp)`` (replicated over tp, as activations between layers are), plus,
  during one unit's backward, that unit's recomputed activations: ``(max_unit_saved_activation_bytes / (B * dp)
  + max_unit_saved_constant_bytes) / tp`` (the largest unit's);
* the P2P receive and send buffers of one micro-batch: ``(act_in + act_out) / (B * dp)``.

Recomputation costs one more forward pass of the stage: ``forward seconds / (dp * tp)`` per iteration, from
the fusion-aware roofline of its forward instructions (``recompute_seconds``), and the forward pass's
collectives again: a recomputing stage's per-micro-batch communication is ``RECOMPUTE_COMM_FACTOR`` = 1.5 times
(the recorded volumes are a forward and a backward half).

Communication of a stage, split as eq. 4 needs it:

* per micro-batch (``comm_mb``): per cluster, the TP all-reduces (``tp_allreduce_bytes / (B dp)`` over
  the tp group) and, for MoE, the expert all-to-all (``alltoall_bytes / (B dp)`` over the dp group);
  each cluster's volume is priced as one collective;
* groups that cross nodes share each node's network adapter with the axis's other groups on the node
  (``CommModel.collective_time``): the tp ranks' dp rings, and an all-to-all whose off-node traffic is most of
  every device's; a stage hand-off across nodes (``CommModel.boundary_time``) passes the adapters of the fewer
  nodes either stage spans;
* P2P between stages (``p2p_per_microbatch``), reported but, as in the paper, left out of l_comm;
* once per iteration (``grad_sync``): the gradient all-reduce of the stage's ``param_bytes / tp`` over
  the dp group, or under ZeRO-1 a reduce-scatter of the gradients plus an all-gather of the updated
  weights (same bandwidth volume, twice the latency steps -- so ZeRO is chosen only when memory needs it).

Known simplifications, with what they were measured to cost on CPU (XLA's own placement, 2026-12-07 review):
all weights and saved activations count as TP-sharded, but XLA's SPMD partition keeps a large share of the saved
activations replicated over tp (per device 1.32x the estimate at tp = 2 and 1.95x at tp = 4 for gpt__small in
bf16; whole stages at tp = 2 1.10-1.24x), so memory under TP is optimistic; the optimizer update's temporaries
(the reduced gradient and the update's own buffers, up to twice the parameter bytes on XLA:CPU) are not counted,
which matters where activations are small (recomputation, many micro-batches: a stage's update peak up to 1.36x
the estimate at dp = 4); the runtime's ZeRO-1 step all-reduces the gradients and all-gathers the weights, 1.5x
the volume priced; a recomputing stage repeats only some of its forward collectives (1.22x for gpt__tiny at
tp = 2, not 1.5x). Recomputation is all or nothing per stage (every unit of the stage recomputes);
MoE expert weights are replicated across dp and split over tp, as the runtime keeps them (the zoo's MoE blocks
declare no all-to-all: their experts' combine is a tp all-reduce).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from libarena.hardware import GPUSpec
from libarena.hardware.comm import CommModel, GroupPlacement
from libarena.plan.model import ModelProfile

#: A recomputing stage runs its forward pass twice: the forward half of its collectives (the TP all-reduces and
#: MoE all-to-alls, half of each recorded volume) again, 1.5 times the communication of a micro-batch.
RECOMPUTE_COMM_FACTOR = 1.5


@dataclass
class StageCostModel:
    """Prices stages of one model on one GPU type (B, the micro-batch count, is an argument)."""

    profile: ModelProfile
    gpu: GPUSpec
    gpus_per_node: int
    comm: CommModel
    usable_memory_fraction: float

    def __post_init__(self) -> None:
        a = self.profile.arrays
        self._pre = {
            name: np.concatenate([[0.0], np.cumsum(a[name])])
            for name in ("param_bytes", "param_count", "saved_activation_bytes", "saved_constant_bytes", "input_activation_bytes")
        }
        self._range_max = {name: _range_max(a[name]) for name in ("max_unit_saved_activation_bytes", "max_unit_saved_constant_bytes")}
        self._pre["recompute_s"] = np.concatenate([[0.0], np.cumsum(self.profile.fused_forward_loads(self.gpu))])
        self._act = a["activation_bytes"]
        self._tp_bytes = a["tp_allreduce_bytes"]
        self._a2a = a["alltoall_bytes"]
        self._comm_prefix: dict[tuple[int, int, int], np.ndarray] = {}
        self._grad_all: dict[tuple[int, int, bool], np.ndarray] = {}
        bpp = self.profile.param_bytes_per_param
        # Adam m and v in fp32, plus an fp32 master copy when the stored parameters are 16-bit.
        self.optimizer_bytes_per_param = 8.0 + (4.0 if bpp < 4.0 else 0.0)

    @property
    def capacity(self) -> float:
        return self.gpu.memory_bytes * self.usable_memory_fraction

    @property
    def num_clusters(self) -> int:
        return self.profile.num_clusters

    def _range(self, name: str, a, b):
        pre = self._pre[name]
        return pre[b] - pre[a]

    def memory(self, a, b, dp, tp, zero, inflight, num_microbatches: int, remat=False):
        """Peak bytes per GPU of the stage [a, b) (all arguments but B broadcast as arrays)."""
        a = np.asarray(a)
        b = np.asarray(b)
        O = self.num_clusters
        B = num_microbatches
        param_bytes = self._range("param_bytes", a, b)
        param_count = self._range("param_count", a, b)
        weights_grads = 2.0 * param_bytes / tp
        optimizer = self.optimizer_bytes_per_param * param_count / (tp * np.where(zero, dp, 1))
        kept = self._range("saved_activation_bytes", a, b) / (B * dp * tp) + self._range("saved_constant_bytes", a, b) / tp
        recomputing = (np.minimum(inflight, B) * self._range("input_activation_bytes", a, b) / (B * dp)
                       + (self._range_max["max_unit_saved_activation_bytes"][a, b] / (B * dp)
                          + self._range_max["max_unit_saved_constant_bytes"][a, b]) / tp)
        activations = np.where(remat, recomputing, np.minimum(inflight, B) * kept)
        act_in = np.where(a > 0, self._act[np.clip(a - 1, 0, O - 1)], 0.0)
        act_out = np.where(b < O, self._act[np.clip(b - 1, 0, O - 1)], 0.0)
        buffers = (act_in + act_out) / (B * dp)
        return weights_grads + optimizer + activations + buffers

    def recompute_seconds(self, a, b):
        """Seconds of one more forward pass of the stage [a, b) per iteration on one GPU (divide by dp x tp)."""
        return self._range("recompute_s", np.asarray(a), np.asarray(b))

    def cluster_comm_prefix(self, dp: int, tp: int, num_microbatches: int) -> np.ndarray:
        """Prefix sums over clusters of the per-micro-batch intra-stage communication under (dp, tp)."""
        key = (dp, tp, num_microbatches)
        if key not in self._comm_prefix:
            B = num_microbatches
            g = self.gpus_per_node
            name = self.gpu.name
            per_cluster = np.zeros(self.num_clusters)
            # Only price collectives that move bytes (keeps a measured model's coverage report honest).
            if tp > 1 and self._tp_bytes.any():
                per_cluster = per_cluster + self.comm.collective_time(
                    "all-reduce", self._tp_bytes / (B * dp), GroupPlacement.tensor_parallel(tp, g), name)
            if dp > 1 and self._a2a.any():
                per_cluster = per_cluster + self.comm.collective_time(
                    "all-to-all", self._a2a / (B * dp), GroupPlacement.data_parallel(dp, tp, g), name)
            self._comm_prefix[key] = np.concatenate([[0.0], np.cumsum(per_cluster)])
        return self._comm_prefix[key]

    def comm_per_microbatch(self, a, b, dp: int, tp: int, num_microbatches: int, remat: bool = False):
        pre = self.cluster_comm_prefix(dp, tp, num_microbatches)
        return (pre[b] - pre[a]) * (RECOMPUTE_COMM_FACTOR if remat else 1.0)

    def p2p_per_microbatch(self, ends, dp, gpus, offsets, num_microbatches: int) -> list[float]:
        """One-direction P2P time per micro-batch across each stage boundary j -> j+1 (the same both ways): the
        activation leaving stage j, shared out over the pairs of the two stages' replicas inside a node, through
        the adapters of the fewer nodes either stage spans when the two stages sit on different nodes
        (``CommModel.boundary_time``). Not part of l_comm (the paper leaves
        P2P out: it overlaps with computation); reported for the profiler's 1F1B model."""
        g = self.gpus_per_node
        out = []
        for j in range(len(ends) - 1):
            volume = self._act[int(ends[j]) - 1] / num_microbatches
            crosses = int(offsets[j]) // g != int(offsets[j + 1]) // g or int(gpus[j]) > g or int(gpus[j + 1]) > g
            out.append(float(self.comm.boundary_time(volume, int(dp[j]), int(dp[j + 1]), int(gpus[j]), int(gpus[j + 1]),
                                                     bool(crosses), g, self.gpu.name)))
        return out

    def _grad_sync_volume(self, volume, dp: int, tp: int, zero: bool):
        if dp <= 1:
            return np.zeros_like(volume)
        placement = GroupPlacement.data_parallel(dp, tp, self.gpus_per_node)
        name = self.gpu.name
        if zero:
            return self.comm.collective_time("reduce-scatter", volume, placement, name) + self.comm.collective_time(
                "all-gather", volume, placement, name
            )
        return self.comm.collective_time("all-reduce", volume, placement, name)

    def grad_sync(self, a, b, dp: int, tp: int, zero: bool):
        """Once-per-iteration gradient synchronisation of the stage [a, b) (fixed dp, tp, zero)."""
        key = (dp, tp, bool(zero))
        if key not in self._grad_all:
            # Every (a, b) at once: the table is (O+1)^2 entries, priced once per option.
            edges = np.arange(self.num_clusters + 1)
            volume = np.maximum(self._pre["param_bytes"][edges][None, :] - self._pre["param_bytes"][edges][:, None], 0.0)
            self._grad_all[key] = np.asarray(self._grad_sync_volume(volume / tp, dp, tp, bool(zero)))
        return self._grad_all[key][a, b]


def _range_max(values: np.ndarray) -> np.ndarray:
    """M[a, b] = max(values[a:b]) for every 0 <= a < b <= len(values) (0 elsewhere): (O+1) x (O+1)."""
    n = len(values)
    out = np.zeros((n + 1, n + 1))
    for a in range(n):
        out[a, a + 1:] = np.maximum.accumulate(values[a:])
    return out


def intra_stage_options(num_gpus: int, allow_zero: bool, allow_remat: bool = False) -> list[tuple[int, int, bool, bool]]:
    """(dp, tp, zero, remat) with dp * tp = num_gpus, powers of two; fixed order (tp ascending, then no ZeRO
    before ZeRO, no recomputation before recomputation) so ties resolve the same way everywhere: least tensor
    parallelism, no ZeRO and no recomputation unless they pay."""
    out = []
    tp = 1
    while tp <= num_gpus:
        dp = num_gpus // tp
        for remat in (False, True) if allow_remat else (False,):
            out.append((dp, tp, False, remat))
            if allow_zero and dp > 1:
                out.append((dp, tp, True, remat))
        tp *= 2
    return out
