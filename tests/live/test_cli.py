"""arena-schedule submit / status / logs / serve through the CLI: good jobs, bad job files (exit 2, one line,
nothing written), profiling on arrival, and a whole run with the emulated-hosts launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.live.helpers import OVERHEADS, cli_env, tool, write_inputs

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def run(*args, check_rc: int | None = 0, timeout: float = 120):
    env = cli_env()
    env["PYTHONPATH"] = str(REPO)
    p = subprocess.run([tool("arena-schedule"), *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)
    if check_rc is not None:
        assert p.returncode == check_rc, (p.stdout, p.stderr)
    return p


def job_file(tmp_path, name, data) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


GOOD = {"model": "gpt__760M", "global_batch": 128, "iterations": 2000, "priority": 1}

BAD = [
    ("missing.yaml", {"model": "gpt__760M", "global_batch": 128}, "missing required key 'iterations'"),
    ("type.yaml", {"model": "gpt__760M", "global_batch": "big", "iterations": 5}, "key 'global_batch': 'big' is not a number"),
    ("float.yaml", {"model": "gpt__760M", "global_batch": 128, "iterations": 5.5}, "key 'iterations': 5.5 is not an integer"),
    ("neg.yaml", {"model": "gpt__760M", "global_batch": -4, "iterations": 5}, "out of range"),
    ("huge.yaml", {"model": "gpt__760M", "global_batch": 128, "iterations": 10**30}, "out of range"),
    ("unknown.yaml", {**GOOD, "gpus": 4}, "unknown key 'gpus'"),
    ("typo.yaml", {**GOOD, "iteration": 4}, "unknown key 'iteration' (did you mean 'iterations'?)"),
    ("model.yaml", {**GOOD, "model": "gpt 760M"}, "unknown model 'gpt 760M'"),
    ("zoo.yaml", {**GOOD, "model": "llama__7B"}, "unknown model 'llama__7B'"),
    ("alias.yaml", "x: &x [1, 2, 3]\nmodel: gpt__760M\nglobal_batch: *x\niterations: 5\n", "YAML aliases"),
    ("deep.yaml", "model: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested deeper than 32 levels"),
    ("gpu.yaml", {**GOOD, "gpu_type": "tpu-v9"}, "key 'gpu_type'"),
    ("deadline.yaml", {**GOOD, "deadline": -1}, "key 'deadline'"),
    ("nan.yaml", "model: gpt__760M\nglobal_batch: 128\niterations: 5\ndeadline: .nan\n", "key 'deadline'"),
    ("list.yaml", "- model: gpt__760M\n", "expected a mapping"),
    ("syntax.yaml", "model: [gpt\n", "not valid YAML at line"),
    ("binary.yaml", b"\xff\xfe\x00model".decode("latin-1"), ""),
    ("empty.yaml", "", "expected a mapping"),
]


def test_bad_job_files_exit_2_one_line(tmp_path):
    state = tmp_path / "state.db"
    run("submit", job_file(tmp_path, "ok.yaml", GOOD), "--state", state)
    for name, data, message in BAD:
        p = run("submit", job_file(tmp_path, name, data), "--state", state, check_rc=2)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("arena-schedule: error: "), (name, p.stderr)
        assert "Traceback" not in p.stderr and message in lines[0] and name in lines[0], (name, lines[0])
    doc = json.loads(run("status", "--state", state, "--json").stdout)
    assert [j["job_id"] for j in doc["jobs"]] == ["job-1"]  # the bad files added nothing


def test_cli_errors(tmp_path):
    p = run("submit", tmp_path / "absent.yaml", "--state", tmp_path / "s.db", check_rc=2)
    assert "no such job file" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = run("status", "--state", tmp_path / "none.db", check_rc=2)
    assert "no scheduler state database" in p.stderr
    (tmp_path / "junk.db").write_text("not sqlite at all" * 100)
    p = run("status", "--state", tmp_path / "junk.db", check_rc=2)
    assert "not a scheduler state database" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    state = tmp_path / "state.db"
    run("submit", job_file(tmp_path, "a.yaml", {**GOOD, "name": "alpha"}), "--state", state)
    p = run("submit", job_file(tmp_path, "a.yaml", {**GOOD, "name": "alpha"}), "--state", state, check_rc=2)
    assert "already exists" in p.stderr
    p = run("logs", "beta", "--state", state, check_rc=2)
    assert "no job 'beta'" in p.stderr
    cluster, perf = write_inputs(tmp_path)
    p = run("serve", "--cluster", cluster, "--perf", perf, "--state", state, "--tick", "0", check_rc=2)
    assert "--tick: 0 is out of range" in p.stderr


def test_submit_reads_a_job_from_stdin(tmp_path):
    state = tmp_path / "state.db"
    env = {**cli_env(), "PYTHONPATH": str(REPO)}
    p = subprocess.run([tool("arena-schedule"), "submit", "-", "--state", str(state)], input=yaml.safe_dump(GOOD),
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "job-1", p.stderr
    p = subprocess.run([tool("arena-schedule"), "submit", "-", "--state", str(state)], input="model: [gpt\n",
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "stdin: malformed job file: not valid YAML" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_a_refused_start_binds_nothing(tmp_path):
    """A serve refused for a bad input (unknown policy, unknown launcher, bad cluster) neither binds the state
    database to those settings nor leaves a new one behind: the same database then serves with good inputs."""
    cluster, perf = write_inputs(tmp_path)
    bad_cluster = tmp_path / "bad-cluster.yaml"
    bad_cluster.write_text("name: x\nnode_groups:\n  - {gpu_type: quantum9000, nodes: 2}\n")
    fresh = tmp_path / "fresh.db"
    p = run("serve", "--cluster", cluster, "--perf", perf, "--state", fresh, "--policy", "sia2", check_rc=2)
    assert "unknown policy 'sia2'" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("fresh.db*"))  # nor its -wal and -shm files
    state = tmp_path / "state.db"
    job = run("submit", job_file(tmp_path, "a.yaml", {**GOOD, "iterations": 300}), "--state", state).stdout.strip()
    base = ["serve", "--cluster", cluster, "--perf", perf, "--state", state, "--time-compression", "2000", "--poll", "0.05"]
    for bad in (["--policy", "sia2"], ["--launcher", "bogus"]):
        p = run(*base, *bad, check_rc=2)
        assert len(p.stderr.strip().splitlines()) == 1 and "served with different" not in p.stderr, p.stderr
    p = run(*[bad_cluster if a == cluster else a for a in base], check_rc=2)
    assert "quantum9000" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    run(*base, "--launcher", "perf-table", "--until-idle")
    doc = json.loads(run("status", "--state", state, "--json").stdout)
    assert {j["job_id"]: j["status"] for j in doc["jobs"]} == {job: "finished"}


def test_a_foreign_sqlite_database_is_refused_untouched(tmp_path):
    import hashlib
    import sqlite3

    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, path TEXT)")
    conn.execute("INSERT INTO photos(path) VALUES ('a.jpg')")
    conn.commit()
    conn.close()
    digest = hashlib.sha256(other.read_bytes()).hexdigest()
    for args in (("submit", job_file(tmp_path, "ok.yaml", GOOD)), ("status",), ("logs", "job-1")):
        p = run(*args, "--state", other, check_rc=2)
        assert "not Arena's scheduler state database" in p.stderr and "photos" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
    assert hashlib.sha256(other.read_bytes()).hexdigest() == digest
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ok.yaml", "other.db"]  # no -wal/-shm left either
    # Arena's own databases carry the marker
    state = tmp_path / "state.db"
    run("submit", job_file(tmp_path, "ok.yaml", GOOD), "--state", state)
    assert sqlite3.connect(state).execute("PRAGMA application_id").fetchone()[0] == 0x41524E41


def test_an_unmarked_database_is_taken_as_arena_s_only_with_arena_s_tables_and_version(tmp_path):
    """A database from before the marker is recognised by its tables, their columns and its schema version; one
    that only looks like it (a ``meta`` and a ``jobs`` table of someone else's), or one of another schema version,
    is refused before anything is written to it (no marker, no WAL files)."""
    import hashlib
    import sqlite3

    from libarena.errors import ArenaError
    from libarena.schedule.live.store import _SCHEMA, Store

    def make(name, script, version):
        path = tmp_path / name
        conn = sqlite3.connect(path)
        conn.executescript(script)
        conn.execute("INSERT INTO meta(key, value) VALUES ('schema_version', ?)", (json.dumps(version),))
        conn.commit()
        conn.close()
        return path, hashlib.sha256(path.read_bytes()).hexdigest()

    lookalike = make("lookalike.db", "CREATE TABLE meta (key TEXT, value TEXT); CREATE TABLE jobs (id INTEGER, name TEXT);", 1)
    future = make("future.db", _SCHEMA, 7)
    garbage = make("garbage.db", _SCHEMA, "x" * 100_000)  # named in the message, bounded
    for (path, digest), needle in ((lookalike, "not Arena's scheduler state database"), (future, "state schema version 7"),
                                   (garbage, "state schema version xxx")):
        for create in (True, False):
            with pytest.raises(ArenaError, match=needle) as err:
                Store(path, create=create)
            assert len(str(err.value)) < len(str(path)) + 200
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert sorted(x.name for x in tmp_path.iterdir()) == ["future.db", "garbage.db", "lookalike.db"]
    old, _ = make("old.db", _SCHEMA, 1)  # a real one from before the marker: accepted, and marked when written
    store = Store(old, create=True)
    store.close()
    assert sqlite3.connect(old).execute("PRAGMA application_id").fetchone()[0] == 0x41524E41


def test_a_damaged_row_is_a_one_line_error(tmp_path):
    """A state database edited by hand (a row that is not JSON, or JSON of the wrong shape) is refused in one line
    naming what is damaged, not with a traceback."""
    import sqlite3

    state = tmp_path / "state.db"
    job = run("submit", job_file(tmp_path, "ok.yaml", GOOD), "--state", state).stdout.strip()
    for damage, needle in (("{not json", "(not JSON:"), ("[1, 2]", "(a JSON list, not an object)")):
        conn = sqlite3.connect(state)
        conn.execute("UPDATE jobs SET spec = ? WHERE job_id = ?", (damage, job))
        conn.commit()
        conn.close()
        p = run("status", "--state", state, check_rc=2)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert f"job {job}'s submission is damaged {needle}" in p.stderr, p.stderr


def test_a_failed_start_removes_only_a_database_without_jobs(tmp_path):
    """A serve that made the state file and then failed removes it, unless a job was submitted into it meanwhile
    (``holds_jobs``: also True where it cannot tell)."""
    import sqlite3

    from libarena.schedule.live.store import holds_jobs

    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    schema_only = tmp_path / "schema.db"
    sqlite3.connect(schema_only).execute("CREATE TABLE meta (key TEXT)").connection.close()
    state = tmp_path / "odd name #1?.db"
    run("submit", job_file(tmp_path, "ok.yaml", GOOD), "--state", state)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all" * 100)
    assert (holds_jobs(empty), holds_jobs(schema_only), holds_jobs(state), holds_jobs(garbage)) == (False, False, True, True)
    assert not list(tmp_path.glob("*-wal")) and not list(tmp_path.glob("*-shm"))  # reading leaves no files


def test_flock_holder_reads_the_kernel_lock_table(tmp_path):
    from libarena.schedule.live.store import flock_holder

    target = tmp_path / "state.db"
    target.write_bytes(b"")
    fd = os.open(target, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        here = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        table = tmp_path / "locks"
        table.write_text(f"1: POSIX  ADVISORY  WRITE 11 {here} 0 EOF\n"    # SQLite's kind of lock: not a server
                         f"2: FLOCK  ADVISORY  WRITE 22 00:01:1 0 EOF\n"    # another file
                         f"3: FLOCK  ADVISORY  WRITE 33 {here} 0 EOF\n"
                         f"3: -> FLOCK  ADVISORY  WRITE 44 {here} 0 EOF\n")  # a waiter
        assert flock_holder(fd, str(table)) == "33"
        assert flock_holder(fd, str(tmp_path / "absent")) is None
    finally:
        os.close(fd)


def test_one_server_per_state_database(tmp_path):
    """Two real server processes on one state database: the second exits 2 naming the first one's pid, and
    once the first is gone a new server starts."""
    import signal
    import time

    cluster, perf = write_inputs(tmp_path)
    state = tmp_path / "state.db"
    args = [tool("arena-schedule"), "serve", "--cluster", str(cluster), "--perf", str(perf), "--state", str(state),
            "--launcher", "perf-table", "--poll", "0.05", "--time-compression", "100"]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        assert "serving" in first.stderr.readline()
        second = subprocess.run(args, capture_output=True, text=True, env=cli_env(), timeout=60)
        assert second.returncode == 2, second.stderr
        assert f"already served by process {first.pid}" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        # another name for the same file is the same database
        alias = tmp_path / "alias.db"
        alias.symlink_to(state)
        third = subprocess.run([str(alias) if a == str(state) else a for a in args], capture_output=True, text=True,
                               env=cli_env(), timeout=60)
        assert third.returncode == 2 and f"already served by process {first.pid}" in third.stderr, third.stderr
        # and so is a hard link (the lock is on the file, not on a name for it)
        hard = tmp_path / "hard.db"
        os.link(state, hard)
        fourth = subprocess.run([str(hard) if a == str(state) else a for a in args], capture_output=True, text=True,
                                env=cli_env(), timeout=60)
        assert fourth.returncode == 2 and f"already served by process {first.pid}" in fourth.stderr, fourth.stderr
        assert first.poll() is None  # the first one is unharmed
        assert not list(tmp_path.glob("*.lock"))  # no lock files left behind
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    # stopped by a signal: its state kept, and said so in one line with status 2 (not the 0 of a finished run)
    assert first.returncode == 2
    err = first.stderr.read().strip().splitlines()
    assert len(err) == 1 and "interrupted (SIGTERM): stopped serving" in err[0], err
    third = subprocess.Popen(args + ["--until-idle"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=cli_env())
    try:
        out, err = third.communicate(timeout=60)
    finally:
        if third.poll() is None:
            third.kill()
    assert third.returncode == 0, err


def test_serve_binds_its_cluster_content_and_workdir(tmp_path):
    """A restart with the cluster file edited in place (its running jobs hold GPUs of its pools) or with another
    --workdir (where the running jobs' files are) is refused in one line; the same inputs serve again."""
    cluster, perf = write_inputs(tmp_path)
    state = tmp_path / "state.db"
    run("submit", job_file(tmp_path, "a.yaml", {**GOOD, "iterations": 300}), "--state", state)
    base = ["serve", "--cluster", cluster, "--perf", perf, "--state", state, "--launcher", "perf-table",
            "--time-compression", "2000", "--poll", "0.05", "--until-idle"]
    run(*base, "--workdir", tmp_path / "wd1")
    p = run(*base, "--workdir", tmp_path / "wd2", check_rc=2)
    assert "was served with --workdir" in p.stderr and "wd1" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    run(*base)  # no --workdir: the one it was served with
    original = cluster.read_text()
    cluster.write_text(original.replace("nodes: 2", "nodes: 1"))
    p = run(*base, check_rc=2)
    assert "was served with different cluster_sha256" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    cluster.write_text(original)
    run(*base)


def test_serve_gives_its_profiles_and_jobs_the_cluster_content_it_loaded(tmp_path):
    """The cluster file is read once per start: the profiles and jobs of that start read a copy of those bytes,
    under the file's own name (a spec without a name is named after its file), which an edit of the file while it
    serves does not reach; a restart with the same content finds the same copy."""
    from libarena.hardware import load_cluster
    from libarena.schedule.live.launchers import LaunchRequest
    from libarena.schedule.live.server import ServeConfig, Server

    cluster, perf = write_inputs(tmp_path)
    original = cluster.read_bytes()
    cluster.write_text(cluster.read_text().replace("name: live-test\n", ""))  # named after its file
    loaded = cluster.read_bytes()
    config = ServeConfig(cluster, perf, tmp_path / "state.db", launcher="perf-table")
    server = Server(config)
    try:
        copy = server.profiler.cluster_path
        assert copy.name == cluster.name and copy.parent.parent == server.workdir / "clusters"
        assert copy.read_bytes() == loaded and load_cluster(copy).name == server.cluster_spec.name == "cluster"
        cluster.write_bytes(original)  # edited while it serves: what it hands out does not change
        assert copy.read_bytes() == loaded
    finally:
        server.close()
    cluster.write_bytes(loaded)
    server = Server(config)
    try:
        assert server.profiler.cluster_path == copy and copy.read_bytes() == loaded
    finally:
        server.close()
    # arena-run jobs are given the copy too
    server = Server(ServeConfig(cluster, perf, tmp_path / "run.db", launcher="arena-run"))
    try:
        req = LaunchRequest("job-1", 1, "launch", "gpt__tiny", 8, 150, "a100", 4, (0,), 0.0, 0.0)
        command = server.launcher.script(req, tmp_path / "run").splitlines()[1]
        assert f"--cluster {server.profiler.cluster_path}" in command
    finally:
        server.close()


def test_a_damaged_state_database_is_a_one_line_error(tmp_path):
    """A database whose pages are damaged opens, then fails on the first query ("database disk image is
    malformed", an sqlite3.DatabaseError that is not an OperationalError): one line, exit 2, for every command."""
    import sqlite3

    state = tmp_path / "state.db"
    for i in range(3):
        run("submit", job_file(tmp_path, f"j{i}.yaml", GOOD), "--state", state)
    conn = sqlite3.connect(state)
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs'").fetchone()
    conn.close()
    with open(state, "r+b") as f:  # the jobs table's first page
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * 64)
    for command in (["status"], ["status", "--json"], ["logs", "job-1"],
                    ["submit", job_file(tmp_path, "j.yaml", GOOD)]):
        p = run(*command, "--state", state, check_rc=2)
        assert p.stderr.strip().endswith("cannot use the scheduler state database (database disk image is malformed)"), \
            (command, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1


def test_serve_refuses_options_it_would_ignore(tmp_path):
    cluster, perf = write_inputs(tmp_path)
    base = ["serve", "--cluster", cluster, "--perf", perf, "--state", tmp_path / "s.db", "--launcher", "perf-table"]
    for extra, message in ((["--address", "head:6379"], "--address has no effect with the perf-table launcher"),
                           (["--checkpoint-every", "5"], "--checkpoint-every has no effect with the perf-table launcher"),
                           (["--profile-script", "echo {foo} > {out}"], "--profile-script 'echo {foo} > {out}': not a template"),
                           (["--profile-script", " "], "--profile-script is empty")):
        p = run(*base, *extra, check_rc=2)
        assert message in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert not (tmp_path / "s.db.d").exists()  # a refused start makes no workdir (nor a copy of the cluster)
    p = run("serve", "--cluster", cluster, "--perf", "-", "--state", tmp_path / "s.db", check_rc=2)
    assert "--perf -: serve reads its performance table again at every restart" in p.stderr
    assert not (tmp_path / "s.db").exists()


@pytest.mark.slow
def test_serve_submit_status_logs_with_profiling_on_arrival(tmp_path):
    cluster, perf = write_inputs(tmp_path)
    state = tmp_path / "state.db"
    ids = [run("submit", job_file(tmp_path, f"j{i}.yaml", {**GOOD, "iterations": 1500 + 500 * i}), "--state", state).stdout.strip()
           for i in range(3)]
    # gpt__2.6B (batch 256) is not in the perf table: it is profiled on arrival, then scheduled
    new = run("submit", job_file(tmp_path, "new.yaml", {"model": "gpt__2.6B", "global_batch": 256, "iterations": 800,
                                                       "name": "fresh", "gpu_type": "v100"}), "--state", state).stdout.strip()
    bad_type = run("submit", job_file(tmp_path, "h.yaml", {**GOOD, "gpu_type": "h100"}), "--state", state).stdout.strip()
    assert ids == ["job-1", "job-2", "job-3"] and new == "fresh"
    before = json.loads(run("status", "--state", state, "--json").stdout)
    assert before["counts"] == {"submitted": 5}
    script = (f"{sys.executable} -c \"from tests.live.helpers import write_perf_for; write_perf_for('{{out}}', "
              f"'{{model}}', {{batch}})\"")
    args = ["serve", "--cluster", cluster, "--perf", perf, "--state", state, "--launcher", "perf-table",
            "--time-compression", "2000", "--tick", "300", "--poll", "0.05", "--until-idle", "--profile-script", script]
    args += [f"--overhead={k}={v}" for k, v in OVERHEADS.__dict__.items()]
    run(*args)
    doc = json.loads(run("status", "--state", state, "--json").stdout)
    status = {j["job_id"]: j for j in doc["jobs"]}
    assert {k: v["status"] for k, v in status.items()} == {**{i: "finished" for i in ids}, "fresh": "finished",
                                                           bad_type: "rejected"}
    assert "h100" in status[bad_type]["error"]
    assert all(status[i]["progress"] == 1.0 for i in ids)
    log = run("logs", "fresh", "--state", state).stdout
    kinds = [line.split()[2] if line.split()[1].startswith("t=") else line.split()[1] for line in log.splitlines()]
    assert kinds[:3] == ["submit", "profile", "profiled"] and "launch" in kinds and kinds[-1] == "finish"
    table = run("status", "--state", state).stdout
    assert "fresh" in table and "finished" in table and "queue" in table
    # the same state cannot be served with other settings (its clock and decisions depend on them)
    p = run(*[a if a != "300" else "60" for a in args], check_rc=2)
    assert "was served with different tick_s" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_a_profile_with_other_pairs_adds_only_its_own(tmp_path):
    """Rows of another (model, batch) in a profile's table never enter the server's lookup (they would be
    used without being saved in its state): only the pair asked for is taken."""
    from libarena.schedule.live.jobfile import JobSubmission
    from libarena.schedule.live.server import ServeConfig, Server
    from tests.live.helpers import write_perf_for
    from tests.schedule.perf_fixtures import write_perf

    cluster, perf = write_inputs(tmp_path)
    server = Server(ServeConfig(cluster, perf, tmp_path / "state.db", launcher="perf-table"))
    try:
        server.store.submit(JobSubmission("gpt__2.6B", 256, 300))
        server.profiler.request = lambda model, batch: None  # profiled by hand below
        server.ingest()
        table = tmp_path / "both.parquet"
        write_perf(table, [("gpt__2.6B", 256), ("moe__2.4B", 256)], ["a100", "v100"], max_gpus=16)
        server.profiler.poll = lambda: [("gpt__2.6B", 256, table, "profiled")]
        server.ingest()
        assert server.perf.has("gpt__2.6B", 256) and not server.perf.has("moe__2.4B", 256)
        only = tmp_path / "moe.parquet"
        write_perf_for(str(only), "moe__2.4B", 256)
        server.store.submit(JobSubmission("wide_resnet__2B", 512, 300))
        server.profiler.poll = lambda: []
        server.ingest()
        server.profiler.poll = lambda: [("wide_resnet__2B", 512, only, "profiled")]
        server.ingest()
        assert not server.perf.has("moe__2.4B", 256) and not server.perf.has("wide_resnet__2B", 512)
    finally:
        server.close()


def test_a_profiled_jobs_deadline_counts_from_its_submission(tmp_path):
    """A job file's deadline is seconds after submission: a job that arrives only once its (model, batch) has been
    profiled keeps it, rather than gaining the profiling time (which deadline-aware policies would then not see)."""
    import time

    from libarena.schedule.live.jobfile import JobSubmission
    from libarena.schedule.live.server import ServeConfig, Server
    from tests.schedule.perf_fixtures import write_perf

    class Clock:  # scheduler time = wall time since ``origin``; the test moves ``t`` as the server's "now"
        compression = 1.0

        def __init__(self, origin: float):
            self.origin, self.t = origin, 0.0

        def now(self) -> float:
            return self.t

        def at(self, wall: float) -> float:
            return wall - self.origin

        def wall_of(self, virtual: float) -> float:
            return virtual + self.origin

    cluster, perf = write_inputs(tmp_path)
    server = Server(ServeConfig(cluster, perf, tmp_path / "state.db", launcher="perf-table"))
    try:
        clock = server.clock = Clock(time.time() - 100.0)  # the submission below is at scheduler time ~100 s
        server.store.submit(JobSubmission("gpt__2.6B", 256, 300, "late", deadline_s=3600.0))
        server.store.submit(JobSubmission("gpt__760M", 128, 300, "known", deadline_s=3600.0))
        server.profiler.request = lambda model, batch: None  # profiled by hand below
        clock.t = 101.0
        server.ingest()
        known = server.live.by_id["known"].spec
        assert known.submit_time == pytest.approx(100.0, abs=1) and known.deadline == pytest.approx(3700.0, abs=1)
        table = tmp_path / "profiled.parquet"
        write_perf(table, [("gpt__2.6B", 256)], ["a100", "v100"], max_gpus=16)
        server.profiler.poll = lambda: [("gpt__2.6B", 256, table, "profiled")]
        server.last_tick, clock.t = 1800.0, 2000.0  # the profile took about half an hour; the ticks kept up
        server.ingest()
        late = server.live.by_id["late"].spec
        assert late.submit_time == 2000.0 and late.deadline == pytest.approx(3700.0, abs=1)
    finally:
        server.close()


def test_state_database_errors_are_one_line():
    import sqlite3

    from libarena.errors import ArenaError
    from libarena.schedule.live.store import state_database_errors

    with pytest.raises(ArenaError, match=r"^s\.db: cannot use the scheduler state database \(database is locked\)$"):
        with state_database_errors("s.db"):
            raise sqlite3.OperationalError("database is locked")


def test_a_hung_profile_is_stopped_after_its_time_limit(tmp_path):
    """A profile script that never ends would hold every later new (model, batch) behind it (profiles run one
    at a time): after --profile-timeout it is killed, with what it started, and its jobs are rejected."""
    import os
    import time

    from libarena.schedule.live.profiling import ArrivalProfiler
    from tests.live.helpers import wait_until

    profiler = ArrivalProfiler(tmp_path / "profiles", tmp_path / "c.yaml", "sleep 600 # {model} {batch} {out}", timeout_s=60.0)
    profiler.request("gpt__2.6B", 256)
    assert profiler.poll() == []
    pid_file = profiler.dir_of("gpt__2.6B", 256) / "pid"
    pid = int(pid_file.read_text().split()[0])
    started = time.time() - 61  # its start moved back past the limit, rather than a wait a slow host could stretch
    os.utime(pid_file, (started, started))
    done: list = []
    wait_until(lambda: bool(done.extend(profiler.poll()) or done), 30)
    ((model, batch, path, message),) = done
    assert (model, batch, path) == ("gpt__2.6B", 256, None) and "ran longer than 60 s and was stopped" in message
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 10)  # the script and its sleep are gone
    profiler.request("gpt__2.6B", 256)  # a later job of the pair meets the same end, without a second hour-long wait
    assert "profiling exited with timeout" in profiler.poll()[0][3]


def test_a_failed_profile_is_retried_after_its_interval(tmp_path):
    """A failed profile is what later jobs of the pair meet (a failure that would repeat is not re-run for each
    job), until --profile-retry has passed since it failed: the next job then has the pair profiled again."""
    import os
    import time

    from libarena.schedule.live.profiling import ArrivalProfiler
    from tests.live.helpers import wait_until

    profiler = ArrivalProfiler(tmp_path / "profiles", tmp_path / "c.yaml",
                               "echo run >> {out}.runs; sh -c 'exit 3' # {model} {batch}", retry_after_s=60)
    runs = profiler.dir_of("gpt__2.6B", 256) / "perf.parquet.runs"

    def outcome():
        profiler.request("gpt__2.6B", 256)
        done: list = []
        wait_until(lambda: bool(done.extend(profiler.poll()) or done), 30)
        ((_, _, path, message),) = done
        assert path is None
        return message

    first = outcome()
    assert first.startswith("profiling exited with 3 (see ") and "has it profiled again 60 s after the failure" in first
    assert outcome() == first and runs.read_text() == "run\n"  # a job right after it: the same end, not run again
    failed = time.time() - 61  # the failure moved back past the interval (a real wait would race a slow host)
    os.utime(profiler.dir_of("gpt__2.6B", 256) / "exit_code", (failed, failed))
    assert outcome() == first and runs.read_text() == "run\nrun\n"  # after the interval: profiled again
    # a failure is reported once whatever the interval (0: each new job profiles again, once), and a restart's
    # request for jobs already waiting is answered with the last result, not a new profile
    eager = ArrivalProfiler(tmp_path / "eager", tmp_path / "c.yaml",
                            "echo run >> {out}.runs; sh -c 'exit 3' # {model} {batch}", retry_after_s=0)
    eager_runs = eager.dir_of("gpt__2.6B", 256) / "perf.parquet.runs"
    for expected in (1, 2):
        eager.request("gpt__2.6B", 256)
        done = []
        wait_until(lambda: bool(done.extend(eager.poll()) or done), 30)
        time.sleep(0.3)
        assert len(done) == 1 and not eager.poll() and eager_runs.read_text().count("run") == expected
    eager.request("gpt__2.6B", 256, new_job=False)
    assert eager.poll()[0][3] == first.replace("60 s", "0 s").replace("/profiles/", "/eager/")
    assert eager_runs.read_text().count("run") == 2
    # a table the server could not use counts as a failure too
    unusable = ArrivalProfiler(tmp_path / "other", tmp_path / "c.yaml", "echo garbage > {out} # {model} {batch}")
    unusable.request("gpt__2.6B", 256)
    done: list = []
    wait_until(lambda: bool(done.extend(unusable.poll()) or done), 30)
    assert done[0][2] is not None
    unusable.mark_unusable("gpt__2.6B", 256)
    unusable.request("gpt__2.6B", 256)
    assert unusable.poll()[0][2:] == (None, f"profiling wrote a table that could not be used (see "
                                            f"{unusable.dir_of('gpt__2.6B', 256) / 'output.log'}); the pair's next job "
                                            "has it profiled again 3600 s after the failure")


def test_a_profile_pid_that_now_belongs_to_another_process_is_not_the_profile(tmp_path):
    """After a host restart the pid a profile recorded may belong to another process (a relaunched job, in a
    session of its own): it is not killed as a hung profile; the profile counts as gone and is started again."""
    import subprocess
    import time

    from libarena.schedule.live.profiling import ArrivalProfiler

    from tests.live.helpers import wait_until

    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        profiler = ArrivalProfiler(tmp_path / "profiles", tmp_path / "c.yaml", "echo {model} {batch:d} > {out}", timeout_s=1.0)
        d = profiler.dir_of("gpt__2.6B", 256)
        d.mkdir(parents=True)
        (d / "pid").write_text(f"{other.pid} 1")  # recorded by a process that started at tick 1 of an earlier boot
        old = time.time() - 3 * 86400
        __import__("os").utime(d / "pid", (old, old))
        profiler.request("gpt__2.6B", 256)
        done: list = profiler.poll()
        wait_until(lambda: bool(done or done.extend(profiler.poll()) or done), 30)
        assert other.poll() is None  # unharmed
        assert done and done[0][3] == "profiled"  # started again: its template wrote the table
    finally:
        other.kill()
        other.wait()


def test_serve_refuses_a_cluster_it_cannot_read_again(tmp_path):
    cluster, perf = write_inputs(tmp_path)
    p = subprocess.run(["bash", "-c", f"{tool('arena-schedule')} serve --cluster <(cat {cluster}) --perf {perf} "
                                      f"--state {tmp_path / 's.db'} --launcher perf-table"],
                       capture_output=True, text=True, env=cli_env(), timeout=120)
    assert p.returncode == 2 and "serve reads its cluster again at every restart" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "s.db").exists()


def test_a_profile_that_writes_no_table_says_so(tmp_path):
    from libarena.schedule.live.profiling import ArrivalProfiler
    from tests.live.helpers import wait_until

    profiler = ArrivalProfiler(tmp_path / "profiles", tmp_path / "c.yaml", "true {model} {batch} {out}")
    profiler.request("gpt__2.6B", 256)
    done: list = []
    wait_until(lambda: bool(done.extend(profiler.poll()) or done), 30)
    ((_, _, path, message),) = done
    assert path is None and "profiling exited with 0 but wrote no table at" in message


def test_a_profile_started_by_a_server_killed_before_recording_it_is_found_on_restart(tmp_path, monkeypatch):
    """The profile script records its own pid first: a server killed between starting it and recording its pid
    finds it running on restart instead of starting the profile a second time beside it."""
    import os
    import time

    import libarena.schedule.live.profiling as profiling
    from tests.live.helpers import wait_until

    script = "echo run >> {out}.runs; sleep 600 # {model} {batch}"
    first = profiling.ArrivalProfiler(tmp_path / "profiles", tmp_path / "c.yaml", script)
    monkeypatch.setattr(profiling, "write_pid_file", lambda path, pid: None)  # killed before it recorded the pid
    first.request("gpt__2.6B", 256)
    assert first.poll() == []
    d = first.dir_of("gpt__2.6B", 256)
    wait_until(lambda: (d / "perf.parquet.runs").exists(), 30)
    monkeypatch.undo()
    pid = int((d / "pid").read_text().split()[0])  # recorded by the script itself
    try:
        restarted = profiling.ArrivalProfiler(tmp_path / "profiles", tmp_path / "c.yaml", script)
        restarted.request("gpt__2.6B", 256, new_job=False)
        assert restarted.poll() == [] and restarted.poll() == []
        time.sleep(0.3)
        assert (d / "perf.parquet.runs").read_text() == "run\n"  # one profile, not two
        assert int((d / "pid").read_text().split()[0]) == pid
    finally:
        os.killpg(pid, 9)


@pytest.mark.parametrize("sql, args, command, needle", [
    ("INSERT OR REPLACE INTO meta (key, value) VALUES ('wall_origin', ?)", ('"abc"',), "status",
     "its stored jobs or settings is damaged (ValueError"),
    ("INSERT OR REPLACE INTO meta (key, value) VALUES ('settings', ?)", ("[1, 2]",), "status",
     "its stored jobs or settings is damaged (AttributeError"),
    ("UPDATE jobs SET spec = json_remove(spec, '$.iterations')", (), "status",
     "its stored jobs or settings is damaged (KeyError: 'iterations')"),
    ("INSERT OR REPLACE INTO meta (key, value) VALUES ('workdir', ?)", ("5",), "logs",
     "job 'job-1''s stored state or the settings is damaged (TypeError"),
])
def test_status_and_logs_of_a_database_with_damaged_values_are_one_line_errors(tmp_path, sql, args, command, needle):
    """Valid JSON of the wrong shape (a hand edit) names what is damaged, exit 2, as a server start does: not an
    internal error."""
    import sqlite3

    state = tmp_path / "state.db"
    run("submit", job_file(tmp_path, "ok.yaml", GOOD), "--state", state)
    conn = sqlite3.connect(state)
    with conn:
        conn.execute(sql, args)
    conn.close()
    p = run(command, *(["job-1"] if command == "logs" else []), "--state", state, check_rc=2)
    assert needle in p.stderr and str(state) in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_serve_refuses_a_workdir_whose_parent_does_not_exist(tmp_path):
    """Only the workdir itself is created: a mistyped parent is a one-line error, and nothing is made."""
    from libarena.errors import ArenaError
    from libarena.schedule.live.server import ServeConfig

    cluster, perf = write_inputs(tmp_path)
    with pytest.raises(ArenaError, match="does not exist \\(only the workdir itself is created\\)"):
        ServeConfig(cluster, perf, tmp_path / "state.db", launcher="perf-table", workdir=tmp_path / "no" / "such" / "wd")
    assert not (tmp_path / "no").exists()
    ServeConfig(cluster, perf, tmp_path / "state.db", launcher="perf-table", workdir=tmp_path / "wd")  # its parent is
