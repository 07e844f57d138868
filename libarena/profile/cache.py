"""On-disk content-addressed cache of profiled stages (and of the local device's roofline spec).

One JSON file per key under ``<root>/<key[:2]>/<key>.json``, written atomically (temp file + rename), so
an interrupted run never leaves a half-written entry; an unreadable or inconsistent entry is a miss and
is overwritten by the next profile. A run killed outright (SIGKILL) between writing a temp file and its
rename leaves the temp file behind: temp files carry their writer's pid (``.<key>.json.<pid>.<rand>.tmp``),
are never read as entries, and opening the cache removes those whose writer is no longer alive (or, for
names without a pid, that are older than ``STALE_TMP_S``).

Runs sharing a cache at the same time (``make -j`` over several models, two perf builds) do not profile the
same stage twice: the profiler claims a key (:meth:`ProfileCache.claim`, an exclusive ``flock`` on
``<root>/<key[:2]>/.<key>.lock``) before profiling it, so a second run waits for the first and then reads its
entry instead of timing the stage again beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libarena.artifacts.io import content_digest, json_default, remove_stale_temps
from libarena.errors import ArenaError

CACHE_FORMAT = 1
#: A temp file whose writer cannot be identified is stale after this long (writes take milliseconds).
STALE_TMP_S = 600.0


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "arena" / "profile"


#: Seconds a run waits for another that is profiling the same stage before it profiles the stage itself: far
#: above a stage's profile (compile included), so only a holder that stopped (Ctrl-Z, a hung device) is outwaited.
CLAIM_MAX_WAIT_S = 3600.0


def claim_notes(log: Callable[[str], None] | None, doing: str) -> dict[str, Callable[[], None]]:
    """:meth:`ProfileCache.claim`'s ``on_wait`` and ``on_give_up`` as lines to ``log`` (none without one), where
    ``doing`` says what the other run holding the claim is doing ("profiling <stage>")."""
    if log is None:
        return {}
    return {"on_wait": lambda: log(f"waiting for another run sharing the cache, which is {doing}"),
            "on_give_up": lambda: log(f"waited {CLAIM_MAX_WAIT_S:.0f} s for another run sharing the cache, which is "
                                      f"{doing}: doing it here")}


def _lock_within(fd: int, max_wait_s: float) -> bool:
    """Take the exclusive flock on ``fd``, polling for at most ``max_wait_s``: whether it was taken."""
    import fcntl

    deadline = time.monotonic() + max_wait_s
    delay = 0.05
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(2 * delay, 1.0)


@dataclass
class ProfileCache:
    root: Path
    hits: int = 0
    misses: int = 0
    writes: int = 0
    stale_removed: int = 0
    #: the timing protocol (warmup, repeats, time budget, statistic) the entries were measured with: one run's
    #: entries are not served to a run that asks for another (a profile of 2 timed runs is not one of 7)
    namespace: str | None = None
    _memory: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ArenaError(f"cannot use profile cache {self.root}: {exc.strerror or exc}") from None
        self.stale_removed = self.remove_stale_temp_files()

    def remove_stale_temp_files(self) -> int:
        """Delete temp files left by killed writers (dead pid, or no pid and older than STALE_TMP_S)."""
        # only the key shards: other tools keep their own directories under the same root
        return sum(len(remove_stale_temps(shard, stale_after_s=STALE_TMP_S)) for shard in self.root.glob("??")
                   if shard.is_dir())

    def within(self, namespace: str) -> ProfileCache:
        """The same folder, seen through ``namespace`` (its entries apart from this view's)."""
        return ProfileCache(self.root, namespace=namespace)

    def scoped(self, key: str) -> str:
        """``key`` within this cache's namespace (what names its file)."""
        return key if self.namespace is None else content_digest("profile-cache-namespace", self.namespace, key)

    def path(self, key: str) -> Path:
        return self._file(self.scoped(key))

    def _file(self, scoped: str) -> Path:
        return self.root / scoped[:2] / f"{scoped}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        key = self.scoped(key)
        if key in self._memory:
            self.hits += 1
            return self._memory[key]
        path = self._file(key)
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            self.misses += 1
            return None
        if not isinstance(entry, dict) or entry.get("key") != key or entry.get("format") != CACHE_FORMAT or "value" not in entry:
            self.misses += 1
            return None
        self.hits += 1
        self._memory[key] = entry["value"]
        return entry["value"]

    def put(self, key: str, value: dict[str, Any]) -> None:
        key = self.scoped(key)
        path = self._file(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"format": CACHE_FORMAT, "key": key, "value": value}, f, sort_keys=True, default=json_default)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)  # atomic: readers see the old entry or the whole new one
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._memory[key] = value
        self.writes += 1

    @contextlib.contextmanager
    def claim(self, key: str, on_wait: Callable[[], None] | None = None, max_wait_s: float = CLAIM_MAX_WAIT_S,
              on_give_up: Callable[[], None] | None = None) -> Iterator[None]:
        """Hold ``key`` against other processes that would profile it at the same time: they wait here (calling
        ``on_wait`` first, to say so) until this one leaves, its entry written or its attempt failed, then look
        the key up again. One that has waited ``max_wait_s`` (the holder may be stopped, Ctrl-Z) goes on
        unclaimed, calling ``on_give_up``, and profiles the key itself. The lock files stay (removing one while a
        process waits on it would let a third lock a new file beside it). Where no lock can be taken (a read-only
        cache, a filesystem without ``flock``) nothing is held, and concurrent runs may both profile the key, as
        without the claim. Not reentrant: a process claims one key at a time."""
        import fcntl

        key = self.scoped(key)
        path = self.root / key[:2] / f".{key}.lock"
        fd = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)  # flock needs no write access to the file
        except OSError:
            pass
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                try:
                    taken = _lock_within(fd, max_wait_s)
                except BaseException:
                    os.close(fd)
                    raise
                if not taken:
                    os.close(fd)
                    fd = None
                    if on_give_up is not None:
                        on_give_up()
            except OSError:
                pass  # no locks on this filesystem: unclaimed
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)  # releases the lock

    def entries(self) -> list[Path]:
        return sorted(self.root.glob("??/*.json"))
