"""A benchmark's record of the code it measured with (bench.provenance), and bench_profile's --resume: an
incomplete run's finished models kept, only when the same code, setup, layout and isolation timed them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from libarena.errors import ArenaError


def _tree(root):
    (root / "libarena" / "sub").mkdir(parents=True)
    (root / "bench").mkdir()
    (root / "libarena" / "a.py").write_text("A = 1\n")
    (root / "libarena" / "sub" / "b.py").write_text("B = 2\n")
    (root / "bench" / "c.py").write_text("import libarena.sub.b\n\nC = 3\n")
    return root


def test_the_source_digest_follows_every_measuring_file_and_nothing_else(tmp_path):
    from libarena.artifacts.source import source_digest

    root = _tree(tmp_path)
    source = ("libarena", "bench/c.py")

    def digest():
        return source_digest(root, source)

    first = digest()
    assert len(first) == 64 and digest() == first
    # caches and non-Python files are not source
    (root / "libarena" / "__pycache__").mkdir()
    (root / "libarena" / "__pycache__" / "a.cpython-311.py").write_text("cached\n")
    (root / "bench" / "results.json").write_text("{}\n")
    assert digest() == first
    # an edit, a new file, a file renamed, bytes moved from one file to the next: each another digest
    (root / "libarena" / "a.py").write_text("A = 10\n")
    edited = digest()
    assert edited != first
    (root / "libarena" / "a.py").write_text("A = 1\n")
    assert digest() == first
    (root / "libarena" / "d.py").write_text("")
    assert digest() not in (first, edited)
    (root / "libarena" / "d.py").unlink()
    (root / "libarena" / "sub" / "b.py").rename(root / "libarena" / "sub" / "e.py")
    assert digest() != first
    (root / "libarena" / "sub" / "e.py").rename(root / "libarena" / "sub" / "b.py")
    assert digest() == first
    # another benchmark's module is not this one's source
    (root / "bench" / "other.py").write_text("X = 1\n")
    assert digest() == first
    (root / "bench" / "c.py").write_text("import libarena.sub.b\n\nC = 4\n")
    assert digest() != first
    (root / "bench" / "c.py").write_text("import libarena.sub.b\n\nC = 3\n")
    (root / "libarena" / "a.py").write_text("A = 1\nB")
    (root / "libarena" / "sub" / "b.py").write_text(" = 2\n")
    assert digest() != first


def test_the_code_identity_names_the_commit_and_whether_the_source_differs_from_it(tmp_path):
    from bench.provenance import code_identity

    if shutil.which("git") is None:
        pytest.skip("no git")
    root = _tree(tmp_path)
    modules = ("bench/c.py",)
    assert code_identity(modules, root)["git"] is None  # not a checkout
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["init", "-q"], cwd=root, check=True)
    subprocess.run(git + ["add", "."], cwd=root, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "c"], cwd=root, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    clean = code_identity(modules, root)
    assert clean["git"] == {"commit": head, "dirty": False} and clean["source"] == ["bench/c.py", "libarena/sub/b.py"]
    # a results file written beside, another benchmark's edit, library code the benchmark cannot run: not an edit
    # of this source
    (root / "libarena" / "results.json").write_text("{}\n")
    (root / "bench" / "other.py").write_text("X = 1\n")
    (root / "libarena" / "a.py").write_text("A = 2\n")
    assert code_identity(modules, root)["git"]["dirty"] is False
    assert code_identity(modules, root)["source_sha256"] == clean["source_sha256"]
    (root / "libarena" / "sub" / "b.py").write_text("B = 3\n")
    edited = code_identity(modules, root)
    assert edited["git"] == {"commit": head, "dirty": True} and edited["source_sha256"] != clean["source_sha256"]


# --------------------------------------------------------------------------------------------------
# --resume


def _row(model, n, est, meas):
    return {"model": model, "num_gpus": n, "plan_id": f"{model}-{n}", "error": est / meas - 1, "measured_s": meas,
            "measured_median_s": meas, "estimate_plain_s": est, "measured_iqr_over_median": 0.02,
            "estimate_other_concurrency_models_s": {"independent": meas}, "measurement_compile_device_s": 10.0 * n,
            "measurement_device_s": 12.0 * n, "measured_samples_s": [meas] * 10}


def _cost(model):
    return {"model": model, "profiling_device_s": 4.0, "co_run_device_s": 0.0, "stages_profiled": 2,
            "measurement_device_s": 36.0, "measurement_compile_device_s": 30.0,
            "paper_grids": [{"num_gpus": 4, "plans": 2, "distinct_stages": 2, "num_units": 2,
                             "stages": [{"start": 0, "stop": 1, "micro_batch": 2, "tp": 1, "ep": 1, "zero_shards": 1},
                                        {"start": 1, "stop": 2, "micro_batch": 2, "tp": 1, "ep": 1, "zero_shards": 1}]}],
            "stage_costs": [{"start": 0, "stop": 2, "micro_batch": 4, "tp": 1, "zero_shards": 1,
                             "device_s": 2.0, "compile_s": 1.0, "timed_microbatch_s": 0.5, "timed_optimizer_s": 0.1}],
            "profiling_timed_iterations": 18, "quiet_check": None,
            "plain_estimates": [[1, f"{model}-1", 1.01], [2, f"{model}-2", 0.98]]}


def _earlier_run(identity, models=("gpt__tiny", "bert__tiny", "moe__tiny"), done=("gpt__tiny",), unsteady=(),
                 layout="pinned", isolation="child"):
    from bench import bench_profile as bp

    rows = [r for m in done for r in (_row(m, 1, 1.01, 1.0), _row(m, 2, 0.98, 1.0))]
    for r in rows:  # each plan judged as timed_until_steady does (an unsteady model: its 1-device plan)
        shaky = r["model"] in unsteady and r["num_gpus"] == 1
        r["steadiness"] = {"control_gap": 0.03 if shaky else 0.005, "control_noise": 0.02, "error_se": 0.01, "steady": not shaky}
    steadiness = {m: {"steady": m not in unsteady, "plans": 2,
                      "largest": {"control_gap": 0.03 if m in unsteady else 0.005, "control_noise": 0.02, "error_se": 0.01},
                      "plans_unsteady": ["1/p"] if m in unsteady else []} for m in done}
    return {"summary": {"models_not_done": [m for m in models if m not in done], "conclusive": not unsteady, "met": False,
                        "plan_limits": LIMITS, "model_steadiness": steadiness, "models_unsteady": list(unsteady),
                        "code_changed_during_run": False},
            "plans": rows, "costs": [_cost(m) for m in done],
            "protocol": {"code": identity, "layout": layout, "stage_isolation": isolation, "models": list(done),
                         "quiet_check": {"quiet": True}},
            "setup": {"models": list(models), "global_batch": bp.GLOBAL_BATCH, "clusters": bp.NUM_CLUSTERS,
                      "device_counts": list(bp.DEVICE_COUNTS), "warmup": bp.WARMUP,
                      "profile_cost_run": {"warmup": bp.PROFILE_WARMUP, "repeats": bp.PROFILE_REPEATS}}}


IDENTITY = {"source_sha256": "a" * 64, "source": ["libarena", "bench"], "git": None}
LIMITS = {"control_gap": 0.02, "control_noise": 0.05, "error_se": 0.03}


def test_an_incomplete_run_of_the_same_code_and_setup_is_resumed_with_its_finished_models_kept(tmp_path):
    from bench.bench_profile import earlier_part

    path = tmp_path / "part.json"
    path.write_text(json.dumps(_earlier_run(IDENTITY)))
    part = earlier_part(path, ("gpt__tiny", "bert__tiny", "moe__tiny"), IDENTITY, None, "child", _limits())
    assert part["done"] == ["gpt__tiny"] and part["todo"] == ["bert__tiny", "moe__tiny"] and part["layout"] == "pinned"
    assert part["timed_again"] == []
    assert part["model_steadiness"] == {"gpt__tiny": {"steady": True, "plans": 2, "plans_unsteady": [],
                                                      "largest": {"control_gap": 0.005, "control_noise": 0.02, "error_se": 0.01}}}
    assert [p["file"] for p in part["parts"]] == ["part.json"] and part["parts"][0]["models"] == ["gpt__tiny"]
    # a part that was itself resumed hands on its earlier parts first
    resumed = _earlier_run(IDENTITY, done=("gpt__tiny", "bert__tiny"))
    resumed["protocol"] = {**resumed["protocol"], "models": ["bert__tiny"], "earlier_parts": part["parts"]}
    path2 = tmp_path / "part2.json"
    path2.write_text(json.dumps(resumed))
    chained = earlier_part(path2, ("gpt__tiny", "bert__tiny", "moe__tiny"), IDENTITY, "pinned", "child", _limits())
    assert chained["todo"] == ["moe__tiny"]
    assert [(p["file"], p["models"]) for p in chained["parts"]] == [("part.json", ["gpt__tiny"]), ("part2.json", ["bert__tiny"])]


def _without_code(payload):
    del payload["protocol"]["code"]


def _other_code(payload):
    payload["protocol"]["code"] = {**IDENTITY, "source_sha256": "b" * 64}


def _other_batch(payload):
    payload["setup"]["global_batch"] = 8


def _edited_while_running(payload):
    payload["summary"]["code_changed_during_run"] = True


def _without_steadiness(payload):
    del payload["summary"]["model_steadiness"]


def _limits():
    from bench.bench_profile import PlanLimits

    return PlanLimits(**LIMITS)


def _other_limits(payload):
    payload["summary"]["plan_limits"] = {**LIMITS, "control_noise": 0.1}


def _earlier_look_judged(payload):  # a part of the protocol before each plan had a control (looks at the host judged)
    summary = payload["summary"]
    summary["noise_limit"], summary["noise_brackets"] = 0.05, summary.pop("model_steadiness")
    del summary["plan_limits"]


def _all_steady(payload):  # every model asked for done steadily
    done = ("gpt__tiny", "bert__tiny", "moe__tiny")
    payload.update(_earlier_run(IDENTITY, done=done))


@pytest.mark.parametrize("content, change, args, why", [
    (None, None, {}, "no such file"),
    ("not json", None, {}, "not a readable JSON file"),
    ("[1, 2]", None, {}, "not a results file of this benchmark"),
    ("", _without_code, {}, "does not record the code"),
    ("", _other_code, {}, "measured with other code \\(source bbbbbbbbbbbb, this checkout's aaaaaaaaaaaa\\)"),
    ("", _other_batch, {}, "its setup differs \\(global_batch\\)"),
    ("", None, {"threading": "default"}, "ran with XLA threading 'pinned', not 'default'"),
    ("", None, {"isolation": "process"}, "timed with isolation 'child', not 'process'"),
    ("", None, {"models": ("bert__tiny", "moe__tiny")}, "holds models not asked for \\(gpt__tiny\\)"),
    ("", None, {"models": ("gpt__tiny",)}, "nothing to resume"),
    ("", _all_steady, {}, "every model asked for is done steadily in it: nothing to resume"),
    ("", _edited_while_running, {}, "its code was edited while it ran"),
    ("", _without_steadiness, {}, "does not record how steadily each model was timed"),
    ("", _other_limits, {}, "judged with other limits \\(\\{'control_gap': 0.02, 'control_noise': 0.1, 'error_se': 0.03\\}, not"),
    ("", _earlier_look_judged, {}, "judged with other limits \\(None, not"),
])
def test_a_resume_is_refused_in_one_line_naming_why(tmp_path, content, change, args, why):
    import re

    from bench.bench_profile import earlier_part

    path = tmp_path / "part.json"
    if content == "":  # a run of this benchmark, changed
        payload = _earlier_run(IDENTITY)
        if change is not None:
            change(payload)
        path.write_text(json.dumps(payload))
    elif content is not None:
        path.write_text(content)
    asked = {"models": ("gpt__tiny", "bert__tiny", "moe__tiny"), "threading": None, "isolation": "child", **args}
    with pytest.raises(ArenaError) as caught:
        earlier_part(path, asked["models"], IDENTITY, asked["threading"], asked["isolation"], _limits())
    message = str(caught.value)
    assert message.startswith(f"bench_profile: cannot resume {path}: ") and "\n" not in message
    assert re.search(why, message), message


def _fake_host(monkeypatch, child_models_done, gap=0.005, start_load=0.1, noise=0.09):
    """The host's probes and the measuring child replaced: what run() does with their results is under test.
    ``gap``: every plan's control gap; ``noise``: what the burst probe reads (a record); ``start_load`` above the
    start policy's limit: the start check gives up on the load (--allow-busy) untimed."""
    from bench import bench_profile, child
    from libarena.profile import host

    floor = {"schemes": [{"turns": 5, "turn_s": 1.0, "mean_gap": 0.001}]}
    started_busy = start_load > host.QuietPolicy().max_load
    monkeypatch.setattr(host, "wait_until_quiet", lambda *a, **k: {"quiet": not started_busy, "load_average": start_load, "busy_processes": [],
                                                                    "timing_noise": None if started_busy else {"level": noise}})
    monkeypatch.setattr(host, "timing_noise", lambda *a, **k: {"level": noise})
    monkeypatch.setattr(host, "alternation_floor", lambda *a, **k: floor)
    asked = []

    def fake_child(command, out, *a, **k):
        request = json.loads(open(command[-2]).read())
        asked.append(request)
        kept = request.get("kept", {})
        rows = [r for m in child_models_done for r in (_row(m, 1, 1.03, 1.0), _row(m, 2, 1.0, 1.0))
                if [r["num_gpus"], r["plan_id"]] not in kept.get(m, {}).get("plans", [])]
        for r in rows:  # each plan judged by its control (timed_until_steady)
            steady = gap <= request["gate"]["limits"]["control_gap"]
            r["steadiness"] = {"control_gap": gap, "control_noise": 0.02, "error_se": 0.01, "busy_processes": [], "steady": steady,
                               "attempt": 1 if steady else bench_profile.PLAN_ATTEMPTS}
        costs = [_cost(m) for m in child_models_done if not kept.get(m, {}).get("cost")]
        for c in costs[1:]:  # the quiet check before each model's cost run (a record)
            look = {"quiet": True, "busy_processes": [], "timing_noise": {"level": noise}}
            c["quiet_check"] = {**look, "first_look": dict(look)}
        again = [{"model": child_models_done[0], "num_gpus": 1, "plan_id": "unsteady-once", "error": 0.2,
                  "steadiness": {"control_gap": 0.04, "control_noise": 0.02, "error_se": 0.01, "busy_processes": [], "steady": False,
                                 "attempt": 1}}]
        return {"rows": rows, "rows_timed_again": again, "costs": costs, "models_done": list(child_models_done),
                "models_skipped_for_time": [], "threading": {"name": request["threading"]}, "host": {}, "calibration_s": 1.0,
                "host_sharing": {}}, None

    monkeypatch.setattr(child, "run_child", fake_child)
    return asked


def test_a_resumed_run_times_only_the_rest_and_writes_every_models_rows_to_another_file(tmp_path, monkeypatch):
    from bench import bench_profile

    identity = bench_profile.measuring_code()
    models = ("gpt__tiny", "bert__tiny", "moe__tiny")
    part = tmp_path / "part.json"
    part.write_text(json.dumps(_earlier_run(identity, models, layout="default")))
    before = part.read_bytes()
    asked = _fake_host(monkeypatch, ["bert__tiny", "moe__tiny"])
    # the resumed file cannot be the one written: that would overwrite an input
    with pytest.raises(ArenaError, match="is the file this run would write"):
        bench_profile.run(tmp_path, models, "part", isolation="child", resume=part)
    assert not asked
    bench_profile.run(tmp_path, models, "whole", isolation="child", resume=part)
    assert part.read_bytes() == before
    # the child was asked for the rest only, with the earlier part's layout
    assert [(a["models"], a["threading"], a["isolation"]) for a in asked] == [(["bert__tiny", "moe__tiny"], "default", "child")]
    whole = json.loads((tmp_path / "whole.json").read_text())
    assert whole["setup"]["models"] == list(models)
    assert sorted({r["model"] for r in whole["plans"]}) == sorted(models) and len(whole["plans"]) == 6
    assert [c["model"] for c in whole["costs"]] == list(models)
    summary = whole["summary"]
    assert summary["complete"] and summary["conclusive"] and not summary["code_changed_during_run"]
    assert summary["plans_1_devices"] == 3 and summary["mae_1_devices"] == pytest.approx((0.01 + 0.03 + 0.03) / 3)
    # a timing done again (unsteady) is kept apart, out of the figures
    assert [r["plan_id"] for r in whole["plans_timed_again"]] == ["unsteady-once"] and summary["plans_timed_again"] == 1
    protocol = whole["protocol"]
    assert protocol["code"] == identity and protocol["models"] == ["bert__tiny", "moe__tiny"]
    assert [(p["file"], p["models"]) for p in protocol["earlier_parts"]] == [("part.json", ["gpt__tiny"])]


def test_a_resumed_run_times_again_the_models_an_earlier_part_timed_unsteadily(tmp_path, monkeypatch):
    from bench import bench_profile

    identity = bench_profile.measuring_code()
    models = ("gpt__tiny", "bert__tiny", "moe__tiny")
    part = tmp_path / "part.json"
    part.write_text(json.dumps(_earlier_run(identity, models, done=("gpt__tiny", "bert__tiny"), unsteady=("bert__tiny",), layout="default")))
    asked = _fake_host(monkeypatch, ["bert__tiny", "moe__tiny"])
    assert bench_profile.run(tmp_path, models, "whole", isolation="child", resume=part)
    assert [a["models"] for a in asked] == [["bert__tiny", "moe__tiny"]]
    assert asked[0]["gate"]["limits"] == {"control_gap": bench_profile.MAX_CONTROL_GAP, "control_noise": bench_profile.MAX_CONTROL_NOISE,
                                          "error_se": bench_profile.MAX_ERROR_SE}
    # bert__tiny's plan timed steadily there (2 devices) and its cost run are kept: the child times its other plan
    assert asked[0]["kept"] == {"bert__tiny": {"plans": [[2, "bert__tiny-2"]], "cost": _cost("bert__tiny")},
                                "moe__tiny": {"plans": [], "cost": None}}
    whole = json.loads((tmp_path / "whole.json").read_text())
    # each plan's row from the one part that timed it steadily; the earlier unsteady row is set aside
    assert sorted(r["model"] for r in whole["plans"]) == sorted(models * 2)
    assert [(r["model"], r["num_gpus"], r.get("timed_in")) for r in whole["plans"]] == [
        ("gpt__tiny", 1, None), ("gpt__tiny", 2, None), ("bert__tiny", 1, "whole.json"), ("bert__tiny", 2, None),
        ("moe__tiny", 1, "whole.json"), ("moe__tiny", 2, "whole.json")]
    assert [(r["model"], r["num_gpus"], r["error"]) for r in whole["plans_timed_again"] if r["model"] == "bert__tiny"] == [
        ("bert__tiny", 1, pytest.approx(0.01)), ("bert__tiny", 1, 0.2)]
    assert [c["model"] for c in whole["costs"]] == list(models)
    # a model's measurement cost sums its plans' rows, whichever part timed them
    assert [(c["model"], c["measurement_device_s"], c["plans_measured"]) for c in whole["costs"]] == [(m, 36.0, 2) for m in models]
    summary = whole["summary"]
    # the burst probe read noisy throughout (0.09): a record, not a judge; each plan's own control judges it
    assert summary["complete"] and summary["conclusive"] and summary["models_unsteady"] == []
    assert sorted(summary["model_steadiness"]) == sorted(models) and all(b["steady"] for b in summary["model_steadiness"].values())
    assert whole["protocol"]["timing_noise_after"] == {"level": 0.09}
    assert [(p["file"], p["models"], p["models_timed_again"]) for p in whole["protocol"]["earlier_parts"]] == \
        [("part.json", ["gpt__tiny", "bert__tiny"], ["bert__tiny"])]
    # a part whose plans drifted is judged so, its models (the earlier part's steady one kept) to be timed again
    _fake_host(monkeypatch, ["bert__tiny", "moe__tiny"], gap=0.03, noise=0.01)
    assert not bench_profile.run(tmp_path, models, "unsteady", isolation="child", resume=part)
    summary = json.loads((tmp_path / "unsteady.json").read_text())["summary"]
    assert not summary["conclusive"] and not summary["met"] and summary["models_unsteady"] == ["bert__tiny", "moe__tiny"]
    assert earlier_todo(tmp_path / "unsteady.json", models, identity) == ["bert__tiny", "moe__tiny"]
    # a start given up on for the load average alone: the noise is timed all the same, for the record; the plans'
    # own controls judge them
    _fake_host(monkeypatch, ["bert__tiny", "moe__tiny"], start_load=5.0, noise=0.02)
    assert bench_profile.run(tmp_path, models, "loaded", isolation="child", resume=part)
    loaded = json.loads((tmp_path / "loaded.json").read_text())
    assert loaded["summary"]["model_steadiness"]["bert__tiny"] == {"steady": True, "plans": 2, "plans_unsteady": [],
                                                                   "largest": {"control_gap": 0.005, "control_noise": 0.02, "error_se": 0.01}}
    check = loaded["protocol"]["quiet_check"]
    assert check["load_average"] == 5.0 and not check["quiet"] and check["timing_noise"] == {"level": 0.02}


def _stopped_in_a_model(identity):
    """A part stopped while timing bert__tiny: gpt__tiny done, bert__tiny's cost run and one plan of two timed
    (steadily), moe__tiny not started; one more bert__tiny row timed unsteadily."""
    payload = _earlier_run(identity, done=("gpt__tiny",), layout="default")
    payload["summary"]["models_not_done"] = ["bert__tiny", "moe__tiny"]
    steady, shaky = _row("bert__tiny", 1, 1.02, 1.0), _row("moe__tiny", 2, 1.2, 1.0)
    steady["steadiness"] = {"control_gap": 0.004, "control_noise": 0.03, "error_se": 0.02, "steady": True}
    shaky["steadiness"] = {"control_gap": 0.06, "control_noise": 0.03, "error_se": 0.02, "steady": False}
    payload["plans"] += [steady, shaky]
    payload["costs"].append(_cost("bert__tiny"))
    return payload


def test_a_part_stopped_inside_a_model_keeps_its_steady_plans_and_cost_run(tmp_path, monkeypatch):
    from bench import bench_profile
    from bench.bench_profile import earlier_part

    identity = bench_profile.measuring_code()
    models = ("gpt__tiny", "bert__tiny", "moe__tiny")
    path = tmp_path / "part.json"
    path.write_text(json.dumps(_stopped_in_a_model(identity)))
    part = earlier_part(path, models, identity, None, "child", _limits())
    assert part["done"] == ["gpt__tiny"] and part["todo"] == ["bert__tiny", "moe__tiny"] and part["timed_again"] == []
    assert part["kept"] == {"bert__tiny": {"plans": [[1, "bert__tiny-1"]], "cost": _cost("bert__tiny")},
                            "moe__tiny": {"plans": [], "cost": None}}
    assert [(r["model"], r["num_gpus"]) for r in part["rows"]] == [("gpt__tiny", 1), ("gpt__tiny", 2), ("bert__tiny", 1)]
    # the plan timed unsteadily is set aside (its samples dropped) and timed again
    assert [(r["model"], r["error"]) for r in part["timed_again_rows"]] == [("moe__tiny", pytest.approx(0.2))]
    assert "measured_samples_s" not in part["timed_again_rows"][0]
    # a cost row from before costs recorded their plain estimates cannot fill later rows: its cost run is done again
    old = _stopped_in_a_model(identity)
    del old["costs"][-1]["plain_estimates"]
    path.write_text(json.dumps(old))
    assert earlier_part(path, models, identity, None, "child", _limits())["kept"]["bert__tiny"] == {"plans": [[1, "bert__tiny-1"]], "cost": None}
    # rows that are not rows are refused in one line
    broken = _stopped_in_a_model(identity)
    broken["plans"].append(7)
    path.write_text(json.dumps(broken))
    with pytest.raises(ArenaError, match="its plans or costs are not rows$"):
        earlier_part(path, models, identity, None, "child", _limits())
    # the next part: its child is asked for the rest only, and the whole holds each plan once
    path.write_text(json.dumps(_stopped_in_a_model(identity)))
    asked = _fake_host(monkeypatch, ["bert__tiny", "moe__tiny"])
    assert bench_profile.run(tmp_path, models, "whole", isolation="child", resume=path)
    assert asked[0]["models"] == ["bert__tiny", "moe__tiny"] and asked[0]["kept"]["bert__tiny"]["plans"] == [[1, "bert__tiny-1"]]
    whole = json.loads((tmp_path / "whole.json").read_text())
    assert [(r["model"], r["num_gpus"], r.get("timed_in")) for r in whole["plans"]] == [
        ("gpt__tiny", 1, None), ("gpt__tiny", 2, None), ("bert__tiny", 1, None), ("bert__tiny", 2, "whole.json"),
        ("moe__tiny", 1, "whole.json"), ("moe__tiny", 2, "whole.json")]
    assert [(c["model"], c.get("timed_in"), c["plans_measured"]) for c in whole["costs"]] == [
        ("gpt__tiny", None, 2), ("bert__tiny", None, 2), ("moe__tiny", "whole.json", 2)]
    assert whole["summary"]["complete"] and whole["summary"]["conclusive"]
    assert whole["protocol"]["models_timed"] == ["bert__tiny", "moe__tiny"]


def test_a_stopped_part_keeps_every_plan_its_child_timed(tmp_path, monkeypatch):
    """The child stopped midway (SIGTERM) after timing one plan of a model: the file holds that plan (and the
    model's cost run), marked incomplete, and a resume from it times the rest only."""
    from bench import bench_profile, child

    identity = bench_profile.measuring_code()
    models = ("gpt__tiny", "bert__tiny")
    _fake_host(monkeypatch, [])
    row = _row("gpt__tiny", 1, 1.01, 1.0)
    row["steadiness"] = {"control_gap": 0.004, "control_noise": 0.03, "error_se": 0.02, "steady": True}

    def stopped_child(command, out, *a, **k):
        request = json.loads(open(command[-2]).read())
        return {"rows": [row], "rows_timed_again": [], "costs": [_cost("gpt__tiny")], "models_done": [],
                "models_skipped_for_time": [], "threading": {"name": request["threading"]}, "host": {}, "calibration_s": 1.0,
                "host_sharing": {}, "quiet_checks": [{"model": "gpt__tiny", "quiet_check": None}]}, "interrupted"

    monkeypatch.setattr(child, "run_child", stopped_child)
    assert not bench_profile.run(tmp_path, models, "part", "default", isolation="child")
    part = json.loads((tmp_path / "part.json").read_text())
    summary = part["summary"]
    assert not summary["complete"] and summary["stopped"] == "interrupted" and summary["models_not_done"] == ["gpt__tiny", "bert__tiny"]
    assert [(r["plan_id"], r["timed_in"]) for r in part["plans"]] == [("gpt__tiny-1", "part.json")]
    assert summary["model_steadiness"]["gpt__tiny"]["plans"] == 1 and summary["conclusive"]
    assert part["protocol"]["models_timed"] == ["gpt__tiny"]
    kept = earlier_part_of(tmp_path / "part.json", models, identity)["kept"]
    assert kept["gpt__tiny"]["plans"] == [[1, "gpt__tiny-1"]] and kept["gpt__tiny"]["cost"]["timed_in"] == "part.json"
    assert kept["bert__tiny"] == {"plans": [], "cost": None}
    # a plan still unsteady after its attempts leaves a stopped part inconclusive, though its model is unfinished
    row["steadiness"] = {"control_gap": 0.004, "control_noise": 0.11, "error_se": 0.02, "steady": False}
    assert not bench_profile.run(tmp_path, models, "shaky", "default", isolation="child")
    summary = json.loads((tmp_path / "shaky.json").read_text())["summary"]
    assert not summary["conclusive"] and summary["models_unsteady"] == ["gpt__tiny"]
    assert earlier_part_of(tmp_path / "shaky.json", models, identity)["kept"]["gpt__tiny"]["plans"] == []


def earlier_part_of(path, models, identity):
    from bench.bench_profile import earlier_part

    return earlier_part(path, models, identity, None, "child", _limits())


def earlier_todo(path, models, identity):
    from bench.bench_profile import earlier_part

    return earlier_part(path, models, identity, None, "child", _limits())["todo"]


def test_the_source_a_benchmark_can_run_follows_imports_strings_and_built_names(tmp_path):
    from bench.provenance import reachable_source

    files = {
        "bench/__init__.py": "",
        "bench/entry.py": "from bench.helper import H\n\ndef later():\n    from libarena.a import x  # deferred\n",
        "bench/helper.py": "H = 1\n",
        "bench/other.py": "import libarena.unused\n",
        "libarena/__init__.py": "",
        "libarena/a/__init__.py": "",
        "libarena/a/x.py": "from ..b import y\nfrom . import z\nCHILD = ['python', '-m', 'libarena.served']\n",
        "libarena/a/z.py": "import libarena.kinds\n",
        "libarena/b/__init__.py": "",
        "libarena/b/y.py": "import numpy\n",
        "libarena/served.py": "",
        "libarena/kinds/__init__.py": "import importlib\nfor m in ('k1',):\n    importlib.import_module(f'{__name__}.{m}')\n",
        "libarena/kinds/k1.py": "",
        "libarena/unused.py": "import libarena.served\n",
        "libarena/mentions.py": '"""importlib.import_module is only named here"""\n',
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    reached = reachable_source(("bench/entry.py",), tmp_path)
    assert reached == sorted(["bench/__init__.py", "bench/entry.py", "bench/helper.py", "libarena/__init__.py",
                              "libarena/a/__init__.py", "libarena/a/x.py", "libarena/a/z.py", "libarena/b/__init__.py",
                              "libarena/b/y.py", "libarena/served.py", "libarena/kinds/__init__.py", "libarena/kinds/k1.py"])
    # a file that only mentions import_module does not bring its package
    assert reachable_source(("libarena/mentions.py",), tmp_path) == ["libarena/mentions.py"]


def test_the_source_of_a_missing_benchmark_module_is_refused_by_name(tmp_path):
    """An identity that silently left out a module it was asked for would not tell two runs' code apart."""
    from bench.provenance import reachable_source

    (tmp_path / "bench").mkdir()
    (tmp_path / "bench/__init__.py").write_text("")
    with pytest.raises(FileNotFoundError, match="bench/gone.py"):
        reachable_source(("bench/__init__.py", "bench/gone.py"), tmp_path)


@pytest.mark.parametrize("benchmark", ["bench_profile", "bench_host", "bench_gpu"])
def test_a_benchmarks_code_holds_every_file_it_loads_and_not_the_scheduler(repo_root, benchmark):
    """The digest covers what a fresh interpreter loads when it runs every import of the benchmark (its functions'
    deferred ones too) and of the modules its children run; the scheduler, which none of these benchmarks can
    run, is outside it (so editing the scheduler does not part two runs' rows)."""
    import ast
    import importlib
    import sys

    from bench.provenance import code_identity

    source = set(code_identity(importlib.import_module(f"bench.{benchmark}").MEASURING_MODULES, repo_root)["source"])
    assert {f"bench/{benchmark}.py", "bench/provenance.py", "libarena/errors.py"} <= source
    assert not any(f.startswith("libarena/schedule/") for f in source)
    imported = {f"bench.{benchmark}"}
    for node in ast.walk(ast.parse((repo_root / "bench" / f"{benchmark}.py").read_text())):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module)
    if benchmark == "bench_profile":  # what its children run with -m
        imported |= {"libarena.profile.corun", "libarena.profile.measure", "libarena.profile.stage_child",
                     "libarena.profile.comm_bench", "libarena.profile.concurrency"}
    code = ("import json, sys\n"
            f"for name in {sorted(imported)!r}:\n"
            "    __import__(name)\n"
            "print(json.dumps(sorted({getattr(m, '__file__', None) or '' for m in list(sys.modules.values())})))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=300, check=True)
    root = repo_root.resolve()
    loaded = {Path(f).resolve().relative_to(root).as_posix() for f in json.loads(done.stdout.splitlines()[-1])
              if f and Path(f).resolve().is_relative_to(root)}
    ours = {f for f in loaded if f.split("/", 1)[0] in ("libarena", "bench")}
    assert f"bench/{benchmark}.py" in ours and ours <= source


def test_code_edited_while_a_run_goes_on_makes_it_inconclusive():
    from bench.bench_profile import judge_code

    summary = {"met": True, "conclusive": True}
    judge_code(summary, IDENTITY, dict(IDENTITY))
    assert summary == {"met": True, "conclusive": True, "code_changed_during_run": False}
    judge_code(summary, IDENTITY, {**IDENTITY, "source_sha256": "c" * 64})
    assert summary == {"met": False, "conclusive": False, "code_changed_during_run": True}
