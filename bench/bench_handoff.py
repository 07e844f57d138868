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


def time_plan(finder: Any, plan: Any, rounds: int = ROUNDS, moves_timed: int = MOVES_TIMED) -> dict[str, Any]:
    """One two-stage plan's step, runtime / copy / ready, interleaved over ``rounds``; and its moves timed alone."""
    import jax

    from libarena.profile.handoff import handoff_executor, time_variants
    from libarena.profile.measure import _run_plan
    from libarena.run.heap import frozen_heap
    from libarena.run.train import batch_for_step

    job = finder.job
    run_plan = _run_plan(job, plan, jax.devices())
    executor = handoff_executor(job.model, run_plan, jax.devices()[:DEVICES], job.dtype)
    executor.init_state(0)
    batch = batch_for_step(job.model, 0, run_plan.global_batch, 0)
    samples = time_variants(executor, batch, VARIANTS, rounds, WARMUP, CHUNK)
    handoffs = len(executor.results)
    # per round: the runtime's chunk median less the ready one's (a host's drift cancels)
    paired = [statistics.median(samples["runtime"][r * CHUNK:(r + 1) * CHUNK]) - statistics.median(samples["ready"][r * CHUNK:(r + 1) * CHUNK])
              for r in range(rounds)]
    moves: dict[str, list[float]] = {"forward": [], "backward": []}
    with frozen_heap():
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
