"""metrics.json and compare.json: JSON artifacts of the registry (run_metrics, comparison), headed by kind,
schema version and provenance, and refused by name otherwise."""

from __future__ import annotations

import json
import math

import pytest

from libarena.artifacts import (Provenance, get_kind, json_document, read_json_document, write_json,
                                write_json_document)
from libarena.artifacts.kinds.run_metrics import SUMMARY_MAX_BYTES
from libarena.errors import ArenaError
from libarena.schedule.metrics import read_metrics

PROVENANCE = Provenance(tool="arena-schedule", parameters={"policy": "arena"},
                        inputs=[{"path": "trace.csv", "sha256": "0" * 64}])


def test_a_written_run_reads_back_without_its_header(tmp_path):
    path = tmp_path / "metrics.json"
    write_json_document(path, "run_metrics", {"policy": "arena", "avg_jct_s": 3.5, "p90_jct_s": None}, PROVENANCE)
    metrics = read_metrics(path)
    assert metrics["policy"] == "arena" and metrics["avg_jct_s"] == 3.5 and math.isnan(metrics["p90_jct_s"])
    assert "arena" not in metrics  # the header is not a metric
    doc = read_json_document(path, "run_metrics")
    assert doc.schema_version == 1 and doc.provenance == PROVENANCE and doc.data["p90_jct_s"] is None
    # the fields stay at the top level for readers that pick keys (jq, a notebook)
    assert json.loads(path.read_text())["avg_jct_s"] == 3.5


def test_a_document_written_before_the_header_still_reads(tmp_path):
    """An output folder that make leaves as it is (examples/paper, the demo) keeps working after an upgrade."""
    path = tmp_path / "metrics.json"
    path.write_text('{"policy": "fcfs", "submitted_jobs": 3, "avg_jct_s": null}')
    metrics = read_metrics(path)
    assert metrics["policy"] == "fcfs" and math.isnan(metrics["avg_jct_s"])
    doc = read_json_document(path, "run_metrics")
    assert doc.schema_version == 0 and doc.provenance == Provenance(tool="")
    path.write_text('{"reference": "arena", "policies": {}}')
    assert read_json_document(path, "comparison").data == {"reference": "arena", "policies": {}}
    # either kind may be asked for: the fields say which it is
    assert read_json_document(path, ("run_metrics", "comparison")).kind == "comparison"


@pytest.mark.parametrize("text,needle", [
    ('{"policy": "arena", "avg_jct_s": 1.0}', "not a run_metrics document (no 'arena' header, nor the fields of one "
                                              "written before it (run_metrics: policy, submitted_jobs, avg_jct_s))"),
    ('{"reference": "arena", "policies": {}}', "not a run_metrics document"),  # a comparison given as a run
    ('[1, 2]', "not a run_metrics document (a JSON list, not an object)"),
    ('{"arena": {"kind": "comparison", "schema_version": 1}}', "is a comparison artifact, expected run_metrics"),
    ('{"arena": {"kind": "plans", "schema_version": 1}}', "is a plans artifact, expected run_metrics"),
    ('{"arena": {"kind": "run_metrics", "schema_version": 2}}', "run_metrics schema version 2 is not supported (this "
                                                               "Arena reads version 0 and 1; re-run arena-schedule simulate"),
    ('{"arena": {"kind": "run_metrics"}}', "corrupt Arena metadata"),
    ('{"arena": [1]}', "corrupt Arena metadata"),
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


def test_a_huge_file_is_refused_unread(tmp_path):
    path = tmp_path / "metrics.json"
    with open(path, "wb") as f:  # sparse: the size alone must refuse it
        f.truncate(SUMMARY_MAX_BYTES + 1)
    with pytest.raises(ArenaError, match=r"refused as a run_metrics document: larger than 16 MiB"):
        read_metrics(path)


def test_a_body_cannot_shadow_the_header_and_tables_are_not_json_documents():
    with pytest.raises(ValueError, match="'arena'"):
        json_document("comparison", {"arena": {}}, PROVENANCE)
    with pytest.raises(ValueError, match="not a JSON artifact"):
        json_document("plans", {}, PROVENANCE)
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
