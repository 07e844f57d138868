"""Export to Alpa of plans that recompute activations in some stages only (Alpa's remat_layer is all or none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from libarena.errors import ArenaError
from libarena.hardware import load_cluster
from libarena.plan.export import alpa_expressible, export_plan, select_for_export

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def planset(tmp_path_factory):
    from libarena.analyze import AnalyzeConfig
    from libarena.pipeline import CacheSettings
    from libarena.pipeline.analyze import operator_table
    from libarena.plan import PlannerConfig, load_model_profile, plan_job

    profile = load_model_profile(operator_table(AnalyzeConfig("moe__2.4B", 256), CacheSettings(tmp_path_factory.mktemp("cache"))))
    return plan_job(profile, load_cluster(REPO / "examples" / "clusters" / "paper-sim-1280.yaml"), PlannerConfig())


def test_a_proxy_alpa_cannot_express_falls_back_to_the_best_expressible_frontier_plan(planset):
    partial = [g for g in planset.grids if g.proxy is not None and not alpa_expressible(g.proxy)]
    assert partial, "moe__2.4B at 256 on the paper's cluster has grids whose proxy recomputes in some stages only"
    kinds = set()
    for grid in partial:
        g = grid.grid
        plan, note = select_for_export(planset, "alpa", None, g.gpu_type, g.num_gpus, g.pipeline_degree)
        assert alpa_expressible(plan) and plan is not grid.proxy
        assert grid.proxy.plan_id in note and plan.plan_id in note
        doc = export_plan(planset, plan, "alpa")
        assert doc["plan_id"] == plan.plan_id and doc["remat_layer"] == plan.recomputes
        expressible = [p for p in grid.frontier if alpa_expressible(p)]
        if expressible:
            # the proxy rule (lowest bias first) applied to the frontier plans Alpa can express
            kinds.add("frontier")
            assert plan in expressible
            assert plan.computation_bias == min(p.computation_bias for p in expressible)
        else:
            # none can: the proxy itself, recomputing in every stage
            kinds.add("everywhere")
            assert plan.remat_per_stage == [True] * len(grid.proxy.stages)
            assert [st.clusters for st in plan.stages] == [st.clusters for st in grid.proxy.stages]
            assert doc["remat_layer"] is True
        # asked for by id, the proxy is refused rather than replaced
        with pytest.raises(ArenaError, match="some stages only"):
            export_plan(planset, select_for_export(planset, "alpa", grid.proxy.plan_id)[0], "alpa")
    assert kinds == {"frontier", "everywhere"}


def test_an_expressible_proxy_is_exported_as_is(planset):
    grid = next(g for g in planset.grids if g.proxy is not None and alpa_expressible(g.proxy))
    g = grid.grid
    plan, note = select_for_export(planset, "alpa", None, g.gpu_type, g.num_gpus, g.pipeline_degree)
    assert plan is grid.proxy and note is None
