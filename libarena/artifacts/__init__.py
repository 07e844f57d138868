"""Reading and writing every Arena artifact (tables, msgpack documents), with schema versions and provenance."""

from libarena.artifacts.io import (
    STDIO,
    DocumentArtifact,
    Provenance,
    TableArtifact,
    atomic_output,
    check_columns,
    content_digest,
    file_sha256,
    input_ref,
    read_document,
    read_table,
    write_bytes,
    write_document,
    write_json,
    write_table,
)
from libarena.artifacts.registry import ArtifactKind, Column, Field, all_kinds, get_kind, register_kind

__all__ = [
    "STDIO",
    "ArtifactKind",
    "Column",
    "DocumentArtifact",
    "Field",
    "Provenance",
    "TableArtifact",
    "all_kinds",
    "atomic_output",
    "check_columns",
    "content_digest",
    "file_sha256",
    "get_kind",
    "input_ref",
    "read_document",
    "read_table",
    "register_kind",
    "write_bytes",
    "write_document",
    "write_json",
    "write_table",
]
