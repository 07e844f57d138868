"""metrics.json and compare.json: headed by kind, schema version and provenance, and refused by name otherwise."""

from __future__ import annotations

import json
import math

import pytest

from libarena.artifacts import Provenance, write_json
from libarena.errors import ArenaError
from libarena.schedule.metrics import read_metrics, read_summary, summary_document

PROVENANCE = Provenance(tool="arena-schedule", parameters={"policy": "arena"},
                        inputs=[{"path": "trace.csv", "sha256": "0" * 64}])


def test_a_written_run_reads_back_without_its_header(tmp_path):
    path = tmp_path / "metrics.json"
    write_json(path, summary_document("run_metrics", {"policy": "arena", "avg_jct_s": 3.5, "p90_jct_s": None}, PROVENANCE))
    metrics = read_metrics(path)
    assert metrics["policy"] == "arena" and metrics["avg_jct_s"] == 3.5 and math.isnan(metrics["p90_jct_s"])
    assert "arena" not in metrics  # the header is not a metric
    body, header = read_summary(path, "run_metrics")
    assert header["provenance"]["inputs"] == PROVENANCE.inputs and body["p90_jct_s"] is None


def test_a_document_written_before_the_header_still_reads(tmp_path):
    """An output folder that make leaves as it is (examples/paper, the demo) keeps working after an upgrade."""
    path = tmp_path / "metrics.json"
    path.write_text('{"policy": "fcfs", "submitted_jobs": 3, "avg_jct_s": null}')
    metrics = read_metrics(path)
    assert metrics["policy"] == "fcfs" and math.isnan(metrics["avg_jct_s"])
    assert read_summary(path, "run_metrics")[1] == {"kind": "run_metrics", "schema_version": 0, "provenance": {}}
    path.write_text('{"reference": "arena", "policies": {}}')
    assert read_summary(path, "comparison")[0] == {"reference": "arena", "policies": {}}


@pytest.mark.parametrize("text,needle", [
    ('{"policy": "arena", "avg_jct_s": 1.0}', "not a run_metrics document (no 'arena' header, nor the keys policy, submitted_jobs, avg_jct_s"),
    ('{"reference": "arena", "policies": {}}', "not a run_metrics document"),  # a comparison given as a run
    ('[1, 2]', "not a run_metrics document (a JSON list, not an object)"),
    ('{"arena": {"kind": "comparison", "schema_version": 1}}', "not a run_metrics document: its header says 'comparison'"),
    ('{"arena": {"kind": "run_metrics", "schema_version": 2}}', "of schema version 2; this Arena reads version 1 and earlier"),
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


def test_a_huge_file_is_refused_unread(tmp_path, monkeypatch):
    import libarena.schedule.metrics as metrics_module

    path = tmp_path / "metrics.json"
    write_json(path, summary_document("run_metrics", {"policy": "arena", "pad": "x" * 4096}, PROVENANCE))
    monkeypatch.setattr(metrics_module, "MAX_SUMMARY_BYTES", 1024)
    with pytest.raises(ArenaError, match=r"not a run_metrics document \(larger than "):
        read_metrics(path)


def test_a_body_cannot_shadow_the_header():
    with pytest.raises(ValueError, match="'arena'"):
        summary_document("comparison", {"arena": {}}, PROVENANCE)
    assert json.loads(json.dumps(summary_document("comparison", {"reference": "arena"}, PROVENANCE)))["arena"]["kind"] == "comparison"
