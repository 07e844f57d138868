"""bench_handoff: a two-stage plan's step timed as the runtime runs it, with copies of ready inputs, and with
its hand-offs' inputs already in place, on a real model in a 2-device child."""

from __future__ import annotations

import pytest


@pytest.mark.multidevice
@pytest.mark.slow
def test_the_handoff_benchmark_times_every_two_stage_plan_three_ways(tmp_path):
    from bench.laid_out import run_laid_out_child
    from libarena.profile.host import STARTING_CORES
    from libarena.profile.local_plans import enumerate_grid_plans, model_clusters, write_plans_table

    if len(STARTING_CORES) < 2:
        pytest.skip("needs 2 usable cores")
    plans = enumerate_grid_plans("gpt__tiny", 8, 2, "cpu", 2)
    two_stage = sorted(p.plan_id for p in plans if p.pipeline_degree == 2)
    path = tmp_path / "plans.parquet"
    write_plans_table(str(path), "gpt__tiny", 8, plans, model_clusters("gpt__tiny", 8, num_clusters=2))
    result = run_laid_out_child("bench.bench_handoff", {"plans": {"gpt__tiny": str(path)}, "rounds": 2, "moves_timed": 2},
                               STARTING_CORES[:2], 2, tmp_path)
    rows = result["models"]["gpt__tiny"]
    assert sorted(r["plan_id"] for r in rows) == two_stage and two_stage
    for r in rows:
        # every micro-batch's activation goes forward and its gradient back
        assert r["handoffs_per_step"] == 2 * r["num_microbatches"]
        assert r["samples_per_variant"] == 2 * 5
        assert min(r["runtime_s"], r["copy_s"], r["ready_s"]) > 0
        assert r["handoffs_s"] == pytest.approx(r["runtime_s"] - r["ready_s"])
        assert set(r["move_alone_s"]) == {"forward", "backward"} and min(r["move_alone_s"].values()) > 0
    assert result["host"]


def test_a_laid_out_benchmark_refuses_in_one_line_without_the_cores_it_needs():
    from bench.laid_out import laid_out_run
    from libarena.errors import ArenaError

    with pytest.raises(ArenaError, match="^bench_x needs 99 usable cores, this process has [0-9]+$"):
        with laid_out_run("bench_x", ("gpt__tiny",), 99, print):
            pass
