"""The per-stage output cache (libarena.artifacts.stage_cache) on its own: keys, hits, refresh, corruption,
killed writers, an unwritable cache."""

from __future__ import annotations

import io
import json
import os
import sys

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from libarena.errors import ArenaError

from libarena.artifacts import Provenance, read_table, write_table
from libarena.artifacts.stage_cache import MANIFEST, TABLE_OUTPUT, StageCache, cache_input

KIND = "comm_table"


def _table(scale: float = 1.0) -> pa.Table:
    return pa.table({"primitive": ["all-reduce", "p2p"], "gpu_type": ["a40", "a40"], "num_devices": [2, 2],
                     "crosses_nodes": [False, False], "bytes": [1024.0, 2048.0], "latency_s": [1e-5 * scale, 2e-5]})


class Producer:
    """A stage's compute-and-write step that counts its runs."""

    def __init__(self, scale: float = 1.0):
        self.runs = 0
        self.scale = scale

    def __call__(self, path: str) -> None:
        self.runs += 1
        write_table(path, KIND, _table(self.scale), Provenance("test", {"scale": self.scale}))


def test_second_run_is_a_hit_with_identical_bytes(tmp_path):
    cache = StageCache(tmp_path / "cache", "test-stage")
    key = cache.key({"scale": 1.0})
    produce = Producer()
    first = cache.produce_table(key, tmp_path / "a.parquet", produce)
    second = cache.produce_table(key, tmp_path / "b.parquet", produce)
    assert produce.runs == 1 and not first.cache_hit and first.stored and second.cache_hit
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert second.rows == 2 and second.summary()["cache"]["hit"] is True
    entry = tmp_path / "cache" / "stages" / "test-stage" / key
    assert sorted(p.name for p in entry.iterdir()) == [MANIFEST, TABLE_OUTPUT]
    # --no-cache recomputes and refreshes the entry
    refresh = StageCache(tmp_path / "cache", "test-stage", refresh=True).produce_table(key, tmp_path / "c.parquet", produce)
    assert produce.runs == 2 and not refresh.cache_hit and refresh.stored
    assert [p.name for p in (tmp_path / "cache" / "stages" / "test-stage").iterdir()] == [key]  # no leftovers


def test_keys_follow_parameters_inputs_versions_and_paths(tmp_path):
    cache = StageCache(tmp_path, "s")
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("x\n1\n")
    b.write_text("x\n1\n")
    base = cache.key({"p": 1}, [cache_input(a)])
    assert base == cache.key({"p": 1}, [cache_input(a)])
    assert base != cache.key({"p": 2}, [cache_input(a)])
    assert base != cache.key({"p": 1}, [cache_input(b)])  # the path is in the output's provenance
    assert base != cache.key({"p": 1}, [cache_input(a)], versions={"jax": "0"})
    assert base != StageCache(tmp_path, "other").key({"p": 1}, [cache_input(a)])
    a.write_text("x\n2\n")
    assert base != cache.key({"p": 1}, [cache_input(a)])


def test_keys_follow_the_library_source_and_the_benchmarks_share_its_digest(tmp_path, monkeypatch):
    import libarena
    from libarena.artifacts import stage_cache
    from libarena.artifacts.source import source_digest

    # the key's code part is the digest the benchmarks record (one recipe), over the installed package
    package = os.path.dirname(os.path.abspath(libarena.__file__))
    assert stage_cache.code_digest() == source_digest(stage_cache.Path(package).parent, ("libarena",))
    base = StageCache(tmp_path, "s").key({"p": 1})
    # another tree of Arena's source (an edit) is another key: an entry made by other code is never served
    fake = tmp_path / "site" / "libarena"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '0'\n")
    monkeypatch.setattr(libarena, "__file__", str(fake / "__init__.py"))
    stage_cache.code_digest.cache_clear()
    try:
        edited = StageCache(tmp_path, "s").key({"p": 1})
        assert edited != base
        (fake / "__init__.py").write_text("__version__ = '1'\n")
        stage_cache.code_digest.cache_clear()
        assert StageCache(tmp_path, "s").key({"p": 1}) not in (base, edited)
    finally:
        monkeypatch.undo()
        stage_cache.code_digest.cache_clear()
    assert StageCache(tmp_path, "s").key({"p": 1}) == base


def test_stdin_inputs_are_keyed_by_their_decoded_content(tmp_path):
    write_table(tmp_path / "t.parquet", KIND, _table(), Provenance("test"))
    art = read_table(tmp_path / "t.parquet", KIND)
    sink = io.BytesIO()
    with ipc.new_stream(sink, art.table.schema) as w:
        w.write_table(art.table)
    write_table(tmp_path / "u.parquet", KIND, _table(2.0), Provenance("test"))
    other = read_table(tmp_path / "u.parquet", KIND)
    assert cache_input("-", art)["sha256"] == cache_input("-", art)["sha256"] != cache_input("-", other)["sha256"]
    # the same rows from another run (other provenance) are another input
    write_table(tmp_path / "v.parquet", KIND, _table(), Provenance("test", {"made_by": "another run"}))
    again = read_table(tmp_path / "v.parquet", KIND)
    assert again.table.equals(art.table) and cache_input("-", again)["sha256"] != cache_input("-", art)["sha256"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest", "missing"])
def test_corrupt_entry_is_reported_removed_and_recomputed(tmp_path, damage):
    warnings: list[str] = []
    cache = StageCache(tmp_path / "cache", "s", warn=warnings.append)
    key = cache.key({})
    produce = Producer()
    cache.produce_table(key, tmp_path / "a.parquet", produce)
    entry = cache.entry_path(key)
    data = (entry / TABLE_OUTPUT).read_bytes()
    if damage == "truncate":
        (entry / TABLE_OUTPUT).write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        (entry / TABLE_OUTPUT).write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "manifest":
        (entry / MANIFEST).write_text("{not json")
    else:
        (entry / TABLE_OUTPUT).unlink()
    again = cache.produce_table(key, tmp_path / "b.parquet", produce)
    assert produce.runs == 2 and not again.cache_hit and again.stored
    assert warnings and "corrupt" in warnings[0]
    assert (tmp_path / "b.parquet").read_bytes() == (tmp_path / "a.parquet").read_bytes()
    assert cache.produce_table(key, tmp_path / "c.parquet", produce).cache_hit  # the fresh entry serves


def test_killed_writer_leaves_nothing_that_is_served(tmp_path):
    cache = StageCache(tmp_path / "cache", "s")
    key = cache.key({})

    def killed(path: str) -> None:
        with open(path, "wb") as f:
            f.write(b"PAR1 half a table")
        raise KeyboardInterrupt  # what SIGTERM becomes in the tools (libarena.cli)

    with pytest.raises(KeyboardInterrupt):
        cache.produce_table(key, "-", killed)
    assert not cache.entry_path(key).exists()
    assert not (tmp_path / "cache").exists()  # the staging directory is removed, and the folders made for it
    nested = StageCache(tmp_path / "a" / "b" / "cache", "s")  # --cache-dir a/b/cache: a/ and a/b/ were made too
    with pytest.raises(KeyboardInterrupt):
        nested.produce_table(key, "-", killed)
    assert list(tmp_path.iterdir()) == []
    # folders that were there before stay (another stage's entries, or empty), whatever fails
    (tmp_path / "cache" / "stages" / "other").mkdir(parents=True)
    for output in ("-", None):
        with pytest.raises(KeyboardInterrupt):
            if output is None:
                cache.table(key, killed, tmp_path)
            else:
                cache.produce_table(key, output, killed)
        assert sorted(p.name for p in (tmp_path / "cache").rglob("*")) == ["other", "stages"]
    cache.root.mkdir()
    with pytest.raises(KeyboardInterrupt):
        cache.produce_table(key, "-", killed)
    assert list(cache.root.iterdir()) == []
    # a SIGKILLed writer cannot clean up: its staging directory (no manifest, hidden name) is never served
    stale = cache.root / f".{key}.abc.tmp"
    stale.mkdir()
    (stale / TABLE_OUTPUT).write_bytes(b"PAR1")
    produce = Producer()
    assert not cache.produce_table(key, tmp_path / "a.parquet", produce).cache_hit and produce.runs == 1
    os.utime(stale, (0, 0))  # old temp directories are swept when the next entry is stored
    StageCache(tmp_path / "cache", "s", refresh=True).produce_table(key, tmp_path / "a.parquet", produce)
    assert not stale.exists()


def test_stdout_output_streams_the_cached_table(tmp_path, monkeypatch):
    cache = StageCache(tmp_path / "cache", "s")
    key = cache.key({})
    produce = Producer()
    streams = []
    for _ in range(2):
        buf = io.BytesIO()
        wrapper = io.TextIOWrapper(buf)
        monkeypatch.setattr(sys, "stdout", wrapper)
        outcome = cache.produce_table(key, "-", produce)
        monkeypatch.undo()
        streams.append((outcome.cache_hit, buf.getvalue()))
    assert [hit for hit, _ in streams] == [False, True] and produce.runs == 1
    assert streams[0][1] == streams[1][1]
    table = ipc.open_stream(streams[1][1]).read_all()
    assert json.loads(table.schema.metadata[b"arena"])["kind"] == KIND
    # the same bytes write_table itself sends to stdout
    buf = io.BytesIO()
    wrapper = io.TextIOWrapper(buf)
    monkeypatch.setattr(sys, "stdout", wrapper)
    Producer()("-")
    monkeypatch.undo()
    assert buf.getvalue() == streams[0][1]


def test_unwritable_cache_warns_and_still_writes_the_output(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    warnings: list[str] = []
    cache = StageCache(tmp_path / "file", "s", warn=warnings.append)
    produce = Producer()
    outcome = cache.produce_table(cache.key({}), tmp_path / "a.parquet", produce)
    assert not outcome.stored and outcome.store_error and warnings
    assert read_table(tmp_path / "a.parquet", KIND).table.num_rows == 2


def test_directory_outputs_restore_every_written_file(tmp_path):
    cache = StageCache(tmp_path / "cache", "tree")
    key = cache.key({})
    out = tmp_path / "run"
    runs = []

    def produce(directory) -> None:
        runs.append(1)
        (directory / "sub").mkdir()
        (directory / "metrics.json").write_text('{"a": 1}')
        (directory / "sub" / "jobs.bin").write_bytes(b"\x00\x01")

    ours = lambda name: name.endswith((".json", ".bin"))  # noqa: E731
    first = cache.produce_tree(key, out, produce, ours)
    assert first.files == ["metrics.json", "sub/jobs.bin"] and first.stored
    second = cache.produce_tree(key, tmp_path / "again", produce, ours)
    assert second.cache_hit and len(runs) == 1
    assert (tmp_path / "again" / "sub" / "jobs.bin").read_bytes() == b"\x00\x01"
    # a directory holding files of another kind is never replaced (nor touched)
    (out / "unrelated.txt").write_text("left alone")
    with pytest.raises(ArenaError, match=r"holds files this command does not write \(unrelated.txt\)"):
        cache.produce_tree(key, out, produce, ours)
    assert (out / "unrelated.txt").read_text() == "left alone" and (out / "metrics.json").exists()


def test_directory_outputs_appear_whole_or_not_at_all(tmp_path):
    """A failing run leaves the previous output as it was and no temp directory; only the last path component
    is created; a killed run's temp directory is removed by the next run."""
    import subprocess
    import sys

    cache = StageCache(tmp_path / "cache", "tree")
    out = tmp_path / "run"

    def produce(directory) -> None:
        (directory / "metrics.json").write_text("new")
        raise RuntimeError("killed half-way")

    out.mkdir()
    (out / "metrics.json").write_text("old")
    with pytest.raises(RuntimeError):
        cache.produce_tree(cache.key({"v": 1}), out, produce, lambda name: True)
    assert (out / "metrics.json").read_text() == "old"
    assert not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(ArenaError, match="does not exist"):
        cache.produce_tree(cache.key({"v": 2}), tmp_path / "no" / "such" / "run", produce, lambda name: True)
    assert not (tmp_path / "no").exists()
    # a temp directory of a process that is gone (a SIGKILLed run) is cleaned by the next run
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".run.{int(dead.stdout)}.abc123.tmp"
    stale.mkdir()
    (stale / "metrics.json").write_text("partial")
    cache.produce_tree(cache.key({"v": 3}), out, lambda d: (d / "metrics.json").write_text("3"), lambda name: True)
    assert not stale.exists() and (out / "metrics.json").read_text() == "3"


def test_a_directory_output_is_swapped_in_with_no_moment_without_it(tmp_path, monkeypatch):
    """An existing output directory was moved aside, then the new one moved in: a run killed between the two
    renames left no output at all (the previous one sat in a temp directory the next run deletes). The two are
    now swapped in one step (renameat2's RENAME_EXCHANGE), so a kill at any moment leaves the old or the new one;
    the two-rename path stays for systems without the call."""
    from libarena.artifacts import io as artifacts_io

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text("old")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").write_text("file")
    assert artifacts_io.exchange_paths(tmp_path / "a", tmp_path / "b")  # this host (Linux) has it
    assert (tmp_path / "a").read_text() == "file" and (tmp_path / "b").is_dir()
    with pytest.raises(FileNotFoundError):
        artifacts_io.exchange_paths(tmp_path / "a", tmp_path / "missing")

    def killed(*args, **kwargs):  # a SIGTERM where the old code renamed the previous output aside
        raise KeyboardInterrupt

    monkeypatch.setattr(artifacts_io.os, "rename", killed)
    with artifacts_io.atomic_directory(out, lambda name: True) as staging:
        (staging / "metrics.json").write_text("new")
    assert (out / "metrics.json").read_text() == "new" and not list(tmp_path.glob(".*.tmp"))
    # without the call (another system, or a filesystem without the flag): the two renames, as before
    monkeypatch.undo()
    monkeypatch.setattr(artifacts_io, "exchange_paths", lambda first, second: False)
    with artifacts_io.atomic_directory(out, lambda name: True) as staging:
        (staging / "metrics.json").write_text("newer")
    assert (out / "metrics.json").read_text() == "newer" and not list(tmp_path.glob(".*.tmp"))


def test_a_simulation_is_keyed_on_the_solver(tmp_path, monkeypatch):
    """Another HiGHS build may return another of several optimal answers to Gavel's and Sia's programs: a
    simulation cached under one build is not served under another."""
    import libarena.artifacts.stage_cache as stage_cache
    from libarena.pipeline.schedule import simulation_key
    from libarena.schedule.config import SimulatorConfig

    real = stage_cache.importlib_metadata.version
    installed = {"highspy": "1.11.0"}
    monkeypatch.setattr(stage_cache.importlib_metadata, "version", lambda name: installed.get(name) or real(name))
    simulations = StageCache(tmp_path, "arena-schedule simulate")

    def key() -> str:
        return simulation_key(simulations, {"policy": "sia"}, SimulatorConfig(), [], skip_bad_rows=False, plot=False)

    before = key()
    installed["highspy"] = "1.12.0"
    assert key() != before


def test_an_entry_a_concurrent_run_committed_first_is_kept(tmp_path):
    """Two runs that miss the same key both compute it; the second to commit keeps the first one's entry (a
    reader may already hold its files' paths) instead of swapping it out; a --no-cache run still replaces it."""
    source = tmp_path / "out.txt"
    source.write_text("same output\n")
    first, second = StageCache(tmp_path / "cache", "test-stage"), StageCache(tmp_path / "cache", "test-stage")
    key = first.key({"scale": 1.0})
    entry = first.store(key, {"out.txt": source})
    identity = entry.stat().st_ino
    assert second.store(key, {"out.txt": source}) == entry and entry.stat().st_ino == identity
    assert second.lookup(key) == {"out.txt": entry / "out.txt"}
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".")]  # its staging folder went away
    refreshing = StageCache(tmp_path / "cache", "test-stage", refresh=True)
    assert refreshing.store(key, {"out.txt": source}).stat().st_ino != identity
