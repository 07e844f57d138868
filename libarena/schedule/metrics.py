"""Summary metrics and per-job records of a simulation (§5 metrics).

Average JCT counts every submitted job: a job unfinished at the end of the run counts with its time so far
(``unfinished_jobs`` says how many), a dropped job with its time until it was dropped. Average cluster
throughput is the samples trained over the run's makespan (execution truth, integrated over each interval);
peak throughput is the largest sum of the running jobs' samples/s at a tick.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pyarrow as pa

from libarena.schedule.entities import JobState
from libarena.schedule.simulator import SimulationResult


def job_status(job) -> str:
    if job.state == JobState.FINISHED:
        return "finished"
    if job.state == JobState.DROPPED:
        return "dropped"
    if job.unschedulable:
        return "unschedulable"
    return "unfinished"


def job_records(res: SimulationResult) -> pa.Table:
    end = res.end_time
    cols: dict[str, list] = {k: [] for k in (
        "job_id", "trace_row", "model", "global_batch", "num_iterations", "completed_iterations", "requested_gpus",
        "requested_gpu_type", "priority", "submit_time_s", "deadline_s", "status", "start_time_s", "finish_time_s",
        "jct_s", "queuing_s", "met_deadline", "reschedules", "overhead_s", "final_gpu_type", "final_num_gpus",
        "unschedulable_reason")}
    nan = float("nan")
    for job in res.jobs:
        s = job.spec
        if job.state == JobState.PENDING:
            continue  # never submitted within the horizon
        status = job_status(job)
        done = job.progress
        if job.state == JobState.RUNNING:
            done = min(float(s.num_iterations), job.progress + job.rate * (end - job.progress_time))
        finish = job.finish_time if job.finish_time is not None else nan
        jct = (job.finish_time if job.finish_time is not None else end) - s.submit_time
        queuing = (job.first_start if job.first_start is not None else end) - s.submit_time
        if job.state == JobState.DROPPED:
            queuing = job.finish_time - s.submit_time
        cols["job_id"].append(s.job_id)
        cols["trace_row"].append(s.row)
        cols["model"].append(s.model)
        cols["global_batch"].append(s.global_batch)
        cols["num_iterations"].append(s.num_iterations)
        cols["completed_iterations"].append(done)
        cols["requested_gpus"].append(s.requested_gpus)
        cols["requested_gpu_type"].append(s.requested_type or "")
        cols["priority"].append(job.submitted_priority)
        cols["submit_time_s"].append(s.submit_time)
        cols["deadline_s"].append(s.deadline if s.deadline is not None else nan)
        cols["status"].append(status)
        cols["start_time_s"].append(job.first_start if job.first_start is not None else nan)
        cols["finish_time_s"].append(finish)
        cols["jct_s"].append(jct)
        cols["queuing_s"].append(queuing)
        cols["met_deadline"].append(bool(status == "finished" and s.deadline is not None and job.finish_time <= s.deadline))
        cols["reschedules"].append(job.reschedules)
        cols["overhead_s"].append(job.overhead_s)
        cols["final_gpu_type"].append(res.gpu_types[job.alloc.type_index] if job.alloc is not None else "")
        cols["final_num_gpus"].append(job.alloc.num_gpus if job.alloc is not None else 0)
        cols["unschedulable_reason"].append(job.unschedulable or "")
    return pa.table(cols)


def timeseries(res: SimulationResult) -> pa.Table:
    return pa.table({
        "time_s": res.ts_time, "cluster_throughput": res.ts_throughput, "busy_gpus": res.ts_busy_gpus,
        "running_jobs": res.ts_running, "starting_jobs": res.ts_starting, "queued_jobs": res.ts_queued,
        "scheduled": res.ts_scheduled, "decision_time_s": res.ts_decision_s})


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else 0.0


def summarize(res: SimulationResult, records: pa.Table | None = None) -> dict:
    rec = records if records is not None else job_records(res)
    status = np.array(rec.column("status").to_pylist(), dtype=object)
    jct = np.array(rec.column("jct_s").to_pylist(), dtype=float)
    queuing = np.array(rec.column("queuing_s").to_pylist(), dtype=float)
    resched = np.array(rec.column("reschedules").to_pylist(), dtype=float)
    started = ~np.isnan(np.array(rec.column("start_time_s").to_pylist(), dtype=float))
    deadlines = ~np.isnan(np.array(rec.column("deadline_s").to_pylist(), dtype=float))
    met = np.array(rec.column("met_deadline").to_pylist(), dtype=bool)
    finished = status == "finished"
    thr = np.array(res.ts_throughput, dtype=float)
    span = res.end_time - res.start_time
    # the averages integrate over the run (samples trained, GPU-seconds held): tick samples taken right after each
    # decision miss the jobs that start and end between ticks and count a launch by its policy's start-up cost
    samples = sum((j.spec.num_iterations - j.remaining_at(res.end_time)) * j.spec.global_batch for j in res.jobs)
    dec = np.array([d for d, s in zip(res.ts_decision_s, res.ts_scheduled) if s], dtype=float)
    n = len(status)
    return {
        "policy": res.policy,
        "view": res.view,
        "submitted_jobs": int(n),
        "finished_jobs": int(finished.sum()),
        "unfinished_jobs": int(((status == "unfinished") | (status == "unschedulable")).sum()),
        "unschedulable_jobs": int((status == "unschedulable").sum()),
        "dropped_jobs": int((status == "dropped").sum()),
        "avg_jct_s": float(jct.mean()) if n else 0.0,
        # NaN (null in metrics.json) when none finished: 0 h would read as the best result there is
        "avg_jct_finished_s": float(jct[finished].mean()) if finished.any() else float("nan"),
        "p50_jct_s": _pct(jct, 50),
        "p90_jct_s": _pct(jct, 90),
        "p99_jct_s": _pct(jct, 99),
        "avg_queuing_s": float(queuing.mean()) if n else 0.0,
        "p90_queuing_s": _pct(queuing, 90),
        "avg_throughput": float(samples / span) if span > 0 else 0.0,
        "peak_throughput": float(thr.max()) if thr.size else 0.0,
        "avg_gpu_utilization": float(res.gpu_seconds / (res.total_gpus * span)) if span > 0 and res.total_gpus else 0.0,
        "deadline_satisfaction_ratio": float(met.sum() / deadlines.sum()) if deadlines.any() else float("nan"),
        "reschedules_per_job": float(resched[started].mean()) if started.any() else 0.0,
        "decision_time_per_tick_median_s": _pct(dec, 50),
        "decision_time_per_tick_p99_s": _pct(dec, 99),
        "decision_time_per_tick_max_s": float(dec.max()) if dec.size else 0.0,
        "decision_time_per_job_s": float(dec.sum() / n) if n else 0.0,
        "scheduled_ticks": int(dec.size),
        "ticks": len(res.ts_time),
        "makespan_s": float(res.end_time - res.start_time),
        "stopped_by": res.stopped_by,
        "simulation_wall_s": res.wall_s,
        # solves whose answer depends on the host's speed (the baselines' ILP, ilp_time_limit_s)
        "ilp_time_limit_hits": int(res.counters.get("ilp_time_limit_hits", 0)),
        "trades": int(res.counters.get("trades", 0)),
        "trades_at_launch": int(res.counters.get("trades_at_launch", 0)),
    }


def time_limit_note(m: dict) -> str | None:
    """The warning a run whose ILP solves stopped at their time limit deserves (None: none did)."""
    hits = m.get("ilp_time_limit_hits") or 0
    if not hits:
        return None
    return (f"{m['policy']}: {hits} ILP solve(s) stopped at the time limit (ilp_time_limit_s): those decisions depend "
            "on this host's speed and load, so the run may not repeat exactly")


def json_safe(metrics: dict) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}


def summary_line(m: dict) -> str:
    """One line of a run's metrics (what the tools log after a simulation)."""
    unschedulable = m.get("unschedulable_jobs", 0)
    among = f", {unschedulable} of them unschedulable" if unschedulable else ""
    return (f"{m['policy']}: {m['finished_jobs']}/{m['submitted_jobs']} finished ({m['unfinished_jobs']} unfinished"
            f"{among}, {m['dropped_jobs']} dropped), avg JCT {m['avg_jct_s'] / 3600:.2f} h, avg queuing "
            f"{m['avg_queuing_s'] / 3600:.2f} h, avg throughput {m['avg_throughput']:.1f} samples/s, peak "
            f"{m['peak_throughput']:.1f}, {m['reschedules_per_job']:.2f} reschedules/job, simulated in "
            f"{m['simulation_wall_s']:.1f} s")


def unschedulable_notes(records: pa.Table, limit: int = 3) -> list[str]:
    """Lines saying which jobs of a run's records the policy could never place and why, one per distinct reason
    (most jobs first, at most ``limit``, then how many reasons are not shown)."""
    by_reason: dict[str, list[str]] = {}
    for job_id, status, reason in zip(records.column("job_id").to_pylist(), records.column("status").to_pylist(),
                                      records.column("unschedulable_reason").to_pylist()):
        if status == "unschedulable":
            by_reason.setdefault(reason, []).append(job_id)
    ranked = sorted(by_reason.items(), key=lambda item: -len(item[1]))  # stable: first-seen order among equals
    lines = [f"unschedulable: {len(ids)} job(s) (first {ids[0]}): {reason}" for reason, ids in ranked[:limit]]
    if len(ranked) > limit:
        rest = sum(len(ids) for _, ids in ranked[limit:])
        lines.append(f"unschedulable: {rest} more job(s), for {len(ranked) - limit} other reason(s) "
                     f"(jobs.parquet's unschedulable_reason)")
    return lines


def read_metrics(path: str | os.PathLike[str]) -> dict:
    """metrics.json (a run_metrics document, libarena.artifacts.kinds.run_metrics) as written (NaN stored as null),
    with null numbers back to NaN for the text summaries."""
    from libarena.artifacts import read_json_document

    return {k: (float("nan") if v is None else v) for k, v in read_json_document(path, "run_metrics").data.items()}
