"""The one place that reads and writes artifacts.

Tables are Parquet files (an Arrow IPC stream when written to stdout), msgpack documents hold plans and
decisions. Every artifact carries, in its metadata under the key ``arena``: its kind, schema version,
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
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgpack
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from libarena import __version__
from libarena.artifacts.registry import ArtifactKind, get_kind
from libarena.errors import ArenaError

METADATA_KEY = b"arena"
STDIO = "-"
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


@dataclass
class DocumentArtifact:
    kind: str
    data: dict[str, Any]
    provenance: Provenance
    schema_version: int
    source: str


def describe(path: str | os.PathLike[str]) -> str:
    return "stdin" if str(path) == STDIO else str(path)


def input_ref(path: str | os.PathLike[str], kind: str | None = None, digest: str | None = None) -> dict[str, Any]:
    """A provenance entry for an input file: its path and sha256 (or a digest computed elsewhere)."""
    ref: dict[str, Any] = {"path": describe(path)}
    if digest is None and str(path) != STDIO and Path(path).is_file():
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


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Yield a binary file that becomes ``path`` only when the block finishes without error.

    ``-`` yields stdout. The temp file lives next to the target so the final rename is atomic.
    """
    if str(path) == STDIO:
        out = sys.stdout.buffer
        yield out
        out.flush()
        return
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ArenaError(f"cannot write {target}: directory {parent} does not exist")
    if target.is_dir():
        raise ArenaError(f"cannot write {target}: it is a directory")
    try:
        fd, tmp_name = tempfile.mkstemp(dir=parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise ArenaError(f"cannot write {target}: {exc.strerror or exc}") from None
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


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(path: str | os.PathLike[str], payload: bytes) -> None:
    with atomic_output(path) as out:
        out.write(payload)


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Atomically write plain JSON (bench results, exports); sorted keys keep output deterministic."""
    write_bytes(path, (json.dumps(data, indent=2, sort_keys=True, default=json_default) + "\n").encode())


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
        data = sys.stdin.buffer.read()
        if not data:
            raise ArenaError("stdin is empty: expected an artifact piped from the previous stage")
        return data
    p = Path(path)
    if not p.exists():
        raise ArenaError(f"{p}: no such file")
    if p.is_dir():
        raise ArenaError(f"{p}: is a directory, expected a file")
    return p.read_bytes()


def _arena_header(schema_metadata: Mapping[bytes, bytes] | None, source: str) -> dict[str, Any] | None:
    if not schema_metadata or METADATA_KEY not in schema_metadata:
        return None
    try:
        header = json.loads(schema_metadata[METADATA_KEY])
        if not _valid_header(header):
            raise ValueError
        return header
    except ValueError:
        raise ArenaError(f"{source}: corrupt Arena metadata") from None


def _valid_header(header: Any) -> bool:
    """The envelope every artifact carries: kind and version, and mappings for metadata and provenance."""
    return (isinstance(header, dict) and "kind" in header and "schema_version" in header
            and isinstance(header.get("metadata", {}), dict) and isinstance(header.get("provenance", {}), dict))


def _check_header(header: dict[str, Any], expect: tuple[str, ...], source: str) -> ArtifactKind:
    found = str(header["kind"])
    if found not in expect:
        raise ArenaError(f"{source}: is a {found} artifact, expected {' or '.join(expect)}")
    spec = get_kind(found)
    version = header["schema_version"]
    if version not in spec.readable_versions():
        readable = " and ".join(str(v) for v in spec.readable_versions())
        raise ArenaError(
            f"{source}: {found} schema version {version} is not supported (this Arena reads version {readable}; "
            f"re-run {spec.produced_by} to regenerate it)"
        )
    return spec


def _decode_table(data: bytes, source: str) -> pa.Table:
    try:
        if data[:4] == _PARQUET_MAGIC:
            # use_threads=False: reading through a Python file object with Arrow's thread pool can abort or
            # hang the interpreter at exit (apache/arrow#34314, #50482); artifacts are small enough for one thread.
            return pq.read_table(io.BytesIO(data), use_threads=False)
        if data[:4] == _IPC_STREAM_MAGIC:
            return ipc.open_stream(io.BytesIO(data)).read_all()
    except (pa.ArrowException, OSError) as exc:
        raise ArenaError(f"{source}: unreadable table ({' '.join(str(exc).split())[:200]})") from None
    raise ArenaError(f"{source}: not a Parquet file or Arrow stream")


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
    data = _read_input_bytes(path)
    if data[:4] not in (_PARQUET_MAGIC, _IPC_STREAM_MAGIC):
        importable = [get_kind(k) for k in kinds if get_kind(k).importable]
        if importable and _looks_like_text(data):
            table = _read_csv(data, source)
            spec = importable[0]
            table = conform_table(spec, table, source=source, fill_defaults=True)
            return TableArtifact(spec.name, table, Provenance(tool="import"), {}, spec.version, source, native=False)
        raise ArenaError(f"{source}: not a {' or '.join(kinds)} artifact (not a Parquet file or Arrow stream)")
    table = _decode_table(data, source)
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
        except (KeyError, TypeError, ValueError, pa.ArrowException) as exc:
            raise ArenaError(f"{source}: cannot read this {spec.name} of schema version {header['schema_version']} "
                             f"({type(exc).__name__}: {exc}); re-run {spec.produced_by} to regenerate it") from None
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
            raise ArenaError(f"{source}: row {row + 1}, column {name!r}: {values[row]!r} is not {need}")


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
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
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


def content_digest(*parts: Any) -> str:
    """A stable sha256 over JSON-able parts: the key of every content-addressed cache."""
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=json_default).encode())
        h.update(b"\x1f")
    return h.hexdigest()
