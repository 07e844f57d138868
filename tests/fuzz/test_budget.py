"""The fuzz suite's size: at least 500 generated cases per tool (each fuzz test also checks it ran its share)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.fuzz.harness import BUDGET, MIN_CASES_PER_TOOL, TOOLS

pytestmark = [pytest.mark.fuzz, pytest.mark.xdist_group("fuzz")]


def test_every_tool_gets_at_least_500_cases():
    for tool in TOOLS:
        assert sum(BUDGET[tool].values()) >= MIN_CASES_PER_TOOL, (tool, BUDGET[tool])


def test_every_budget_entry_is_used_by_a_test():
    """A budget line no test runs would inflate the count above."""
    used: set[tuple[str, str]] = set()
    for path in Path(__file__).parent.glob("test_fuzz_*.py"):
        tree = ast.parse(path.read_text())
        tool = next(node.value.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "TOOL" for t in node.targets))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "run_cases":
                used.add((tool, node.args[1].value))
    declared = {(tool, name) for tool, tests in BUDGET.items() for name in tests}
    assert declared == used, {"declared, unused": declared - used, "used, undeclared": used - declared}
