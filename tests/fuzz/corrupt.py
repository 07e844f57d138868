"""Hypothesis strategies that break Arena's inputs: bytes, Arrow tables, artifact headers, text files, numbers.

Each strategy draws a *mutation* and applies it to a valid seed input built by the fixtures (a real
operator table from arena-analyze, real plans from arena-plan, small perf tables, traces and clusters), so
generated cases stay close to what users really feed the tools: a truncated download, a hand-edited CSV,
a table from another tool or an older Arena.
"""

from __future__ import annotations

import io
import json
import math
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
from hypothesis import strategies as st

from libarena.artifacts.registry import all_kinds

#: Numbers users should never pass but sometimes do.
ABSURD_FLOATS = [float("nan"), float("inf"), float("-inf"), -1.0, 0.0, -0.0, 1e-320, 1e308, -1e308, 2.0 ** 63, 1e30]
ABSURD_INTS = [0, -1, -(2 ** 63), 2 ** 63 - 1, 2 ** 31, 10 ** 12, 3, 7]
ABSURD_STRINGS = ["", " ", "nan", "NaN", "inf", "-1", "1e999", "0x10", "1,5", "ünïcødé", "a" * 5000, "\u202e",
                  "x\ny", "null", "None", "'", '"', "--help"]

absurd_scalar = st.one_of(
    st.sampled_from(ABSURD_FLOATS), st.sampled_from(ABSURD_INTS), st.sampled_from(ABSURD_STRINGS),
    st.none(), st.booleans(), st.just([]), st.just({}), st.just([1, "a", None]),
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
)

number_text = st.one_of(
    st.sampled_from(["0", "-1", "-0", "1e400", "nan", "inf", "-inf", "abc", "", "1.5", "9" * 40, "0x10", "1_000",
                     "2147483648", "9223372036854775808", " 4", "4 ", "١٢", "+3", "1e-400"]),
    st.integers(min_value=-(2 ** 66), max_value=2 ** 66).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)

# --------------------------------------------------------------------------------------------------
# Bytes


@st.composite
def corrupt_bytes(draw, data: bytes) -> bytes:
    """Truncate, flip, overwrite, insert or delete bytes of a file; or replace it with junk."""
    n = len(data)
    op = draw(st.sampled_from(["truncate", "flip", "overwrite", "insert", "delete", "junk", "empty", "prefix",
                               "tail", "double"]))
    if op == "empty" or n == 0:
        return b""
    if op == "junk":
        return draw(st.binary(min_size=1, max_size=256))
    if op == "double":
        return data + data
    pos = draw(st.integers(min_value=0, max_value=n - 1))
    if op == "truncate":
        return data[:pos]
    if op == "tail":
        return data[pos:]
    if op == "flip":
        count = draw(st.integers(min_value=1, max_value=8))
        out = bytearray(data)
        for k in range(count):
            i = (pos + k * draw(st.integers(min_value=1, max_value=max(1, n // 8)))) % n
            out[i] ^= draw(st.integers(min_value=1, max_value=255))
        return bytes(out)
    if op == "overwrite":
        junk = draw(st.binary(min_size=1, max_size=64))
        return data[:pos] + junk + data[pos + len(junk):]
    if op == "insert":
        return data[:pos] + draw(st.binary(min_size=1, max_size=64)) + data[pos:]
    if op == "delete":
        length = draw(st.integers(min_value=1, max_value=max(1, min(n - pos, 4096))))
        return data[:pos] + data[pos + length:]
    return draw(st.binary(max_size=16)) + data  # prefix


# --------------------------------------------------------------------------------------------------
# Arrow tables with an Arena header


def arena_header(kind: str, version: int, metadata: dict[str, Any], provenance: dict[str, Any] | None = None) -> dict:
    return {"kind": kind, "schema_version": version, "metadata": metadata,
            "provenance": provenance or {"tool": "fuzz", "parameters": {}, "inputs": [], "arena_version": "0"}}


def encode_table(table: pa.Table, header: Any, fmt: str) -> bytes:
    """Serialise a table with ``header`` (a dict, raw bytes, or None for no Arena metadata)."""
    if header is not None:
        blob = header if isinstance(header, bytes) else json.dumps(header, default=str, allow_nan=True).encode()
        table = table.replace_schema_metadata({b"arena": blob})
    else:
        table = table.replace_schema_metadata(None)
    sink = io.BytesIO()
    if fmt == "parquet":
        pq.write_table(table, sink)
    else:
        with ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    return sink.getvalue()


def _absurd_array(draw, typ: pa.DataType, n: int) -> pa.Array:
    """``n`` values of ``typ`` built from a short drawn pattern (tables have thousands of rows)."""
    if pa.types.is_null(typ):  # (a column an earlier mutation retyped to null holds nothing else)
        return pa.nulls(n)
    if pa.types.is_floating(typ):
        pool: list = ABSURD_FLOATS + [None]
    elif pa.types.is_integer(typ) or pa.types.is_timestamp(typ):
        pool = ABSURD_INTS + [None]
    elif pa.types.is_boolean(typ):
        pool = [True, False, None]
    elif pa.types.is_list(typ):
        inner = typ.value_type
        pool = ([[], None, [0], [-1], [2 ** 40], [1] * 64] if pa.types.is_integer(inner)
                else [[], None, [float("nan")], [-1.0], [1e308]] if pa.types.is_floating(inner)
                else [[], None, [""], ["x" * 200]])
    else:
        pool = ABSURD_STRINGS + [None]
    pattern = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
    values = (pattern * (n // len(pattern) + 1))[:n]
    return pa.array(values, type=typ)


def _replace_column(table: pa.Table, name: str, array: pa.Array) -> pa.Table:
    i = table.column_names.index(name)
    return table.set_column(i, pa.field(name, array.type), array)


TABLE_MUTATIONS = ["drop_column", "retype_column", "absurd_values", "absurd_cell", "nulls", "empty", "extra_column",
                   "rename_column", "duplicate_rows", "wrong_kind", "wrong_version", "corrupt_header",
                   "no_header", "metadata_value", "metadata_drop", "shuffle_rows", "keep"]


def _json_paths(obj: Any, prefix: tuple = (), depth: int = 0) -> list[tuple]:
    paths = [prefix] if prefix else []
    if depth > 4:
        return paths
    if isinstance(obj, dict):
        for k, v in obj.items():
            paths.extend(_json_paths(v, prefix + (k,), depth + 1))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            paths.extend(_json_paths(v, prefix + (i,), depth + 1))
    return paths


def _set_path(obj: Any, path: tuple, value: Any, delete: bool = False) -> Any:
    obj = json.loads(json.dumps(obj, default=str))
    cur = obj
    for key in path[:-1]:
        cur = cur[key]
    if delete:
        if isinstance(cur, dict):
            cur.pop(path[-1], None)
        else:
            del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return obj


@st.composite
def mutated_table_bytes(draw, kind: str, table: pa.Table, metadata: dict[str, Any],
                        mutations: list[str] | None = None, version: int = 1) -> bytes:
    """A table artifact of ``kind`` with one or two mutations applied, as Parquet or an Arrow stream."""
    header: Any = arena_header(kind, version, metadata)
    steps = draw(st.lists(st.sampled_from(mutations or TABLE_MUTATIONS), min_size=1, max_size=2))
    names = table.column_names
    for op in steps:
        names = table.column_names
        if op == "drop_column" and names:
            table = table.drop_columns([draw(st.sampled_from(names))])
        elif op == "retype_column" and names:
            name = draw(st.sampled_from(names))
            target = draw(st.sampled_from([pa.string(), pa.float64(), pa.int64(), pa.bool_(), pa.list_(pa.string()),
                                           pa.null(), pa.binary(), pa.timestamp("s")]))
            try:
                array = table.column(name).cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                array = pa.nulls(table.num_rows, type=target) if target != pa.null() else pa.nulls(table.num_rows)
            table = _replace_column(table, name, array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array)
        elif op in ("absurd_values", "nulls") and names and table.num_rows:
            name = draw(st.sampled_from(names))
            typ = table.schema.field(name).type
            array = pa.nulls(table.num_rows, type=typ) if op == "nulls" else _absurd_array(draw, typ, table.num_rows)
            table = _replace_column(table, name, array)
        elif op == "absurd_cell" and names and table.num_rows:
            name = draw(st.sampled_from(names))
            row = draw(st.integers(min_value=0, max_value=table.num_rows - 1))
            typ = table.schema.field(name).type
            column = table.column(name).to_pylist()
            column[row] = _absurd_array(draw, typ, 1).to_pylist()[0]
            table = _replace_column(table, name, pa.array(column, type=typ))
        elif op == "empty":
            table = table.slice(0, 0)
        elif op == "extra_column":
            table = table.append_column(draw(st.sampled_from(["extra", "__index_level_0__", ""])),
                                        pa.array([1] * table.num_rows))
        elif op == "rename_column" and names:
            name = draw(st.sampled_from(names))
            table = table.rename_columns([n + "_x" if n == name else n for n in names])
        elif op == "duplicate_rows" and table.num_rows:
            table = pa.concat_tables([table, table])
        elif op == "shuffle_rows" and table.num_rows > 1:
            order = draw(st.permutations(range(min(table.num_rows, 40))))
            table = table.take(list(order) + list(range(len(order), table.num_rows)))
        elif op == "wrong_kind" and isinstance(header, dict):
            other = draw(st.sampled_from([k.name for k in all_kinds()] + ["", "nope", 7]))
            header["kind"] = other
        elif op == "wrong_version" and isinstance(header, dict):
            header["schema_version"] = draw(st.sampled_from([0, 2, 99, -1, "1", None, 1.5, [1]]))
        elif op == "corrupt_header":
            header = draw(st.sampled_from([b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"kind": 1}', b"42",
                                           b'{"kind": "x", "schema_version": 1, "metadata": []}',
                                           b'{"kind": "%s", "schema_version": 1, "metadata": 5, "provenance": 3}'
                                           % kind.encode()]))
        elif op == "no_header":
            header = None
        elif op in ("metadata_value", "metadata_drop") and isinstance(header, dict) and header.get("metadata"):
            paths = _json_paths(header["metadata"])
            if paths:
                path = draw(st.sampled_from(paths))
                value = draw(absurd_scalar) if op == "metadata_value" else None
                header["metadata"] = _set_path(header["metadata"], path, value, delete=op == "metadata_drop")
    fmt = draw(st.sampled_from(["parquet", "stream"]))
    return encode_table(table, header, fmt)


# --------------------------------------------------------------------------------------------------
# Text files: CSV, YAML, TOML


@st.composite
def mutated_csv(draw, header: list[str], rows: list[list[str]]) -> bytes:
    """A CSV (a trace or an imported perf table) with broken cells, rows, columns or encoding."""
    header = list(header)
    rows = [list(r) for r in rows]
    for op in draw(st.lists(st.sampled_from(["cell", "cell", "cell", "drop_column", "dup_column", "short_row",
                                             "long_row", "empty_rows", "no_rows", "header_only_blank", "bad_utf8",
                                             "bom", "crlf", "quote", "dup_row", "keep", "nul", "spaces"]),
                            min_size=1, max_size=3)):
        if op == "cell" and rows:
            r = draw(st.integers(min_value=0, max_value=len(rows) - 1))
            c = draw(st.integers(min_value=0, max_value=len(header) - 1))
            if c < len(rows[r]):
                rows[r][c] = draw(st.one_of(number_text, st.sampled_from(ABSURD_STRINGS[:12]),
                                            st.sampled_from(["gpt__999B", "resnet50", "h100", "tpu", "a100 ", "A100",
                                                             "moe__2.4B", "gpt__tiny", "x__1B", "__"]),
                                            st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)))
        elif op == "drop_column" and header:
            c = draw(st.integers(min_value=0, max_value=len(header) - 1))
            header.pop(c)
            rows = [r[:c] + r[c + 1:] for r in rows]
        elif op == "dup_column" and header:
            c = draw(st.integers(min_value=0, max_value=len(header) - 1))
            header.append(header[c])
            rows = [r + [r[c] if c < len(r) else ""] for r in rows]
        elif op == "short_row" and rows:
            r = draw(st.integers(min_value=0, max_value=len(rows) - 1))
            rows[r] = rows[r][: draw(st.integers(min_value=0, max_value=max(0, len(rows[r]) - 1)))]
        elif op == "long_row" and rows:
            r = draw(st.integers(min_value=0, max_value=len(rows) - 1))
            rows[r] = rows[r] + ["extra"]
        elif op == "empty_rows":
            rows.insert(draw(st.integers(min_value=0, max_value=len(rows))), [])
        elif op == "no_rows":
            rows = []
        elif op == "header_only_blank":
            header = [""] * len(header)
        elif op == "dup_row" and rows:
            rows.append(list(rows[0]))
        elif op == "spaces":
            header = [f" {h} " for h in header]
    text = "\n".join(",".join(r) for r in [header] + rows) + "\n"
    data = text.encode("utf-8")
    post = draw(st.sampled_from(["none", "none", "bad_utf8", "bom", "crlf", "truncate", "nul"]))
    if post == "bad_utf8":
        pos = draw(st.integers(min_value=0, max_value=len(data)))
        data = data[:pos] + b"\xff\xfe\xc3" + data[pos:]
    elif post == "bom":
        data = b"\xef\xbb\xbf" + data
    elif post == "crlf":
        data = data.replace(b"\n", b"\r\n")
    elif post == "truncate":
        data = data[: draw(st.integers(min_value=0, max_value=len(data)))]
    elif post == "nul":
        data = data.replace(b",", b",\x00", 1)
    return data


def _mutate_json_like(draw, doc: Any) -> Any:
    paths = _json_paths(doc)
    op = draw(st.sampled_from(["value", "value", "drop", "add", "replace_root"]))
    if op == "replace_root" or not paths:
        return draw(st.one_of(absurd_scalar, st.just({"node_groups": None}), st.just({"node_groups": [None]})))
    path = draw(st.sampled_from(paths))
    if op == "drop":
        return _set_path(doc, path, None, delete=True)
    if op == "add":
        container = path[:-1]
        target = doc
        for key in container:
            target = target[key]
        if isinstance(target, dict):
            return _set_path(doc, container + (draw(st.sampled_from(["extra", "nodes", "gpu_type", "name"])),),
                             draw(absurd_scalar)) if container else {**doc, "extra": draw(absurd_scalar)}
    return _set_path(doc, path, draw(absurd_scalar))


def _yaml_dump(doc: Any) -> str:
    import yaml

    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)


def _toml_dump(doc: Any) -> str:
    """A tiny TOML writer for cluster specs (tomllib only reads)."""

    def scalar(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            if isinstance(v, float) and math.isnan(v):
                return "nan"
            if isinstance(v, float) and math.isinf(v):
                return "inf" if v > 0 else "-inf"
            return repr(v)
        if v is None:
            return '""'
        if isinstance(v, list):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(str(k))} = {scalar(x)}" for k, x in v.items()) + "}"
        return json.dumps(str(v))

    if not isinstance(doc, dict):
        return f"value = {scalar(doc)}\n"
    lines = []
    for k, v in doc.items():
        if k == "node_groups" and isinstance(v, list) and all(isinstance(g, dict) for g in v):
            for g in v:
                lines.append("[[node_groups]]")
                lines.extend(f"{json.dumps(str(gk))} = {scalar(gv)}" for gk, gv in g.items())
        else:
            lines.insert(0, f"{json.dumps(str(k))} = {scalar(v)}")
    return "\n".join(lines) + "\n"


@st.composite
def mutated_document_text(draw, doc: dict[str, Any], formats: tuple[str, ...] = ("yaml",)) -> tuple[str, bytes]:
    """(suffix, bytes) of a YAML/TOML document with a mutated value, or broken syntax/encoding."""
    fmt = draw(st.sampled_from(formats))
    mode = draw(st.sampled_from(["structure", "structure", "structure", "syntax", "bytes", "keep"]))
    if mode == "structure":
        doc = _mutate_json_like(draw, doc)
    text = _yaml_dump(doc) if fmt == "yaml" else _toml_dump(doc)
    data = text.encode("utf-8")
    if mode == "syntax":
        junk = draw(st.sampled_from(["{", "]", ": :", "\t- x", "[[", "= =", "&a *a", "!!python/object:os.system x",
                                     "key: [1, 2", '"unterminated', "- - -", "%YAML 9.9", "---\n---\n", "@"]))
        pos = draw(st.integers(min_value=0, max_value=len(data)))
        data = data[:pos] + junk.encode() + data[pos:]
    elif mode == "bytes":
        data = draw(corrupt_bytes(data))
    return "." + fmt, data
