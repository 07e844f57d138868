"""Artifact kinds: every file Arena writes is of a registered kind with a versioned, documented schema.

A kind declares its columns (tables) or top-level fields (msgpack and JSON documents). ``schemas/`` is generated
from this registry (``make schemas``) and a test fails when the two drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, Literal

import pyarrow as pa

from libarena.registry import Registry

#: Arrow types by the short names used in column declarations (and in schemas/).
ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "list<int64>": pa.list_(pa.int64()),
    "list<float64>": pa.list_(pa.float64()),
    "list<string>": pa.list_(pa.string()),
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: the scalar types a JSON document's fields may declare (besides dict[...] and list[...]), each with what a
#: field of it may hold: the one list register_kind and the readers (json_field_matches) both go by
JSON_SCALARS: dict[str, Callable[[Any], bool]] = {
    "str": lambda value: isinstance(value, str),
    "int": lambda value: isinstance(value, int) and not isinstance(value, bool),
    "float": lambda value: value is None or _is_number(value),  # NaN is written as null
}


def json_field_matches(value: Any, declared: str) -> bool:
    """Whether a JSON document's field holds a value of its ``declared`` type (a JSON_SCALARS name, ``dict[...]``
    (``dict[str, dict]``: every value an object too) or ``list[...]``)."""
    if declared in JSON_SCALARS:
        return JSON_SCALARS[declared](value)
    if declared == "dict[str, dict]":
        return isinstance(value, dict) and all(isinstance(v, dict) for v in value.values())
    if declared.startswith("dict["):
        return isinstance(value, dict)
    return declared.startswith("list[") and isinstance(value, list)


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    description: str
    required: bool = True
    #: Value used when an optional column is missing from an imported (foreign) table.
    default: Any = None

    @property
    def arrow_type(self) -> pa.DataType:
        return ARROW_TYPES[self.type]


@dataclass(frozen=True)
class Field:
    """A documented top-level field of a msgpack or JSON document, or a metadata entry of a table."""

    name: str
    type: str
    description: str


#: An upgrade of a table artifact by one schema version: (table, metadata) of version v -> of version v + 1.
Upgrade = Callable[[pa.Table, dict[str, Any]], tuple[pa.Table, dict[str, Any]]]


@dataclass(frozen=True)
class ArtifactKind:
    name: str
    version: int
    #: table: Parquet (Arrow IPC on a pipe); msgpack: {"arena": header, "data": fields}; json: a small summary
    #: people and scripts read, its fields at the top level beside the "arena" header
    format: Literal["table", "msgpack", "json"]
    description: str
    produced_by: str
    columns: tuple[Column, ...] = ()
    #: For tables: documented entries of the ``metadata`` mapping; for documents: their fields.
    fields: tuple[Field, ...] = ()
    #: Columns may be imported from CSV/Parquet written outside Arena (e.g. a measured perf table).
    importable: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Readers of older versions: ``(v, upgrade)`` turns a version-v table into version v + 1 (tables only).
    upgrades: tuple[tuple[int, Upgrade], ...] = ()
    #: The most rows a table of this kind is read with (a small compressed file can decode to millions of rows):
    #: well above what Arena writes
    max_rows: int = 1_000_000
    #: The largest file of this kind read (None: the bound every artifact has, libarena.artifacts.io)
    max_bytes: int | None = None
    #: JSON documents Arena wrote before they carried the header: the fields such a file always held. A file
    #: without the header but with these reads as version 0, without provenance.
    headerless_fields: tuple[str, ...] = ()

    def readable_versions(self) -> list[int]:
        """This version and every older one a chain of upgrades reaches (and 0 for headerless documents)."""
        steps = dict(self.upgrades)
        out = [self.version]
        while out[-1] - 1 in steps:
            out.append(out[-1] - 1)
        if self.headerless_fields and 0 not in out:
            out.append(0)
        return sorted(out)

    def upgrade(self, version: int, table: pa.Table, metadata: dict[str, Any]) -> tuple[pa.Table, dict[str, Any]]:
        """A version-``version`` table and metadata brought to this version."""
        steps = dict(self.upgrades)
        while version < self.version:
            table, metadata = steps[version](table, metadata)
            version += 1
        return table, metadata

    def column(self, name: str) -> Column:
        for col in self.columns:
            if col.name == name:
                return col
        raise KeyError(name)

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.arrow_type) for c in self.columns])


def _load_builtin_kinds() -> None:
    # The kinds live in libarena.artifacts.kinds.*, one module per artifact, each calling register_kind.
    import libarena.artifacts.kinds  # noqa: F401


KINDS: Registry[ArtifactKind] = Registry("artifact kind", _load_builtin_kinds)


def register_kind(kind: ArtifactKind) -> ArtifactKind:
    if kind.headerless_fields and kind.format != "json":
        raise ValueError(f"artifact kind {kind.name!r}: only JSON documents are read without a header")
    for fld in kind.fields if kind.format == "json" else ():
        # the types libarena.artifacts.io checks a JSON document's fields against: no field goes unchecked
        if fld.type not in JSON_SCALARS and not fld.type.startswith(("dict[", "list[")):
            raise ValueError(f"artifact kind {kind.name!r}: field {fld.name!r} has unknown type {fld.type!r}")
    for col in kind.columns:
        if col.type not in ARROW_TYPES:
            raise ValueError(f"artifact kind {kind.name!r}: column {col.name!r} has unknown type {col.type!r}")
    return KINDS.register(kind.name, kind)


def get_kind(name: str) -> ArtifactKind:
    return KINDS.get(name)


def all_kinds() -> list[ArtifactKind]:
    return [kind for _, kind in KINDS.items()]
