"""Generate ``schemas/<kind>.json`` from the artifact registry: ``python -m libarena.artifacts.schema_docs schemas``.

tests/test_schemas.py compares the committed files with this output, so the docs cannot drift from the code.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from libarena.artifacts.registry import ArtifactKind, all_kinds


FORMATS = {"table": "Parquet (Arrow IPC stream on stdout)", "msgpack": "msgpack", "json": "JSON"}
_PROVENANCE = "provenance {tool, arena_version, inputs, parameters}"
HEADERS = {
    "table": f"arena (JSON: kind, schema_version, {_PROVENANCE}, metadata)",
    "msgpack": f"arena (JSON: kind, schema_version, {_PROVENANCE}, metadata)",
    "json": f"arena (an object beside the fields: kind, schema_version, {_PROVENANCE})",
}


def kind_document(kind: ArtifactKind) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "kind": kind.name,
        "schema_version": kind.version,
        "format": FORMATS[kind.format],
        "produced_by": kind.produced_by,
        "description": kind.description,
        "metadata_key": HEADERS[kind.format],
    }
    if kind.headerless_fields:
        doc["headerless"] = (f"a file without the header that holds {', '.join(kind.headerless_fields)} (written "
                             "before the header) reads as schema version 0, without provenance")
    if kind.columns:
        doc["columns"] = [asdict(c) for c in kind.columns]
    if kind.fields:
        doc["metadata_fields" if kind.format == "table" else "fields"] = [asdict(f) for f in kind.fields]
    if kind.importable:
        doc["importable"] = "CSV or Parquet written elsewhere is accepted with the required columns; optional ones take their default"
    if kind.notes:
        doc["notes"] = list(kind.notes)
    return doc


def render(kind: ArtifactKind) -> str:
    return json.dumps(kind_document(kind), indent=2, sort_keys=False, default=str) + "\n"


def write_all(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in all_kinds():
        path = directory / f"{kind.name}.json"
        path.write_text(render(kind))
        written.append(path)
    return written


if __name__ == "__main__":
    for p in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "schemas")):
        print(p, file=sys.stderr)
