"""How the server hands versions to the launcher when a pass moves a job: a lost version the same pass moved is
not relaunched, and launches re-issued after a crash stop every departing version before any starts.

The server runs in this process, stepped by hand on a clock the test sets, with a fake launcher that keeps its
runs in memory (they outlive a server, as real processes do) and notes every GPU it would hand out twice."""

from __future__ import annotations

from collections import Counter

import pytest

from libarena.schedule.config import OverheadConfig
from libarena.schedule.live import server as server_module
from libarena.schedule.live.jobfile import JobSubmission
from libarena.schedule.live.launchers import LaunchRequest, RunStatus
from libarena.schedule.live.launchers.base import JobLauncher
from libarena.schedule.live.server import ServeConfig, Server
from tests.live.helpers import SetClock, write_inputs

MODEL, BATCH = "gpt__760M", 128
GPUS_PER_NODE = 4  # write_inputs: one node of 4 A100s and one of 4 V100s (nodes=1)


class FakeHosts(JobLauncher):
    """Runs are entries of ``running`` ((job, version) -> request). As the real launchers do, ``launch`` stops the
    job's previous version first; a start that puts more GPUs in use on a node than it has is noted in
    ``clashes`` (two versions would hold the same GPU). ``crash`` makes a version vanish: it is then reported lost."""

    name = "fake"

    def __init__(self) -> None:
        self.running: dict[tuple[str, int], LaunchRequest] = {}
        self.calls: list[tuple[str, str, int | None]] = []
        self.clashes: list[tuple[str, int, str, int]] = []

    def _start(self, req: LaunchRequest) -> None:
        self.running[(req.job_id, req.version)] = req
        used = Counter()
        for r in self.running.values():
            for node in r.nodes:
                used[(r.gpu_type, node)] += r.num_gpus // len(r.nodes)
        self.clashes += [(req.job_id, req.version, t, n) for (t, n), k in used.items() if k > GPUS_PER_NODE]

    def launch(self, request: LaunchRequest) -> None:
        self.calls.append(("launch", request.job_id, request.version))
        if (request.job_id, request.version) not in self.running:
            self._stop_previous(request)
            self._start(request)

    def relaunch(self, request: LaunchRequest) -> None:
        self.calls.append(("relaunch", request.job_id, request.version))
        self._start(request)

    def vacate(self, request: LaunchRequest) -> None:
        self.calls.append(("vacate", request.job_id, request.previous_version))
        self._stop_previous(request)

    def _stop_previous(self, request: LaunchRequest) -> None:
        if request.previous_version is not None:
            self.running.pop((request.job_id, request.previous_version), None)

    def stop(self, job_id: str, version: int, at: float | None = None) -> None:
        self.calls.append(("stop", job_id, version))
        self.running.pop((job_id, version), None)

    def crash(self, job_id: str, version: int) -> None:
        del self.running[(job_id, version)]

    def poll(self, now: float, versions: dict[str, int]) -> dict[str, RunStatus]:
        out = {}
        for job_id, version in versions.items():
            req = self.running.get((job_id, version))
            out[job_id] = (RunStatus(job_id, version, "lost", message="no such run") if req is None
                           else RunStatus(job_id, version, "running", req.decided_at + req.overhead_s, None, None))
        return out

    def versions_of(self, job_id: str) -> set[int]:
        return {v for j, v in self.running if j == job_id}


@pytest.fixture
def hosts(monkeypatch) -> FakeHosts:
    """One FakeHosts for every server the test starts (a restarted server finds the runs of the one before)."""
    fake = FakeHosts()
    monkeypatch.setattr(server_module, "get_launcher", lambda name, context: fake)
    return fake


def _config(tmp_path) -> ServeConfig:
    cluster, perf = write_inputs(tmp_path, nodes=1)
    return ServeConfig(cluster, perf, tmp_path / "state.db", policy="fcfs", tick_s=300.0, launcher="perf-table",
                       overheads=OverheadConfig(0, 0, 0, 0, 0, 0), poll_s=0.01)


def _start(cfg: ServeConfig) -> tuple[Server, SetClock]:
    server = Server(cfg)
    clock = SetClock(server.live.now)
    server.clock = clock
    return server, clock


def _running(server: Server, clock: SetClock, jobs: dict[str, tuple[str, int]]) -> None:
    """Submit ``jobs`` (id -> (GPU type, count)) at 10 s; launched at once, reported training at 20 s."""
    server.step()  # the tick at 0
    for job_id, (gpu_type, n) in jobs.items():
        server.store.submit(JobSubmission(MODEL, BATCH, 100_000, job_id, num_gpus=n, gpu_type=gpu_type))
    clock.t = 10.0
    assert server.step()
    clock.t = 20.0
    assert server.step()
    assert all(server.live.by_id[j].state.value == "running" for j in jobs)


def _in_next_pass(server: Server, action) -> None:
    """The policy's next round also does ``action(live)`` (a move fcfs never makes by itself)."""
    policy, live = server.policy, server.live
    schedule = policy.schedule

    def schedule_and_act() -> None:
        schedule()
        action(live)
        del policy.schedule

    policy.schedule = schedule_and_act
    live.dirty = True


def test_a_lost_version_is_relaunched(tmp_path, hosts):
    """The path the next test guards: a version the launcher lost, still the job's current one, is started again."""
    server, clock = _start(_config(tmp_path))
    try:
        _running(server, clock, {"a": ("a100", 1)})
        hosts.crash("a", 1)
        clock.t = 30.0
        assert server.step()  # the lost report runs a pass at once
        assert ("relaunch", "a", 1) in hosts.calls and hosts.versions_of("a") == {1}
        assert [e["kind"] for e in server.store.log_of("a")].count("relaunch") == 1
    finally:
        server.close()


def test_a_lost_version_the_pass_moved_is_not_relaunched(tmp_path, hosts):
    """A version lost in the very pass that rescales its job: the pass stops it and starts the new version, so
    relaunching the lost one would run two versions of the job (the old one never stopped, on GPUs the new one
    holds)."""
    server, clock = _start(_config(tmp_path))
    try:
        _running(server, clock, {"a": ("a100", 1)})
        hosts.crash("a", 1)
        _in_next_pass(server, lambda live: live.rescale(live.by_id["a"], 0, 2))  # to 4 A100s
        clock.t = 30.0
        assert server.step()
        assert server.live.by_id["a"].version == 2
        assert hosts.versions_of("a") == {2} and hosts.clashes == []
        assert not [c for c in hosts.calls if c[0] == "relaunch"]
        assert hosts.calls[-2:] == [("vacate", "a", 1), ("launch", "a", 2)]
        assert "relaunch" not in [e["kind"] for e in server.store.log_of("a")]
        assert server._relaunches == {}
    finally:
        server.close()


class Crash(Exception):
    pass


def test_reissued_launches_stop_every_departing_version_first(tmp_path, hosts):
    """Killed after a pass committed a trade (two jobs take each other's GPUs) but before it handed the launches
    over, the server re-issues them at its restart: both old versions stop before either new one starts.
    Started one by one, the first would start on GPUs the other job still held."""
    cfg = _config(tmp_path)
    server, clock = _start(cfg)
    try:
        _running(server, clock, {"short": ("v100", 4), "long": ("a100", 4)})
        _in_next_pass(server, lambda live: live.trade(live.by_id["short"], live.by_id["long"]))

        def killed(intents):
            raise Crash

        server._execute = killed
        clock.t = 300.0
        with pytest.raises(Crash):
            server.step()  # the periodic tick: its transaction commits, then the server dies
        # the journal holds the trade, not carried out: the old versions still run, on their GPUs
        assert {(r["job_id"], r["version"], r["state"]) for r in server.store.launches() if r["version"] == 2} == \
            {("short", 2, "intent"), ("long", 2, "intent")}
        assert set(hosts.running) == {("short", 1), ("long", 1)}
    finally:
        server.close()
    hosts.calls.clear()
    server, clock = _start(cfg)  # the restart re-issues the two launches
    try:
        assert hosts.clashes == []
        kinds = [kind for kind, _, _ in hosts.calls]
        assert kinds == ["vacate", "vacate", "launch", "launch"]  # every stop before any start
        assert sorted(hosts.calls) == sorted([("vacate", "short", 1), ("vacate", "long", 1),
                                              ("launch", "short", 2), ("launch", "long", 2)])
        assert {k: r.gpu_type for k, r in hosts.running.items()} == {("short", 2): "a100", ("long", 2): "v100"}
        assert {(r["job_id"], r["version"], r["state"]) for r in server.store.launches() if r["version"] == 2} == \
            {("short", 2, "launched"), ("long", 2, "launched")}
    finally:
        server.close()


def test_relaunch_counts_survive_a_restart(tmp_path, hosts):
    """A version that dies each time it is relaunched fails its job after max_relaunches relaunches in all, even
    when the server is restarted between them (a server under a supervisor would otherwise relaunch it for ever)."""
    cfg = _config(tmp_path)
    server, clock = _start(cfg)
    try:
        _running(server, clock, {"a": ("a100", 1)})
        limit = server.max_relaunches
    finally:
        server.close()
    for loss in range(limit + 1):
        server, clock = _start(cfg)
        try:
            hosts.crash("a", 1)
            clock.t = 30.0 + loss
            assert server.step()
            status = server.store.job("a")["status"]
        finally:
            server.close()
        if loss < limit:
            assert status == "running" and hosts.versions_of("a") == {1}
    assert status == "failed"
    assert [c for c in hosts.calls if c[0] == "relaunch"] == [("relaunch", "a", 1)] * limit


def _damage(cfg: ServeConfig, sql: str, *args) -> None:
    import sqlite3

    conn = sqlite3.connect(str(cfg.state))
    with conn:
        conn.execute(sql, args)
    conn.close()


@pytest.mark.parametrize("sql, args, needle", [
    ("UPDATE jobs SET state = json_remove(state, '$.snapshot.priority') WHERE job_id = ?", ("a",),
     "job a's stored state is damaged (KeyError: 'priority')"),
    ("UPDATE jobs SET state = json_set(state, '$.spec.colour', 'red') WHERE job_id = ?", ("a",),
     "job a's stored state is damaged (TypeError"),
    ("UPDATE meta SET value = ? WHERE key = 'last_pass'", ('"noon"',), "setting 'last_pass' is damaged (not a number: noon)"),
    ("UPDATE meta SET value = ? WHERE key = 'active_order'", ('5',), "setting 'active_order' is damaged (TypeError"),
    # settings of the wrong shape would otherwise bind nothing (every later start accepted) or fail as a TypeError
    ("UPDATE meta SET value = ? WHERE key = 'settings'", ('[1, 2]',), "setting 'settings' is damaged (not a mapping: [1, 2])"),
    ("UPDATE meta SET value = ? WHERE key = 'settings'", ('7',), "setting 'settings' is damaged (not a mapping: 7)"),
    ("UPDATE meta SET value = ? WHERE key = 'workdir'", ('5',), "setting 'workdir' is damaged (not a path: 5)"),
])
def test_stored_state_of_the_wrong_shape_is_a_one_line_error(tmp_path, hosts, sql, args, needle):
    """Valid JSON that is not what the server wrote (a hand edit, another version) stops the start with an error
    naming what is damaged, and the database is left as it was."""
    from libarena.errors import ArenaError

    cfg = _config(tmp_path)
    server, clock = _start(cfg)
    try:
        _running(server, clock, {"a": ("a100", 1)})
    finally:
        server.close()
    _damage(cfg, sql, *args)
    before = cfg.state.read_bytes()
    with pytest.raises(ArenaError) as err:
        Server(cfg)
    assert needle in str(err.value) and str(cfg.state) in str(err.value) and "\n" not in str(err.value)
    assert cfg.state.read_bytes() == before


def test_a_first_start_stopped_while_binding_its_settings_leaves_the_database_servable(tmp_path, hosts, monkeypatch):
    """The first start binds the settings and the clock's origin together: stopped between the two (Ctrl-C, a
    kill, a power loss), the database holds neither, and the next start serves its submitted jobs (it held the
    settings without the origin, and every later start refused it as damaged)."""
    from libarena.schedule.live.store import Store

    cfg = _config(tmp_path)
    store = Store(cfg.state, create=True)
    store.submit(JobSubmission(MODEL, BATCH, 100_000, "early", num_gpus=1, gpu_type="a100"))
    store.close()
    real_set_meta = Store.set_meta

    def stopped_at_the_origin(self, key, value, conn=None):
        if key == "wall_origin":
            raise KeyboardInterrupt
        real_set_meta(self, key, value, conn)

    monkeypatch.setattr(Store, "set_meta", stopped_at_the_origin)
    with pytest.raises(KeyboardInterrupt):
        Server(cfg)
    monkeypatch.setattr(Store, "set_meta", real_set_meta)
    store = Store(cfg.state)
    assert store.get_meta("settings") is None and store.get_meta("wall_origin") is None
    store.close()
    server, clock = _start(cfg)
    try:
        assert server.store.get_meta("settings") is not None and server.store.get_meta("wall_origin") is not None
        server.step()
        assert [row["job_id"] for row in server.store.jobs()] == ["early"]
    finally:
        server.close()


@pytest.mark.parametrize("damage, needle", [
    ("garbage", "emulated-hosts.db: not an emulated-hosts database"),
    ("request", "emulated-hosts.db: the run of job a is damaged (JSONDecodeError"),
])
def test_a_damaged_emulated_hosts_database_is_a_one_line_error_naming_it(tmp_path, damage, needle):
    """The perf-table launcher's own database, not the state database, is named when it is the damaged one."""
    import sqlite3

    from libarena.errors import ArenaError

    cfg = _config(tmp_path)
    server, clock = _start(cfg)  # the real perf-table launcher
    try:
        _running(server, clock, {"a": ("a100", 1)})
        hosts_db = server.workdir / "launcher" / "emulated-hosts.db"
    finally:
        server.close()
    if damage == "garbage":
        for suffix in ("-wal", "-shm"):
            hosts_db.with_name(hosts_db.name + suffix).unlink(missing_ok=True)
        hosts_db.write_bytes(b"not a database at all" * 100)
    else:
        conn = sqlite3.connect(str(hosts_db))
        with conn:
            conn.execute("UPDATE runs SET request = '{' WHERE job_id = 'a'")
        conn.close()
    with pytest.raises(ArenaError) as err:
        Server(cfg)
    assert str(err.value).startswith(str(hosts_db)) and needle in str(err.value)
