"""End-to-end 1F1B iteration time from per-stage times (§3.4, Fig. 8).

For stage j of s with B micro-batches: ``compute_j`` is one micro-batch's forward + backward on one
worker, ``comm_j`` its sequential intra-stage collectives per micro-batch (TP all-reduces, MoE
all-to-all), ``p2p_j`` its activation send forward plus gradient send backward. Then

    T_j  = compute_j + comm_j + p2p_j
    T    = setup                                  (the runtime's per-step host work: input placement;
                                                   sum over stages, one host thread)
         + sum_j T_j                              (the first micro-batch through every stage)
         + (B - 1) * max_j (T_j - p2p_j)          (steady state of the slowest stage; P2P overlapped --
                                                   on separate chips; on a host see below)
         + max_j grad_sync_j                      (DP gradient all-reduce / ZeRO reduce-scatter + all-gather)
         + max_j optimizer_j                      (the optimizer step with the accumulators' reset,
                                                   stages in parallel)

One thread issues every call of a step (the runtime's executor), so the step also takes at least that
thread's CPU time: ``T >= setup + sum_j (B * (dispatch_j + send_dispatch_j) + optimizer_dispatch_j)``, with ``dispatch_j`` the
calling thread's CPU seconds to issue one micro-batch's forward and backward of stage j (measured beside its
time), ``send_dispatch_j`` its sends' (host devices, libarena.profile.corun) and ``optimizer_dispatch_j`` its
update's. A model whose kernels outrun their launches (a tiny model on a GPU) is bound there; elsewhere the
bound stays below the 1F1B time and changes nothing.

Devices that share compute. The model above assumes every device is its own hardware (GPUs). When they
are not -- several XLA host devices on one CPU share its cores -- devices busy at once slow each other
down. Three models of it:

* co-run (the profiler's default on a host; libarena.profile.corun): each stage also timed in a process laid
  out as the plan's, ``alone_s`` while its worker is the only device busy and ``together_s`` while every
  device is. A single-worker stage passes the first micro-batch at its alone time (a multi-worker one keeps
  all its devices busy: together); in the steady state the bottleneck b works the whole period, beside the
  others for o = max_{j != b} together_j and alone for the rest: P = o + alone_b (1 - o / together_b), with
  o lengthened by the dispatching thread's work beside b that b's own timings did not have beside them (every
  stage's calls and sends as the runtime issues them, less b's own calls as issued while b was timed, alone
  and, over the overlapped part, for each partner device of its all-busy timing).
  The optimizer step and setup follow the CPU-time model below. A stage whose workers hold every device is
  timed as the runtime's SPMD executable instead (libarena.profile.corun.SpmdStage): alone = together = that
  time, its collectives, gradient reduction (in the optimizer step) and setup measured with it.

* CPU time (``host_cores`` = C, the cores the plan's devices share): each stage's profile says how many
  cores' worth of CPU its computation keeps busy while it runs alone (``cores`` = p_j, its process CPU time
  over its wall time). Stage j's k_j workers at once need k_j p_j cores, so they take
  ``max(1, k_j p_j / C)`` times as long as one alone; phases where all devices work at once (the steady
  state, the optimizer step) take at least their CPU seconds over the cores, ``sum_j k_j p_j x_j / C``.
  A stage that keeps one core busy runs two devices side by side on two cores at full speed; one that
  already keeps both busy runs them at half speed each.
* measured slowdown: k devices busy at once each run ``slowdown(k)`` times slower than one alone, one
  factor for every stage, from a micro-benchmark (an MLP); then stage j's k_j workers slow each other by
  slowdown(k_j), and all-devices phases run the solo work ``sum_j k_j x_j`` at ``N / slowdown(N)`` devices'
  worth of throughput.

With neither (GPUs) the bounds never bind (``sum_j k_j x_j / N <= max_j x_j``), so the GPU model is unchanged.

Hand-offs on a host. Between GPUs an activation or its gradient moves on a copy engine while the stages
compute, so the steady state hides P2P. Between host devices the move is a copy the shared cores make, and the
receiving stage's call waits for it: in the steady state the bottleneck also takes its sends and receives,
2 p2p_b per micro-batch (it receives as much as it sends, over the same links; ``handoff_s``: those seconds
over the step). When the term was made the tiny models' two-stage plans spent 1-4 ms of 20-56 ms steps on
their hand-offs (bench/results/handoff-before-stagepass.json), about what ``2 p2p_b`` prices per micro-batch, and
with it their pipelines read within 4% of a direct measurement (profile-handoff-part2.json). Their steps are
about half as long now and the hand-offs cost 0.2-2.5 ms by model (handoff.json), so the flat price reads
gpt__tiny's and bert__tiny's pipelines 9-15% high and wide_resnet__tiny's 5-6.5% low (profile.json); the small
models' are within 5%. The moves' issuing is priced already (``send_dispatch_s``, beside the bottleneck in the
period), so where the profiler measured a plan's boundary (libarena.profile.handoff: two one-device stages whose
flat price is at least 2% of the step) the step's wait for the producers (``handoff_wait_s``: the runtime's
step less the same step handing off copies of ready inputs) replaces the flat price; elsewhere it stays.
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
    #: per-step host work of the runtime for this stage (input placement)
    setup_s: float = 0.0
    #: cores' worth of CPU the stage's computation (and its optimizer step) keeps busy on a host device
    cores: float = 1.0
    optimizer_cores: float = 1.0
    #: host devices timed as the plan's process lays them out (libarena.profile.corun): one micro-batch's
    #: compute while the stage's worker is the only device busy, and while every device is (None: not measured)
    alone_s: float | None = None
    together_s: float | None = None
    #: CPU seconds of the calling thread to issue one micro-batch's forward and backward, and the update
    dispatch_s: float = 0.0
    optimizer_dispatch_s: float = 0.0
    #: ... and to send one micro-batch's activation on and its input gradient back (host devices, co-run timed)
    send_dispatch_s: float = 0.0
    #: the calling thread's CPU per micro-batch beside the stage while ``alone_s`` and ``together_s`` were timed
    #: (None: as ``dispatch_s``)
    timed_dispatch_s: float | None = None
    #: timed as one SPMD executable over all its workers (libarena.profile.corun.SpmdStage): its update's time
    #: already holds what its devices cost each other, so no host-sharing model slows it again
    timed_as_spmd: bool = False


@dataclass(frozen=True)
class IterationEstimate:
    iter_time_s: float
    first_microbatch_s: float
    steady_state_s: float
    grad_sync_s: float
    optimizer_s: float
    bottleneck_stage: int
    setup_s: float = 0.0
    #: slowdown(N) applied for devices sharing compute (1.0: independent devices or the CPU-time model)
    host_slowdown: float = 1.0
    #: the dispatching thread's CPU seconds per step (setup included): a bound the step cannot go under
    dispatch_s: float = 0.0
    #: whether that bound, not the 1F1B composition, gives ``iter_time_s``
    dispatch_bound: bool = False
    #: seconds of the steady state the bottleneck spends on its hand-offs (devices on a host; 0 on separate chips)
    handoff_s: float = 0.0
    #: whether ``handoff_s`` is the step's measured wait for its producers (libarena.profile.handoff), not the flat price
    handoff_measured: bool = False

    @property
    def composed_s(self) -> float:
        """The 1F1B composition alone (without the dispatch bound)."""
        return self.setup_s + self.first_microbatch_s + self.steady_state_s + self.grad_sync_s + self.optimizer_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def one_f_one_b(
    stages: Sequence[StageTimes], num_microbatches: int, slowdown: Callable[[int], float] | None = None,
    host_cores: float | None = None, handoff_wait_s: float | None = None,
) -> IterationEstimate:
    """The iteration time of ``stages`` over ``num_microbatches`` micro-batches. Devices that share a host:
    ``host_cores`` (the CPU-time model: the cores the devices share) or ``slowdown`` (the measured-slowdown
    model); neither for independent devices. ``handoff_wait_s``: a host step's measured wait for its hand-offs'
    producers, charged in place of the flat ``2 p2p_b`` per micro-batch (module doc)."""
    if not stages:
        raise ValueError("a pipeline needs at least one stage")
    if num_microbatches < 1:
        raise ValueError("num_microbatches must be >= 1")
    if host_cores is not None and slowdown is not None:
        raise ValueError("one host-sharing model at a time: host_cores or slowdown")
    if host_cores is not None and not host_cores > 0:
        raise ValueError("host_cores must be positive")
    if handoff_wait_s is not None and not handoff_wait_s >= 0:
        raise ValueError("handoff_wait_s must be >= 0")
    slow = slowdown or (lambda k: 1.0)
    total = sum(max(1, st.workers) for st in stages)
    shared = max(1.0, float(slow(total)))

    def alone(st: StageTimes, cores: float) -> float:
        if host_cores is not None:
            return max(1.0, max(1, st.workers) * cores / host_cores)
        return max(1.0, float(slow(max(1, st.workers))))

    def capacity_bound(work: Sequence[tuple[float, float]]) -> float:
        """Seconds the whole host needs when all devices are busy with per-stage (solo seconds, cores) ``work``."""
        if host_cores is not None:
            return sum(max(1, st.workers) * w * c for st, (w, c) in zip(stages, work, strict=True)) / host_cores
        return shared * sum(max(1, st.workers) * w for st, (w, _) in zip(stages, work, strict=True)) / total

    corun = all(st.alone_s is not None and st.together_s is not None for st in stages)
    if corun:
        # A stage alone on the host runs at its alone time; one whose own workers run at once (dp x tp > 1)
        # keeps every device busy.
        solo = [float(st.together_s if max(1, st.workers) > 1 else st.alone_s) for st in stages]  # type: ignore[arg-type]
    else:
        solo = [st.compute_s * alone(st, st.cores) for st in stages]
    per_mb = [x + st.comm_s + st.p2p_s for x, st in zip(solo, stages, strict=True)]
    first = sum(per_mb)
    steady = [t - st.p2p_s for t, st in zip(per_mb, stages, strict=True)]
    if corun:
        period, bottleneck = _corun_period(stages, steady)
    else:
        bottleneck = max(range(len(stages)), key=lambda j: steady[j])
        # A host's collectives are copies on one core each.
        work = [(st.compute_s * st.cores + st.comm_s, 1.0) if host_cores is not None else (st.compute_s + st.comm_s, 1.0) for st in stages]
        period = max(steady[bottleneck], capacity_bound(work))
    # On a host the bottleneck's sends and receives are copies its call waits for, not overlapped (module doc)
    on_host = corun or host_cores is not None or slowdown is not None
    measured = on_host and handoff_wait_s is not None
    if measured:
        handoff_total = float(handoff_wait_s)  # type: ignore[arg-type]
    else:
        handoff_total = (num_microbatches - 1) * 2.0 * stages[bottleneck].p2p_s if on_host else 0.0
    steady_total = (num_microbatches - 1) * period + handoff_total
    grad = max(st.grad_sync_s for st in stages)
    opt = max(max(st.optimizer_s if st.timed_as_spmd else st.optimizer_s * alone(st, st.optimizer_cores) for st in stages),
              capacity_bound([(0.0 if st.timed_as_spmd else st.optimizer_s, st.optimizer_cores) for st in stages]))
    setup = sum(st.setup_s for st in stages)
    composed = setup + first + steady_total + grad + opt  # IterationEstimate.composed_s
    dispatch = setup + sum(num_microbatches * (st.dispatch_s + st.send_dispatch_s) + st.optimizer_dispatch_s for st in stages)
    return IterationEstimate(max(composed, dispatch), first, steady_total, grad, opt, bottleneck, setup, shared, dispatch,
                             dispatch > composed, handoff_total, measured)


def _corun_period(stages: Sequence[StageTimes], alone: Sequence[float]) -> tuple[float, int]:
    """The steady-state period of stages timed alone and all-busy on a shared host, and its bottleneck.

    The bottleneck b (the longest all-busy time c_b) works the whole period; the others work beside it for
    o = max_j c_j of them (they overlap one another too), and for the rest of the period b runs alone (a_b):
    b's one micro-batch of work done is o / c_b + (P - o) / a_b = 1, so P = o + a_b (1 - o / c_b). One stage:
    its own time; equal stages: c_b (always overlapped); a short partner: close to a_b. ``alone``: each
    stage's per-micro-batch time without P2P when it works alone (a_j).

    The runtime's one dispatching thread is busy beside b too: per micro-batch it issues every stage's calls and
    every send between stages (``dispatch_s`` + ``send_dispatch_s``, timed as the runtime issues them). Part of
    that is in b's timings already: b's own calls as they were issued while b was timed (``timed_dispatch_s``,
    d), once in a_b, and in c_b once for every device of the all-busy timing, whose thread issued a one-worker b
    on each of the plan's N devices. Over a period b runs at c_b for o and at a_b for the rest, so its timings
    hold d (1 + (N - 1) o / c_b) of issuing. The rest keeps a core b does not hold busy, so b is overlapped for
    o + that (at most the whole period, c_b): a tiny model's stages, whose calls cost the CPU a good part of
    their kernels' time, otherwise looked less contended than the runtime's step makes them
    (bench/results/profile-dispatch-priced.json: the pipelined plans from about -9% to +1.6% signed). Counting
    the partner devices' issuing twice put the plans whose calls are dearest, wide_resnet's, over their steps
    in most earlier runs (docs/profiler-accuracy.md, "The partner devices' issuing", which also gives a run that went the other way).
    """
    busy = [float(st.together_s) + st.comm_s for st in stages]  # type: ignore[arg-type]
    b = max(range(len(stages)), key=lambda j: busy[j])
    others = max((busy[j] for j in range(len(stages)) if j != b), default=0.0)
    if busy[b] <= 0:
        return alone[b], b
    beside = 0.0
    if len(stages) > 1:
        own = stages[b].dispatch_s if stages[b].timed_dispatch_s is None else stages[b].timed_dispatch_s
        # a one-worker stage's all-busy timing ran it on every device of the plan's layout, each issued by the
        # timing thread; a multi-worker stage's is its SPMD executable, issued once (and c_b = a_b there)
        partners = sum(max(1, st.workers) for st in stages) - 1 if max(1, stages[b].workers) == 1 else 0
        in_timings = own * (1.0 + partners * min(1.0, others / busy[b]))
        beside = max(0.0, sum(st.dispatch_s + st.send_dispatch_s for st in stages) - in_timings)
    overlapped = min(busy[b], others + beside)
    return overlapped + alone[b] * (1.0 - overlapped / busy[b]), b
