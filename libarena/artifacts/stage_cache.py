"""Per-stage output cache: re-running a pipeline stage on unchanged inputs and parameters is instant.

Every producing command (arena-analyze, arena-plan, arena-profile, arena-schedule simulate / compare /
perf build) computes a key before doing any work::

    key = content_digest(cache format, stage, Arena version, digest of Arena's source code,
                         library versions, the typed parameters, every input's provenance entry)

An input's provenance entry is its path and the sha256 of its bytes (a file) or of the decoded artifact
(stdin: the same digest whether the table was piped as an Arrow stream or read from Parquet). The path is
part of the key because it is part of the output's provenance: a cache hit is then byte for byte the
output a recomputation would write, provenance included.

Layout: ``<cache-dir>/stages/<stage>/<key>/`` holds the output file(s) and ``MANIFEST.json``, which lists
each file's size and sha256 and is written last. An entry is assembled in a hidden temp directory next to
it and renamed into place, so a killed run leaves at most an ignored temp directory; an entry whose files
do not match its manifest (truncated, edited, half-deleted) is reported, removed and recomputed. A cache
that cannot be written (read-only, full disk) costs a warning, never the run.

On a hit a table output is copied atomically to ``-o FILE``, or streamed to stdout (``-o -``) as the Arrow
IPC stream the stage itself writes there; a directory output (simulate, compare) is rebuilt from the entry under a
temp name and renamed into place, like a computed one.
``--no-cache`` skips the lookup, recomputes and refreshes the entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from libarena import __version__
from libarena.artifacts.io import (
    STDIO, TableArtifact, atomic_directory, atomic_output, content_digest, describe, input_ref, is_stream,
    remove_stale_temps,
)
from libarena.artifacts.source import source_digest
from libarena.errors import ArenaError

#: Bump when the key recipe or the entry layout changes: older entries then simply stop matching.
CACHE_FORMAT = 1
#: The default cache root (relative to the working directory): every stage's entries, and perf build's stage profiles.
DEFAULT_CACHE_DIR = Path(".arena-cache")
MANIFEST = "MANIFEST.json"
#: seconds after which a pid-less staging folder in the cache (an older Arena's) is removed
STALE_TEMP_S = 3600.0
#: The file name of a single-table output inside its entry.
TABLE_OUTPUT = "output.parquet"

Log = Callable[[str], None]


# --------------------------------------------------------------------------------------------------
# Key ingredients


def library_versions(*names: str) -> dict[str, str]:
    """Installed versions of the libraries a stage's output depends on (``absent`` when not installed)."""
    versions = {"python": f"{sys.version_info.major}.{sys.version_info.minor}"}
    for name in ("numpy", "pyarrow", *names):
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


@lru_cache(maxsize=None)
def code_digest() -> str:
    """sha256 over Arena's own source (the libarena package).

    Arena's version number does not change with every edit; the source digest does, so an entry made by
    other code is never served (a few milliseconds, once per process).
    """
    import libarena

    package = Path(libarena.__file__).resolve().parent
    return source_digest(package.parent, (package.name,))


def table_digest(artifact: TableArtifact) -> str:
    """sha256 of a decoded table artifact: its canonical Arrow IPC serialisation, metadata and provenance."""
    import pyarrow.ipc as ipc

    table = artifact.table.replace_schema_metadata(None)
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    h = hashlib.sha256(sink.getvalue())
    h.update(json.dumps([artifact.kind, artifact.metadata, asdict(artifact.provenance)], sort_keys=True,
                        default=str).encode())
    return h.hexdigest()


def cache_input(path: str | os.PathLike[str], artifact: TableArtifact | None = None, kind: str | None = None) -> dict[str, Any]:
    """An input's part of the key: path and sha256 of the file (of the bytes ``artifact`` was decoded from, when
    given), or of the decoded artifact read from stdin."""
    if str(path) == STDIO:
        if artifact is None:
            raise ValueError("a stdin input needs its decoded artifact for the cache key")
        return {"path": describe(path), "kind": kind or artifact.kind, "sha256": table_digest(artifact)}
    if artifact is not None and artifact.content_sha256 is not None:
        return input_ref(path, kind, digest=artifact.content_sha256)
    return input_ref(path, kind)


# --------------------------------------------------------------------------------------------------
# The cache


@dataclass
class StageOutcome:
    """What a producing command did: the basis of its ``--json`` summary and its ``cached:`` log line."""

    output: str
    cache_hit: bool
    key: str
    entry: str | None = None
    #: rows of a table output
    rows: int | None = None
    files: list[str] = field(default_factory=list)
    stored: bool = False
    store_error: str | None = None

    def summary(self) -> dict[str, Any]:
        data: dict[str, Any] = {"output": self.output, "cache": {"hit": self.cache_hit, "key": self.key,
                                                                "entry": self.entry, "stored": self.stored}}
        if self.store_error:
            data["cache"]["error"] = self.store_error
        if self.rows is not None:
            data["rows"] = self.rows
        if self.files:
            data["files"] = self.files
        return data


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its ancestors that do not exist yet, outermost first (what ``mkdir(parents=True)`` makes)."""
    missing = []
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    return missing[::-1]


class UncacheableInput(OSError):
    """An input the key cannot name by content (a pipe, ``<(...)``): nothing of that run is served or stored."""


class StageCache:
    """The output cache of one stage (``arena-plan``, ``arena-schedule simulate``, ...) under ``cache_dir``."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None, stage: str, *, refresh: bool = False,
                 log: Log | None = None, warn: Log | None = None) -> None:
        self.stage = stage
        self.root = Path(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR) / "stages" / stage.replace(" ", "-")
        #: --no-cache: never serve an entry, recompute and store a fresh one
        self.refresh = refresh
        self.log = log or (lambda message: None)
        self.warn = warn or self.log
        #: staged entry -> the cache folders made for it (removed again, if empty, when it is discarded)
        self._made: dict[Path, list[Path]] = {}
        #: keys of runs with an input named only by its path (see ``key``) -> why
        self._uncacheable: dict[str, str] = {}

    # -- keys ----------------------------------------------------------------------------------------
    def key(self, parameters: Mapping[str, Any], inputs: Iterable[Mapping[str, Any]] = (),
            versions: Mapping[str, str] | None = None) -> str:
        """The entry of a run: its stage, Arena's code, library versions, parameters and inputs. An input entry
        with a path but no sha256 (a pipe or process substitution, whose path a later, different input reuses)
        makes the run uncacheable: the key is returned but never served or stored."""
        inputs = [dict(i) for i in inputs]
        key = content_digest("arena-stage-cache", CACHE_FORMAT, self.stage, __version__, code_digest(),
                             dict(versions or library_versions()), dict(parameters), inputs)
        unnamed = [str(i["path"]) for i in inputs if "path" in i and "sha256" not in i]
        if unnamed:
            self._uncacheable[key] = f"{unnamed[0]} is not a regular file, so its content cannot be keyed"
            self.log(f"not cached: {self._uncacheable[key]}")
        return key

    def entry_path(self, key: str) -> Path:
        return self.root / key

    # -- reading -------------------------------------------------------------------------------------
    def lookup(self, key: str) -> dict[str, Path] | None:
        """The files of a complete, intact entry (name -> path), or None (missing, or corrupt and removed)."""
        if self.refresh or key in self._uncacheable:
            return None
        entry = self.entry_path(key)
        try:
            if not (entry / MANIFEST).is_file():
                return None
            identity = entry.stat().st_ino
        except OSError:  # the cache dir is not a directory, not readable...: a miss
            return None
        problem = None
        files: dict[str, Path] = {}
        try:
            manifest = json.loads((entry / MANIFEST).read_text())
            if not (isinstance(manifest, dict) and manifest.get("format") == CACHE_FORMAT and manifest.get("key") == key
                    and isinstance(manifest.get("files"), dict) and manifest["files"]):
                raise ValueError("unexpected manifest")
            for name, expect in manifest["files"].items():
                path = entry / name
                if Path(name).is_absolute() or ".." in Path(name).parts or not isinstance(expect, dict):
                    raise ValueError(f"bad file name {name!r}")
                if not path.is_file() or path.stat().st_size != expect.get("size"):
                    problem = f"{name} is missing or has the wrong size"
                    break
                if _file_sha256(path) != expect.get("sha256"):
                    problem = f"{name} does not match its checksum"
                    break
                files[name] = path
        except (OSError, ValueError, RecursionError) as exc:
            problem = f"unreadable manifest ({exc})"
        if problem is None:
            return files
        self.warn(f"cache entry {entry} is corrupt ({problem}); recomputing")
        with contextlib.suppress(OSError):
            if entry.stat().st_ino == identity:  # not an entry another run swapped in meanwhile
                shutil.rmtree(entry)
        return None

    # -- writing -------------------------------------------------------------------------------------
    def store(self, key: str, files: Mapping[str, str | os.PathLike[str]]) -> Path:
        """Copy ``files`` (entry name -> source path) into a fresh entry; atomic (raises OSError on failure)."""
        staging = self._staging(key)
        try:
            for name, source in files.items():
                target = staging / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
            return self._commit(key, staging)
        except BaseException:
            self._discard(staging)
            raise

    def _staging(self, key: str) -> Path:
        if key in self._uncacheable:
            raise UncacheableInput(self._uncacheable[key])
        # the folders this makes (the stage's, stages/, the cache dir and any missing parents of a nested
        # --cache-dir) are removed again, if left empty, when the staged entry is discarded (a run that fails
        # leaves nothing behind); another run's discard may remove one meanwhile: made again
        attempt = 0
        while True:
            made = _missing_folders(self.root)
            self.root.mkdir(parents=True, exist_ok=True)
            remove_stale_temps(self.root, stale_after_s=STALE_TEMP_S)  # (Arena's own folder: pid-less names too)
            try:
                staging = Path(tempfile.mkdtemp(dir=self.root, prefix=f".{key}.{os.getpid()}.", suffix=".tmp"))
            except FileNotFoundError:
                attempt += 1
                if attempt == 3:
                    raise
                continue
            self._made[staging] = made
            return staging

    def _discard(self, staging: Path) -> None:
        """Remove a staged entry that will not be committed, and the cache folders made for it if now empty."""
        shutil.rmtree(staging, ignore_errors=True)
        for folder in reversed(self._made.pop(staging, [])):
            try:
                folder.rmdir()
            except OSError:  # not empty: another entry, another run's
                break

    def _commit(self, key: str, staging: Path) -> Path:
        """Checksum the staged files, write the manifest last, and rename the directory into place."""
        listing = {}
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            listing[str(path.relative_to(staging))] = {"size": path.stat().st_size, "sha256": _file_sha256(path)}
        if not listing:
            raise OSError(f"nothing to cache for {self.stage}")
        manifest = {"format": CACHE_FORMAT, "key": key, "stage": self.stage, "arena_version": __version__,
                    "created": time.time(), "files": listing}
        with open(staging / MANIFEST, "w") as f:
            f.write(json.dumps(manifest, indent=1, sort_keys=True))
            f.flush()
            os.fsync(f.fileno())
        self._made.pop(staging, None)  # committed: its folders hold an entry now
        entry = self.entry_path(key)
        if not self.refresh and self.lookup(key) is not None:
            # a concurrent run of the same key committed first: its entry stays (a reader may hold its files' paths)
            shutil.rmtree(staging, ignore_errors=True)
            return entry
        old = None
        if entry.exists():  # a refresh (--no-cache) or a corrupt entry: move it aside, then swap
            old = Path(tempfile.mkdtemp(dir=self.root, prefix=f".{key}.old.{os.getpid()}.", suffix=".tmp"))
            os.rename(entry, old / "entry")
        try:
            os.rename(staging, entry)
        except OSError:
            if not (entry / MANIFEST).is_file():  # not a concurrent writer that just committed the same key
                raise
            shutil.rmtree(staging, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return entry

    # -- the two shapes of stage output ---------------------------------------------------------------
    def produce_table(self, key: str, output: str | os.PathLike[str], produce: Callable[[str], None]) -> StageOutcome:
        """A single-table output: serve ``key`` from the cache, or run ``produce(path)`` (compute and write the
        artifact to ``path``, a file or ``-``) and cache what it wrote."""
        output = str(output)
        outcome = StageOutcome(describe(output), False, key)
        hit = self.lookup(key)
        if hit is not None and TABLE_OUTPUT in hit:
            deliver_table(hit[TABLE_OUTPUT], output)
            outcome.cache_hit, outcome.entry = True, str(self.entry_path(key))
            outcome.rows = _parquet_rows(hit[TABLE_OUTPUT])
            return outcome
        if output == STDIO or is_stream(output):
            # stdout, a device or a FIFO cannot be read back: write into the entry first, then stream it out
            try:
                staging = self._staging(key)
            except OSError as exc:
                self._not_stored(outcome, exc)
                produce(output)
                return outcome
            try:
                produce(str(staging / TABLE_OUTPUT))
                entry = self._commit(key, staging)
            except BaseException:
                self._discard(staging)
                raise
            deliver_table(entry / TABLE_OUTPUT, output)
            outcome.stored, outcome.entry = True, str(entry)
            outcome.rows = _parquet_rows(entry / TABLE_OUTPUT)
            return outcome
        produce(output)
        outcome.rows = _parquet_rows(Path(output))
        self._store_quietly(outcome, {TABLE_OUTPUT: Path(output)})
        return outcome

    def table(self, key: str, produce: Callable[[str], None], scratch: str | os.PathLike[str]) -> Path:
        """A single-table output for use by a later stage (no ``-o`` copy): the entry's own file, produced
        straight into the cache on a miss. Where the cache cannot be written, ``produce`` writes into
        ``scratch`` (a directory the caller owns) instead."""
        hit = self.lookup(key)
        if hit is not None and TABLE_OUTPUT in hit:
            return hit[TABLE_OUTPUT]
        try:
            staging = self._staging(key)
        except OSError as exc:
            self._not_stored(None, exc)
            path = Path(scratch) / TABLE_OUTPUT
            produce(str(path))
            return path
        try:
            produce(str(staging / TABLE_OUTPUT))
            return self._commit(key, staging) / TABLE_OUTPUT
        except BaseException:
            self._discard(staging)
            raise

    def restore_tree(self, key: str, out_dir: str | os.PathLike[str],
                     replaceable: Callable[[str], bool]) -> StageOutcome | None:
        """A directory output's cached files, restored as a whole into ``out_dir`` (built under a temp name and
        renamed, libarena.artifacts.io.atomic_directory); None when the cache has no entry. ``replaceable``:
        as for produce_tree."""
        self.refuse_inside(out_dir)
        hit = self.lookup(key)
        if hit is None:
            return None
        out_dir = Path(out_dir)
        with atomic_directory(out_dir, replaceable) as staging:
            for name, path in sorted(hit.items()):
                target = staging / name
                target.parent.mkdir(parents=True, exist_ok=True)  # inside the output being built
                shutil.copyfile(path, target)
        return StageOutcome(str(out_dir), True, key, entry=str(self.entry_path(key)), files=sorted(hit))

    def refuse_inside(self, out_dir: str | os.PathLike[str]) -> None:
        """A directory output is rebuilt as a whole (built under a temp name, swapped in): a cache inside it would
        be swapped out with the old output, the entries this run stored with it."""
        cache_dir = self.root.parent.parent
        out, inside = Path(os.path.realpath(out_dir)), Path(os.path.realpath(cache_dir))
        if inside == out or out in inside.parents:
            raise ArenaError(f"--cache-dir {cache_dir} is inside the output {out_dir}, which is rebuilt as a whole: "
                             "put the cache elsewhere")

    def produce_tree(self, key: str, out_dir: str | os.PathLike[str], produce: Callable[[Path], None],
                     replaceable: Callable[[str], bool]) -> StageOutcome:
        """A directory output (simulate, compare), built as a whole under a temp name and renamed into place
        (libarena.artifacts.io.atomic_directory): the cached files, or ``produce(directory)`` (write every output
        file into ``directory``) and cache what it wrote. ``replaceable(relative path)``: the files an earlier
        output of this stage may hold (anything else in an existing ``out_dir`` refuses the run)."""
        out_dir = Path(out_dir)
        restored = self.restore_tree(key, out_dir, replaceable)
        if restored is not None:
            return restored
        outcome = StageOutcome(str(out_dir), False, key)
        with atomic_directory(out_dir, replaceable) as staging:
            produce(staging)
            written = {str(p.relative_to(staging)): p for p in sorted(staging.rglob("*")) if p.is_file()}
            outcome.files = sorted(written)
            if written:
                self._store_quietly(outcome, written)
        return outcome

    def _store_quietly(self, outcome: StageOutcome, files: Mapping[str, Path]) -> None:
        try:
            outcome.entry = str(self.store(outcome.key, files))
            outcome.stored = True
        except OSError as exc:
            self._not_stored(outcome, exc)

    def _not_stored(self, outcome: StageOutcome | None, exc: OSError) -> None:
        if isinstance(exc, UncacheableInput):  # said once, by ``key``
            return
        reason = _os_reason(exc)
        if outcome is not None:
            outcome.store_error = reason
        self.warn(f"cannot write the stage cache {self.root}: {reason}")


# --------------------------------------------------------------------------------------------------
# Delivery


def copy_atomically(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    with open(source, "rb") as src, atomic_output(target) as out:
        shutil.copyfileobj(src, out, 1 << 20)


def deliver_table(source: Path, output: str) -> None:
    """A cached table to ``output``: an atomic copy of the Parquet file, or the Arrow IPC stream on stdout
    (the same bytes the stage writes there: the schema and its Arena metadata survive the Parquet round trip)."""
    if output != STDIO:
        copy_atomically(source, output)
        return
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(source, use_threads=False)
    except Exception as exc:  # noqa: BLE001 - checksummed moments ago; report rather than trace back
        raise ArenaError(f"cache entry {source}: unreadable ({' '.join(str(exc).split())[:200]})") from None
    with atomic_output(STDIO) as out, ipc.new_stream(out, table.schema) as writer:
        writer.write_table(table)


# --------------------------------------------------------------------------------------------------
# Helpers


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _parquet_rows(path: Path) -> int | None:
    import pyarrow.parquet as pq

    try:
        return int(pq.ParquetFile(path).metadata.num_rows)
    except Exception:  # noqa: BLE001 - the row count is informative only
        return None


def _os_reason(exc: OSError) -> str:
    return f"{exc.strerror or exc}{f': {exc.filename}' if getattr(exc, 'filename', None) else ''}"
