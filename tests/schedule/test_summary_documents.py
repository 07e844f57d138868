"""metrics.json and compare.json: JSON artifacts of the registry (run_metrics, comparison), headed by kind,
schema version and provenance, their fields checked, and refused by name otherwise."""

from __future__ import annotations

import io
import json
import math
import sys

import pytest

from libarena.artifacts import (Provenance, get_kind, json_document, read_json_document, write_json,
                                write_json_document)
from libarena.artifacts.kinds.run_metrics import SUMMARY_MAX_BYTES
from libarena.errors import ArenaError
from libarena.schedule.metrics import read_metrics, summary_line

PROVENANCE = Provenance(tool="arena-schedule", parameters={"policy": "arena"},
                        inputs=[{"path": "trace.csv", "sha256": "0" * 64}])
SAMPLE = {"str": "arena", "int": 3, "float": 3.5}


def a_run(**override):
    """Every field run_metrics declares, with a value of its type."""
    fields = {f.name: SAMPLE[f.type] for f in get_kind("run_metrics").fields}
    fields.update(override)
    return fields


def test_a_written_run_reads_back_without_its_header(tmp_path):
    path = tmp_path / "metrics.json"
    write_json_document(path, "run_metrics", a_run(p90_jct_s=None), PROVENANCE)
    metrics = read_metrics(path)
    assert metrics["policy"] == "arena" and metrics["avg_jct_s"] == 3.5 and math.isnan(metrics["p90_jct_s"])
    assert "arena" not in metrics  # the header is not a metric
    doc = read_json_document(path, "run_metrics")
    assert doc.schema_version == 1 and doc.provenance == PROVENANCE and doc.data["p90_jct_s"] is None
    # the fields stay at the top level for readers that pick keys (jq, a notebook)
    assert json.loads(path.read_text())["avg_jct_s"] == 3.5
    assert summary_line(metrics).startswith("arena: 3/3 finished")


def test_a_document_written_before_the_header_still_reads(tmp_path):
    """An output folder that make leaves as it is (examples/paper, the demo) keeps working after an upgrade."""
    path = tmp_path / "metrics.json"
    legacy = {name: SAMPLE["int"] for name in get_kind("run_metrics").headerless_fields} | {"policy": "fcfs", "avg_jct_s": None}
    path.write_text(json.dumps(legacy))
    metrics = read_metrics(path)
    assert metrics["policy"] == "fcfs" and math.isnan(metrics["avg_jct_s"])
    doc = read_json_document(path, "run_metrics")
    assert doc.schema_version == 0 and doc.provenance == Provenance(tool="", arena_version="")  # nobody vouches for it
    path.write_text(json.dumps({"arena": None, **legacy}))  # a null header is no header, and not a field
    assert "arena" not in read_json_document(path, "run_metrics").data
    path.write_text('{"reference": "arena", "policies": {}}')
    assert read_json_document(path, "comparison").data == {"reference": "arena", "policies": {}}
    # either kind may be asked for: the fields say which it is
    assert read_json_document(path, ("run_metrics", "comparison")).kind == "comparison"


@pytest.mark.parametrize("text,needle", [
    ('{"policy": "arena", "avg_jct_s": 1.0}', "not a run_metrics document (no 'arena' header, nor the fields of one "
                                              "written before it (run_metrics: policy, submitted_jobs, finished_jobs"),
    ('{"reference": "arena", "policies": {}}', "not a run_metrics document"),  # a comparison given as a run
    ('[1, 2]', "not a run_metrics document (a JSON list, not an object)"),
    ('{"arena": {"kind": "comparison", "schema_version": 1}}', "is a comparison artifact, expected run_metrics"),
    ('{"arena": {"kind": "plans", "schema_version": 1}}', "is a plans artifact, expected run_metrics"),
    ('{"arena": {"kind": "run_metrics", "schema_version": 2}}', "run_metrics schema version 2 is not supported (this "
                                                               "Arena reads version 0 and 1; re-run arena-schedule simulate"),
    ('{"arena": {"kind": "run_metrics", "schema_version": "1"}}', "run_metrics schema version '1' is not supported"),
    ('{"arena": {"kind": "run_metrics", "schema_version": true}}', "run_metrics schema version True is not supported"),
    ('{"arena": {"kind": "run_metrics", "schema_version": 1.0}}', "run_metrics schema version 1.0 is not supported"),
    ('{"arena": {"kind": "run_metrics", "schema_version": 0}}', "corrupt Arena metadata (a run_metrics header of schema version 0)"),
    ('{"arena": {"kind": ["run_metrics"], "schema_version": 1}}', "corrupt Arena metadata (its kind is ['run_metrics'])"),
    ('{"arena": {"kind": "run_metrics"}}', "corrupt Arena metadata"),
    ('{"arena": [1]}', "corrupt Arena metadata"),
    ('{"arena": {"kind": "run_metrics", "schema_version": 1}}', "corrupt run_metrics document (no field policy, view,"),
    ("[" * 100000 + "]" * 100000, "not a run_metrics document (RecursionError"),
    ('{"arena": {"kind": "run_metrics"', "not a run_metrics document (JSONDecodeError"),
    ("\xff\xfe", "not a run_metrics document"),
])
def test_anything_else_is_a_one_line_error_naming_the_file(tmp_path, text, needle):
    path = tmp_path / "metrics.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ArenaError) as err:
        read_metrics(path)
    message = str(err.value)
    assert message.startswith(str(path)) and needle in message and "\n" not in message
    with pytest.raises(ArenaError, match="no such file"):
        read_metrics(tmp_path / "absent.json")
    with pytest.raises(ArenaError, match="is a directory"):
        read_metrics(tmp_path)


@pytest.mark.parametrize("field,value,needle", [
    ("policy", 1, "field 'policy' is a int, expected str"),
    ("finished_jobs", True, "field 'finished_jobs' is a bool, expected int"),
    ("avg_jct_s", "3 h", "field 'avg_jct_s' is a str, expected float"),
])
def test_fields_of_the_wrong_type_are_refused(tmp_path, field, value, needle):
    """What reads the document formats and indexes these: a wrong type would be a traceback there."""
    path = tmp_path / "metrics.json"
    write_json(path, json_document("run_metrics", a_run(**{field: value}), PROVENANCE))
    with pytest.raises(ArenaError, match=needle):
        read_metrics(path)
    path.write_text('{"reference": 1, "policies": {"fcfs": 5}}')
    with pytest.raises(ArenaError, match="field 'reference' is a int, expected str"):
        read_json_document(path, "comparison")
    path.write_text('{"reference": "arena", "policies": {"fcfs": 5}}')
    with pytest.raises(ArenaError, match=r"field 'policies' is a dict, expected dict\[str, dict\]"):
        read_json_document(path, "comparison")


def test_a_huge_header_value_makes_a_short_message(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"arena": {"kind": "x" * 100_000, "schema_version": 1}}))
    with pytest.raises(ArenaError) as err:
        read_metrics(path)
    assert len(str(err.value)) < len(str(path)) + 200


def test_a_huge_file_is_refused_unread(tmp_path):
    path = tmp_path / "metrics.json"
    with open(path, "wb") as f:  # sparse: the size alone must refuse it
        f.truncate(SUMMARY_MAX_BYTES + 1)
    with pytest.raises(ArenaError, match=r"refused as a run_metrics document: larger than 16 MiB"):
        read_metrics(path)


def test_stdin(monkeypatch):
    """'-' reads the document from stdin, as the other artifacts' readers do."""
    body = json.dumps(json_document("run_metrics", a_run(), PROVENANCE)).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(body)))
    assert read_json_document("-", "run_metrics").data["policy"] == "arena"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    with pytest.raises(ArenaError, match="stdin is empty"):
        read_json_document("-", "run_metrics")


def test_a_body_cannot_shadow_the_header_and_other_kinds_are_not_json_documents(tmp_path):
    with pytest.raises(ValueError, match="'arena'"):
        json_document("comparison", {"arena": {}}, PROVENANCE)
    with pytest.raises(ValueError, match="not a JSON artifact"):
        json_document("plans", {}, PROVENANCE)
    with pytest.raises(ValueError, match="not a JSON artifact"):
        read_json_document(tmp_path / "plans.parquet", "plans")
    assert json.loads(json.dumps(json_document("comparison", {"reference": "arena"}, PROVENANCE)))["arena"]["kind"] == "comparison"


def test_the_registry_documents_them():
    for name in ("run_metrics", "comparison"):
        kind = get_kind(name)
        assert kind.format == "json" and kind.readable_versions() == [0, 1] and kind.max_bytes == SUMMARY_MAX_BYTES
        assert set(kind.headerless_fields) <= {f.name for f in kind.fields}


def test_a_plain_json_file_is_not_mistaken_for_a_document(tmp_path):
    """write_json (bench results, exports) writes no header: such a file is not a run's metrics."""
    path = tmp_path / "metrics.json"
    write_json(path, {"policy": "arena"})
    with pytest.raises(ArenaError, match="no 'arena' header"):
        read_json_document(path, "run_metrics")


def test_a_writer_cannot_write_what_its_reader_refuses(tmp_path):
    path = tmp_path / "metrics.json"
    with pytest.raises(ValueError, match="no field view"):
        write_json_document(path, "run_metrics", {k: v for k, v in a_run().items() if k != "view"}, PROVENANCE)
    with pytest.raises(ValueError, match="field 'ticks' is a str, expected int"):
        write_json_document(path, "run_metrics", a_run(ticks="3"), PROVENANCE)
    assert not path.exists()
    import numpy as np

    write_json_document(path, "run_metrics", a_run(ticks=np.int64(3), avg_jct_s=np.float32(2.5)), PROVENANCE)  # as JSON sees them
    assert read_metrics(path)["ticks"] == 3


def test_a_json_kind_declares_only_types_its_reader_checks():
    from libarena.artifacts import ArtifactKind, Field, register_kind

    with pytest.raises(ValueError, match="field 'flag' has unknown type 'bool'"):
        register_kind(ArtifactKind(name="test_json_kind", version=1, format="json", produced_by="tests",
                                   description="a JSON kind for tests", fields=(Field("flag", "bool", "a flag"),)))


def test_a_kind_name_that_is_no_word_is_corrupt_metadata(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"arena": {"kind": "\x1b[31mrun_metrics", "schema_version": 1}}))
    with pytest.raises(ArenaError, match="corrupt Arena metadata \\(its kind is"):
        read_metrics(path)
