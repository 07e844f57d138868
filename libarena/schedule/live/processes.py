"""The processes the live scheduler starts (launched jobs, profiles on arrival) and finds again after a restart.

Each is recorded in a pid file as ``"<pid> <start time>"``: a pid alone does not identify a process, since the
kernel reuses it after the process ends (after a host restart, a recorded pid may belong to anything). A process
is taken as the recorded one only while it runs with the recorded start time; a file without one (an older
Arena's) falls back to the pid alone."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from pathlib import Path

from libarena.artifacts.io import pid_alive


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an exited child not yet reaped); one owned by another
    user counts as alive."""
    if not pid_alive(pid):
        return False
    fields = _stat_fields(pid)
    return not fields or fields[0] != "Z"


def start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks after boot, /proc/<pid>/stat field 22), or None where unknown."""
    fields = _stat_fields(pid)
    return fields[19] if fields and len(fields) > 19 else None


def write_pid_file(path: Path, pid: int) -> None:
    """Record process ``pid`` (with its start time) in ``path``, atomically."""
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text(f"{pid} {start_time(pid) or ''}".strip())
    os.replace(tmp, path)


def shell_records_own_pid(path: Path) -> str:
    """A shell line that records the shell's own pid and start time in ``path`` (atomically), as
    :func:`write_pid_file` does: the script's first line, so a scheduler killed between starting the script and
    recording it still finds the script on restart. The command name of ``/bin/sh`` has no spaces, so field 22 of
    its /proc stat line is its start time."""
    q = shlex.quote
    tmp = path.with_name(f"{path.name}.sh.tmp")
    return (f"echo \"$$ $(cut -d' ' -f22 /proc/$$/stat 2>/dev/null)\" > {q(str(tmp))} && "
            f"mv -f {q(str(tmp))} {q(str(path))}")


def _record(path: Path) -> tuple[int, str] | None:
    """(pid, start time or "") as recorded in ``path``, None when there is no readable record."""
    try:
        pid_text, _, started = path.read_text().strip().partition(" ")
        return int(pid_text), started.strip()
    except (OSError, ValueError):
        return None


def recorded_pid(path: Path) -> int | None:
    """The pid recorded in ``path`` (whether or not it still runs), None when there is no readable record."""
    record = _record(path)
    return None if record is None else record[0]


def running_pid(path: Path) -> int | None:
    """The pid recorded in ``path`` while that very process runs; None once it is gone, or when the pid now
    belongs to another process (its start time differs from the recorded one)."""
    record = _record(path)
    if record is None:
        return None
    pid, started = record
    if not alive(pid) or (started and start_time(pid) != started):
        return None
    return pid


#: set in the environment of every process the live scheduler starts, to the directory of its pid file: what its
#: children inherit, so members left in its process group after the leader died can be told from another group
#: that now has the same number (a double-forked daemon's, after the pid was reused)
PROCESS_DIR_VARIABLE = "ARENA_PROCESS_DIR"


def process_env(directory: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment to start a recorded process with (its pid file in ``directory``)."""
    env = dict(os.environ if base is None else base)
    env[PROCESS_DIR_VARIABLE] = str(Path(directory).resolve())
    return env


def recorded_group(path: Path) -> int | None:
    """The process group that the process recorded in ``path`` leads (started in a session of its own, with
    :func:`process_env`), while any of it runs: the leader itself, or, once the leader is gone, members left in
    its group (a killed script's children) that carry the leader's :data:`PROCESS_DIR_VARIABLE`."""
    pid = running_pid(path)
    if pid is not None:
        return pid
    pid = recorded_pid(path)
    if pid is None or pid <= 0 or alive(pid):
        return None  # no record, or the pid belongs to another process now
    return pid if _group_has_members(pid, str(path.parent.resolve())) else None


def _group_has_members(pgid: int, directory: str) -> bool:
    """Whether a live process of group ``pgid`` was started by the recorded process (its environment says so)."""
    return any(fields[2] == str(pgid) and started_by == directory for _, fields, started_by in _marked_processes())


def processes_started_under(root: Path) -> list[int]:
    """The live processes that the live scheduler of a state directory under ``root`` started, and their
    descendants (each carries :data:`PROCESS_DIR_VARIABLE`): what to stop when a scheduler is gone for good,
    including a job launched just before it died, whose pid file it never wrote."""
    root = Path(root).resolve()
    return [pid for pid, _, started_by in _marked_processes() if Path(started_by).is_relative_to(root)]


def _marked_processes() -> Iterator[tuple[int, list[str], str]]:
    """(pid, /proc stat fields after the command name, the directory its :data:`PROCESS_DIR_VARIABLE` names) of
    each live process carrying the variable; zombies and processes of other users (unreadable) are left out."""
    prefix = f"{PROCESS_DIR_VARIABLE}=".encode()
    try:
        entries = [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return
    for pid in entries:
        fields = _stat_fields(pid)
        if not fields or len(fields) <= 2 or fields[0] == "Z":
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                variables = f.read().split(b"\0")
        except OSError:
            continue
        for variable in variables:
            if variable.startswith(prefix):
                yield pid, fields, variable[len(prefix):].decode(errors="replace")
                break
