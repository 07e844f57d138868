"""Runtime pruning (§3.6) on gpt__tiny's real plans from arena-plan: the pruned space obeys the three
rules and is a subset of the full space; the searches pick the fastest measured candidate and account for
their cost. Measurement is injected (a deterministic timing function) so the rules are tested without
compiling anything; real measurements are the benchmark's job (bench/bench_run.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from libarena.models import get_model
from libarena.plan import read_plans
from libarena.run.search import (
    SearchConfig,
    SearchSpace,
    cluster_loads,
    computation_bias,
    full_search,
    full_space,
    grid_frontiers,
    pruned_search,
    pruned_space,
)


def _key(plan) -> tuple:
    return (tuple(st.first_cluster for st in plan.stages), tuple(st.intra for st in plan.stages), plan.num_microbatches)


@pytest.fixture(scope="module")
def space_and_plans(gpt_tiny_plans: Path):
    planset = read_plans(gpt_tiny_plans)
    return SearchSpace(get_model("gpt__tiny"), 8, "a100", 4, tuple(planset.clusters)), planset


def test_pruned_space_follows_the_three_rules(space_and_plans) -> None:
    space, planset = space_and_plans
    full = full_space(space, SearchConfig())
    full_keys = {_key(p) for p in full}
    assert len(full_keys) == len(full)
    loads = cluster_loads(space.clusters, "a100", "fp32")
    for s, grid in grid_frontiers(planset, "a100", 4).items():
        frontier = grid.frontier
        pruned = pruned_space(space, frontier, s, SearchConfig())
        assert pruned and {_key(p) for p in pruned} <= full_keys  # a subset of the full space
        assert all(p.pipeline_degree == s for p in pruned)  # rule 1
        threshold = max(computation_bias(loads, p.stage_boundaries, p.gpus_per_stage) for p in frontier)
        fixed = {(st.first_cluster, st.end_cluster): set() for p in frontier for st in p.stages}
        for p in frontier:
            for st in p.stages:
                fixed[(st.first_cluster, st.end_cluster)].add(st.intra)
        for plan in pruned:
            bounds = [st.first_cluster for st in plan.stages]
            assert computation_bias(loads, bounds, [st.num_gpus for st in plan.stages]) <= threshold + 1e-9  # rule 2
            for st in plan.stages:  # rule 3
                if (st.first_cluster, st.end_cluster) in fixed:
                    assert st.intra in fixed[(st.first_cluster, st.end_cluster)]
        # Every Pareto plan of the grid is a candidate.
        assert {(tuple(p.stage_boundaries), tuple(st.intra for st in p.stages)) for p in frontier} <= {
            (k[0], k[1]) for k in map(_key, pruned)}
    # All grids together are still far smaller than the full space.
    total_pruned = sum(len(pruned_space(space, g.frontier, s, SearchConfig())) for s, g in grid_frontiers(planset, "a100", 4).items())
    assert total_pruned * 5 < len(full)


def test_searches_pick_the_fastest_and_count_cost(space_and_plans) -> None:
    space, planset = space_and_plans
    calls = []

    def fake_step_time(plan) -> float:
        # Deterministic stand-in: fewer stages and more data parallelism are faster.
        calls.append(plan.plan_id)
        return 0.01 * plan.pipeline_degree + 0.001 * sum(st.tp for st in plan.stages)

    full = full_search(space, fake_step_time, SearchConfig(max_candidates=20, sample_seed=1))
    assert full.candidates_measured == 20 == len(full.trials) and full.candidates_total > 20
    assert full.best.step_time_s == min(t.step_time_s for t in full.trials)
    assert full.cost_device_s == pytest.approx(sum(t.cost_device_s for t in full.trials))
    calls.clear()
    pruned = pruned_search(space, planset, fake_step_time, SearchConfig())
    # Rule 1 measured every grid's proxy, then chose the fastest grid's pipeline degree (s = 1 here).
    proxies = [g.proxy.plan_id for g in grid_frontiers(planset, "a100", 4).values()]
    assert calls[: len(proxies)] == proxies
    assert pruned.pipeline_degree == 1 and all(t.plan.pipeline_degree == 1 for t in pruned.trials)
    assert pruned.grid_selection_cost_device_s > 0
    assert pruned.cost_device_s > pruned.grid_selection_cost_device_s
    same = pruned_search(space, planset, fake_step_time, SearchConfig(), pipeline_degree=2)
    assert same.grid_selection_cost_device_s == 0 and same.pipeline_degree == 2


def test_a_candidate_out_of_device_memory_is_a_failed_trial(space_and_plans, monkeypatch) -> None:
    """On a GPU a candidate that does not fit raises XLA's RESOURCE_EXHAUSTED: that trial fails, the search goes on
    and picks among the others; any other runtime error still ends it."""
    import importlib
    import types

    import jax

    from libarena.run.search import measure_in_process

    train_module = importlib.import_module("libarena.run.train")  # the package's ``train`` is the function

    space, _ = space_and_plans
    config = SearchConfig(max_candidates=6, sample_seed=1)

    too_large: list[str] = []

    def measure_plan(model, plan, **kwargs):
        if len(too_large) < 3:  # the first three candidates do not fit
            too_large.append(plan.plan_id)
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 123 bytes.")
        return types.SimpleNamespace(step_time_s=0.01 * plan.pipeline_degree)

    monkeypatch.setattr(train_module, "measure_plan", measure_plan)
    measure = measure_in_process(space.model, config)
    result = full_search(space, measure, config)
    failed = [t for t in result.trials if t.error]
    assert [t.plan.plan_id for t in failed] == too_large and len(result.trials) == 6
    assert all("ran out of device memory" in t.error and "RESOURCE_EXHAUSTED" in t.error for t in failed)
    assert result.best.plan.plan_id not in too_large and result.best.step_time_s < float("inf")

    def broken(model, plan, **kwargs):
        raise jax.errors.JaxRuntimeError("INTERNAL: something else")

    monkeypatch.setattr(train_module, "measure_plan", broken)
    with pytest.raises(jax.errors.JaxRuntimeError):
        full_search(space, measure_in_process(space.model, config), config)


def test_the_pruned_search_runs_plans_as_the_planner_priced_them(tmp_path: Path) -> None:
    """gpt__tiny planned at a fixed B = 16 on two 4-GPU nodes: the pruned search measures every candidate, the
    frontier plans included, at the plans file's B (before, at its own 4 x s) and with the planner's buddy stage
    placement (before, stages one after another, so a 4-GPU stage after a 2-GPU one straddled both nodes)."""
    from libarena.analyze.api import analyze_model
    from libarena.artifacts import read_table
    from libarena.hardware.cluster import ClusterSpec, NodeGroup
    from libarena.plan import PlannerConfig, plan_job

    ops = tmp_path / "ops.parquet"
    analyze_model("gpt__tiny", 16, dtype="fp32", num_clusters=6).write(ops)
    cluster = ClusterSpec("two-nodes", (NodeGroup("a100", 2, 4),))
    planset = plan_job(read_table(ops, "operator_table"), cluster,
                       PlannerConfig(num_gpus=(8,), pipeline_degrees=(3,), num_microbatches=16, gpu_types=("a100",)))
    frontier = grid_frontiers(planset, "a100", 8)[3].frontier
    space = SearchSpace(get_model("gpt__tiny"), 16, "a100", 8, tuple(planset.clusters))
    measured = []

    def measure(plan) -> float:
        measured.append(plan)
        return 1.0

    pruned_search(space, planset, measure, SearchConfig(), pipeline_degree=3)
    assert measured and {p.num_microbatches for p in measured} == {16}
    for plan in measured:  # every stage on one node or on whole nodes, at a multiple of its size
        for st, offset in zip(plan.stages, plan.offsets()):
            assert offset % st.num_gpus == 0
    by_structure = {(tuple(p.plan.stage_boundaries), tuple(st.intra for st in p.stages)): p for p in measured}
    for p in frontier:
        candidate = by_structure[(tuple(p.stage_boundaries), tuple(st.intra for st in p.stages))]
        assert list(candidate.offsets()) == list(p.stage_gpu_offsets)


@pytest.mark.parametrize("planner", [{"num_microbatches": "x"}, {"num_microbatches": 2.5}, {"microbatches_per_stage": None},
                                     {"microbatches_per_stage": True}, {"num_microbatches": 0}])
def test_damaged_micro_batch_settings_of_a_plans_file_are_a_one_line_error(planner) -> None:
    from libarena.errors import ArenaError

    with pytest.raises(ArenaError, match="microbatches"):
        SearchConfig().as_planned(planner)
    assert SearchConfig().as_planned({"microbatches_per_stage": 2, "num_microbatches": None}).microbatches(60, 3) == 6


def test_a_plans_file_without_proxies_or_a_plan_of_other_stages_is_a_one_line_error(space_and_plans) -> None:
    """A plans file written outside arena-plan need not mark a proxy per grid: running a grid's proxy, or
    choosing a grid by its proxies, is refused by name (it was an AttributeError and an IndexError); and a
    --plan-id whose stages are not the --grid's is refused, not run."""
    import dataclasses

    from libarena.errors import ArenaError
    from libarena.run.api import parse_grid, select_plan

    space, planset = space_and_plans
    unmarked = dataclasses.replace(planset, grids=[
        dataclasses.replace(g, plans=tuple(dataclasses.replace(p, is_proxy=False) for p in g.plans)) for g in planset.grids])
    with pytest.raises(ArenaError, match=r"^grid .* has no proxy plan in the plans file: give --plan-id, or --search$"):
        select_plan(unmarked, parse_grid("a100,4,2"), None)
    with pytest.raises(ArenaError, match=r"^no grid of a100 x4 has a proxy plan in the plans file: give --grid a100,4,S "):
        pruned_search(space, unmarked, lambda plan: 0.01, SearchConfig())
    one_stage = planset.grid("a100", 4, 1).proxy
    assert select_plan(planset, parse_grid("a100,4,1"), one_stage.plan_id) is one_stage
    assert select_plan(planset, parse_grid("a100,4"), one_stage.plan_id) is one_stage
    with pytest.raises(ArenaError, match=rf"^plan {one_stage.plan_id} has 1 stages, not the grid's 2$"):
        select_plan(planset, parse_grid("a100,4,2"), one_stage.plan_id)
