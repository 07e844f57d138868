"""Load-aware parallelism planning (§3.3): the whole grid space of one job, vectorised with numpy.

Per (GPU type, n, s):

1. roofline loads per cluster (model.ModelProfile.loads) -> load-proportional D for every one of the
   C(O-1, s-1) partitions (all enumerated: 6,435 at most for O = 16; processed in blocks for larger O);
2. power-of-two normalisation of D by dynamic programming over (stage, GPUs used), vectorised across
   partitions (partition.normalize_power_of_two) -> assignment and b_comp;
3. intra-stage choice from a *stage table*: every distinct stage (first cluster a, end b, GPUs c,
   in-flight micro-batches k) is priced once for every (dp, tp, zero) -- at most O^2 * log2(n) * s
   entries -- keeping the cheapest option that fits in memory (objective B * comm_mb + grad_sync, the
   stage's share of eq. 4 if it were the bottleneck); every plan's stages are then gathered from it;
4. l_comm (eq. 4) per plan, Pareto frontier; the frontier's partitions choose their stages' options again
   jointly for l_comm (StageTable.joint_choice: its max terms couple the stages), until the frontier is made
   of such partitions; cap, proxy.

l_comm here is eq. 4 with its per-iteration terms made explicit:
``(B - 1) * max_j comm_mb_j + sum_j comm_mb_j + max_j grad_sync_j`` -- intra-stage communication of the
remaining micro-batches on the slowest stage, one micro-batch through every stage, and the gradient
synchronisation after the pipeline flush (stages synchronise concurrently). P2P is excluded as in the paper.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, replace
from itertools import product

import numpy as np

from libarena.artifacts import read_table
from libarena.errors import ArenaError
from libarena.hardware import ClusterSpec, GPUSpec, get_gpu
from libarena.hardware.comm import SOURCE_ALPHA_BETA, SOURCE_MEASURED, AlphaBetaCommModel, CommModel, MeasuredCommModel
from libarena.plan.config import PlannerConfig
from libarena.plan.costs import StageCostModel, intra_stage_options
from libarena.plan.frontier import cap_frontier, choose_proxy, pareto_front
from libarena.plan.grids import Grid, enumerate_grids, stage_offsets
from libarena.plan.model import ModelProfile, load_model_profile
from libarena.plan.partition import (
    load_proportional_assignment,
    least_peak_over_assignments,
    normalize_power_of_two,
    partitions,
    power_of_two_compositions,
    weighted_composition_count,
)
from libarena.plan.types import GridResult, ParallelPlan, PlanSet, StagePlan, make_plan_id

GIB = 1024**3
#: Partitions normalised per block (bounds the DP's (n+1) x block temporaries); O = 16 needs one block.
PARTITION_CHUNK = 1 << 16
#: C(O-1, s-1) beyond this per grid is refused: re-cluster the model (O = 16 gives at most 6,435).
MAX_PARTITIONS = 2_000_000


#: Entries of one StageTable (options x (O+1)^2 x s): its few float arrays of that shape stay within a few GiB.
MAX_STAGE_TABLE_ENTRIES = 50_000_000
#: What the power-of-two rounding of one block of partitions may hold: (n+1) x block cells of its DP, each three
#: float64 (costs, the next stage's, the candidates), a mask byte and a choice byte per stage.
MAX_ROUNDING_BYTES = 2 * GIB


def _check_partition_count(profile: ModelProfile, stages: int) -> None:
    """Refuse, before enumerating them, more partitions than the planner handles (they are all built at once)."""
    total = math.comb(profile.num_clusters - 1, stages - 1)
    if total > MAX_PARTITIONS:
        raise ArenaError(
            f"{profile.source}: {profile.num_clusters} clusters into {stages} stages is {total:,} partitions per grid "
            f"(limit {MAX_PARTITIONS:,}); cluster the model into fewer operators (O = 16 is the usual)"
        )


def _check_planning_size(profile: ModelProfile, grids: list[Grid], config: PlannerConfig) -> None:
    """Every grid's partitions and stage table within bounds, checked before any is built."""
    O = profile.num_clusters
    for s in sorted({g.pipeline_degree for g in grids}):
        if config.exhaustive or config.too_few_microbatches(s, profile.global_batch):
            continue  # the exhaustive path checks its own total; a grid of too few samples is infeasible
        _check_partition_count(profile, s)
        max_gpus = max(g.num_gpus for g in grids if g.pipeline_degree == s)
        options = sum(len(intra_stage_options(1 << level, config.allow_zero, config.allow_remat))
                      for level in range(max_gpus.bit_length()))
        entries = options * (O + 1) ** 2 * s
        if entries > MAX_STAGE_TABLE_ENTRIES:
            raise ArenaError(
                f"{profile.source}: {O} clusters into {s} stages needs a stage table of {entries:,} entries "
                f"(limit {MAX_STAGE_TABLE_ENTRIES:,}); cluster the model into fewer operators (O = 16 is the usual)"
            )
        block = min(math.comb(O - 1, s - 1), PARTITION_CHUNK)
        rounding = (max_gpus + 1) * block * (3 * 8 + 1 + s)
        if rounding > MAX_ROUNDING_BYTES:
            raise ArenaError(
                f"{profile.source}: rounding {max_gpus} GPUs over {s} stages of {O} clusters to powers of two needs "
                f"about {rounding / GIB:.1f} GiB (limit {MAX_ROUNDING_BYTES / GIB:.0f} GiB); plan fewer GPUs per job "
                f"(--max-gpus, --num-gpus), fewer stages, or cluster the model into fewer operators"
            )


class StageTable:
    """Best intra-stage choice for every stage (a, b, log2 c, k) of one GPU type and pipeline degree s.

    Entries are flattened to one index ``((a * (O+1) + b) * levels + level) * s + (k - 1)`` so plans
    gather their stages with one ``take`` per field. All options of all GPU counts are priced in one
    broadcast (options x a x b x k); the table serves every n of the type (a stage's best choice does
    not depend on the grid's other stages).
    """

    def __init__(self, costs: StageCostModel, max_gpus: int, stages: int, num_microbatches: int, global_batch: int,
                 allow_zero: bool, allow_remat: bool = False):
        O = costs.num_clusters
        self.levels = levels = max_gpus.bit_length()
        self.stages = stages
        self.num_clusters = O
        B = num_microbatches
        options = [
            (level, dp, tp, zero, remat)
            for level in range(levels)
            for dp, tp, zero, remat in intra_stage_options(1 << level, allow_zero, allow_remat)
            if (global_batch // B) % dp == 0  # the runtime splits a micro-batch evenly over the replicas
        ]
        lv = np.array([o[0] for o in options])
        dp = np.array([o[1] for o in options], dtype=np.float64)[:, None, None, None]
        tp = np.array([o[2] for o in options], dtype=np.float64)[:, None, None, None]
        zero = np.array([o[3] for o in options])[:, None, None, None]
        remat = np.array([o[4] for o in options])[:, None, None, None]
        a = np.arange(O + 1)[None, :, None, None]
        b = np.arange(O + 1)[None, None, :, None]
        inflight = np.arange(1, stages + 1)[None, None, None, :]
        a_safe = np.minimum(a, O - 1)
        valid = a < b
        mem = costs.memory(a_safe, b, dp, tp, zero, inflight, B, remat)  # (opt, a, b, k)
        comm = np.stack([costs.comm_per_microbatch(a_safe[0, :, :, 0], b[0, :, :, 0], o[1], o[2], B, o[4]) for o in options])
        grad = np.stack([costs.grad_sync(a_safe[0, :, :, 0], b[0, :, :, 0], o[1], o[2], o[3]) for o in options])
        comm = comm[:, :, :, None]
        grad = grad[:, :, :, None]
        # A recomputing stage pays one more forward pass (spread over its GPUs) beside its communication (whose
        # forward collectives it repeats: comm_per_microbatch's remat).
        recompute = np.where(remat, costs.recompute_seconds(a_safe[0, :, :, 0], b[0, :, :, 0])[None, :, :, None] / (dp * tp), 0.0)
        obj = np.where(valid & (mem <= costs.capacity), B * comm + grad + recompute, np.inf)
        full = obj.shape
        min_memory = np.empty((O + 1, O + 1, levels, stages))
        best = np.empty((O + 1, O + 1, levels, stages))
        chosen = np.empty((O + 1, O + 1, levels, stages), dtype=np.int64)
        for level in range(levels):
            sel = np.flatnonzero(lv == level)
            o = obj[sel]
            best[:, :, level, :] = o.min(axis=0)
            # First option (least tp, no ZeRO, no recomputation) within a relative 1e-9 of the best: float
            # noise must not flip ties such as ZeRO's RS+AG against the equal-volume all-reduce.
            chosen[:, :, level, :] = sel[np.argmax(o <= best[None, :, :, level, :] * (1 + 1e-9), axis=0)]
            min_memory[:, :, level, :] = np.where(valid[0], mem[sel], np.inf).min(axis=0)
        # One gather per field: flat index of (chosen option, a, b, k) in the (option, a, b, k) arrays.
        ab_k = (np.arange(O + 1)[:, None, None, None] * (O + 1) + np.arange(O + 1)[None, :, None, None]) * stages
        flat = chosen * ((O + 1) * (O + 1) * stages) + ab_k + np.arange(stages)[None, None, None, :]

        def pick(arr: np.ndarray) -> np.ndarray:
            return np.broadcast_to(arr, full).ravel().take(flat).ravel()

        # Every option of every stage, for the joint choice (``joint_choice``): per level, its options' indices
        # (padded with -1), and each option's communication, gradient sync, memory and recomputation.
        width = max(int((lv == level).sum()) for level in range(levels))
        self._level_options = np.full((levels, width), -1, dtype=np.int64)
        for level in range(levels):
            sel = np.flatnonzero(lv == level)
            self._level_options[level, :sel.size] = sel
        self._option_comm = np.broadcast_to(comm, full)
        self._option_grad = np.broadcast_to(grad, full)
        self._option_fits = np.isfinite(obj)
        self._option_fields = {"memory": np.broadcast_to(mem, full), "dp": dp[:, 0, 0, 0].astype(np.int64),
                               "tp": tp[:, 0, 0, 0].astype(np.int64), "zero": zero[:, 0, 0, 0], "remat": remat[:, 0, 0, 0]}
        self.fields = {
            "obj": best.ravel(),
            "min_memory": min_memory.ravel(),
            "memory": pick(mem),
            "comm_mb": pick(comm),
            "grad": pick(grad),
            "dp": pick(dp).astype(np.int64),
            "tp": pick(tp).astype(np.int64),
            "zero": pick(zero),
            "remat": pick(remat),
            "option": chosen.ravel(),
        }

    def flat_index(self, starts: np.ndarray, ends: np.ndarray, level: np.ndarray) -> np.ndarray:
        s = starts.shape[1]
        k = np.arange(s - 1, -1, -1)[None, :]  # stage j holds s - j micro-batches in flight (k - 1 = s - j - 1)
        return ((starts * (self.num_clusters + 1) + ends) * self.levels + level) * self.stages + k

    def gather(self, name: str, flat: np.ndarray) -> np.ndarray:
        return self.fields[name].take(flat)

    def joint_choice(self, starts: np.ndarray, ends: np.ndarray, gpus: np.ndarray, num_microbatches: int,
                     ) -> dict[str, np.ndarray]:
        """Each stage's intra-stage option for plans (P, s) with GPU assignment ``gpus``, chosen for the plan's l_comm.

        The table's choice is each stage's own best (``B * comm_mb + grad_sync``), but l_comm's max terms couple the
        stages: where another stage is the bottleneck, a stage may as well take an option that communicates more per
        micro-batch and synchronises its gradients faster (or the reverse). From the table's choices, the single
        change of one stage's option that lowers l_comm most is made until none does (each step lowers it, so this
        ends; it need not reach the joint optimum). Options keep each stage's recomputation as chosen, so the
        plan's computation bias does not move, and must fit in memory. Returns the chosen options' fields (P, s):
        memory, comm_mb, grad, dp, tp, zero, remat."""
        count, s = starts.shape
        B = num_microbatches
        level = np.log2(np.maximum(gpus, 1)).round().astype(np.int64)
        flat = self.flat_index(starts, ends, level)
        chosen = self.fields["option"].take(flat)  # (P, s)
        options = self._level_options[level]  # (P, s, m)
        real = options >= 0
        options = np.where(real, options, 0)
        a, b = starts[..., None], ends[..., None]
        k = np.arange(s - 1, -1, -1)[None, :, None]
        a_safe = np.minimum(a, self.num_clusters - 1)
        comm = self._option_comm[options, a_safe, b, k]
        grad = self._option_grad[options, a_safe, b, k]
        allowed = (real & self._option_fits[options, a_safe, b, k]
                   & (self._option_fields["remat"][options] == self._option_fields["remat"][chosen][..., None]))
        position = np.argmax(options == chosen[..., None], axis=2)  # (P, s): the chosen option among the stage's
        rows = np.arange(count)
        feasible = np.isfinite(self.fields["obj"].take(flat)).all(axis=1)
        stage_index = np.arange(s)[None, :]
        for _ in range(4 * s * options.shape[2]):  # (a bound: every step lowers l_comm by a relative 1e-12 at least)
            c = np.take_along_axis(comm, position[..., None], axis=2)[..., 0]
            g = np.take_along_axis(grad, position[..., None], axis=2)[..., 0]
            current = communication_load(c, g, B)
            # the largest comm and grad of the stages other than each one: the top two of each row
            order_c = np.argsort(-c, axis=1, kind="stable")
            order_g = np.argsort(-g, axis=1, kind="stable")
            top_c, second_c = c[rows, order_c[:, 0]], (c[rows, order_c[:, 1]] if s > 1 else np.full(count, -np.inf))
            top_g, second_g = g[rows, order_g[:, 0]], (g[rows, order_g[:, 1]] if s > 1 else np.full(count, -np.inf))
            other_c = np.where(stage_index == order_c[:, :1], second_c[:, None], top_c[:, None])
            other_g = np.where(stage_index == order_g[:, :1], second_g[:, None], top_g[:, None])
            moved = ((B - 1) * np.maximum(other_c[..., None], comm) + (c.sum(axis=1)[:, None] - c)[..., None] + comm
                     + np.maximum(other_g[..., None], grad))
            moved = np.where(allowed & feasible[:, None, None], moved, np.inf).reshape(count, -1)
            best = np.argmin(moved, axis=1)
            better = np.flatnonzero(moved[rows, best] < current * (1 - 1e-12))
            if not better.size:
                break
            j, o = np.divmod(best[better], options.shape[2])
            position[better, j] = o
        option = np.take_along_axis(options, position[..., None], axis=2)[..., 0]
        out = {"comm_mb": np.take_along_axis(comm, position[..., None], axis=2)[..., 0],
               "grad": np.take_along_axis(grad, position[..., None], axis=2)[..., 0],
               "memory": self._option_fields["memory"][option, a_safe[..., 0], ends, k[..., 0]]}
        for name in ("dp", "tp", "zero", "remat"):
            out[name] = self._option_fields[name][option]
        return out


def _grid_comm_label(comm: CommModel, gpu_type: str) -> str:
    if not isinstance(comm, MeasuredCommModel):
        return SOURCE_ALPHA_BETA
    used = {src for key, src in comm.sources().items() if key[1] == gpu_type}
    if used == {SOURCE_MEASURED}:
        return SOURCE_MEASURED
    if SOURCE_MEASURED in used:
        return f"{SOURCE_MEASURED}+{SOURCE_ALPHA_BETA}"
    return SOURCE_ALPHA_BETA


def _oom_reason(grid: Grid, gpu: GPUSpec, min_memory: float, capacity: float) -> str:
    return (
        f"out of memory: the smallest plan needs {min_memory / GIB:.1f} GiB per GPU, "
        f"{grid.gpu_type} has {gpu.memory_bytes / GIB:.1f} GiB ({capacity / GIB:.1f} GiB usable)"
    )


def _build_plan(
    costs: StageCostModel,
    grid: Grid,
    B: int,
    starts: np.ndarray,
    ends: np.ndarray,
    gpus: np.ndarray,
    dp: np.ndarray,
    tp: np.ndarray,
    zero: np.ndarray,
    remat: np.ndarray,
    memory: np.ndarray,
    comm_mb: np.ndarray,
    grad: np.ndarray,
    bias: float,
    l_comm: float,
    offsets: np.ndarray,
) -> ParallelPlan:
    stages = tuple(
        StagePlan(
            index=j,
            first_cluster=int(starts[j]),
            end_cluster=int(ends[j]),
            num_gpus=int(gpus[j]),
            dp=int(dp[j]),
            tp=int(tp[j]),
            zero=bool(zero[j]),
            gpu_offset=int(offsets[j]),
            memory_bytes=float(memory[j]),
            comm_per_microbatch_s=float(comm_mb[j]),
            grad_sync_s=float(grad[j]),
            remat=bool(remat[j]),
        )
        for j in range(len(starts))
    )
    plan_id = make_plan_id(
        grid,
        [int(x) for x in starts],
        [int(x) for x in gpus],
        [int(x) for x in dp],
        [int(x) for x in tp],
        [int(x) for x in zero],
        [int(x) for x in remat],
    )
    return ParallelPlan(
        grid=grid,
        plan_id=plan_id,
        num_microbatches=B,
        stages=stages,
        computation_bias=float(bias),
        communication_load=float(l_comm),
        memory_per_gpu_bytes=float(memory.max()),
        p2p_per_microbatch_s=tuple(costs.p2p_per_microbatch(ends, dp, gpus, offsets, B)),
    )


def communication_load(comm_mb: np.ndarray, grad: np.ndarray, num_microbatches: int) -> np.ndarray:
    """l_comm (eq. 4 plus the per-iteration gradient sync) per plan; arrays (P, s)."""
    comm_mb = np.atleast_2d(comm_mb)
    grad = np.atleast_2d(grad)
    return (num_microbatches - 1) * comm_mb.max(axis=1) + comm_mb.sum(axis=1) + grad.max(axis=1)


def _select(plans: list[ParallelPlan], config: PlannerConfig, mark_only: bool) -> tuple[ParallelPlan, ...]:
    """Frontier (capped) with the proxy marked; in exhaustive mode keep all plans, frontier ones marked."""
    bias = np.array([p.computation_bias for p in plans])
    comm = np.array([p.communication_load for p in plans])
    front = [int(i) for i in pareto_front(bias, comm)]
    proxy_pos = front[choose_proxy(bias[front], comm[front])]
    kept = cap_frontier(
        [plans[i].stage_boundaries for i in front],
        [plans[i].communication_load for i in front],
        [plans[i].computation_bias for i in front],
        config.frontier_cap,
        keep=front.index(proxy_pos),
    )
    frontier = {front[k] for k in kept}

    if mark_only:
        out = [replace(p, is_proxy=(i == proxy_pos), on_frontier=(i in frontier)) for i, p in enumerate(plans)]
        out.sort(key=lambda p: (not p.on_frontier, p.computation_bias, p.communication_load, p.plan_id))
        return tuple(out)
    out = [replace(plans[i], is_proxy=(i == proxy_pos)) for i in sorted(frontier, key=lambda i: (bias[i], comm[i], i))]
    return tuple(out)


def plan_grid(
    profile: ModelProfile,
    grid: Grid,
    loads: np.ndarray,
    costs: StageCostModel,
    config: PlannerConfig,
    table: StageTable | None = None,
    forward_loads: np.ndarray | None = None,
) -> GridResult:
    """All plans of one grid: one per partition (normalised assignment, best intra-stage choice).

    ``forward_loads``: each cluster's forward load (eq. 2), which a recomputing stage adds to its own: the
    computation bias of a plan with recomputing stages is measured against the load-proportional assignment
    of those effective loads (the same value as before for plans without recomputation)."""
    n, s = grid.num_gpus, grid.pipeline_degree
    B = config.microbatches(s, profile.global_batch)
    reason = config.too_few_microbatches(s, profile.global_batch)
    if reason:
        return GridResult(grid, (), B, 0, 0, reason)
    if config.exhaustive:
        return plan_grid_exhaustive(profile, grid, loads, costs, config)
    if table is None:
        table = StageTable(costs, n, s, B, profile.global_batch, config.allow_zero, config.allow_remat)
    if forward_loads is None:
        forward_loads = profile.forward_loads(costs.gpu)
    _check_partition_count(profile, s)
    starts_all, ends_all = partitions(profile.num_clusters, s)
    total = starts_all.shape[0]
    bias = np.empty(total)
    l_comm = np.full(total, np.inf)
    # Peak memory per partition: of the chosen options when it fits, else the least any option needs.
    need = np.empty(total)
    # each partition's GPU assignment, kept for the joint choice and the frontier's plans (2 bytes a stage)
    assigned = np.empty((total, s), dtype=np.int16 if n < 2**15 else np.int64)
    for lo in range(0, total, PARTITION_CHUNK):  # chunks bound the DP's temporaries for large O
        hi = min(lo + PARTITION_CHUNK, total)
        gpus, bias[lo:hi], flat = _normalised_stages(table, loads, forward_loads, n, starts_all[lo:hi], ends_all[lo:hi])
        assigned[lo:hi] = gpus
        fits = np.isfinite(table.gather("obj", flat)).all(axis=1)
        need[lo:hi] = np.where(fits, table.gather("memory", flat).max(axis=1), table.gather("min_memory", flat).max(axis=1))
        load = communication_load(table.gather("comm_mb", flat), table.gather("grad", flat), B)
        l_comm[lo:hi] = np.where(fits, load, np.inf)
    feasible = np.isfinite(l_comm)
    oom = total - int(feasible.sum())
    if not feasible.any():
        min_mem = _least_memory(table, n, starts_all, ends_all)
        return GridResult(grid, (), B, total, oom, _oom_reason(grid, costs.gpu, min_mem, costs.capacity), min_mem)
    rows = np.flatnonzero(feasible)
    # l_comm couples the stages through its max terms, which the stage table's per-stage choice ignores
    # (StageTable.joint_choice). Choosing again for every partition costs several times the rest of the planning,
    # so it is done for the frontier's partitions, again for those a lowered l_comm brings onto it, until the
    # frontier holds only partitions chosen again (a partition off it could still have a lower l_comm than shown).
    refined = np.zeros(total, dtype=bool)
    while True:
        front = rows[pareto_front(bias[rows], l_comm[rows])]
        todo = front[~refined[front]]
        if s == 1 or not todo.size:
            break
        refined[todo] = True
        chosen = table.joint_choice(starts_all[todo].astype(np.int64), ends_all[todo].astype(np.int64),
                                    assigned[todo].astype(np.int64), B)
        l_comm[todo] = communication_load(chosen["comm_mb"], chosen["grad"], B)
        need[todo] = chosen["memory"].max(axis=1)
    # Plan objects only for the frontier (a few dozen per grid at most): redo its rows in detail.
    starts, ends = starts_all[front], ends_all[front]
    gpus = assigned[front].astype(np.int64)
    fields = table.joint_choice(starts.astype(np.int64), ends.astype(np.int64), gpus, B)
    offsets = stage_offsets(gpus)
    plans = [
        _build_plan(
            costs, grid, B, starts[pos], ends[pos], gpus[pos], fields["dp"][pos], fields["tp"][pos], fields["zero"][pos],
            fields["remat"][pos], fields["memory"][pos], fields["comm_mb"][pos], fields["grad"][pos], bias[i], l_comm[i],
            offsets[pos],
        )
        for pos, i in enumerate(front)
    ]
    return GridResult(grid, _select(plans, config, mark_only=False), B, total, oom, "", float(need[rows].min()))


def _normalised_stages(table: StageTable, loads: np.ndarray, forward_loads: np.ndarray, n: int, starts: np.ndarray,
                       ends: np.ndarray):
    """Power-of-two assignment, b_comp and stage-table indices for a block of partitions: the assignment
    closest to the load-proportional one among those whose every stage has an option that fits in memory
    (the closest of all where none fits: the partition is then infeasible).

    Where a stage recomputes, b_comp is measured against the loads the stages then carry (a recomputing stage one
    forward pass more: :func:`recomputing_bias`), so the assignment is rounded against those loads too and kept
    where it is closer to them than the first rounding (against the plain loads) was."""
    starts = starts.astype(np.int64)
    ends = ends.astype(np.int64)
    gpus, bias, flat = _closest_fitting(table, load_proportional_assignment(loads, n, starts, ends), n, starts, ends)
    remat = table.gather("remat", flat)
    rows = np.flatnonzero(remat.any(axis=1))
    if rows.size:
        bias[rows] = recomputing_bias(loads, forward_loads, starts[rows], ends[rows], gpus[rows], remat[rows])
        # (a partition with no fitting assignment has none after a second rounding either)
        rows = rows[np.isfinite(table.gather("obj", flat[rows])).all(axis=1)]
        ideal = _recomputing_ideal(loads, forward_loads, starts[rows], ends[rows], remat[rows], n)
        # no assignment is closer than each stage's nearest power of two: where the first rounding is as close as
        # that, there is nothing to round again (most partitions, and the DP is most of the planner's time)
        exponent = np.log2(np.clip(ideal, 1.0, n))
        nearest = np.minimum(np.abs(np.exp2(np.floor(exponent)) - ideal), np.abs(np.exp2(np.ceil(exponent)) - ideal))
        open_rows = np.sqrt((nearest ** 2).sum(axis=1)) < bias[rows] - 1e-12
        rows, ideal = rows[open_rows], ideal[open_rows]
    if rows.size:
        # (one DP over the fitting assignments: each of these partitions has one)
        allowed = np.isfinite(_all_levels(table, n, starts[rows], ends[rows], "obj"))
        again, _ = normalize_power_of_two(ideal, n, allowed)
        again_flat = table.flat_index(starts[rows], ends[rows], np.log2(again).round().astype(np.int64))
        again_bias = recomputing_bias(loads, forward_loads, starts[rows], ends[rows], again,
                                      table.gather("remat", again_flat))
        # (the second rounding's stages may recompute elsewhere: it is judged by the loads it then carries)
        closer = np.isfinite(table.gather("obj", again_flat)).all(axis=1) & (again_bias < bias[rows] - 1e-12)
        better = rows[closer]
        gpus[better], bias[better], flat[better] = again[closer], again_bias[closer], again_flat[closer]
    return gpus, bias, flat


def _closest_fitting(table: StageTable, ideal: np.ndarray, n: int, starts: np.ndarray, ends: np.ndarray):
    """The power-of-two assignment closest to ``ideal`` (P, s) whose every stage fits (the closest of all where
    none does), its distance and its stage-table indices."""
    gpus, bias = normalize_power_of_two(ideal, n)
    flat = table.flat_index(starts, ends, np.log2(gpus).round().astype(np.int64))
    short = np.flatnonzero(~np.isfinite(table.gather("obj", flat)).all(axis=1))
    if short.size:
        # the closest assignment leaves a stage without a fitting option: another may fit (more GPUs there)
        allowed = np.isfinite(_all_levels(table, n, starts[short], ends[short], "obj"))
        fitted, fitted_bias = normalize_power_of_two(ideal[short], n, allowed)
        found = np.isfinite(fitted_bias)
        gpus[short[found]], bias[short[found]] = fitted[found], fitted_bias[found]
        flat = table.flat_index(starts, ends, np.log2(gpus).round().astype(np.int64))
    return gpus, bias, flat


def _all_levels(table: StageTable, n: int, starts: np.ndarray, ends: np.ndarray, name: str) -> np.ndarray:
    """``name`` of every stage of the partitions at every power-of-two GPU count up to ``n``: (P, s, levels)."""
    return np.stack([table.gather(name, table.flat_index(starts, ends, np.full_like(starts, level)))
                     for level in range(n.bit_length())], axis=2)


def _least_memory(table: StageTable, n: int, starts_all: np.ndarray, ends_all: np.ndarray) -> float:
    """The least peak memory per GPU of any plan of the grid: over every partition and every assignment."""
    least = np.inf
    for lo in range(0, starts_all.shape[0], PARTITION_CHUNK):
        starts = starts_all[lo:lo + PARTITION_CHUNK].astype(np.int64)
        ends = ends_all[lo:lo + PARTITION_CHUNK].astype(np.int64)
        least = min(least, float(least_peak_over_assignments(_all_levels(table, n, starts, ends, "min_memory"), n).min()))
    return least


def _recomputing_ideal(loads: np.ndarray, forward_loads: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                       remat: np.ndarray, num_gpus: np.ndarray | int) -> np.ndarray:
    """The assignment of ``num_gpus`` proportional to the stage loads when the ``remat`` stages (P, s) carry one
    more forward pass."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    load = np.concatenate([[0.0], np.cumsum(loads)])
    forward = np.concatenate([[0.0], np.cumsum(forward_loads)])
    stage = (load[ends] - load[starts]) + np.where(remat, forward[ends] - forward[starts], 0.0)
    return stage / stage.sum(axis=1, keepdims=True) * num_gpus


def recomputing_bias(loads: np.ndarray, forward_loads: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                     gpus: np.ndarray, remat: np.ndarray) -> np.ndarray:
    """b_comp (eq. 3) of plans whose recomputing stages (``remat``, (P, s)) carry one more forward pass: the
    distance of ``gpus`` from the assignment proportional to the effective stage loads."""
    gpus = np.asarray(gpus, dtype=np.float64)
    ideal = _recomputing_ideal(loads, forward_loads, starts, ends, remat, gpus.sum(axis=1, keepdims=True))
    return np.sqrt(((gpus - ideal) ** 2).sum(axis=1))


def plan_grid_exhaustive(
    profile: ModelProfile, grid: Grid, loads: np.ndarray, costs: StageCostModel, config: PlannerConfig
) -> GridResult:
    """Reference enumeration: every partition x every power-of-two assignment x every intra-stage choice.

    Scalar code on purpose (it doubles as the oracle for the vectorised path in the tests).
    """
    n, s = grid.num_gpus, grid.pipeline_degree
    B = config.microbatches(s, profile.global_batch)
    samples_per_microbatch = profile.global_batch // B
    option_cache: dict[int, list[tuple[int, int, bool, bool]]] = {}
    for level in range(n.bit_length()):
        c = 1 << level
        option_cache[c] = [o for o in intra_stage_options(c, config.allow_zero, config.allow_remat)
                           if samples_per_microbatch % o[0] == 0]
    # counted before the GPU assignments or the partitions are built (either can run to hundreds of millions)
    per_comp = weighted_composition_count(n, s, lambda c: len(option_cache[c]))
    total = per_comp * math.comb(profile.num_clusters - 1, s - 1)
    if total > config.exhaustive_limit:
        shown = f"{int(total):,}" if math.isfinite(total) else "more than 10^308"
        raise ArenaError(
            f"--exhaustive: grid {grid.label} has {shown} candidate plans (limit {config.exhaustive_limit:,}); "
            "narrow it with --gpu-type, --num-gpus and --stages"
        )
    compositions = power_of_two_compositions(n, s)
    starts_all, ends_all = partitions(profile.num_clusters, s)
    d = loads / loads.sum() * n
    forward_loads = profile.forward_loads(costs.gpu)
    capacity = costs.capacity
    plans: list[ParallelPlan] = []
    considered = oom = 0
    min_mem = math.inf
    for p in range(starts_all.shape[0]):
        starts, ends = starts_all[p], ends_all[p]
        ideal = np.array([d[a:b].sum() for a, b in zip(starts, ends, strict=True)])
        for comp in compositions:
            gpus = np.array(comp, dtype=np.int64)
            bias = float(np.sqrt(((gpus - ideal) ** 2).sum()))
            offsets = stage_offsets(gpus)[0]
            per_stage = []
            for j in range(s):
                a, b = int(starts[j]), int(ends[j])
                choices = []
                for dp, tp, zero, remat in option_cache[int(gpus[j])]:
                    mem = float(costs.memory(a, b, dp, tp, zero, s - j, B, remat))
                    cm = float(costs.comm_per_microbatch(a, b, dp, tp, B, remat))
                    gs = float(costs.grad_sync(a, b, dp, tp, zero))
                    cost = B * cm + gs + (float(costs.recompute_seconds(a, b)) / (dp * tp) if remat else 0.0)
                    choices.append((dp, tp, zero, remat, mem, cm, gs, cost))
                # A stage recomputes only where that pays (as the fast path's stage table decides): when no option
                # without recomputation fits, or a recomputing one costs less than all of them.
                plain = [c[7] for c in choices if not c[3] and c[4] <= capacity]
                per_stage.append([c for c in choices if not c[3] or not plain or c[7] < min(plain) * (1 - 1e-9)])
            for combo in product(*per_stage):
                considered += 1
                mems = np.array([c[4] for c in combo])
                min_mem = min(min_mem, float(mems.max()))
                if (mems > capacity).any():
                    oom += 1
                    continue
                comm_mb = np.array([c[5] for c in combo])
                grad = np.array([c[6] for c in combo])
                remat = np.array([c[3] for c in combo])
                l_comm = float(communication_load(comm_mb, grad, B)[0])
                plan_bias = bias if not remat.any() else float(
                    recomputing_bias(loads, forward_loads, starts[None], ends[None], gpus[None], remat[None])[0])
                plans.append(
                    _build_plan(
                        costs, grid, B, starts, ends, gpus,
                        np.array([c[0] for c in combo]), np.array([c[1] for c in combo]), np.array([c[2] for c in combo]),
                        remat, mems, comm_mb, grad, plan_bias, l_comm, offsets,
                    )
                )
    if not plans:
        return GridResult(grid, (), B, considered, oom, _oom_reason(grid, costs.gpu, min_mem, capacity), min_mem)
    return GridResult(grid, _select(plans, config, mark_only=True), B, considered, oom, "", min_mem)


def plan_job(
    operator_table,
    cluster: ClusterSpec,
    config: PlannerConfig | None = None,
    comm: CommModel | None = None,
    require_measured_comm: bool = False,
) -> PlanSet:
    """Plan every grid of a job on a cluster.

    ``operator_table``: a path, a TableArtifact of kind operator_table (libarena.artifacts.read_table)
    or an already loaded ModelProfile. ``comm``: the communication model (alpha-beta from the catalogue when
    None; a MeasuredCommModel from ``--comm``). With ``require_measured_comm`` a GPU type the measured
    table does not cover is an error instead of an alpha-beta fallback.
    """
    config = config or PlannerConfig()
    comm = comm or AlphaBetaCommModel()
    if isinstance(operator_table, (str, os.PathLike)):
        operator_table = read_table(operator_table, "operator_table")
    profile = operator_table if isinstance(operator_table, ModelProfile) else load_model_profile(operator_table)
    grids = enumerate_grids(profile.name, profile.global_batch, profile.num_clusters, cluster, config)
    _check_planning_size(profile, grids, config)
    if require_measured_comm:
        if not isinstance(comm, MeasuredCommModel):
            raise ArenaError("a measured communication table is required but none was given (--comm)")
        for gpu_type in sorted({g.gpu_type for g in grids}):
            if not comm.covers(gpu_type):
                raise ArenaError(
                    f"{comm.source_name}: no measurements for {gpu_type} (it has: {', '.join(comm.gpu_types)}); "
                    "drop --comm-required to fall back to the alpha-beta model for it"
                )
    results: list[GridResult] = []
    loads_by_type: dict[str, np.ndarray] = {}
    forward_loads_by_type: dict[str, np.ndarray] = {}
    costs_by_type: dict[str, StageCostModel] = {}
    tables: dict[tuple[str, int], StageTable] = {}
    max_gpus_by_type: dict[str, int] = {}
    for grid in grids:
        max_gpus_by_type[grid.gpu_type] = max(max_gpus_by_type.get(grid.gpu_type, 1), grid.num_gpus)
    for grid in grids:
        gpu_type, s = grid.gpu_type, grid.pipeline_degree
        if gpu_type not in costs_by_type:
            gpu = get_gpu(gpu_type)
            loads_by_type[gpu_type] = profile.loads(gpu)
            forward_loads_by_type[gpu_type] = profile.forward_loads(gpu)
            costs_by_type[gpu_type] = StageCostModel(profile, gpu, grid.gpus_per_node, comm, config.usable_memory_fraction)
        table = None
        if not config.exhaustive and not config.too_few_microbatches(s, profile.global_batch):
            key = (gpu_type, s)
            if key not in tables:
                tables[key] = StageTable(
                    costs_by_type[gpu_type], max_gpus_by_type[gpu_type], s, config.microbatches(s, profile.global_batch),
                    profile.global_batch, config.allow_zero, config.allow_remat,
                )
            table = tables[key]
        results.append(plan_grid(profile, grid, loads_by_type[gpu_type], costs_by_type[gpu_type], config, table,
                                 forward_loads_by_type[gpu_type]))
    results = [replace(r, comm_model=_grid_comm_label(comm, r.grid.gpu_type)) for r in results]
    planner = asdict(config)
    return PlanSet(
        model=profile.model,
        global_batch=profile.global_batch,
        seq_len=profile.seq_len,
        dtype=profile.dtype,
        cluster_name=cluster.name,
        operator_table_sha256=profile.digest,
        clusters=[dict(c) for c in profile.clusters],
        grids=results,
        planner=planner,
        comm_model=comm.describe(),
    )
