"""libarena.artifacts: round trips, provenance, atomic writes and one-line errors on bad input."""

from __future__ import annotations

import io
import subprocess
import sys

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from libarena.artifacts import Provenance, read_document, read_table, write_document, write_table
from libarena.artifacts.io import atomic_output, content_digest
from libarena.artifacts.registry import ArtifactKind, Column, Field, register_kind
from libarena.errors import ArenaError
from tests.conftest import REPO

DEMO_TABLE = register_kind(
    ArtifactKind(
        name="test_table",
        version=3,
        format="table",
        produced_by="tests",
        description="a table for tests",
        importable=True,
        columns=(
            Column("name", "string", "a name"),
            Column("value", "float64", "a value"),
            Column("count", "int64", "optional count", required=False, default=7),
        ),
    )
)
DEMO_DOC = register_kind(
    ArtifactKind(
        name="test_doc", version=1, format="msgpack", produced_by="tests", description="a document",
        fields=(Field("items", "list", "items"),),
    )
)


def _table() -> pa.Table:
    return pa.table({"value": [1.5, 2.5], "name": ["a", "b"], "count": [1, 2]})


def test_table_round_trip_keeps_provenance_and_metadata(tmp_path):
    path = tmp_path / "t.parquet"
    prov = Provenance(tool="tests", parameters={"seed": 3}, inputs=[{"path": "x", "sha256": "00"}])
    write_table(path, "test_table", _table(), prov, {"note": "hello"})
    art = read_table(path, "test_table")
    assert art.table.column_names == ["name", "value", "count"]  # declared order
    assert art.table.column("value").to_pylist() == [1.5, 2.5]
    assert art.provenance.parameters == {"seed": 3}
    assert art.provenance.inputs[0]["sha256"] == "00"
    assert art.metadata == {"note": "hello"}
    assert art.schema_version == 3 and art.native



def test_a_header_nested_too_deeply_is_corrupt_metadata(tmp_path):
    """The JSON parser takes a header nested 600 levels deep, the recursive code that later walks it (the
    provenance's dataclasses.asdict for a table piped on stdin) does not: refused as corrupt where it is read."""
    import json

    from libarena.artifacts.io import MAX_HEADER_DEPTH, METADATA_KEY

    path = tmp_path / "t.parquet"
    write_table(path, "test_table", _table(), Provenance(tool="tests"))
    table = pq.read_table(path)
    header = json.loads(table.schema.metadata[METADATA_KEY])
    nested: dict = {}
    for _ in range(600):
        nested = {"x": nested}
    deep = tmp_path / "deep.parquet"
    for parameters, ok in ((nested, False), (json.loads('{"x":' * (MAX_HEADER_DEPTH - 3) + "1" + "}" * (MAX_HEADER_DEPTH - 3)), True)):
        header["provenance"]["parameters"] = parameters
        pq.write_table(table.replace_schema_metadata({**table.schema.metadata, METADATA_KEY: json.dumps(header).encode()}), deep)
        if ok:
            assert read_table(deep, "test_table").provenance.parameters == parameters
        else:
            with pytest.raises(ArenaError, match=r"deep.parquet: corrupt Arena metadata$"):
                read_table(deep, "test_table")

def test_text_that_is_not_utf8_in_a_damaged_file_is_a_one_line_error(tmp_path):
    """Parquet has no checksum over its values: a damaged file can decode into a string column that fails only
    when read. The reader validates every column and names the damaged one."""
    path = tmp_path / "t.parquet"
    write_table(path, "test_table", _table(), Provenance(tool="tests"))
    table = pq.read_table(path)
    damaged = pa.array([b"a", b"\x90b"], type=pa.binary()).view(pa.string())
    pq.write_table(table.set_column(table.column_names.index("name"), "name", damaged), path)
    with pytest.raises(ArenaError, match=r"t\.parquet: column 'name' is damaged \(.*Invalid UTF8 sequence at string index 1\)$"):
        read_table(path, "test_table")


def test_an_arrow_stream_with_offsets_out_of_range_is_refused_before_any_cast(tmp_path):
    """The Arrow stream reader checks a batch only lightly: text whose offsets are out of order reads without
    error, and a cast of damaged text (a column stored as text where the kind declares a number) can crash the
    interpreter. Every column is checked in full first."""
    import json

    import pyarrow.ipc as ipc

    offsets = pa.py_buffer(np.array([0, 2, 1], dtype=np.int32).tobytes())  # (decreasing)
    damaged = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"ab")])
    header = {"kind": "test_table", "schema_version": 3, "provenance": {"tool": "tests"}, "metadata": {}}
    table = pa.table({"name": ["a", "b"], "value": damaged}).replace_schema_metadata(
        {b"arena": json.dumps(header).encode()})
    path = tmp_path / "t.arrow"
    with open(path, "wb") as f, ipc.new_stream(f, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(ArenaError, match=r"t\.arrow: column 'value' is damaged \("):
        read_table(path, "test_table")


def test_wrong_kind_is_a_one_line_error(tmp_path):
    path = tmp_path / "t.parquet"
    write_table(path, "test_table", _table(), Provenance(tool="tests"))
    with pytest.raises(ArenaError, match="is a test_table artifact, expected plans"):
        read_table(path, "plans")


def test_wrong_schema_version_is_rejected(tmp_path):
    path = tmp_path / "t.parquet"
    write_table(path, "test_table", _table(), Provenance(tool="tests"))
    table = pq.read_table(path)
    meta = table.schema.metadata[b"arena"].replace(b'"schema_version": 3', b'"schema_version": 9')
    pq.write_table(table.replace_schema_metadata({b"arena": meta}), path)
    with pytest.raises(ArenaError, match="schema version 9 is not supported"):
        read_table(path, "test_table")


def test_missing_column_and_missing_file(tmp_path):
    with pytest.raises(ArenaError, match="missing column"):
        write_table(tmp_path / "x.parquet", "test_table", pa.table({"name": ["a"]}), Provenance(tool="t"))
    assert not list(tmp_path.iterdir())  # nothing half-written
    with pytest.raises(ArenaError, match="no such file"):
        read_table(tmp_path / "nope.parquet", "test_table")


def test_foreign_csv_import_fills_defaults(tmp_path):
    path = tmp_path / "measured.csv"
    path.write_text("name,value\nx,1.0\ny,2.0\n")
    art = read_table(path, "test_table")
    assert not art.native
    assert art.table.column("count").to_pylist() == [7, 7]


def test_garbage_is_rejected(tmp_path):
    path = tmp_path / "junk.parquet"
    path.write_bytes(b"PAR1" + b"\x00" * 50)
    with pytest.raises(ArenaError, match="unreadable table"):
        read_table(path, "test_table")
    path.write_bytes(b"\x89PNG\x00\x00")
    with pytest.raises(ArenaError, match="not a"):
        read_table(path, "test_table")


def test_atomic_output_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_output(target) as f:
            f.write(b"new-partial")
            raise RuntimeError("boom")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]
    with pytest.raises(ArenaError, match="does not exist"):
        with atomic_output(tmp_path / "missing-dir" / "x"):
            pass


def test_document_round_trip_and_errors(tmp_path):
    path = tmp_path / "d.msgpack"
    write_document(path, "test_doc", {"items": [1, 2, {"a": b"x"}]}, Provenance(tool="tests"))
    doc = read_document(path, "test_doc")
    assert doc.data["items"][2]["a"] == b"x"
    path.write_bytes(msgpack.packb({"hello": 1}))
    with pytest.raises(ArenaError, match="not an Arena artifact"):
        read_document(path, "test_doc")
    path.write_bytes(b"\xc1\xc1")
    with pytest.raises(ArenaError, match="not a msgpack artifact"):
        read_document(path, "test_doc")


def test_stdout_is_an_arrow_stream_that_reads_back(tmp_path):
    code = (
        "import pyarrow as pa, sys\n"
        "import tests.test_artifacts as t\n"
        "from libarena.artifacts import Provenance, write_table\n"
        "write_table('-', 'test_table', t._table(), Provenance(tool='tests'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, cwd=REPO)
    assert out.stdout[:4] == b"\xff\xff\xff\xff"
    reader = pa.ipc.open_stream(io.BytesIO(out.stdout))
    assert reader.read_all().num_rows == 2


def test_content_digest_is_stable_and_order_independent_for_dicts():
    assert content_digest({"a": 1, "b": 2}) == content_digest({"b": 2, "a": 1})
    assert content_digest({"a": 1}) != content_digest({"a": 2})


def test_atomic_output_has_ordinary_permissions(tmp_path):
    import os
    import stat

    target = tmp_path / "perm.bin"
    with atomic_output(target) as f:
        f.write(b"x")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask


def test_a_column_name_that_is_not_utf8_is_an_unreadable_table(tmp_path):
    """Found by the fuzz suite: pyarrow decodes column names lazily, so the damage surfaced deep in a reader."""
    buf = io.BytesIO()
    pq.write_table(pa.table({"abcd": [1]}), buf)
    data = bytearray(buf.getvalue())
    at = data.find(b"abcd")
    while at >= 0:
        data[at + 3] = 0xC2  # an invalid UTF-8 continuation
        at = data.find(b"abcd", at + 1)
    (tmp_path / "bad.parquet").write_bytes(bytes(data))
    with pytest.raises(ArenaError, match="a column name is not UTF-8 text"):
        read_table(tmp_path / "bad.parquet", "plans")


def test_inputs_are_read_within_a_bound(tmp_path, monkeypatch):
    """A device that never ends, or a file larger than any artifact, is refused before it is read whole."""
    import os

    import libarena.artifacts.io as artifact_io
    from libarena.artifacts import input_ref

    if os.path.exists("/dev/zero"):
        with pytest.raises(ArenaError, match="is not a regular file or a pipe"):
            read_table("/dev/zero", "perf_table")
    monkeypatch.setattr(artifact_io, "MAX_ARTIFACT_BYTES", 1000)
    big = tmp_path / "big.parquet"
    with open(big, "wb") as f:
        f.truncate(5000)  # sparse: nothing is written, so nothing is there to read either
    with pytest.raises(ArenaError, match="refused as an artifact: larger than"):
        read_table(big, "perf_table")
    with pytest.raises(ArenaError, match="refused as an input: larger than"):
        input_ref(big)


def test_a_table_that_decodes_past_the_bounds_is_refused_before_it_is_in_memory(tmp_path, monkeypatch):
    """A few hundred kilobytes of Parquet (one value repeated) decode to gigabytes: refused by the footer's row
    count, and by the decoded size batch by batch, with one line, whatever the table's kind."""
    from libarena.artifacts import io as artifact_io
    from libarena.artifacts.registry import get_kind
    from libarena.schedule.config import MAX_TICKS
    from libarena.schedule.traces import MAX_SCALED_JOBS

    # the kinds Arena writes most rows of are read back at the sizes its own limits allow
    assert get_kind("job_records").max_rows >= MAX_SCALED_JOBS and get_kind("timeseries").max_rows >= 100 * MAX_TICKS
    many = tmp_path / "many.parquet"
    pq.write_table(pa.table({"x": pa.array(np.zeros(get_kind("perf_table").max_rows + 1))}), many, compression="zstd")
    assert many.stat().st_size < 1 << 20
    with pytest.raises(ArenaError, match=r"many\.parquet: refused: the table decodes to more than 1,000,000 rows"):
        read_table(many, "perf_table")
    wide = tmp_path / "wide.parquet"
    pq.write_table(pa.table({"junk": pa.array(["x" * 100] * 200_000)}), wide, compression="zstd")
    stream = tmp_path / "wide.arrows"
    table = pa.table({"junk": pa.array(["x" * 100] * 200_000)})
    with pa.ipc.new_stream(stream, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=10_000):
            writer.write_batch(batch)
    monkeypatch.setattr(artifact_io, "MAX_DECODED_BYTES", 1 << 20)  # 20 MB of text against 1 MiB
    for path in (wide, stream):
        with pytest.raises(ArenaError, match="refused: the table decodes to more than"):
            read_table(path, "perf_table")


def test_a_failing_upgrade_is_a_short_one_line_error(tmp_path):
    """An upgrade that cannot read an old table says so in one line of bounded length, whatever it raised."""
    import json

    def broken(table, metadata):
        raise ValueError("no such column\n" + "x" * 100_000)

    register_kind(ArtifactKind(name="test_upgrading", version=2, format="table", produced_by="tests",
                               description="a table with an upgrade that fails", columns=(Column("a", "int64", "a"),),
                               upgrades=((1, broken),)))
    path = tmp_path / "old.parquet"
    header = {"kind": "test_upgrading", "schema_version": 1, "provenance": {}, "metadata": {}}
    pq.write_table(pa.table({"a": [1]}).replace_schema_metadata({b"arena": json.dumps(header).encode()}), path)
    with pytest.raises(ArenaError, match="cannot read this test_upgrading of schema version 1 \\(ValueError: no such column") as err:
        read_table(path, "test_upgrading")
    assert len(str(err.value)) < len(str(path)) + 400


@pytest.mark.parametrize("error", [OverflowError, IndexError])
def test_an_upgrade_failing_on_numbers_out_of_its_types_is_a_one_line_error(tmp_path, error):
    """An old table's column of another type than its upgrade reads (a uint64 of 2**64-1 made int64 raises
    OverflowError) is the same one-line error as any other upgrade failure, not an internal error."""
    import json

    def out_of_range(table, metadata):
        raise error("Python int too large to convert to C long")

    name = f"test_upgrading_{error.__name__.lower()}"
    register_kind(ArtifactKind(name=name, version=2, format="table", produced_by="tests",
                               description="a table with an upgrade that fails", columns=(Column("a", "int64", "a"),),
                               upgrades=((1, out_of_range),)))
    path = tmp_path / "old.parquet"
    header = {"kind": name, "schema_version": 1, "provenance": {}, "metadata": {}}
    pq.write_table(pa.table({"a": [1]}).replace_schema_metadata({b"arena": json.dumps(header).encode()}), path)
    with pytest.raises(ArenaError, match=rf"cannot read this {name} of schema version 1 \({error.__name__}: "):
        read_table(path, name)


def test_a_users_hidden_tmp_file_beside_an_output_is_not_removed_as_a_stale_temp(tmp_path):
    """Only names as Arena writes them (``.<target>.<pid>.<random>.tmp``, their writer dead) are a killed
    write's leftovers beside an output; a user's ``.out.parquet.my-notes.tmp`` is kept however old."""
    import os

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    leftover = tmp_path / f".out.parquet.{int(dead.stdout)}.k2j3h4ab.tmp"
    notes = tmp_path / ".out.parquet.my-notes.tmp"
    pid_like = tmp_path / f".out.parquet.{int(dead.stdout)}.my-notes.tmp"
    for path in (leftover, notes, pid_like):
        path.write_text("x")
        os.utime(path, (0, 0))
    with atomic_output(tmp_path / "out.parquet") as out:
        out.write(b"data")
    assert not leftover.exists() and notes.read_text() == "x" and pid_like.read_text() == "x"


@pytest.mark.parametrize("store_schema", [False, True])
@pytest.mark.parametrize("in_a_list", [False, True])
def test_a_tiny_parquet_file_that_would_expand_to_gigabytes_is_refused_in_bounded_memory(tmp_path, store_schema,
                                                                                          in_a_list):
    """One 32 KiB text value repeated over 65,536 rows is a file of a kilobyte (dictionary-encoded) and 2 GiB
    decoded: it is decoded as its dictionary and its expanded size counted before any value is copied (the
    first batch used to take several GiB before the size check; stored as an Arrow dictionary column, the cast
    to text did). So is a list<string> column's, even one the kind does not declare (read before it is
    dropped)."""
    import os
    import resource

    n = 65_536
    repeated = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array(["x" * 32_768]))
    columns = {"name": repeated, "value": pa.array([1.0] * n)}
    if in_a_list:
        columns["name"] = pa.array(["abc"] * n)
        columns["extra"] = pa.ListArray.from_arrays(pa.array(range(n + 1), pa.int32()), repeated)
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.table(columns), path, store_schema=store_schema)
    assert os.path.getsize(path) < 10_000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ArenaError, match=r"bomb.parquet: refused: the table decodes to more than .* or 1024 MiB"):
        read_table(path, "test_table")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 300_000  # KiB
    # the same shape at a sane size reads, text as text
    small = pa.DictionaryArray.from_arrays(pa.array([0, 0, 0], pa.int32()), pa.array(["abc"]))
    pq.write_table(pa.table({"name": small, "value": pa.array([1.0, 2.0, 3.0])}), path, store_schema=store_schema)
    table = read_table(path, "test_table").table
    assert table.column("name").type == pa.string() and table.column("name").to_pylist() == ["abc"] * 3


def test_an_input_is_named_by_the_bytes_that_were_decoded(tmp_path, repo_root):
    """A table (and a cluster spec) replaced after it was read keeps the digest of what was decoded, in a
    provenance entry and in a cache key; hashing the path again would name the new content."""
    import hashlib
    import os

    from libarena.artifacts.stage_cache import cache_input
    from libarena.hardware import load_cluster_input

    path = tmp_path / "t.parquet"
    write_table(path, "test_table", _table(), Provenance(tool="tests"))
    decoded = path.read_bytes()
    art = read_table(path, "test_table")
    write_table(path, "test_table", _table().slice(0, 1), Provenance(tool="tests"))  # replaced (atomically)
    assert path.read_bytes() != decoded
    assert art.content_sha256 == hashlib.sha256(decoded).hexdigest()
    assert cache_input(path, art, "test_table") == {"path": str(path), "sha256": art.content_sha256, "kind": "test_table"}

    cluster = tmp_path / "c.yaml"
    cluster.write_bytes((repo_root / "examples" / "clusters" / "paper-sim-1280.yaml").read_bytes())
    spec, ref = load_cluster_input(cluster)
    assert ref == {"path": str(cluster), "sha256": hashlib.sha256(cluster.read_bytes()).hexdigest()}
    assert spec.total_gpus == 1280

    # a pipe is named by its path alone (its path names other content later: no cache key may rest on it)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, decoded)
    os.close(write_fd)
    piped = read_table(f"/dev/fd/{read_fd}", "test_table")
    os.close(read_fd)
    assert piped.content_sha256 is None and "sha256" not in cache_input(f"/dev/fd/{read_fd}", piped)
