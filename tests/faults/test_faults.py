"""Fault tests (issue 6). Three faults, each injected for real:

- a profiling run killed mid-way: here (the cache keeps only complete entries, a rerun resumes from them);
- the live scheduler killed -9 and restarted: tests/live/test_recovery.py::test_kill9_and_restart_recovers;
- a training actor killed mid-run: tests/run/test_ray.py::test_killed_actor_restarts_from_last_checkpoint.

``python -m bench faults`` runs all three and records the outcomes in bench/results/faults.json.
"""

from __future__ import annotations

import pytest

from bench.bench_faults import profile_kill_and_resume

pytestmark = [pytest.mark.slow]


def test_killed_profiling_run_leaves_a_valid_cache_and_resumes(tmp_path):
    result = profile_kill_and_resume(tmp_path)
    assert result["killed"] and result["exit_signal"] == 9, result  # killed mid-way, not after finishing
    assert result["stage_profiles_at_kill"] >= 1
    assert result["incomplete_entries_at_kill"] == [], result  # no half-written entry
    assert not result["output_written_before_completion"], result  # no partial perf table
    assert result["rerun_exit_code"] == 0, result
    # every entry finished before the kill is served from the cache, not recomputed, and the rest is profiled
    assert result["entries_reused_unchanged"] == result["entries_at_kill"], result
    assert result["entries_rewritten"] == [], result
    assert result["entries_after_rerun"] > result["entries_at_kill"], result
    assert result["output_complete"], result
    assert result["ok"], result
