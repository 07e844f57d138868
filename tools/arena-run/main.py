"""arena-run: train a model under a plan from arena-plan (proxy plan, a chosen plan, or a pruned/full
runtime search), checkpointed and resumable onto any other plan, on Ray (embedded local cluster by default).

    arena-run --plan plans.parquet --grid a100,8,2 --model gpt__tiny --global-batch 32 --steps 50 --checkpoint-dir ckpt/
    arena-run ... --search pruned          # §3.6 runtime pruning, then train the winner
    arena-run ... --address ray://head:10001 --json

Not cached (unlike the other stages): training is the point of running it, and its checkpoints already make
a rerun resume rather than start over.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from libarena.cli import QUIET_OPTION, run_app, stderr_console, strict_json
from libarena.errors import ArenaError
from libarena.run.checkpoint import DEFAULT_CHECKPOINT_EVERY

app = typer.Typer(add_completion=False, help="Train a model under an arena-plan plan with adaptive parallelism (JAX + Ray).")


@app.command()
def run(
    plan: Path = typer.Option(..., "--plan", help="plans file from arena-plan"),
    model: str = typer.Option(..., "--model", help="model identifier, family__size"),
    global_batch: int = typer.Option(..., "--global-batch", help="global batch size (must match the plans)"),
    steps: int = typer.Option(..., "--steps", help="train until this many steps are done (resumes count)"),
    checkpoint_dir: Path = typer.Option(..., "--checkpoint-dir", help="checkpoints: resumed from when present"),
    grid: Optional[str] = typer.Option(None, "--grid", help="allocated resources GPU_TYPE,NUM_GPUS[,PIPELINE_DEGREE]"),
    plan_id: Optional[str] = typer.Option(None, "--plan-id", help="run this plan of the plans file"),
    proxy: bool = typer.Option(False, "--proxy", help="run the grid's proxy plan, zero search (the default)"),
    search: Optional[str] = typer.Option(None, "--search", help="runtime AP search before training: pruned or full (proxy: none, as --proxy)"),
    search_max: int = typer.Option(0, "--search-max", help="measure at most this many candidates (seeded sample; 0 = all)"),
    search_steps: int = typer.Option(2, "--search-steps", help="timed steps per candidate (after one warm-up step)"),
    checkpoint_every: int = typer.Option(DEFAULT_CHECKPOINT_EVERY, "--checkpoint-every", help="save every N steps (and at the end)"),
    address: Optional[str] = typer.Option(None, "--address", help="join this Ray cluster (default: start an embedded one)"),
    no_ray: bool = typer.Option(False, "--no-ray", help="run in this process instead of on Ray"),
    cpu_devices: Optional[bool] = typer.Option(
        None, "--cpu-devices/--accelerators", help="train on host CPU devices standing in for the GPUs, or on the "
        "nodes' accelerators (default: CPU devices on the embedded cluster, accelerators when joining one with --address)"),
    devices: int = typer.Option(8, "--devices", help="devices the local host presents as the GPU type (no --address)"),
    hosts: int = typer.Option(0, "--hosts", help="spread the job over this many hosts, one Ray actor (JAX process) each; 0 = auto"),
    seed: int = typer.Option(0, "--seed", help="parameter initialisation seed"),
    data_seed: int = typer.Option(0, "--data-seed", help="training data seed"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="compute dtype (fp32, bf16, fp16): the one the plans "
                                        "were made in (the default), or a resumed checkpoint's; another is refused"),
    learning_rate: float = typer.Option(1e-3, "--lr", help="Adam learning rate"),
    json_out: bool = typer.Option(False, "--json", help="print the run report as JSON on stdout"),
    report: Optional[Path] = typer.Option(None, "--report", help="also write the run report (JSON) here"),
    quiet: bool = QUIET_OPTION,
) -> None:
    from libarena.artifacts import refuse_overwriting_inputs, write_json
    from libarena.artifacts.io import check_writable
    from libarena.models.training import OptimizerConfig
    from libarena.run.api import RunRequest, parse_grid, run as run_job
    from libarena.run.cluster import LocalClusterConfig
    from libarena.run.search import SearchConfig

    if proxy and search:
        raise ArenaError("--proxy and --search exclude each other")
    if proxy and plan_id:
        raise ArenaError("--proxy runs the grid's proxy plan and --plan-id another: give one of them")
    # the request checks every value (the library's callers get the same one-line errors) before anything runs
    request = RunRequest(
        plans_path=str(plan), model=model, global_batch=global_batch, steps=steps, checkpoint_dir=str(checkpoint_dir),
        grid=parse_grid(grid) if grid else None, plan_id=plan_id, selection=search or "proxy",
        search=SearchConfig(max_candidates=search_max, timed_steps=search_steps), address=address, use_ray=not no_ray,
        local=LocalClusterConfig(num_devices=devices), num_hosts=hosts, checkpoint_every=checkpoint_every, seed=seed, data_seed=data_seed,
        dtype=dtype, optimizer=OptimizerConfig(learning_rate=learning_rate), cpu_devices=cpu_devices,
    )
    if report is not None:  # checked before training, not after it
        refuse_overwriting_inputs(report, {"--plan": plan}, output_flag="--report")
        if os.path.abspath(report) == os.path.abspath(checkpoint_dir):
            raise ArenaError(f"--report {report} is the --checkpoint-dir: write the report elsewhere")
        check_writable(report)
    result = run_job(request)
    if report is not None:
        write_json(report, result)
    _notices(result, quiet)
    if json_out:
        print(strict_json(result, default=str))
    else:
        _summary(result, quiet)


def _notices(result: dict, quiet: bool) -> None:
    """What the user must hear about the checkpoints on stderr (also with --json; warnings also with --quiet)."""
    from libarena.run.api import skipped_checkpoints

    if result.get("dtype_note"):
        stderr_console.print(f"warning: {result['dtype_note']}", markup=False, soft_wrap=True)
    for entry in skipped_checkpoints(result):
        aside = f" (set aside as {entry['set_aside_as']})" if entry.get("set_aside_as") else ""
        stderr_console.print(f"warning: skipped checkpoint {entry['path']}{aside}: {entry['why']}", markup=False, soft_wrap=True)
    resumed, steps = result.get("resumed_from"), result.get("steps")
    if resumed is not None and steps is not None and resumed >= steps:
        stderr_console.print(f"nothing to train: the checkpoint is already at step {resumed} (--steps {steps})",
                             markup=False, soft_wrap=True)
    elif resumed is not None and not quiet:
        stderr_console.print(f"resumed from step {resumed}", markup=False, soft_wrap=True)


def _summary(result: dict, quiet: bool = False) -> None:
    plan = result["plan"]
    if plan is not None and not quiet:  # (None: a finished job rerun with --search, which searched nothing)
        stderr_console.print(f"plan {plan['plan_id']}: {plan['pipeline_degree']} stages, GPUs {plan['gpus_per_stage']}, "
                             f"dp {plan['dp_per_stage']}, tp {plan['tp_per_stage']}", markup=False, soft_wrap=True)
    if "search" in result and not quiet:
        s = result["search"]
        stderr_console.print(f"{s['mode']} search: {s['candidates_measured']}/{s['candidates_total']} candidates, "
                             f"{s['cost_device_s']:.1f} device-s, best {s['best_step_time_s'] * 1e3:.1f} ms/step",
                             markup=False, soft_wrap=True)
    run = result.get("train") or result.get("job") or {}
    losses = run.get("losses") or []
    if losses:
        print(f"steps {losses[0][0]}..{losses[-1][0]}: loss {losses[0][1]:.4f} -> {losses[-1][1]:.4f}")
    if result.get("job"):
        print(f"restarts: {result['job']['restarts']}")


def main() -> None:
    run_app("arena-run", app)


if __name__ == "__main__":
    main()
