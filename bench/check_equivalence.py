"""Do two versions of the simulator decide the same? Fingerprints of every policy's run on real traces.

A speed-up of the simulator or of a policy must not change a result. ``record`` simulates every policy on
the prepared traces of the paper's experiment (examples/paper's ``OUT/T/trace.csv`` and ``OUT/T/perf.parquet``,
iterations / 5, 600,000 s, ticks of 300 s, bad rows skipped) and writes, per trace and policy, every job's
status and JCT (the job_records) and a digest of the decisions and of the time series (decision times left
out); ``compare`` says where two fingerprints differ (exit 1) or that they are identical. Run ``record``
once with the old code on the path and once with the new::

    PYTHONPATH=/path/to/old/checkout .venv/bin/python -m bench.check_equivalence record -o old.json
    .venv/bin/python -m bench.check_equivalence record -o new.json
    .venv/bin/python -m bench.check_equivalence compare old.json new.json

(``git archive BASE libarena tools | tar -x -C /path/to/old/checkout`` gives the old code.) Not a
benchmark: ``python -m bench`` does not run it, and it writes only where ``-o`` says.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "examples" / "clusters" / "paper-sim-1280.yaml"
POLICIES = ("arena", "fcfs", "gavel", "elasticflow", "elasticflow-ls", "sia")


def _digest(values) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=repr).encode()).hexdigest()


def fingerprint(res) -> dict:
    """The job_records (status and JCT by job id), the decisions and the time series of one run."""
    from libarena.schedule.metrics import job_records

    rec = job_records(res).to_pydict()
    rec.pop("unschedulable_reason", None)  # a message, not a decision (and absent before job_records version 2)
    jobs = {job_id: [status, repr(jct), repr(done)] for job_id, status, jct, done in
            zip(rec["job_id"], rec["status"], rec["jct_s"], rec["completed_iterations"])}
    series = {"time": res.ts_time, "throughput": res.ts_throughput, "busy": res.ts_busy_gpus,
              "running": res.ts_running, "starting": res.ts_starting, "queued": res.ts_queued,
              "scheduled": res.ts_scheduled}
    return {"finished": sorted(j for j, v in jobs.items() if v[0] == "finished"), "jobs": jobs,
            "records": _digest(rec), "decisions": _digest(res.decisions),
            "timeseries": _digest(series), "end_time": repr(res.end_time)}


def record(work: Path, traces: list[str], policies: list[str], output: Path, cluster: Path = CLUSTER) -> int:
    from libarena.schedule.api import make_policy, prepare_workload, run_policy
    from libarena.schedule.config import SimulatorConfig

    config = SimulatorConfig(tick_s=300.0, horizon_s=600000.0)
    doc: dict = {}
    for trace in traces:
        workload = prepare_workload(work / trace / "trace.csv", work / trace / "perf.parquet", cluster, skip_bad_rows=True)
        for policy in policies:
            start = time.perf_counter()
            res = run_policy(workload, make_policy(policy), config)
            doc.setdefault(trace, {})[policy] = fingerprint(res)
            print(f"{trace} {policy}: {len(doc[trace][policy]['finished'])} finished, "
                  f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    output.write_text(json.dumps(doc, indent=1, sort_keys=True))
    return 0


def compare(old: Path, new: Path) -> int:
    a, b = json.loads(old.read_text()), json.loads(new.read_text())
    differences = []
    for trace in sorted(set(a) | set(b)):
        for policy in sorted(set(a.get(trace, {})) | set(b.get(trace, {}))):
            fa, fb = a.get(trace, {}).get(policy), b.get(trace, {}).get(policy)
            if fa is None or fb is None:
                differences.append(f"{trace} {policy}: only in {'new' if fa is None else 'old'}")
                continue
            changed = [job for job in sorted(set(fa["jobs"]) | set(fb["jobs"]))
                       if fa["jobs"].get(job) != fb["jobs"].get(job)]
            if changed:
                differences.append(f"{trace} {policy}: {len(changed)} jobs differ in status or JCT, first "
                                   f"{changed[0]}: {fa['jobs'].get(changed[0])} -> {fb['jobs'].get(changed[0])}")
            for part in ("records", "decisions", "timeseries", "end_time"):
                if fa[part] != fb[part]:
                    differences.append(f"{trace} {policy}: {part} differ")
            if not changed and all(fa[p] == fb[p] for p in ("records", "decisions", "timeseries", "end_time")):
                print(f"{trace} {policy}: identical ({len(fa['finished'])} finished)")
    for line in differences:
        print(line)
    return 1 if differences else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="simulate every policy on the traces, write their fingerprints")
    rec.add_argument("-o", "--output", type=Path, required=True)
    rec.add_argument("--work", type=Path, default=REPO / "examples" / "paper" / "out",
                     help="examples/paper's OUT: T/trace.csv and T/perf.parquet per trace")
    rec.add_argument("--traces", default="philly,venus,pai")
    rec.add_argument("--policies", default=",".join(POLICIES))
    rec.add_argument("--cluster", type=Path, default=CLUSTER, help="cluster spec (default: the paper's 1,280 GPUs)")
    cmp = sub.add_parser("compare", help="where two fingerprint files differ")
    cmp.add_argument("old", type=Path)
    cmp.add_argument("new", type=Path)
    args = parser.parse_args(argv)
    if args.command == "record":
        return record(args.work, [t for t in args.traces.split(",") if t], [p for p in args.policies.split(",") if p],
                      args.output, args.cluster)
    return compare(args.old, args.new)


if __name__ == "__main__":
    raise SystemExit(main())
