"""What a pipeline's hand-offs cost on a host: the evidence behind the 1F1B model's ``handoff_s``.

A two-stage plan on two XLA host devices hands every micro-batch's activation to the second stage and its
gradient back to the first (``PipelineExecutor._move``: a ``jax.device_put``). On GPUs a copy engine moves them
while the stages compute; on a host the copy is made by the cores the devices share, and the receiving call
waits for it. In one interpreter laid out as the profiler's measurement is (two devices pinned to two cores),
the runtime's step of each two-stage plan is timed three ways, interleaved step chunk by step chunk:

* ``runtime``: as arena-run runs it;
* ``copy``: every hand-off a copy of an input that is already computed (captured from an earlier step), so the
  move is made but nobody waits for its producer;
* ``ready``: every hand-off's input already on the receiving device (captured), nothing moved.

``runtime - ready`` is what the hand-offs cost the step; beside it each direction's move timed alone (issued and
waited for). No target: the 1F1B model's term is read against it (docs/profiler-accuracy.md).

    .venv/bin/python -m bench handoff          # alone; results in bench/results/handoff.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

from libarena.artifacts import write_json
from libarena.errors import ArenaError

MODELS = ("gpt__tiny", "bert__tiny", "moe__tiny", "wide_resnet__tiny")
DEVICES = 2
#: untimed steps after building a plan's executor (the first compiles), then ROUNDS rounds of CHUNK steps per
#: variant, the variants' order reversed every other round; each variant's figure is its steps' lower quartile
WARMUP, ROUNDS, CHUNK = 10, 40, 5
#: moves of a captured input timed alone, per direction
MOVES_TIMED = 50
VARIANTS = ("runtime", "copy", "ready")
REFUSALS = (ArenaError,)
#: the files the measurement runs (bench.provenance.code_identity follows the imports)
MEASURING_MODULES = ("bench/bench_handoff.py",)


def _log(message: str) -> None:
    print(f"[bench_handoff] {message}", file=sys.stderr, flush=True)


def _lower_quartile(samples: list[float]) -> float:
    from libarena.profile.timers import lower_quartile

    return float(lower_quartile(samples))


def handoff_executor(model: Any, run_plan: Any, devices: list[Any], dtype: str) -> Any:
    """The runtime's executor with its hand-offs replaceable: ``variant`` (runtime, copy, ready, or record: run as
    the runtime and keep each hand-off's source and result, waited for). A step's hand-offs come in the same
    order every step (its fixed 1F1B order), so the k-th of one step stands in for the k-th of another."""
    import jax

    from libarena.run.executor import PipelineExecutor

    class HandoffExecutor(PipelineExecutor):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.variant = "runtime"
            self._handoff = 0
            self.sources: list[Any] = []
            self.results: list[Any] = []
            self.directions: list[str] = []

        def step(self, batch: Any, profile_stages: bool = False) -> Any:
            self._handoff = 0
            return super().step(batch, profile_stages)

        def _move(self, x: Any, source: Any, target: Any) -> Any:
            k, self._handoff = self._handoff, self._handoff + 1
            if self.variant == "record":
                moved = super()._move(x, source, target)
                self.sources.append(jax.block_until_ready(x))
                self.results.append(jax.block_until_ready(moved))
                self.directions.append("forward" if self.stages.index(target) > self.stages.index(source) else "backward")
                return moved
            if self.variant == "ready":
                return self.results[k]
            if self.variant == "copy":
                return super()._move(self.sources[k], source, target)
            return super()._move(x, source, target)

        def move_alone(self, k: int) -> float:
            """Wall seconds to issue the k-th hand-off's move of its captured source and wait for it."""
            j = self.directions[k]
            pair = (self.stages[0], self.stages[1]) if j == "forward" else (self.stages[1], self.stages[0])
            t0 = time.perf_counter()
            jax.block_until_ready(super()._move(self.sources[k], *pair))
            return time.perf_counter() - t0

    return HandoffExecutor(model, run_plan, devices, dtype)


def time_plan(finder: Any, plan: Any, rounds: int = ROUNDS, moves_timed: int = MOVES_TIMED) -> dict[str, Any]:
    """One two-stage plan's step, runtime / copy / ready, interleaved over ``rounds``; and its moves timed alone."""
    import warnings

    import jax

    from libarena.profile.measure import _run_plan
    from libarena.run.heap import frozen_heap
    from libarena.run.train import batch_for_step

    job = finder.job
    run_plan = _run_plan(job, plan, jax.devices())
    executor = handoff_executor(job.model, run_plan, jax.devices()[:DEVICES], job.dtype)
    executor.init_state(0)
    batch = batch_for_step(job.model, 0, run_plan.global_batch, 0)
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    for _ in range(WARMUP):
        executor.step(batch)
    executor.variant = "record"
    executor.step(batch)
    handoffs = len(executor.results)
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    paired: list[float] = []  # per round: the runtime's chunk median less the ready one's (a host's drift cancels)
    with frozen_heap():
        for variant in VARIANTS:  # each variant's first steps after a switch, untimed
            executor.variant = variant
            executor.step(batch)
        for rnd in range(rounds):
            for variant in VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]:
                executor.variant = variant
                samples[variant] += [executor.step(batch).step_time_s for _ in range(CHUNK)]
            paired.append(statistics.median(samples["runtime"][-CHUNK:]) - statistics.median(samples["ready"][-CHUNK:]))
        moves: dict[str, list[float]] = {"forward": [], "backward": []}
        for _ in range(moves_timed):
            for k in range(handoffs):
                moves[executor.directions[k]].append(executor.move_alone(k))
    figure = {v: _lower_quartile(s) for v, s in samples.items()}
    return {"plan_id": plan.plan_id, "num_microbatches": run_plan.num_microbatches, "handoffs_per_step": handoffs,
            **{f"{v}_s": figure[v] for v in VARIANTS},
            **{f"{v}_median_s": statistics.median(s) for v, s in samples.items()},
            "handoffs_s": figure["runtime"] - figure["ready"],
            "per_handoff_s": (figure["runtime"] - figure["ready"]) / handoffs,
            "handoffs_paired_s": statistics.median(paired),
            "handoffs_paired_se_s": statistics.stdev(paired) / len(paired) ** 0.5 if len(paired) > 1 else None,
            "copies_s": figure["copy"] - figure["ready"],
            "move_alone_s": {d: statistics.median(m) for d, m in moves.items() if m},
            "samples_per_variant": len(samples["runtime"])}


def _child(request: dict[str, Any]) -> dict[str, Any]:
    from libarena.profile.host import host_window, snapshot
    from libarena.profile.measure import _PlanFinder

    before = snapshot()
    out: dict[str, Any] = {}
    for model, plans_path in request["plans"].items():
        finder = _PlanFinder(plans_path)
        plans = [p for p in finder.planset.plans() if p.grid.num_gpus == DEVICES and p.pipeline_degree == 2]
        if not plans:
            raise ArenaError(f"{model} has no two-stage plan on {DEVICES} devices")
        out[model] = []
        for plan in plans:
            row = time_plan(finder, plan, int(request.get("rounds", ROUNDS)), int(request.get("moves_timed", MOVES_TIMED)))
            out[model].append(row)
            _log(f"{model} {plan.plan_id}: runtime {row['runtime_s'] * 1e3:.2f} ms, copies of ready inputs "
                 f"{row['copy_s'] * 1e3:.2f} ms, ready {row['ready_s'] * 1e3:.2f} ms: hand-offs {row['handoffs_s'] * 1e3:+.2f} ms "
                 f"({row['per_handoff_s'] * 1e3:.3f} ms each of {row['handoffs_per_step']}; paired by round "
                 f"{row['handoffs_paired_s'] * 1e3:+.2f} ms)")
    return {"models": out, "host": host_window(before, snapshot())}


def run(results_dir: Path, models: tuple[str, ...] = MODELS) -> bool:
    from bench.laid_out import laid_out_run, run_laid_out_child
    from bench.provenance import code_identity
    from libarena.profile.host import STARTING_CORES

    with laid_out_run("bench_handoff", models, DEVICES, _log) as (timed, request, tmp):
        measured = run_laid_out_child("bench.bench_handoff", request, STARTING_CORES[:DEVICES], DEVICES, tmp)
    payload = {"models": measured["models"],
               "setup": {"devices": DEVICES, "layout": "pinned", "warmup": WARMUP, "rounds": ROUNDS, "chunk": CHUNK,
                         "variants": list(VARIANTS), "statistic": "lower quartile", "moves_timed": MOVES_TIMED},
               "protocol": timed.protocol(host=measured["host"]),
               "code": code_identity(MEASURING_MODULES)}
    write_json(results_dir / "handoff.json", payload)
    shares = [r["handoffs_s"] / r["runtime_s"] for rows in measured["models"].values() for r in rows]
    _log(f"hand-offs take {min(shares):.1%}-{max(shares):.1%} of the two-stage plans' steps")
    return True


if __name__ == "__main__":
    from bench.laid_out import laid_out_main

    laid_out_main(_child, run)
