"""The live scheduler's state in SQLite (WAL mode): the single source of truth across restarts.

Tables:
- ``meta``: server settings (cluster, perf, policy, tick, compression, clock origin) and progress (last tick).
- ``jobs``: one row per submitted job: the submission, its status and, while the server owns it, a snapshot
  of its scheduler state (allocation, version, progress, queue position, ...), updated once per tick.
- ``launches``: one row per (job, version) action (launch / rescale / migrate), written as ``intent`` in the
  same transaction as the decision, *before* the launcher is called, then marked ``launched``: an intent
  left behind by a crash is re-issued on restart, and the launcher ignores a version it already runs.
- ``log``: the event and decision log (``arena-schedule logs JOB``); ``arena-schedule cancel`` writes its
  requests there too (kind ``cancel-request``), and the server acts on those logged after ``meta.cancels_seen``.
- ``perf_rows``: performance rows measured by profiling on arrival (added to the perf table on restart).

Writers: the server (one process), ``submit`` (inserts a ``submitted`` row) and ``cancel`` (logs a request; only
the server changes a job's status); readers: ``status``, ``logs``.

The database is marked as Arena's (SQLite's ``application_id``, :data:`APPLICATION_ID`): a ``--state`` file that
is some other SQLite database is refused before anything is written to it (not even its journal mode is
changed). One server at a time: :class:`ServerLock` holds an exclusive lock on the database file for the
server's life, and a second server exits naming the first one's process id.
"""

from __future__ import annotations

import fcntl
import functools
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
CREATE INDEX IF NOT EXISTS log_cancel_requests ON log(id) WHERE kind = 'cancel-request';
CREATE TABLE IF NOT EXISTS perf_rows (model TEXT NOT NULL, global_batch INTEGER NOT NULL, rows TEXT NOT NULL,
                                      PRIMARY KEY (model, global_batch));
"""

#: job statuses; ``submitted`` rows are written by ``submit`` and picked up by the server
SUBMITTED, PROFILING, ARRIVING, QUEUED, STARTING, RUNNING = "submitted", "profiling", "arriving", "queued", "starting", "running"
FINISHED, DROPPED, FAILED, REJECTED, UNSCHEDULABLE = "finished", "dropped", "failed", "rejected", "unschedulable"
CANCELLED = "cancelled"
TERMINAL = (FINISHED, DROPPED, FAILED, REJECTED, UNSCHEDULABLE, CANCELLED)
#: the log kind of ``arena-schedule cancel``'s request: the server acts on the ones after ``meta.cancels_seen``
#: (a log row, not a table of its own: a database of an earlier version takes requests as it is)
CANCEL_REQUEST = "cancel-request"
MAX_REASON_CHARS = 500


def check_not_before(not_before: float | None) -> None:
    """``submit --at``: a scheduler time in [0, 100 years] (a job that never arrives would wait forever)."""
    check_range(not_before, "--at", 0, MAX_SECONDS, optional=True)


@contextmanager
def state_database_errors(path: str | Path, what: str = "the scheduler state database") -> Iterator[None]:
    """SQLite's errors on a state database in use (read-only, locked past the busy timeout, a full disk, a damaged
    file: "database disk image is malformed") as one-line errors naming it (``what``: also the other databases
    the command uses)."""
    try:
        yield
    except sqlite3.DatabaseError as exc:  # (OperationalError is one)
        raise ArenaError(f"{path}: cannot use {what} ({exc})") from None


#: what reading stored JSON of the wrong shape raises (a hand edit, another version's database)
_DAMAGE = (KeyError, TypeError, ValueError, AttributeError, IndexError, AssertionError)


@contextmanager
def damaged_state(path: str | Path, what: str) -> Iterator[None]:
    """Stored values of the wrong shape as a one-line error naming what is damaged, not an exception from deep
    in the code that reads them."""
    try:
        yield
    except ArenaError:
        raise
    except _DAMAGE as e:
        raise ArenaError(f"{path}: {what} is damaged ({type(e).__name__}: {str(e):.200}); restore the database "
                         "from a copy or serve a new --state") from None


@functools.cache
def _expected_columns() -> dict[str, list[str]]:
    """Each table of :data:`_SCHEMA` and its columns, as SQLite reports them."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(_SCHEMA)
        tables = [name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        return {t: [row[1] for row in conn.execute(f"PRAGMA table_info({t})")] for t in tables}
    finally:
        conn.close()


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
                raise ArenaError(f"{self.path}: state schema version {str(version)[:40]}, this arena-schedule reads {SCHEMA_VERSION}")
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
        legacy = app_id == 0 and bool(tables) and self._shaped_like_arena(tables)
        if app_id != 0 or (tables and not legacy):
            shown = ", ".join(tables[:5]) + (" ..." if len(tables) > 5 else "")
            raise ArenaError(f"{self.path}: not Arena's scheduler state database (application id {app_id:#x}, "
                             f"tables: {shown or 'none'}); refusing to write into it: use another --state")
        if not tables and not create:
            raise ArenaError(f"{self.path}: not a scheduler state database (it is empty)")
        if create:
            self.conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def _shaped_like_arena(self, tables: list[str]) -> bool:
        """Whether an unmarked database is one of an Arena from before the marker: only Arena's tables, each
        with Arena's columns, and a schema version in ``meta``. One with another version is refused here,
        before anything (the marker, the journal mode) is written to it."""
        expected = _expected_columns()
        if "meta" not in tables or "jobs" not in tables or not set(tables) <= set(expected):
            return False
        for table in tables:
            columns = [row[1] for row in self.conn.execute(f"PRAGMA table_info({table})")]
            if columns != expected[table]:
                return False
        row = self.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        try:
            version = None if row is None else json.loads(row[0])
        except ValueError:
            return False
        if version is None:
            return False
        if str(version) != str(SCHEMA_VERSION):
            raise ArenaError(f"{self.path}: state schema version {str(version)[:40]}, this arena-schedule reads {SCHEMA_VERSION}")
        return True

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
        return default if row is None else self._loads(row[0], f"setting {key!r}", None)

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

    def request_cancel(self, job_ids: list[str], reason: str) -> dict[str, str]:
        """Ask the server to cancel jobs (``arena-schedule cancel``); returns each job's status now. One-line
        ArenaError, and nothing requested, for an unknown job or one already ended. The server acts on them at
        its next poll (or its next start): it alone changes a job's status, so a cancel never races its own
        handling of the job."""
        reason = " ".join(str(reason).split())[:MAX_REASON_CHARS] or "cancelled by the operator"
        statuses = {}
        with self.transaction() as c:
            for job_id in job_ids:
                row = c.execute("SELECT status FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
                if row is None:
                    raise ArenaError(f"{self.path}: no job {job_id!r}")
                if row[0] in TERMINAL:
                    raise ArenaError(f"job {job_id!r} has already ended ({row[0]}): nothing to cancel")
                statuses[job_id] = row[0]
            for job_id in statuses:
                c.execute("INSERT INTO log(wall, time, job_id, kind, detail) VALUES (?, NULL, ?, ?, ?)",
                          (time.time(), job_id, CANCEL_REQUEST, json.dumps({"why": reason})))
        return statuses

    def cancels_seen(self) -> int:
        """The log id up to which the server has acted on cancel requests."""
        seen = self.get_meta("cancels_seen", 0)
        if isinstance(seen, bool) or not isinstance(seen, int) or seen < 0:
            raise ArenaError(f"{self.path}: setting 'cancels_seen' is damaged (not a log id: {str(seen):.80})")
        return seen

    def cancel_requests(self, after: int) -> tuple[list[tuple[int, str, str, float]], int]:
        """The cancel requests logged after log id ``after`` ((log id, job id, reason, wall time), oldest first) and
        the log id the next call may start after (the log's end as read: a server polling twice a second scans
        only what was logged since, however long the log)."""
        (end,) = self.conn.execute("SELECT COALESCE(MAX(id), 0) FROM log").fetchone()
        out = []
        for i, wall, job_id, detail in self.conn.execute(
                # (the kind written out: SQLite uses the partial index only for the literal of its WHERE)
                f"SELECT id, wall, job_id, detail FROM log WHERE id > ? AND kind = '{CANCEL_REQUEST}' ORDER BY id",
                (after,)):
            why = self._loads(detail, f"log entry {i}").get("why")
            out.append((int(i), str(job_id), str(why) if why else "cancelled by the operator", float(wall)))
        # (ids are given in commit order, one writer at a time: every id up to one read is there to be read)
        return out, max([after, int(end)] + [r[0] for r in out])

    # -- reading --------------------------------------------------------------------------------------
    def jobs(self, statuses: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        if statuses:
            return self._select(f" WHERE status IN ({','.join('?' * len(statuses))})", statuses)
        return self._select("", ())

    def _select(self, where: str, args: tuple) -> list[dict[str, Any]]:
        q = "SELECT seq, job_id, spec, submitted_wall, not_before, status, arrival_time, state, error FROM jobs"
        out = []
        for seq, job_id, spec, sw, nb, status, at, state, err in self.conn.execute(q + where + " ORDER BY seq", args):
            out.append({"seq": seq, "job_id": job_id, "spec": self._loads(spec, f"job {job_id}'s submission"),
                        "submitted_wall": sw, "not_before": nb, "status": status, "arrival_time": at,
                        "state": self._loads(state, f"job {job_id}'s state") if state else None, "error": err})
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
        rows = [{"id": i, "wall": w, "time": t, "job_id": j, "kind": k, "detail": self._loads(d, f"log entry {i}")}
                for i, w, t, j, k, d in self.conn.execute(q, args)]
        return rows[-limit:] if limit else rows

    def launches(self, states: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        q = "SELECT job_id, version, request, state, decided_at FROM launches"
        args: tuple = ()
        if states:
            q += f" WHERE state IN ({','.join('?' * len(states))})"
            args = states
        return [{"job_id": j, "version": v, "request": self._loads(r, f"job {j}'s launch {v}"), "state": s, "decided_at": d}
                for j, v, r, s, d in self.conn.execute(q + " ORDER BY decided_at, rowid", args)]

    def perf_rows(self) -> list[dict[str, list]]:
        return [self._loads(r, f"profiled rows of {m} (batch {b})")
                for m, b, r in self.conn.execute("SELECT model, global_batch, rows FROM perf_rows ORDER BY model, global_batch")]

    def _loads(self, text: Any, what: str, shape: type | None = dict) -> Any:
        """A JSON value read back from the database; a damaged one (edited by hand, a disk error) is a one-line
        error naming it, not a traceback."""
        try:
            value = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise ArenaError(f"{self.path}: {what} is damaged (not JSON: {exc}); the state database cannot be used "
                             "as it is") from None
        if shape is not None and not isinstance(value, shape):
            raise ArenaError(f"{self.path}: {what} is damaged (a JSON {type(value).__name__}, not an object); the "
                             "state database cannot be used as it is")
        return value

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
    """An exclusive ``flock`` on the state database file itself, held for a server's life: one live scheduler per
    state database (two would both launch jobs onto the same GPUs). Locking the file, not a name for it, makes
    every name it has (a symbolic link, a hard link, a bind mount) the same database, and leaves no lock file
    behind. ``flock`` locks are independent of the POSIX locks SQLite takes on the same file (on a local file
    system, where SQLite's WAL mode must live anyway), but closing any descriptor of the file drops this
    process's POSIX locks on it, so :meth:`release` must come after the database is closed. The kernel releases
    the lock when the holder dies, however it dies; the second server names the holder from ``/proc/locks``."""

    def __init__(self, state: str | Path):
        self.state = Path(state)
        self._path = Path(os.path.abspath(state))  # (not resolved: the name it was given is what SQLite opens)
        if self.state.is_dir():
            raise ArenaError(f"{state}: is a directory, not a scheduler state database")
        for _ in range(3):
            fd, self.created = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = flock_holder(fd) or "unknown"
                os.close(fd)  # (even a file this attempt made: the holder serves it now)
                raise ArenaError(f"{state} is already served by process {holder}: one server per state database; "
                                 f"stop that one first, or use another --state") from None
            except OSError as exc:
                self._abandon(fd)
                raise ArenaError(f"cannot lock {state}: {exc.strerror or exc}") from None
            if self._names_locked_file(fd):
                self.fd: int | None = fd
                return
            os.close(fd)  # the name was given to another file while locking (replaced, re-linked): again
        raise ArenaError(f"cannot lock {state}: the file keeps being replaced")

    def _open(self) -> tuple[int, bool]:
        try:
            try:  # O_EXCL: whether this server made the file (a failed start then removes it)
                return os.open(self.state, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), True
            except FileExistsError:
                return os.open(self.state, os.O_RDONLY | os.O_CLOEXEC), False
        except OSError as exc:
            raise ArenaError(f"cannot lock {self.state}: {exc.strerror or exc}") from None

    def _names_locked_file(self, fd: int) -> bool:
        """Whether the state's name still leads to the file locked through ``fd`` (SQLite opens it by name)."""
        try:
            st, locked = os.stat(self._path), os.fstat(fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (locked.st_dev, locked.st_ino)

    def check(self) -> None:
        """A one-line ArenaError once the state's name no longer leads to the locked file (removed, or replaced by
        another file): this server's writes would be lost, and another server could take the new file."""
        if self.fd is None:
            return
        try:
            st, locked = os.stat(self._path), os.fstat(self.fd)
        except FileNotFoundError:
            raise ArenaError(f"{self.state}: the state database was removed or moved away while this server held "
                             "it; stopped (a moved one can be served under its new name)") from None
        except OSError as exc:
            raise ArenaError(f"{self.state}: cannot check the state database ({exc.strerror or exc}); stopped") from None
        if (st.st_dev, st.st_ino) != (locked.st_dev, locked.st_ino):
            raise ArenaError(f"{self.state}: the state database was replaced by another file while this server held "
                             "it; stopped (the new file can be served now)")

    def _abandon(self, fd: int) -> None:
        """Give up a lock that cannot be taken (no locks on this file system): an empty file this attempt made is
        removed."""
        try:
            if self.created and os.fstat(fd).st_size == 0 and self._names_locked_file(fd):
                self.state.unlink()
        except OSError:
            pass
        os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None


def _connect_existing(path: Path) -> sqlite3.Connection:
    """A connection to the database file at ``path`` that never creates one (sqlite3.Error where there is none).
    Read-write: the last connection's close then removes the -wal and -shm files it made."""
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True, timeout=30.0)


_SUBMITTED_ROW = "SELECT job_id, spec, submitted_wall FROM jobs WHERE job_id = ?"


def submit_job(state: str | Path, sub: JobSubmission, not_before: float | None = None) -> str:
    """``arena-schedule submit``: the job inserted into the state database (made if there is none yet: a job may
    be submitted before the server first starts) and read back through its name; returns its id. A first serve
    that fails on a new path removes the database it made, unless it holds a job; a job inserted just after that
    check would go with the file, so it is reported, never lost silently."""
    state = Path(state)
    store = Store(state, create=True)
    try:
        with state_database_errors(state):
            job_id = store.submit(sub, not_before=not_before)
            # the row as written: a database made at the same path meanwhile may hold a job of the same id
            row = store.conn.execute(_SUBMITTED_ROW, (job_id,)).fetchone()
    finally:
        store.close()
    found = False
    try:
        conn = _connect_existing(state)
        try:
            found = conn.execute(_SUBMITTED_ROW, (job_id,)).fetchone() == row
        finally:
            conn.close()
    except sqlite3.OperationalError as exc:
        gone = "no such table" in str(exc) or not state.exists()
        if not gone:  # locked past the busy timeout, an I/O error: cannot tell
            raise ArenaError(f"{state}: job {job_id} was submitted, but reading it back failed ({exc}); see "
                             "arena-schedule status before submitting it again") from None
    except sqlite3.DatabaseError:
        pass  # replaced by a file that is not a database (a damaged one would not have taken the job either)
    if not found:
        raise ArenaError(f"{state}: the state database was removed or replaced while job {job_id} was submitted "
                         "(a serve that fails to start removes the database it made if it holds no job); submit it again")
    return job_id


def holds_jobs(path: str | Path, conn: sqlite3.Connection | None = None) -> bool:
    """Whether the database at ``path`` (through ``conn`` when one is open) holds any job; True where that cannot
    be read (better kept than lost)."""
    path = Path(path)
    own = conn is None
    try:
        if own:
            if path.stat().st_size == 0:
                return False
            conn = _connect_existing(path)
    except (OSError, sqlite3.Error):
        return True
    try:
        return conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] > 0
    except sqlite3.OperationalError as exc:
        return "no such table" not in str(exc)
    except sqlite3.Error:
        return True
    finally:
        if own:
            conn.close()


def flock_holder(fd: int, locks: str = "/proc/locks") -> str | None:
    """The process id holding a ``flock`` on ``fd``'s file, from the kernel's lock table (Linux), or None where
    it is not listed there (another OS, another pid namespace)."""
    st = os.fstat(fd)
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open(locks) as table:
            for line in table:
                # "1: FLOCK  ADVISORY  WRITE 1234 00:2d:5678 0 EOF" (a blocked waiter's line has "->" after "1:")
                fields = line.split()
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == device and fields[4].isdigit() \
                        and int(fields[4]) > 0:
                    return fields[4]
    except OSError:
        return None
    return None
