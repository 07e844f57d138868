"""The live scheduler's state in SQLite (WAL mode): the single source of truth across restarts.

Tables:
- ``meta``: server settings (cluster, perf, policy, tick, compression, clock origin) and progress (last tick).
- ``jobs``: one row per submitted job: the submission, its status and, while the server owns it, a snapshot
  of its scheduler state (allocation, version, progress, queue position, ...), updated once per tick.
- ``launches``: one row per (job, version) action (launch / rescale / migrate), written as ``intent`` in the
  same transaction as the decision, *before* the launcher is called, then marked ``launched``: an intent
  left behind by a crash is re-issued on restart, and the launcher ignores a version it already runs.
- ``log``: the event and decision log (``arena-schedule logs JOB``).
- ``perf_rows``: performance rows measured by profiling on arrival (added to the perf table on restart).

Writers: the server (one process) and ``submit`` (inserts a ``submitted`` row); readers: ``status``, ``logs``.

The database is marked as Arena's (SQLite's ``application_id``, :data:`APPLICATION_ID`): a ``--state`` file that
is some other SQLite database is refused before anything is written to it (not even its journal mode is
changed). One server at a time: :class:`ServerLock` holds an exclusive lock on ``<state>.lock`` for the server's
life, and a second server exits naming the first one's process id.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from libarena.checks import MAX_SECONDS, check_range
from libarena.errors import ArenaError
from libarena.schedule.live.jobfile import JobSubmission

SCHEMA_VERSION = 1
#: SQLite's application_id of Arena's state databases ("ARNA")
APPLICATION_ID = 0x41524E41

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL UNIQUE,
    spec TEXT NOT NULL,
    submitted_wall REAL NOT NULL,
    not_before REAL,
    status TEXT NOT NULL,
    arrival_time REAL,
    state TEXT,
    error TEXT,
    updated_wall REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs(status);
CREATE TABLE IF NOT EXISTS launches (
    job_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    request TEXT NOT NULL,
    state TEXT NOT NULL,
    decided_at REAL NOT NULL,
    updated_wall REAL NOT NULL,
    PRIMARY KEY (job_id, version)
);
CREATE INDEX IF NOT EXISTS launches_state ON launches(state);
CREATE TABLE IF NOT EXISTS log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    wall REAL NOT NULL,
    time REAL,
    job_id TEXT,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS log_job ON log(job_id);
CREATE TABLE IF NOT EXISTS perf_rows (model TEXT NOT NULL, global_batch INTEGER NOT NULL, rows TEXT NOT NULL,
                                      PRIMARY KEY (model, global_batch));
"""

#: job statuses; ``submitted`` rows are written by ``submit`` and picked up by the server
SUBMITTED, PROFILING, ARRIVING, QUEUED, STARTING, RUNNING = "submitted", "profiling", "arriving", "queued", "starting", "running"
FINISHED, DROPPED, FAILED, REJECTED, UNSCHEDULABLE = "finished", "dropped", "failed", "rejected", "unschedulable"
TERMINAL = (FINISHED, DROPPED, FAILED, REJECTED, UNSCHEDULABLE)


def check_not_before(not_before: float | None) -> None:
    """``submit --at``: a scheduler time in [0, 100 years] (a job that never arrives would wait forever)."""
    check_range(not_before, "--at", 0, MAX_SECONDS, optional=True)


@contextmanager
def state_database_errors(path: str | Path, what: str = "the scheduler state database") -> Iterator[None]:
    """SQLite's operational errors on a state database in use (read-only, locked past the busy timeout, a full
    disk) as one-line errors naming it (``what``: also the other databases the command uses)."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        raise ArenaError(f"{path}: cannot use {what} ({exc})") from None


class Store:
    def __init__(self, path: str | Path, create: bool = False):
        self.path = Path(path)
        if not create and not self.path.exists():
            raise ArenaError(f"{self.path}: no scheduler state database (start one with arena-schedule serve --state {self.path})")
        if self.path.is_dir():
            raise ArenaError(f"{self.path}: is a directory, not a scheduler state database")
        self.conn = None
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None)
            self.conn.execute("PRAGMA busy_timeout=30000")
            self._check_marker(create)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            if create:
                self.conn.executescript(_SCHEMA)
            version = self.get_meta("schema_version")
            if version is None:
                if not create:
                    raise ArenaError(f"{self.path}: not a scheduler state database (no schema version)")
                self.set_meta("schema_version", SCHEMA_VERSION)
            elif str(version) != str(SCHEMA_VERSION):
                raise ArenaError(f"{self.path}: state schema version {version}, this arena-schedule reads {SCHEMA_VERSION}")
        except (sqlite3.DatabaseError, ArenaError, ValueError) as e:
            # Closing removes the -wal/-shm files opening created: a refused database is left as it was found.
            if self.conn is not None:
                self.conn.close()
            if isinstance(e, ArenaError):
                raise
            if isinstance(e, sqlite3.OperationalError):  # read-only, locked past the busy timeout, ...
                raise ArenaError(f"{self.path}: cannot use the scheduler state database ({e})") from None
            raise ArenaError(f"{self.path}: not a scheduler state database ({e})") from None

    def _check_marker(self, create: bool) -> None:
        """Arena's marker, or an empty database (marked when ``create``); anything else is refused untouched.
        A database of an Arena from before the marker (its ``meta`` table holds a schema version) is accepted."""
        (app_id,) = self.conn.execute("PRAGMA application_id").fetchone()
        if app_id == APPLICATION_ID:
            return
        tables = [name for (name,) in self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        legacy = False
        if app_id == 0 and "meta" in tables and "jobs" in tables:
            try:
                legacy = self.conn.execute("SELECT 1 FROM meta WHERE key = 'schema_version'").fetchone() is not None
            except sqlite3.DatabaseError:  # a "meta" table of someone else's
                legacy = False
        if app_id != 0 or (tables and not legacy):
            shown = ", ".join(tables[:5]) + (" ..." if len(tables) > 5 else "")
            raise ArenaError(f"{self.path}: not Arena's scheduler state database (application id {app_id:#x}, "
                             f"tables: {shown or 'none'}); refusing to write into it: use another --state")
        if not tables and not create:
            raise ArenaError(f"{self.path}: not a scheduler state database (it is empty)")
        if create:
            self.conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # -- meta -----------------------------------------------------------------------------------------
    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def set_meta(self, key: str, value: Any, conn: sqlite3.Connection | None = None) -> None:
        (conn or self.conn).execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                                    (key, json.dumps(value)))

    # -- submission (the CLI) -------------------------------------------------------------------------
    def submit(self, sub: JobSubmission, not_before: float | None = None) -> str:
        """Insert a submitted job; returns its id. ``not_before``: scheduler time before which it does not
        arrive (trace replay)."""
        check_not_before(not_before)
        now = time.time()
        with self.transaction() as c:
            if sub.name is not None:
                if c.execute("SELECT 1 FROM jobs WHERE job_id = ?", (sub.name,)).fetchone():
                    raise ArenaError(f"job {sub.name!r} already exists in {self.path}")
                job_id = sub.name
            else:
                (n,) = c.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()
                job_id = f"job-{n}"
                while c.execute("SELECT 1 FROM jobs WHERE job_id = ?", (job_id,)).fetchone():
                    n += 1
                    job_id = f"job-{n}"
            c.execute("INSERT INTO jobs(job_id, spec, submitted_wall, not_before, status, updated_wall) VALUES (?, ?, ?, ?, ?, ?)",
                      (job_id, json.dumps(sub.to_dict()), now, not_before, SUBMITTED, now))
            c.execute("INSERT INTO log(wall, time, job_id, kind, detail) VALUES (?, NULL, ?, 'submit', ?)",
                      (now, job_id, json.dumps(sub.to_dict())))
        return job_id

    # -- reading --------------------------------------------------------------------------------------
    def jobs(self, statuses: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        if statuses:
            return self._select(f" WHERE status IN ({','.join('?' * len(statuses))})", statuses)
        return self._select("", ())

    def _select(self, where: str, args: tuple) -> list[dict[str, Any]]:
        q = "SELECT seq, job_id, spec, submitted_wall, not_before, status, arrival_time, state, error FROM jobs"
        out = []
        for seq, job_id, spec, sw, nb, status, at, state, err in self.conn.execute(q + where + " ORDER BY seq", args):
            out.append({"seq": seq, "job_id": job_id, "spec": json.loads(spec), "submitted_wall": sw, "not_before": nb,
                        "status": status, "arrival_time": at, "state": json.loads(state) if state else None,
                        "error": err})
        return out

    def job(self, job_id: str) -> dict[str, Any] | None:
        for j in self._select(" WHERE job_id = ?", (job_id,)):
            return j
        return None

    def log_of(self, job_id: str | None, limit: int | None = None) -> list[dict[str, Any]]:
        q = "SELECT id, wall, time, job_id, kind, detail FROM log"
        args: tuple = ()
        if job_id is not None:
            q += " WHERE job_id = ?"
            args = (job_id,)
        q += " ORDER BY id"
        rows = [{"id": i, "wall": w, "time": t, "job_id": j, "kind": k, "detail": json.loads(d)}
                for i, w, t, j, k, d in self.conn.execute(q, args)]
        return rows[-limit:] if limit else rows

    def launches(self, states: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        q = "SELECT job_id, version, request, state, decided_at FROM launches"
        args: tuple = ()
        if states:
            q += f" WHERE state IN ({','.join('?' * len(states))})"
            args = states
        return [{"job_id": j, "version": v, "request": json.loads(r), "state": s, "decided_at": d}
                for j, v, r, s, d in self.conn.execute(q + " ORDER BY decided_at, rowid", args)]

    def perf_rows(self) -> list[dict[str, list]]:
        return [json.loads(r) for (r,) in self.conn.execute("SELECT rows FROM perf_rows ORDER BY model, global_batch")]

    # -- writing (the server) -------------------------------------------------------------------------
    @staticmethod
    def log(c: sqlite3.Connection, time_: float | None, job_id: str | None, kind: str, detail: dict[str, Any]) -> None:
        c.execute("INSERT INTO log(wall, time, job_id, kind, detail) VALUES (?, ?, ?, ?, ?)",
                  (time.time(), time_, job_id, kind, json.dumps(detail, default=float)))

    @staticmethod
    def set_status(c: sqlite3.Connection, job_id: str, status: str, state: dict[str, Any] | None = None,
                   arrival_time: float | None = None, error: str | None = None) -> None:
        c.execute("UPDATE jobs SET status = ?, state = COALESCE(?, state), arrival_time = COALESCE(?, arrival_time), "
                  "error = COALESCE(?, error), updated_wall = ? WHERE job_id = ?",
                  (status, None if state is None else json.dumps(state, default=float), arrival_time, error,
                   time.time(), job_id))

    @staticmethod
    def add_launch(c: sqlite3.Connection, job_id: str, version: int, request: dict[str, Any], decided_at: float) -> None:
        c.execute("INSERT OR IGNORE INTO launches(job_id, version, request, state, decided_at, updated_wall) "
                  "VALUES (?, ?, ?, 'intent', ?, ?)", (job_id, version, json.dumps(request), decided_at, time.time()))

    def mark_launch(self, job_id: str, version: int, state: str) -> None:
        self.conn.execute("UPDATE launches SET state = ?, updated_wall = ? WHERE job_id = ? AND version = ?",
                          (state, time.time(), job_id, version))

    def add_perf_rows(self, c: sqlite3.Connection, model: str, batch: int, rows: dict[str, list]) -> None:
        c.execute("INSERT OR REPLACE INTO perf_rows(model, global_batch, rows) VALUES (?, ?, ?)",
                  (model, batch, json.dumps(rows, default=float)))


class ServerLock:
    """An exclusive lock on ``<state>.lock``, held for a server's life: one live scheduler per state database
    (two would both launch jobs onto the same GPUs). The file holds the holder's process id, for the message
    the second server exits with. The kernel releases the lock when the holder dies, however it dies."""

    def __init__(self, state: str | Path):
        # the file itself, not the name it was given by: a link to a served database is the same database
        self.path = Path(f"{os.path.realpath(state)}.lock")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ArenaError(f"cannot lock {state}: {exc.strerror or exc} ({self.path})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ArenaError(f"{state} is already served by process {holder} (lock {self.path}): one server per "
                             f"state database; stop that one first, or use another --state") from None
        except OSError as exc:
            os.close(fd)
            raise ArenaError(f"cannot lock {state}: {exc.strerror or exc} ({self.path})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd: int | None = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the lock; the file stays (harmless, reused)
            self.fd = None
