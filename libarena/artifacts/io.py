"""The one place that reads and writes artifacts.

Tables (operator tables, plans, performance tables, a run's records) are Parquet files (an Arrow IPC stream
when written to stdout), msgpack documents hold decisions, JSON documents the small summaries people and scripts
read (a run's metrics, a comparison). Every
artifact carries, in its metadata under the key ``arena``: its kind, schema version,
and provenance (tool, Arena version, inputs with their content hashes, parameters). Writes are atomic
(temp file in the target directory, then rename); reading a file of the wrong kind or version fails with
a one-line :class:`ArenaError`.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgpack
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from libarena import __version__
from libarena.artifacts.registry import ArtifactKind, get_kind, json_field_matches
from libarena.artifacts.untrusted import read_bounded
from libarena.errors import ArenaError

METADATA_KEY = b"arena"
#: ... and the key of a JSON document's header, beside its fields
_HEADER_KEY = METADATA_KEY.decode()
STDIO = "-"
#: the largest artifact read (Arena's own are kilobytes to megabytes): a bound on memory for any input
MAX_ARTIFACT_BYTES = 1 << 30
#: the most bytes a table decodes to: a small compressed file (one value repeated millions of times) can expand
#: to gigabytes. Rows are bounded per kind (ArtifactKind.max_rows): what reads a table builds objects per row.
MAX_DECODED_BYTES = 1 << 30
#: rows decoded at a time, so a table over the bounds is refused before it is all in memory
_DECODE_BATCH_ROWS = 1 << 16
_PARQUET_MAGIC = b"PAR1"
_IPC_STREAM_MAGIC = b"\xff\xff\xff\xff"


@dataclass
class Provenance:
    """Where an artifact came from: enough to tell whether a cached copy is still valid."""

    tool: str
    parameters: dict[str, Any] = field(default_factory=dict)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    arena_version: str = __version__

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Provenance:
        # Provenance is informative: a malformed record (hand-edited file) reads as empty, never fails.
        parameters, inputs = data.get("parameters"), data.get("inputs")
        return cls(
            tool=str(data.get("tool", "")),
            parameters=dict(parameters) if isinstance(parameters, dict) else {},
            inputs=list(inputs) if isinstance(inputs, list) else [],
            arena_version=str(data.get("arena_version", "")),
        )


@dataclass
class TableArtifact:
    kind: str
    table: pa.Table
    provenance: Provenance
    metadata: dict[str, Any]
    schema_version: int
    source: str
    #: False when the table was imported from a CSV/Parquet written outside Arena.
    native: bool = True
    #: sha256 of the bytes decoded, when read from a regular file: what names it in a provenance entry or a cache
    #: key (hashing the file again would name a file replaced in between by the new content's digest)
    content_sha256: str | None = None


@dataclass
class DocumentArtifact:
    kind: str
    data: dict[str, Any]
    provenance: Provenance
    schema_version: int
    source: str


def describe(path: str | os.PathLike[str]) -> str:
    return "stdin" if str(path) == STDIO else str(path)


def read_input_ref(path: str | os.PathLike[str], data: bytes, kind: str | None = None) -> dict[str, Any]:
    """The provenance entry of an input whose bytes ``data`` were read from ``path`` (and parsed): a regular
    file is named by their digest. A pipe or process substitution is named by its path alone, as
    :func:`input_ref` names it (no cache entry may be keyed on a path that later, different input reuses)."""
    return input_ref(path, kind, digest=hashlib.sha256(data).hexdigest() if Path(path).is_file() else None)


def input_ref(path: str | os.PathLike[str], kind: str | None = None, digest: str | None = None) -> dict[str, Any]:
    """A provenance entry for an input file: its path and sha256 (or a digest computed elsewhere)."""
    ref: dict[str, Any] = {"path": describe(path)}
    if digest is None and str(path) != STDIO and Path(path).is_file():
        if Path(path).stat().st_size > MAX_ARTIFACT_BYTES:  # no input of Arena's is that large: not read at all
            raise ArenaError(f"{path}: refused as an input: larger than {MAX_ARTIFACT_BYTES >> 20} MiB")
        digest = file_sha256(path)
    if digest is not None:
        ref["sha256"] = digest
    if kind is not None:
        ref["kind"] = kind
    return ref


def file_sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------
# Atomic output


#: Temp files and directories are named ``.<target>.<pid>.<random>.tmp`` next to their target (random: the
#: letters and digits mkstemp and mkdtemp draw); one whose process is gone (a killed run's) is removed by the next write
#: of the same target. Arena's own caches also remove names without a pid (an older Arena's) once they are this
#: old; beside a user's output such a name may be the user's own file, and is left alone.
_STALE_TEMP_S = 3600.0
_TEMP_RANDOM = re.compile(r"[a-z0-9_]{6,16}")


def _temp_prefix(name: str) -> str:
    return f".{name}.{os.getpid()}."


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (on this host); one owned by another user counts as alive."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def remove_stale_temps(directory: str | os.PathLike[str], name: str | None = None,
                       stale_after_s: float | None = None) -> list[Path]:
    """Remove the temp files and directories that killed runs left in ``directory`` (for the target ``name``,
    or for every target): those named as Arena names them whose writer's process is gone, and (only where
    ``stale_after_s`` is given: Arena's own cache folders) pid-less ones older than that. Returns what was
    removed; what cannot be removed is left (never an error)."""
    import glob
    import shutil
    import time

    removed = []
    now = time.time()
    for path in Path(directory).glob(f".{glob.escape(name)}.*.tmp" if name is not None else ".*.tmp"):
        parts = path.name[: -len(".tmp")].rsplit(".", 2)  # [".<target>", pid, random] for Arena's own names
        try:
            if len(parts) == 3 and parts[1].isdigit() and _TEMP_RANDOM.fullmatch(parts[2]):
                stale = not pid_alive(int(parts[1]))
            else:
                stale = stale_after_s is not None and now - path.lstat().st_mtime > stale_after_s
            if stale:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
                removed.append(path)
        except OSError:
            continue
    return removed


def is_stream(path: str | os.PathLike[str]) -> bool:
    """Whether writing ``path`` writes a stream that cannot be read back: stdout, a device or a FIFO."""
    # (the link itself first: /dev/stdout on a pipe resolves to a /proc name that realpath cannot follow)
    return str(path) == STDIO or _stream_target(Path(path)) or _stream_target(Path(os.path.realpath(path)))


def _stream_target(target: Path) -> bool:
    """Whether ``target`` exists and is a character/block device or a FIFO (written as a stream)."""
    import stat

    try:
        mode = target.stat().st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode)


def resolve_output(path: str | os.PathLike[str]) -> Path:
    """Where writing ``path`` lands: a symbolic link is followed (its target is written, the link is kept);
    refuses a directory and anything that is neither a regular file, a device nor a FIFO (a socket)."""
    import stat

    target = Path(path)
    if _stream_target(target):  # /dev/stdout, /dev/fd/N, >(cmd): a pipe behind a link realpath cannot name
        return target
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise ArenaError(f"cannot write {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise ArenaError(f"cannot write {path}: it is a directory")
    if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode)):
        raise ArenaError(f"cannot write {path}: it is not a regular file, a device or a FIFO")
    return target


def check_table_output(path: str | os.PathLike[str]) -> None:
    """``check_writable``, and a table output not named as a text file: tables are written as Parquet (an Arrow
    stream on stdout), so ``-o perf.csv`` would be a Parquet file named .csv."""
    if str(path) != STDIO and Path(path).suffix.lower() in (".csv", ".tsv", ".txt", ".json"):
        raise ArenaError(f"-o {path}: tables are written as Parquet (an Arrow stream on stdout); name the output "
                         f"{Path(path).with_suffix('.parquet').name}")
    check_writable(path)


def creation_refused(directory: str | os.PathLike[str], prefix: str) -> str:
    """Why a file cannot be created in ``directory`` ("" when it can): a probe file is made and removed, since
    permissions do not show a read-only mount (or what root may write)."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=".tmp")
    except OSError as exc:
        return str(exc.strerror or exc)
    os.close(fd)
    os.unlink(probe)
    return ""


def check_writable(path: str | os.PathLike[str]) -> None:
    """Fail early (before minutes of work) when ``path`` cannot be written; ``-`` is stdout."""
    if str(path) == STDIO:
        return
    target = resolve_output(path)
    if _stream_target(target):
        return
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ArenaError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ArenaError(f"cannot write {path}: directory {parent} is not writable")
    # what atomic_output will do, tried now: permissions do not tell about a read-only mount (or root's writes)
    refused = creation_refused(parent, _temp_prefix(target.name))
    if refused:
        raise ArenaError(f"cannot write {path}: {refused}")
    if target.exists() and not os.access(target, os.W_OK):
        raise ArenaError(f"cannot write {path}: permission denied")


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Yield a binary file that becomes ``path`` only when the block finishes without error.

    ``-`` yields stdout. A device or a FIFO (``-o /dev/null``, a named pipe) is written as a stream: it is
    never replaced by a regular file. A symbolic link is followed. Otherwise the data goes to a temp file next
    to the target (so the final rename is atomic), and temp files of killed runs are cleaned first. Only the
    file itself is created: its directory must exist.
    """
    if str(path) == STDIO:
        out = sys.stdout.buffer
        yield out
        out.flush()
        return
    target = resolve_output(path)
    if _stream_target(target):
        try:
            stream = open(target, "wb")
        except OSError as exc:
            raise ArenaError(f"cannot write {path}: {exc.strerror or exc}") from None
        try:
            with stream:
                yield stream
                stream.flush()
        except BrokenPipeError:
            raise  # a named pipe's reader went away: the run ends as for stdout's (SIGPIPE, libarena.cli)
        except OSError as exc:
            raise ArenaError(f"cannot write {path}: {exc.strerror or exc}") from None
        return
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ArenaError(f"cannot write {path}: directory {parent} does not exist")
    remove_stale_temps(parent, target.name)
    try:
        fd, tmp_name = tempfile.mkstemp(dir=parent, prefix=_temp_prefix(target.name), suffix=".tmp")
    except OSError as exc:
        raise ArenaError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as tmp:
            yield tmp
            tmp.flush()
            os.fsync(tmp.fileno())
        # mkstemp creates the file 0600; give the result the permissions a plain open() would.
        os.chmod(tmp_name, 0o666 & ~_current_umask())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_overwriting_inputs(output: str | os.PathLike[str] | None, inputs: Mapping[str, Any], *,
                              directory: bool = False, output_flag: str = "-o") -> None:
    """Refuse an output that is one of the inputs (``inputs``: how each is named, e.g. ``--ops``, -> its path;
    None and ``-`` are skipped): the atomic rename would replace the input with the output. A directory
    output (``directory``) is rebuilt as a whole, so it may not hold an input either."""
    if output is None or str(output) == STDIO:
        return
    out = Path(output)
    out_real = Path(os.path.realpath(out))
    for flag, path in inputs.items():
        if path is None:
            continue
        if str(path) == STDIO:
            _refuse_overwriting_stdin(output, out, flag, directory)
            continue
        src = Path(path)
        if _same_file(out, src) or out_real == Path(os.path.realpath(src)):
            raise ArenaError(f"{output_flag} {output} is the input {flag} {path}: refusing to overwrite an input "
                             f"(write the output elsewhere)")
        if directory and out_real in Path(os.path.realpath(src)).parents:
            raise ArenaError(f"-o {output} holds the input {flag} {path}, and the output directory is replaced "
                             f"as a whole: write the output elsewhere")


def _refuse_overwriting_stdin(output: str | os.PathLike[str], out: Path, flag: str, directory: bool) -> None:
    """An input read from stdin is a file when stdin is redirected from one (``< FILE``): the output may not be
    that file (or, for a directory output, hold it) either."""
    import stat

    try:
        st_in = os.fstat(0)
    except OSError:
        return  # no stdin at all
    if not stat.S_ISREG(st_in.st_mode):
        return  # a pipe or a terminal: nothing to overwrite
    try:
        st_out = os.stat(out)
    except OSError:
        return  # the output does not exist yet
    if (st_out.st_dev, st_out.st_ino) == (st_in.st_dev, st_in.st_ino):
        raise ArenaError(f"-o {output} is the file on stdin ({flag} -): refusing to overwrite an input "
                         f"(write the output elsewhere)")
    if directory and stat.S_ISDIR(st_out.st_mode):
        for root, _, files in os.walk(out):
            for name in files:
                with contextlib.suppress(OSError):
                    st = os.stat(os.path.join(root, name))
                    if (st.st_dev, st.st_ino) == (st_in.st_dev, st_in.st_ino):
                        raise ArenaError(f"-o {output} holds the file on stdin ({flag} -), and the output "
                                         f"directory is replaced as a whole: write the output elsewhere")


def foreign_files(directory: Path, replaceable: Callable[[str], bool]) -> list[str]:
    """The files under ``directory`` (relative paths, sorted) that ``replaceable`` does not accept."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if (p.is_symlink() or not p.is_dir()) and not replaceable(str(p.relative_to(directory))))


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str], replaceable: Callable[[str], bool]) -> Iterator[Path]:
    """Yield an empty temp directory that becomes the directory ``path`` only when the block finishes without
    error (a killed or failed run leaves the previous ``path``, or nothing, never a half-written one).

    An existing ``path`` is replaced only when every file under it is one this kind of output writes
    (``replaceable(relative path)``): other files are never deleted, the run is refused instead. Only the last
    component is created (the parent must exist). Temp directories of killed runs are cleaned first.
    """
    import shutil

    if str(path) == STDIO:
        raise ArenaError("-o -: this command writes a directory of files, which cannot go to stdout; "
                         "give a directory name")
    target = Path(os.path.realpath(path))  # links followed, "." and ".." resolved: the directory really written
    parent = target.parent
    if not parent.is_dir():
        raise ArenaError(f"cannot write {path}/: directory {parent} does not exist (only the output directory "
                         f"itself is created)")
    if target.exists():
        if not target.is_dir():
            raise ArenaError(f"cannot write {path}/: it exists and is not a directory")
        foreign = foreign_files(target, replaceable)
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise ArenaError(f"cannot write {path}/: it holds files this command does not write ({shown}); "
                             f"the output directory is replaced as a whole, so choose another or empty it")
    remove_stale_temps(parent, target.name)
    try:
        staging = Path(tempfile.mkdtemp(dir=parent, prefix=_temp_prefix(target.name), suffix=".tmp"))
    except OSError as exc:
        raise ArenaError(f"cannot write {path}/: {exc.strerror or exc}") from None
    try:
        yield staging
        os.chmod(staging, 0o777 & ~_current_umask())
        if target.exists() and exchange_paths(staging, target):
            # one atomic swap: ``path`` is the previous output or the new one at every moment; the staging
            # directory now holds the previous one (a run killed before removing it leaves a stale temp)
            shutil.rmtree(staging, ignore_errors=True)
            return
        old = None
        if target.exists():  # (no atomic swap here: a kill between these two renames leaves no ``path``)
            old = Path(tempfile.mkdtemp(dir=parent, prefix=_temp_prefix(target.name), suffix=".tmp"))
            os.rename(target, old / "previous")
        os.rename(staging, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


#: renameat2's flag that swaps two existing paths, and the "relative to the working directory" descriptor
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange_paths(first: str | os.PathLike[str], second: str | os.PathLike[str]) -> bool:
    """Swap two existing paths in one atomic step (Linux's ``renameat2`` with ``RENAME_EXCHANGE``): True when
    done, False where this system or filesystem cannot (the caller then renames in two steps)."""
    import ctypes
    import errno

    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library without it (glibc < 2.28, musl before 1.2.3)
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # no such call, or a filesystem without the flag
        return False
    raise OSError(code, os.strerror(code), os.fspath(first), None, os.fspath(second))


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(path: str | os.PathLike[str], payload: bytes) -> None:
    with atomic_output(path) as out:
        out.write(payload)


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Atomically write plain JSON (bench results, exports); sorted keys keep output deterministic."""
    write_bytes(path, _json_text(data).encode())


def _json_text(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=json_default) + "\n"


def json_default(value: Any) -> Any:
    """JSON/msgpack fallback for numpy scalars and arrays."""
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# --------------------------------------------------------------------------------------------------
# Tables


def conform_table(kind: ArtifactKind, table: pa.Table, *, source: str, fill_defaults: bool = False) -> pa.Table:
    """Check ``table`` against the kind's columns, cast to the declared types and order the columns."""
    seen: set[str] = set()
    for name in table.column_names:
        if name in seen:
            raise ArenaError(f"{source}: column {name!r} appears more than once")
        seen.add(name)
    arrays = []
    missing = []
    for col in kind.columns:
        if col.name in table.column_names:
            arr = table.column(col.name)
            if arr.type != col.arrow_type:
                try:
                    arr = arr.cast(col.arrow_type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                    raise ArenaError(
                        f"{source}: column {col.name!r} has type {arr.type}, expected {col.type} for a {kind.name}"
                    ) from None
            arrays.append(arr)
        elif not col.required or fill_defaults and col.default is not None:
            if col.required and col.default is None:
                missing.append(col.name)
                continue
            arrays.append(pa.array([col.default] * table.num_rows, type=col.arrow_type))
        else:
            missing.append(col.name)
    if missing:
        raise ArenaError(f"{source}: not a {kind.name} table: missing column(s) {', '.join(missing)}")
    return pa.Table.from_arrays(arrays, schema=kind.arrow_schema())


def _metadata_blob(kind: ArtifactKind, provenance: Provenance, metadata: Mapping[str, Any]) -> bytes:
    return json.dumps(
        {"kind": kind.name, "schema_version": kind.version, "provenance": asdict(provenance), "metadata": dict(metadata)},
        sort_keys=True,
        default=json_default,
    ).encode()


def write_table(
    path: str | os.PathLike[str],
    kind: str,
    table: pa.Table,
    provenance: Provenance,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Write a table artifact: Parquet to a file, an Arrow IPC stream to stdout (``-``)."""
    spec = get_kind(kind)
    if spec.format != "table":
        raise ValueError(f"{kind} is not a table artifact")
    table = conform_table(spec, table, source=f"writing {describe(path)}")
    table = table.replace_schema_metadata({METADATA_KEY: _metadata_blob(spec, provenance, metadata or {})})
    with atomic_output(path) as out:
        if str(path) == STDIO:
            with ipc.new_stream(out, table.schema) as writer:
                writer.write_table(table)
        else:
            pq.write_table(table, out, compression="zstd")


def _read_input_bytes(path: str | os.PathLike[str]) -> bytes:
    if str(path) == STDIO:
        return read_bounded(path, MAX_ARTIFACT_BYTES, "artifact piped from the previous stage", stdin=True)
    return read_bounded(path, MAX_ARTIFACT_BYTES, "artifact", noun="file")


def _arena_header(schema_metadata: Mapping[bytes, bytes] | None, source: str) -> dict[str, Any] | None:
    if not schema_metadata or METADATA_KEY not in schema_metadata:
        return None
    try:
        header = json.loads(schema_metadata[METADATA_KEY])
        if not _valid_header(header):
            raise ValueError
        return header
    except (ValueError, RecursionError):  # a hostile header may nest too deeply for the JSON parser
        raise ArenaError(f"{source}: corrupt Arena metadata") from None


#: how deeply an artifact's header may nest (Arena's own nest a few levels; the JSON parser takes about a thousand,
#: deeper than the recursive code that later walks a header, such as dataclasses.asdict, can go)
MAX_HEADER_DEPTH = 64


def _valid_header(header: Any) -> bool:
    """The envelope every artifact carries: kind and version, and mappings for metadata and provenance, nested
    at most MAX_HEADER_DEPTH levels."""
    return (isinstance(header, dict) and "kind" in header and "schema_version" in header
            and isinstance(header.get("metadata", {}), dict) and isinstance(header.get("provenance", {}), dict)
            and _nests_within(header, MAX_HEADER_DEPTH))


def _nests_within(value: Any, limit: int) -> bool:
    """Whether ``value``'s lists and dicts nest at most ``limit`` levels (without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return False
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return True


_KIND_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def _check_header(header: dict[str, Any], expect: tuple[str, ...], source: str) -> ArtifactKind:
    from libarena.checks import brief

    found = header["kind"]
    if not isinstance(found, str) or not _KIND_NAME.fullmatch(found):  # a kind's name is a short word: else garbage
        raise ArenaError(f"{source}: corrupt Arena metadata (its kind is {brief(found)})")
    if found not in expect:
        raise ArenaError(f"{source}: is a {found} artifact, expected {' or '.join(expect)}")
    spec = get_kind(found)
    version = header["schema_version"]
    # an integer (not True, 1.0 or "1"): a header names the version it was written in exactly
    if type(version) is not int or version not in spec.readable_versions():
        readable = " and ".join(str(v) for v in spec.readable_versions())
        shown = version if type(version) is int else brief(version)
        raise ArenaError(
            f"{source}: {found} schema version {shown} is not supported (this Arena reads version {readable}; "
            f"re-run {spec.produced_by} to regenerate it)"
        )
    return spec


def _too_large(source: str, max_rows: int) -> ArenaError:
    return ArenaError(f"{source}: refused: the table decodes to more than {max_rows:,} rows or "
                      f"{MAX_DECODED_BYTES >> 20} MiB (far more than such a table holds)")


def _bounded_batches(batches: Iterable[pa.RecordBatch], source: str, max_rows: int) -> Iterator[pa.RecordBatch]:
    """``batches`` as they decode, refused once past ``max_rows`` or MAX_DECODED_BYTES."""
    rows = size = 0
    for batch in batches:
        rows += batch.num_rows
        size += batch.nbytes
        if rows > max_rows or size > MAX_DECODED_BYTES:
            raise _too_large(source, max_rows)
        yield batch


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _has_dictionary(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return True
    return any(_has_dictionary(t.field(i).type) for i in range(t.num_fields))


def _expanded_bytes(array: pa.Array) -> int:
    """What ``array`` takes once its dictionaries are decoded: each text value counted at its length for every
    entry that holds it, inside lists and structs too."""
    import pyarrow.compute as pc

    t = array.type
    if pa.types.is_dictionary(t):
        if _is_text(t.value_type):
            lengths = pc.binary_length(array.dictionary)
            return (pc.sum(pc.take(lengths, array.indices)).as_py() or 0) + 8 * len(array)
        return len(array) * -(-array.dictionary.nbytes // max(1, len(array.dictionary)))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return 8 * (len(array) + 1) + _expanded_bytes(array.flatten())
    if pa.types.is_struct(t):
        return len(array) + sum(_expanded_bytes(field) for field in array.flatten())
    return array.nbytes


def _check_expanded_size(table: pa.Table, source: str, max_rows: int) -> None:
    """Refuse a table whose dictionary-encoded columns (at the top or inside lists and structs) would expand past
    MAX_DECODED_BYTES once decoded (what reading or casting them does)."""
    total = 0
    for column in table.columns:
        if not _has_dictionary(column.type):
            total += column.nbytes
        else:
            for chunk in column.chunks:
                total += _expanded_bytes(chunk)
                if total > MAX_DECODED_BYTES:
                    break
        if total > MAX_DECODED_BYTES:
            raise _too_large(source, max_rows)


def _decode_table(data: bytes, source: str, max_rows: int) -> pa.Table:
    try:
        if data[:4] == _PARQUET_MAGIC:
            # use_threads=False: reading through a Python file object with Arrow's thread pool can abort or
            # hang the interpreter at exit (apache/arrow#34314, #50482); artifacts are small enough for one thread.
            parquet = pq.ParquetFile(io.BytesIO(data))
            if parquet.metadata.num_rows > max_rows:  # the footer says so: refused before decoding
                raise _too_large(source, max_rows)
            schema = parquet.schema_arrow
            # Text is decoded as its dictionary first, at the top level and inside lists (a list<string> column's
            # leaf): one long value repeated over a column compresses to a few kilobytes and would expand to
            # gigabytes in the first batch, before any size check.
            leaves = [parquet.schema.column(i) for i in range(len(parquet.schema))]
            texts = [leaf.path for leaf in leaves if leaf.physical_type == "BYTE_ARRAY"
                     and str(leaf.logical_type) in ("String", "None")]
            if texts:
                parquet = pq.ParquetFile(io.BytesIO(data), read_dictionary=texts)
            batches = list(_bounded_batches(parquet.iter_batches(batch_size=_DECODE_BATCH_ROWS, use_threads=False),
                                            source, max_rows))
            table = pa.Table.from_batches(batches) if batches else schema.empty_table()
            _check_expanded_size(table, source, max_rows)
            table = pa.table([c.cast(f.type) if c.type != f.type else c for f, c in zip(schema, table.columns)],
                             schema=schema)
            # the file's own schema metadata (Arena's header) is kept as pq.read_table keeps it
            table = table.replace_schema_metadata(schema.metadata)
        elif data[:4] == _IPC_STREAM_MAGIC:
            reader = ipc.open_stream(io.BytesIO(data))
            table = pa.Table.from_batches(list(_bounded_batches(reader, source, max_rows)), schema=reader.schema)
            _check_expanded_size(table, source, max_rows)
        else:
            raise ArenaError(f"{source}: not a Parquet file or Arrow stream")
        table.column_names  # noqa: B018 - names are decoded lazily: a damaged one must fail here, not deep inside
    except (pa.ArrowException, OSError) as exc:
        raise ArenaError(f"{source}: unreadable table ({' '.join(str(exc).split())[:200]})") from None
    except UnicodeDecodeError:
        raise ArenaError(f"{source}: unreadable table (a column name is not UTF-8 text)") from None
    # A damaged file can decode into arrays that fail only when used (text that is not UTF-8, offsets out of
    # range: a cast of those can crash the interpreter), so every column is checked in full before anything
    # casts, upgrades or reads it (linear in the data: milliseconds for tables of megabytes).
    for name, column in zip(table.column_names, table.columns):
        try:
            column.validate(full=True)
        except pa.ArrowException as exc:
            raise ArenaError(f"{source}: column {name!r} is damaged ({' '.join(str(exc).split())[:160]})") from None
    return table


def _read_csv(data: bytes, source: str) -> pa.Table:
    import pyarrow.csv as pacsv

    try:
        return pacsv.read_csv(io.BytesIO(data), read_options=pacsv.ReadOptions(use_threads=False))
    except (pa.ArrowException, UnicodeDecodeError) as exc:
        raise ArenaError(f"{source}: unreadable CSV ({' '.join(str(exc).split())[:200]})") from None


def read_table(path: str | os.PathLike[str], expect: str | tuple[str, ...]) -> TableArtifact:
    """Read a table artifact of one of the ``expect``ed kinds.

    For an importable kind (say a performance table measured elsewhere), a CSV or a Parquet file without
    Arena metadata is accepted when it has the kind's required columns; optional columns take defaults.
    """
    kinds = (expect,) if isinstance(expect, str) else tuple(expect)
    source = describe(path)
    max_rows = max(get_kind(k).max_rows for k in kinds)
    data = _read_input_bytes(path)
    artifact = _table_from_bytes(data, kinds, source, max_rows)
    if str(path) != STDIO:
        artifact.content_sha256 = read_input_ref(path, data).get("sha256")
    return artifact


def _table_from_bytes(data: bytes, kinds: tuple[str, ...], source: str, max_rows: int) -> TableArtifact:
    if data[:4] not in (_PARQUET_MAGIC, _IPC_STREAM_MAGIC):
        importable = [get_kind(k) for k in kinds if get_kind(k).importable]
        if importable and _looks_like_text(data):
            table = _read_csv(data, source)
            if table.num_rows > max_rows:
                raise _too_large(source, max_rows)
            spec = importable[0]
            table = conform_table(spec, table, source=source, fill_defaults=True)
            return TableArtifact(spec.name, table, Provenance(tool="import"), {}, spec.version, source, native=False)
        raise ArenaError(f"{source}: not a {' or '.join(kinds)} artifact (not a Parquet file or Arrow stream)")
    table = _decode_table(data, source, max_rows)
    header = _arena_header(table.schema.metadata, source)
    if header is None:
        importable = [get_kind(k) for k in kinds if get_kind(k).importable]
        if not importable:
            raise ArenaError(f"{source}: not an Arena artifact (no Arena metadata), expected {' or '.join(kinds)}")
        spec = importable[0]
        table = conform_table(spec, table.replace_schema_metadata(None), source=source, fill_defaults=True)
        return TableArtifact(spec.name, table, Provenance(tool="import"), {}, spec.version, source, native=False)
    spec = _check_header(header, kinds, source)
    if spec.format != "table":
        raise ArenaError(f"{source}: {spec.name} is not a table")
    table, metadata = table.replace_schema_metadata(None), dict(header.get("metadata", {}))
    if header["schema_version"] != spec.version:
        try:
            table, metadata = spec.upgrade(header["schema_version"], table, metadata)
        except (KeyError, TypeError, ValueError, OverflowError, IndexError, pa.ArrowException) as exc:
            raise ArenaError(f"{source}: cannot read this {spec.name} of schema version {header['schema_version']} "
                             f"({type(exc).__name__}: {str(exc)[:200]}); re-run {spec.produced_by} to regenerate it") from None
    table = conform_table(spec, table, source=source)
    return TableArtifact(spec.name, table, Provenance.from_dict(header.get("provenance", {})), metadata, spec.version, source)


def check_columns(table: pa.Table, source: str, *, non_null: tuple[str, ...] = (),
                  non_negative: tuple[str, ...] = (), positive: tuple[str, ...] = ()) -> None:
    """One-line ArenaError naming the first bad row and column: nulls, NaN/inf, negative or non-positive numbers.

    ``read_table`` checks names and types; the reader of a kind states which values it can compute with.
    """
    import numpy as np

    for name in dict.fromkeys(non_null + non_negative + positive):
        if name not in table.column_names:
            continue
        column = table.column(name)
        if column.null_count:
            row = next(i for i, v in enumerate(column.is_null().to_pylist()) if v)
            raise ArenaError(f"{source}: row {row + 1}, column {name!r}: missing value")
        if name not in non_negative and name not in positive:
            continue
        values = column.to_numpy(zero_copy_only=False).astype(np.float64)
        bad = ~np.isfinite(values) | (values < 0 if name in non_negative else values <= 0)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            need = "a finite number >= 0" if name in non_negative else "a finite number > 0"
            raise ArenaError(f"{source}: row {row + 1}, column {name!r}: {float(values[row])!r} is not {need}")


def _looks_like_text(data: bytes) -> bool:
    head = data[:4096]
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if b"," in head:
        return True
    try:
        return bool(csv.Sniffer().has_header(head.decode("utf-8", "replace")))
    except csv.Error:  # the sniffer gives up on text it cannot split (one column, no delimiter)
        return False


# --------------------------------------------------------------------------------------------------
# msgpack documents


def write_document(path: str | os.PathLike[str], kind: str, data: Mapping[str, Any], provenance: Provenance) -> None:
    spec = get_kind(kind)
    if spec.format != "msgpack":
        raise ValueError(f"{kind} is not a msgpack artifact")
    envelope = {
        "arena": {"kind": spec.name, "schema_version": spec.version, "provenance": asdict(provenance)},
        "data": dict(data),
    }
    write_bytes(path, msgpack.packb(envelope, use_bin_type=True, default=json_default))


def read_document(path: str | os.PathLike[str], expect: str | tuple[str, ...]) -> DocumentArtifact:
    kinds = (expect,) if isinstance(expect, str) else tuple(expect)
    source = describe(path)
    data = _read_input_bytes(path)
    try:
        envelope = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        # (TypeError: a map whose key is a map or an array, which Python cannot hash)
        raise ArenaError(f"{source}: not a msgpack artifact ({type(exc).__name__})") from None
    if not isinstance(envelope, dict) or not isinstance(envelope.get("arena"), dict) or "data" not in envelope:
        raise ArenaError(f"{source}: not an Arena artifact, expected {' or '.join(kinds)}")
    header = envelope["arena"]
    if not _valid_header(header):
        raise ArenaError(f"{source}: corrupt Arena metadata")
    spec = _check_header(header, kinds, source)
    if not isinstance(envelope["data"], dict):
        raise ArenaError(f"{source}: corrupt {spec.name} document")
    return DocumentArtifact(
        spec.name, envelope["data"], Provenance.from_dict(header.get("provenance", {})), spec.version, source
    )


# --------------------------------------------------------------------------------------------------
# JSON documents: the fields at the top level (readers pick keys), the header beside them


def json_document(kind: str, data: Mapping[str, Any], provenance: Provenance) -> dict[str, Any]:
    """``data`` headed by its kind, schema version and provenance under ``arena``, its fields left at the top level."""
    spec = get_kind(kind)
    if spec.format != "json":
        raise ValueError(f"{kind} is not a JSON artifact")
    if _HEADER_KEY in data:
        raise ValueError(f"a {kind} document cannot hold a field named {_HEADER_KEY!r}")
    header = {"kind": spec.name, "schema_version": spec.version, "provenance": asdict(provenance)}
    return {_HEADER_KEY: header, **data}


def write_json_document(path: str | os.PathLike[str], kind: str, data: Mapping[str, Any], provenance: Provenance) -> None:
    """``data`` as a ``kind`` document; what its reader would refuse (a field missing or of another type) is a
    ValueError here instead, a writer's bug found before the file exists."""
    text = _json_text(json_document(kind, data, provenance))
    written = json.loads(text)  # as the reader will see it (numpy scalars as JSON numbers)
    spec = get_kind(kind)
    try:
        _check_fields(spec, {k: v for k, v in written.items() if k != _HEADER_KEY}, describe(path),
                      required=tuple(f.name for f in spec.fields))
    except ArenaError as exc:
        raise ValueError(str(exc)) from None
    write_bytes(path, text.encode())


def read_json_document(path: str | os.PathLike[str], expect: str | tuple[str, ...]) -> DocumentArtifact:
    """A JSON document ``write_json_document`` wrote, or one Arena wrote before the header (a kind's
    ``headerless_fields`` all present: version 0, empty provenance); its fields are checked against the kind's
    declared types, and a headed one must hold every declared field. Anything else is a one-line error."""
    from libarena.checks import brief

    kinds = (expect,) if isinstance(expect, str) else tuple(expect)
    for name in kinds:
        if get_kind(name).format != "json":
            raise ValueError(f"{name} is not a JSON artifact")
    source = describe(path)
    wanted = " or ".join(kinds)
    limit = min((get_kind(k).max_bytes or MAX_ARTIFACT_BYTES) for k in kinds)
    data = read_bounded(path, limit, f"{wanted} document", stdin=True, noun="file")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ArenaError(f"{source}: not a {wanted} document ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(doc, dict):
        raise ArenaError(f"{source}: not a {wanted} document (a JSON {type(doc).__name__}, not an object)")
    header = doc.get(_HEADER_KEY)
    body = {k: v for k, v in doc.items() if k != _HEADER_KEY}
    if header is None:
        for name in kinds:
            spec = get_kind(name)
            if spec.headerless_fields and all(f in body for f in spec.headerless_fields):
                _check_fields(spec, body, source, required=spec.headerless_fields)
                return DocumentArtifact(name, body, Provenance(tool="", arena_version=""), 0, source)
        expected = "; ".join(f"{k}: {', '.join(get_kind(k).headerless_fields)}" for k in kinds
                             if get_kind(k).headerless_fields)
        raise ArenaError(f"{source}: not a {wanted} document (no {_HEADER_KEY!r} header"
                         + (f", nor the fields of one written before it ({expected})" if expected else "") + ")")
    if not _valid_header(header):
        raise ArenaError(f"{source}: corrupt Arena metadata (its {_HEADER_KEY!r} header is {brief(header)})")
    spec = _check_header(header, kinds, source)
    if header["schema_version"] < 1:  # version 0 is a file without the header, never one that says so
        raise ArenaError(f"{source}: corrupt Arena metadata (a {spec.name} header of schema version 0)")
    _check_fields(spec, body, source, required=tuple(f.name for f in spec.fields))
    return DocumentArtifact(spec.name, body, Provenance.from_dict(header.get("provenance", {})),
                            header["schema_version"], source)


def _check_fields(spec: ArtifactKind, body: Mapping[str, Any], source: str, required: tuple[str, ...]) -> None:
    """Each of ``required`` present and every declared field of ``body`` of its declared type
    (registry.json_field_matches): what reads the document indexes and formats them."""
    missing = [name for name in required if name not in body]
    if missing:
        raise ArenaError(f"{source}: corrupt {spec.name} document (no field {', '.join(missing[:5])}"
                         f"{', ...' if len(missing) > 5 else ''})")
    for field_spec in spec.fields:
        if field_spec.name in body and not json_field_matches(body[field_spec.name], field_spec.type):
            raise ArenaError(f"{source}: corrupt {spec.name} document (field {field_spec.name!r} is a "
                             f"{type(body[field_spec.name]).__name__}, expected {field_spec.type})")


def content_digest(*parts: Any) -> str:
    """A stable sha256 over JSON-able parts: the key of every content-addressed cache."""
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=json_default).encode())
        h.update(b"\x1f")
    return h.hexdigest()
