"""Hostile input, concurrent use and interrupted runs (issue 17), one test per category, with generated cases.

Every case runs a tool's real console script in a subprocess under RLIMIT_AS, RLIMIT_CPU and a wall-clock
watchdog (tests/fuzz/limits.py), so a case that runs away fails here instead of hanging the suite; each
case's wall time and peak memory are measured and summarised per category at the end of the session.

- numbers: absurd values in trace cells, perf-table cells and numeric flags (simulate, plan, profile comm);
  an out-of-range perf value is reported as a problem of the perf table, naming its row and column;
- spec files: YAML alias bombs, deep nesting (flow and block), oversized files and mistyped keys in cluster
  specs (YAML and TOML) and job files;
- outputs: an output spelled as one of the inputs (every producing tool, several spellings: ./, absolute,
  symbolic and hard links, dir/..), a directory output holding an input or foreign files, devices as outputs,
  foreign SQLite databases as --state; nothing is overwritten and devices stay devices;
- interrupted: SIGKILL of arena-plan and arena-schedule compare at a random moment: the output is absent
  or complete, never partial, and the next run cleans the killed run's temp files;
- concurrency: a second live scheduler on the same state database exits 2 naming the first one's pid;
- pipes: a reader that closes after a few bytes ends the tool quietly (SIGPIPE), as Unix tools end;
- stdin: generated traces piped to ``trace stats -`` and ``simulate --trace -``.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.corrupt import number_text
from tests.fuzz.harness import FUZZ_SETTINGS
from tests.fuzz.limits import Result, check_clean, limited, record, run_limited, tool_path

pytestmark = [pytest.mark.fuzz, pytest.mark.slow, pytest.mark.xdist_group("hostile")]

#: generated cases per category (each case is a subprocess: about half a second to a few seconds)
BUDGET = {"numbers": 60, "spec_files": 40, "outputs": 36, "interrupted": 8, "concurrency": 3, "pipes": 16,
          "stdin": 10}
ABSURD = st.one_of(number_text, st.sampled_from(["1e18", "1e300", "1" + "0" * 300, "-1", "0", "nan", "inf", "-inf",
                                                 "1e-300", "0.000001", "4294967296", "999999999999999"]))


def _cases(category: str, strategy: st.SearchStrategy, body) -> None:
    count = 0

    @settings(max_examples=BUDGET[category], **FUZZ_SETTINGS)
    @given(strategy)
    def cases(case) -> None:
        nonlocal count
        count += 1
        body(case)

    cases()
    assert count >= BUDGET[category], f"{category}: only {count} cases generated"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fresh(seeds, parent: Path, *names: str) -> Path:
    """A new working directory under ``parent`` with the seed inputs named (trace.csv, perf.parquet,
    cluster.yaml, ops.parquet, plans.parquet; default all)."""
    root = Path(tempfile.mkdtemp(prefix="case-", dir=parent))
    files = {"trace.csv": ("\n".join(",".join(r) for r in [seeds.trace_header] + seeds.trace_rows) + "\n").encode(),
             "perf.parquet": seeds.perf_bytes, "cluster.yaml": seeds.cluster_yaml.read_bytes(),
             "ops.parquet": seeds.ops_bytes, "plans.parquet": seeds.plans_bytes}
    for name in names or files:
        (root / name).write_bytes(files[name])
    return root


def _run(category: str, tool: str, argv: list[str], cwd: Path, **kw):
    result = run_limited(tool, argv, cwd=cwd, **kw)
    record(category, result)
    return result


SIMULATE = ["simulate", "--trace", "trace.csv", "--perf", "perf.parquet", "--cluster", "cluster.yaml", "-o", "run",
            "--policy", "fcfs", "--no-cache"]


# --------------------------------------------------------------------------------------------------
# numbers


TRACE_COLUMNS = ["submission_time", "num_iteration", "batch_size", "num_gpu", "deadline"]
PERF_COLUMNS = ["iter_time_s", "throughput", "num_gpus", "global_batch"]
SIM_FLAGS = ["--tick", "--horizon", "--max-ticks", "--seed", "--promotion-time", "--max-gpus-per-job", "--queues",
             "--search-depth", "--overhead checkpoint_resume_s=", "--overhead grid_profiling_s="]
PLAN_FLAGS = ["--max-gpus", "--memory-fraction", "--frontier-cap", "--microbatches-per-stage", "--num-microbatches",
              "--exhaustive-limit"]
COMM_FLAGS = ["--max-bytes", "--min-bytes", "--devices", "--points", "--repeats"]
COMM_ABSURD = ["0", "-1", "1e300", "nan", "1000000000000", "99999999999999999999"]


def test_numbers(seeds, tmp_path):
    where = st.one_of(
        st.tuples(st.just("trace"), st.sampled_from(TRACE_COLUMNS), st.integers(0, 3), ABSURD),
        st.tuples(st.just("perf"), st.sampled_from(PERF_COLUMNS), st.integers(0, seeds.perf.table.num_rows - 1), ABSURD),
        st.tuples(st.just("simulate"), st.sampled_from(SIM_FLAGS), st.just(0), ABSURD),
        st.tuples(st.just("plan"), st.sampled_from(PLAN_FLAGS), st.just(0), ABSURD),
        st.tuples(st.just("comm"), st.sampled_from(COMM_FLAGS), st.just(0), st.sampled_from(COMM_ABSURD)),
    )

    def body(case):
        kind, name, row, value = case
        work = _fresh(seeds, tmp_path)
        if kind == "trace":
            header, rows = seeds.trace_header, [list(r) for r in seeds.trace_rows]
            rows[row][header.index(name)] = value
            (work / "trace.csv").write_text("\n".join(",".join(r) for r in [header] + rows) + "\n")
            r = _run("numbers", "arena-schedule", SIMULATE, work)
            check_clean(r)
            if r.code == 2 and "trace.csv" in r.stderr:
                assert f"row {row + 1}" in r.stderr or "no job" in r.stderr or "lacks" in r.stderr, r.describe()
        elif kind == "perf":
            header = ["model", "global_batch", "gpu_type", "num_gpus", "view", "iter_time_s", "throughput",
                      "fits_in_memory"]
            rows = [[str(v).lower() if isinstance(v, bool) else str(v) for v in r.values()]
                    for r in seeds.perf.table.select(header).to_pylist()]
            rows[row][header.index(name)] = value
            (work / "perf.csv").write_text("\n".join(",".join(r) for r in [header] + rows) + "\n")
            r = _run("numbers", "arena-schedule", [*SIMULATE[:4], "perf.csv", *SIMULATE[5:]], work)
            check_clean(r)
            if r.code == 2 and f"row {row + 1}, column '{name}'" in r.stderr:
                assert "perf.csv" in r.stderr, r.describe()  # the perf table's problem, never a trace row's
        elif kind == "simulate":
            flag = [name + value] if name.endswith("=") else [name, value]
            r = _run("numbers", "arena-schedule", [*SIMULATE, *flag], work)
            check_clean(r)
        elif kind == "plan":
            r = _run("numbers", "arena-plan", ["--ops", "ops.parquet", "--cluster", "cluster.yaml", "-o", "p.parquet",
                                               "--no-cache", name, value], work)
            check_clean(r)
        else:
            r = _run("numbers", "arena-profile", ["comm", "-o", "c.parquet", name, value], work)
            check_clean(r, codes=(2,))  # refused before anything is allocated or measured
        assert r.wall_s < 60, r.describe()

    _cases("numbers", where, body)


# --------------------------------------------------------------------------------------------------
# spec files


KNOWN_KEYS = {"cluster": ["name", "node_groups", "gpu_type", "nodes", "gpus_per_node"],
              "job": ["model", "global_batch", "iterations", "priority", "deadline", "gpu_type", "num_gpus", "name"]}


@st.composite
def hostile_spec(draw):
    target = draw(st.sampled_from(["cluster", "job"]))
    kind = draw(st.sampled_from(["alias-bomb", "flow-depth", "block-depth", "oversize", "typo", "toml-depth"]))
    if kind == "alias-bomb":
        width, depth = draw(st.integers(2, 12)), draw(st.integers(2, 12))
        lines = ["a0: &a0 [" + ", ".join(["x"] * width) + "]"]
        lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, depth)]
        key = "node_groups" if target == "cluster" else draw(st.sampled_from(["model", "global_batch", "name"]))
        return target, kind, "\n".join(lines) + f"\n{key}: *a{depth - 1}\n", "YAML aliases"
    if kind == "flow-depth":
        n = draw(st.integers(33, 200_000))
        return target, kind, "model: " + "[" * n + "]" * n + "\n", "nested deeper than 32 levels"
    if kind == "block-depth":
        n = draw(st.integers(33, 120))
        return target, kind, "x:\n" + "".join("  " * (i + 1) + "-\n" for i in range(n)), "nested deeper than 32"
    if kind == "toml-depth":
        n = draw(st.integers(33, 100_000))
        return target, kind, "x = " + "[" * n + "]" * n + "\n", "nested deeper than 32 levels"
    if kind == "oversize":
        return target, kind, "# pad\n" * (1 << 18), "larger than 1024 KiB"
    known = KNOWN_KEYS[target]
    word = draw(st.sampled_from(known[1:] if target == "cluster" else known))
    i = draw(st.integers(0, len(word) - 1))
    typo = draw(st.sampled_from([word[:i] + word[i + 1:], word[:i] + "x" + word[i:], word + "s"]))
    if typo in known or len(typo) < 4:
        typo = word + "_x"
    if target == "cluster":
        group = {"gpu_type": "a40", "nodes": 1}
        if word in group or word == "gpus_per_node":
            group[typo] = group.pop(word, 2)
            doc = {"name": "c", "node_groups": [group]}
        else:
            doc = {typo: "c" if word == "name" else [group], **({"node_groups": [group]} if word == "name" else {})}
    else:
        doc = {"model": "gpt__tiny", "global_batch": 8, "iterations": 5}
        doc[typo] = doc.pop(word, 1)
    return target, kind, yaml.safe_dump(doc), f"unknown key '{typo}'"


def test_spec_files(seeds, tmp_path):
    def body(case):
        target, kind, text, needle = case
        work = _fresh(seeds, tmp_path, "trace.csv")
        name = f"spec.{'toml' if kind == 'toml-depth' else 'yaml'}"
        (work / name).write_text(text)
        if target == "cluster":
            r = _run("spec_files", "arena-schedule", ["trace", "stats", "trace.csv", "--cluster", name], work)
        else:
            r = _run("spec_files", "arena-schedule", ["submit", name, "--state", "state.db"], work)
        check_clean(r, codes=(2,), needle=needle)
        assert r.wall_s < 30 and r.peak_rss_mib < 1024, r.describe()

    _cases("spec_files", hostile_spec(), body)


# --------------------------------------------------------------------------------------------------
# outputs


#: (tool, argv before -o, the input flag whose file -o names)
PRODUCERS = [
    ("arena-plan", ["--ops", "ops.parquet", "--cluster", "cluster.yaml", "--no-cache"], "ops.parquet"),
    ("arena-plan", ["--ops", "ops.parquet", "--cluster", "cluster.yaml", "--no-cache"], "cluster.yaml"),
    ("arena-plan", ["export", "plans.parquet", "--gpu-type", "a40", "--num-gpus", "2", "--stages", "1"], "plans.parquet"),
    ("arena-profile", ["--plans", "plans.parquet", "--no-cache"], "plans.parquet"),
    ("arena-schedule", ["perf", "build", "--trace", "trace.csv", "--cluster", "cluster.yaml", "--no-cache"], "trace.csv"),
    ("arena-schedule", SIMULATE[:-5] + ["--no-cache"], "perf.parquet"),
]


@st.composite
def output_case(draw):
    kind = draw(st.sampled_from(["same-file", "same-file", "dir-holds-input", "foreign-dir", "device", "state"]))
    if kind == "same-file":
        producer = draw(st.sampled_from(range(len(PRODUCERS))))
        spelling = draw(st.sampled_from(["plain", "dot", "absolute", "symlink", "hardlink", "dotdot"]))
        return kind, (producer, spelling)
    if kind == "dir-holds-input":
        return kind, draw(st.sampled_from(["trace", "perf", "cluster"]))
    if kind == "foreign-dir":
        # also names a run writes, in places it does not (a rule by name alone deleted them)
        return kind, draw(st.sampled_from(["notes.txt", "data/raw.csv", "model.ckpt", "photos/2024/holiday.png", "draft.tmp",
                                           "mine/metrics.json", "notes/.metrics.json.1.a.tmp"]))
    if kind == "device":
        return kind, draw(st.sampled_from(["/dev/null", "/dev/full"]))
    tables = draw(st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True).filter(
        lambda name: not name.startswith("sqlite")), min_size=1, max_size=4, unique=True))
    return kind, (tables, draw(st.sampled_from(["submit", "status", "logs"])))


def test_outputs(seeds, tmp_path):
    def body(case):
        kind, detail = case
        work = _fresh(seeds, tmp_path)
        before = {p.name: _digest(p) for p in work.iterdir() if p.is_file()}
        if kind == "same-file":
            (tool, argv, victim), spelling = PRODUCERS[detail[0]], detail[1]
            target = {"plain": victim, "dot": f"./{victim}", "absolute": str(work / victim), "symlink": "link",
                      "hardlink": "hard", "dotdot": f"sub/../{victim}"}[spelling]
            (work / "sub").mkdir()
            (work / "link").symlink_to(victim)
            os.link(work / victim, work / "hard")
            r = _run("outputs", tool, [*argv, "-o", target], work)
            check_clean(r, codes=(2,), needle="refusing to overwrite an input")
        elif kind == "dir-holds-input":
            (work / "out").mkdir()
            name = {"trace": "trace.csv", "perf": "perf.parquet", "cluster": "cluster.yaml"}[detail]
            os.replace(work / name, work / "out" / name)
            argv = [a if a != name else f"out/{name}" for a in SIMULATE]
            argv[argv.index("run")] = "out"
            r = _run("outputs", "arena-schedule", argv, work)
            check_clean(r, codes=(2,), needle="holds the input")
            before[f"out/{name}"] = before.pop(name)
            assert _digest(work / "out" / name) == before[f"out/{name}"]
        elif kind == "foreign-dir":
            (work / "run" / detail).parent.mkdir(parents=True, exist_ok=True)
            (work / "run" / detail).write_text("keep me")
            r = _run("outputs", "arena-schedule", SIMULATE, work)
            check_clean(r, codes=(2,), needle="holds files this command does not write")
            assert (work / "run" / detail).read_text() == "keep me"
        elif kind == "device":
            r = _run("outputs", "arena-plan", ["--ops", "ops.parquet", "--cluster", "cluster.yaml", "-o", detail, "-q"],
                     work)
            check_clean(r, codes=(0,) if detail == "/dev/null" else (2,))
            assert stat.S_ISCHR(os.stat(detail).st_mode), f"{detail} is no longer a device"
        else:
            tables, command = detail
            db = work / "other.db"
            conn = sqlite3.connect(db)
            for t in tables:
                conn.execute(f'CREATE TABLE "{t}" (x)')
            conn.commit()
            conn.close()
            before["other.db"] = _digest(db)
            (work / "job.yaml").write_text(yaml.safe_dump(seeds.job))
            argv = {"submit": ["submit", "job.yaml"], "status": ["status"], "logs": ["logs", "job-1"]}[command]
            r = _run("outputs", "arena-schedule", [*argv, "--state", "other.db"], work)
            check_clean(r, codes=(2,), needle="not Arena's scheduler state database")
            assert not list(work.glob("other.db-*")), "the refused database got a journal"
        for name, digest in before.items():  # no input was touched
            assert _digest(work / name) == digest, f"{name} changed: {r.describe()}"

    _cases("outputs", output_case(), body)


# --------------------------------------------------------------------------------------------------
# interrupted runs


def _kill_after(tool: str, argv: list[str], cwd: Path, delay: float) -> None:
    proc = subprocess.Popen(limited([tool_path(tool), *argv]), cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=dict(os.environ, RAY_AUTH_MODE="disabled"),
                            start_new_session=True)
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_interrupted(seeds, tmp_path):
    from libarena.artifacts import read_table

    strategy = st.tuples(st.sampled_from(["plan", "compare"]), st.floats(0.3, 4.0))

    def body(case):
        which, delay = case
        work = _fresh(seeds, tmp_path)
        if which == "plan":
            tool, argv, out = "arena-plan", ["--ops", "ops.parquet", "--cluster", "cluster.yaml", "--no-cache",
                                             "-o", "plans-new.parquet"], work / "plans-new.parquet"
        else:
            tool, argv, out = "arena-schedule", ["compare", "--policies", "arena,fcfs,gavel,sia", *SIMULATE[1:7],
                                                 "--plot", "--no-cache", "-o", "cmp"], work / "cmp"
        _kill_after(tool, argv, work, delay)
        if out.exists():  # complete, never partial
            if which == "plan":
                read_table(out, "plans")
            else:
                assert (out / "compare.json").is_file() and all((out / p / "metrics.json").is_file()
                                                                for p in ("arena", "fcfs", "gavel", "sia"))
        r = _run("interrupted", tool, argv, work)  # the next run completes and cleans up after the killed one
        check_clean(r, codes=(0,))
        leftovers = [p.name for p in work.iterdir() if p.name.endswith(".tmp")]
        assert not leftovers, f"temp files of the killed run left: {leftovers}"

    _cases("interrupted", strategy, body)


# --------------------------------------------------------------------------------------------------
# concurrency


def test_concurrency(seeds, tmp_path):
    def body(policy):
        work = _fresh(seeds, tmp_path, "perf.parquet", "cluster.yaml")
        argv = ["serve", "--cluster", "cluster.yaml", "--perf", "perf.parquet", "--state", "state.db", "--launcher",
                "perf-table", "--policy", policy, "--poll", "0.05"]
        first = subprocess.Popen([tool_path("arena-schedule"), *argv], cwd=work, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, env=dict(os.environ, RAY_AUTH_MODE="disabled"))
        try:
            assert "serving" in first.stderr.readline()
            r = _run("concurrency", "arena-schedule", argv, work, wall_s=60)
            check_clean(r, codes=(2,), needle=f"already served by process {first.pid}")
            assert first.poll() is None
        finally:
            first.terminate()
            first.wait(timeout=60)

    _cases("concurrency", st.sampled_from(["arena", "fcfs", "sia"]), body)


# --------------------------------------------------------------------------------------------------
# pipes


PIPED = [
    ("arena-analyze", ["--model", "gpt__tiny", "--global-batch", "8", "-o", "-"]),
    ("arena-plan", ["--ops", "ops.parquet", "--cluster", "cluster.yaml", "-o", "-"]),
    ("arena-plan", ["show", "plans.parquet", "--json"]),
    ("arena-schedule", ["trace", "stats", "trace.csv", "--json"]),
]


def test_pipes(seeds, tmp_path):
    def body(case):
        which, keep = case
        tool, argv = PIPED[which]
        work = _fresh(seeds, tmp_path)
        t0 = time.perf_counter()
        proc = subprocess.Popen(limited([tool_path(tool), *argv]), cwd=work, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=dict(os.environ, RAY_AUTH_MODE="disabled"),
                                start_new_session=True)
        proc.stdout.read(keep)
        proc.stdout.close()  # the reader goes away, as `| head -c N` does
        err = proc.stderr.read().decode()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        r = Result([tool, *argv], 128 + signal.SIGPIPE if code == -signal.SIGPIPE else code, b"", err,
                   time.perf_counter() - t0, usage.ru_maxrss / 1024)
        record("pipes", r)
        # quietly: no error and no traceback (the tools' own progress logs may precede the end)
        assert r.code in (0, 128 + signal.SIGPIPE) and "error" not in err and "Traceback" not in err, r.describe()

    _cases("pipes", st.tuples(st.integers(0, len(PIPED) - 1), st.sampled_from([0, 1, 10, 100, 1000])), body)


# --------------------------------------------------------------------------------------------------
# stdin


def test_stdin(seeds, tmp_path):
    from tests.fuzz.corrupt import mutated_csv

    def body(case):
        data, command = case
        work = _fresh(seeds, tmp_path, "perf.parquet", "cluster.yaml")
        argv = ["trace", "stats", "-"] if command == "stats" else [*SIMULATE[:2], "-", *SIMULATE[3:]]
        r = _run("stdin", "arena-schedule", argv, work, stdin=data)
        check_clean(r)
        if r.code == 2:
            assert "stdin" in r.stderr or "perf.parquet" in r.stderr, r.describe()

    _cases("stdin", st.tuples(mutated_csv(seeds.trace_header, seeds.trace_rows), st.sampled_from(["stats", "simulate"])),
           body)
