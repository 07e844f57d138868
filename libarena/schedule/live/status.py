"""What ``arena-schedule status`` and ``logs`` show, read from the state database only (no server needed)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from libarena.checks import check_range
from libarena.schedule.live import store as st
from libarena.schedule.live.clock import VirtualClock
from libarena.schedule.live.store import Store


def job_rows(store: Store, include_done: bool = True) -> dict[str, Any]:
    settings = store.get_meta("settings") or {}
    origin = store.get_meta("wall_origin")
    clock = VirtualClock(float(origin), float(settings.get("compression", 1.0))) if origin is not None else None
    now = clock.at(time.time()) if clock else None
    # cancels the server has not acted on yet (it is down, or between polls)
    cancelling = {r[1] for r in store.cancel_requests(store.cancels_seen())[0]}
    rows = []
    for j in store.jobs():
        if not include_done and j["status"] in st.TERMINAL:
            continue
        spec = j["spec"]
        snap = (j["state"] or {}).get("snapshot") or {}
        alloc = snap.get("alloc")
        iters = spec["iterations"]
        done = _iterations_done(j["status"], snap, iters, now)
        # the model's estimate ran out before the launcher reported the end: training goes on, of unknown length
        overdue = j["status"] in (st.RUNNING, st.STARTING) and done >= iters
        if j["status"] != st.FINISHED:
            done = min(done, max(0.0, iters - 1.0))  # a job still training is never shown complete
        eta = None
        if j["status"] in (st.RUNNING, st.STARTING) and snap.get("true_rate", 0) > 0 and now is not None and not overdue:
            eta_s = (iters - done) / snap["true_rate"]
            eta = {"scheduler_s": eta_s, "wall_s": eta_s / (clock.compression if clock else 1.0)}
        req = snap.get("request")
        rows.append({
            "job_id": j["job_id"], "status": j["status"], "model": spec["model"], "global_batch": spec["global_batch"],
            "iterations": iters, "iterations_done": done, "progress": done / iters if iters else 0.0,
            "priority": snap.get("priority", spec.get("priority")),
            "gpu_type": alloc["gpu_type"] if alloc and j["status"] in (st.RUNNING, st.STARTING) else None,
            "num_gpus": (1 << alloc["count_index"]) if alloc and j["status"] in (st.RUNNING, st.STARTING) else 0,
            "nodes": req["nodes"] if req and j["status"] in (st.RUNNING, st.STARTING) else [],
            "plan": (f"{req['gpu_type']},{req['num_gpus']}" if req and j["status"] in (st.RUNNING, st.STARTING) else None),
            "version": snap.get("version", 0), "reschedules": snap.get("reschedules", 0),
            "arrival_time": j["arrival_time"], "finish_time": snap.get("finish_time"), "eta": eta, "overdue": overdue,
            "progress_measured": bool(snap.get("measured_progress")), "error": j["error"],
            "cancel_requested": j["job_id"] in cancelling and j["status"] not in st.TERMINAL,
        })
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return {"state": str(store.path), "policy": settings.get("policy"), "cluster": settings.get("cluster"),
            "scheduler_time": now, "last_tick": store.get_meta("last_tick"), "counts": counts, "jobs": rows}


def _iterations_done(status: str, snap: dict[str, Any], iters: int, now: float | None) -> float:
    """Iterations a job has done: all of them once finished; what the launcher measured (its newest
    checkpoint), never extrapolated, when the launcher measures progress; else the scheduler's model (the
    perf table's rate since the last snapshot). Not capped: the caller decides how to show an overrun."""
    if status == st.FINISHED:
        return float(iters)
    if not snap:
        return 0.0
    reported = snap.get("reported_iterations")
    if snap.get("measured_progress"):
        return float(reported if reported is not None else snap.get("progress", 0.0))
    if reported is not None:
        return float(reported)
    done = iters - snap.get("remaining", iters)
    if status == st.RUNNING and now is not None:
        done += snap.get("true_rate", 0.0) * max(0.0, now - snap.get("snapshot_time", now))
    return float(done)


def render(doc: dict[str, Any]):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def fmt_s(s: float | None) -> str:
        if s is None:
            return "-"
        return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"

    head = Text(f"{doc['state']}: policy {doc['policy']}, scheduler time {fmt_s(doc['scheduler_time'])}, last tick "
                f"{fmt_s(doc['last_tick'])}; " + ", ".join(f"{k} {v}" for k, v in sorted(doc["counts"].items())))
    running = Table(title="running", title_justify="left")
    for col in ("job", "status", "model", "batch", "GPUs", "nodes", "plan", "progress", "ETA (wall)", "rescales"):
        running.add_column(col)
    queue = Table(title="queue", title_justify="left")
    for col in ("job", "status", "model", "batch", "iterations", "priority", "note"):
        queue.add_column(col)
    done = Table(title="done", title_justify="left")
    for col in ("job", "status", "model", "finish", "note"):
        done.add_column(col)
    for r in doc["jobs"]:
        if r["status"] in (st.RUNNING, st.STARTING):
            running.add_row(r["job_id"], r["status"], r["model"], str(r["global_batch"]), f"{r['num_gpus']} x {r['gpu_type']}",
                            ",".join(map(str, r["nodes"])), r["plan"] or "-",
                            f"{int(r['iterations_done'])}/{r['iterations']} ({int(100 * r['progress'])}%)",
                            "cancel requested" if r.get("cancel_requested") else "overdue" if r.get("overdue")
                            else fmt_s(r["eta"]["wall_s"]) if r["eta"] else "-",
                            str(r["reschedules"]))
        elif r["status"] in st.TERMINAL:
            done.add_row(r["job_id"], r["status"], r["model"], fmt_s(r["finish_time"]), r["error"] or "")
        else:
            queue.add_row(r["job_id"], r["status"], r["model"], str(r["global_batch"]), str(r["iterations"]),
                          str(r["priority"] or "-"), "cancel requested" if r.get("cancel_requested") else r["error"] or "")
    return Group(head, running, queue, done)


def log_lines(store: Store, job_id: str, limit: int | None = None) -> list[str]:
    check_range(limit, "--tail", 1, 10**9, integer=True, optional=True)
    out = []
    for e in store.log_of(job_id, limit):
        when = time.strftime("%H:%M:%S", time.localtime(e["wall"]))
        t = "" if e["time"] is None else f" t={e['time']:.0f}s"
        detail = " ".join(f"{k}={v}" for k, v in e["detail"].items() if k not in ("view_throughput", "true_throughput"))
        out.append(f"{when}{t} {e['kind']} {detail}".rstrip())
    return out


def job_output(store: Store, job_id: str, state_path: Path, lines: int) -> tuple[Path, list[str]] | None:
    """The last ``lines`` of the output of the job's current run (arena-run's log), when it has one."""
    from libarena.errors import ArenaError

    check_range(lines, "--output-lines", 0, 10**6, integer=True)
    row = store.job(job_id)
    if row is None:
        raise ArenaError(f"{state_path}: no job {job_id!r}")
    snap = (row["state"] or {}).get("snapshot") or {}
    workdir = Path(store.get_meta("workdir") or state_path.with_name(state_path.name + ".d"))
    out = workdir / "launcher" / "jobs" / job_id / f"v{snap.get('version', 0)}" / "output.log"
    if lines <= 0 or not out.exists():
        return None
    return out, last_lines(out, lines)


#: The most of a job's output ``logs`` reads from its end (a run's log grows for days, and relaunches append).
MAX_OUTPUT_TAIL_BYTES = 1 << 26
_TAIL_BLOCK = 1 << 16


def last_lines(path: Path, lines: int, max_bytes: int = MAX_OUTPUT_TAIL_BYTES) -> list[str]:
    """The last ``lines`` lines of a file (split as universal newlines: \\n, \\r\\n, \\r), read backwards from its end in
    blocks, at most ``max_bytes`` of it: time and memory bounded by what is shown, not by the file's size."""
    import os

    chunks: list[bytes] = []
    line_feeds = returns = 0
    with path.open("rb") as f:
        end = pos = f.seek(0, os.SEEK_END)
        # until more line ends than lines wanted (the first line read may have begun before), counted low
        # (\r\n is one end, \n or \r alone one each: the larger count is at most the lines)
        while pos > 0 and max(line_feeds, returns) <= lines and end - pos < max_bytes:
            step = min(_TAIL_BLOCK, pos, max_bytes - (end - pos))
            pos -= step
            f.seek(pos)
            chunk = f.read(step)
            chunks.append(chunk)
            line_feeds, returns = line_feeds + chunk.count(b"\n"), returns + chunk.count(b"\r")
        data = b"".join(reversed(chunks))
        whole = pos == 0
        if not whole:
            f.seek(pos - 1)
            before = f.read(1)
            # the first line read is whole where a line ended just before it (not at the \r of a \r\n it splits)
            whole = before == b"\n" or (before == b"\r" and not data.startswith(b"\n"))
    found = data.splitlines()
    return [line.decode(errors="replace") for line in found[0 if whole else 1:][-lines:]]
