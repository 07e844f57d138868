"""The import rules of the layers (README, "Code map"): each package of libarena imports only the packages
below it; only models, analyze, profile and run import JAX; the planner imports no model and no profiler, the
scheduler no model, analyzer, planner, profiler or runtime; nothing in libarena imports the tools.

Every import statement counts, at module level or inside a function (a lazy import is a dependency too)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

LIBARENA = Path(__file__).resolve().parents[1] / "libarena"

#: package -> the libarena packages it may import (itself and the libarena root, for __version__, always)
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "checks": {"errors"},
    "registry": {"errors"},
    "progress": set(),
    "workloads": set(),
    "artifacts": {"errors", "checks", "registry"},
    "hardware": {"errors", "checks", "registry", "artifacts"},
    "models": {"workloads", "errors", "checks", "registry", "hardware"},
    "analyze": {"workloads", "errors", "checks", "registry", "progress", "artifacts", "hardware", "models"},
    "plan": {"errors", "checks", "registry", "progress", "artifacts", "hardware"},
    "run": {"workloads", "errors", "checks", "registry", "progress", "artifacts", "hardware", "models", "plan"},
    "profile": {"workloads", "errors", "checks", "registry", "progress", "artifacts", "hardware", "models", "plan", "run"},
    "schedule": {"workloads", "errors", "checks", "registry", "progress", "artifacts", "hardware"},
    "pipeline": {"workloads", "errors", "checks", "registry", "progress", "artifacts", "hardware", "models", "analyze", "plan", "run",
                 "profile", "schedule"},
    "cli": {"errors", "checks", "progress"},
    "demo": {"errors"},
    "entry": set(),
}
#: the only packages that may import JAX (directly: the others import none of them, so not transitively either)
JAX_PACKAGES = {"models", "analyze", "profile", "run"}
TOOL_MODULES = {"tools", "arena_analyze", "arena_plan", "arena_profile", "arena_schedule", "arena_run"}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def layer_violations(root: Path, allowed: dict[str, set[str]], jax_packages: set[str]) -> list[str]:
    """Every import of the package ``root`` (a libarena) that breaks the rules, as 'file:line: reason'."""
    name = root.name
    problems = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        package = parts[0] if parts[0] != "__init__" else None
        for line, module in _imports(path):
            where = f"{path.relative_to(root.parent)}:{line}"
            top, _, rest = module.partition(".")
            if top in TOOL_MODULES:
                problems.append(f"{where}: imports the tool {module}")
            elif top in ("jax", "jaxlib") and package not in jax_packages:
                problems.append(f"{where}: {package} imports {module} (only {', '.join(sorted(jax_packages))} may)")
            elif top == name and rest and package is not None:
                target = rest.partition(".")[0]
                if target != package and target not in allowed.get(package, set()):
                    problems.append(f"{where}: {package} imports {name}.{target}")
    return problems


def test_libarena_follows_the_layer_rules():
    packages = {p.stem if p.is_file() else p.name for p in LIBARENA.iterdir()
                if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    assert packages == set(ALLOWED), "every package of libarena has a rule (README Code map)"
    assert layer_violations(LIBARENA, ALLOWED, JAX_PACKAGES) == []


def test_the_rules_catch_a_violation(tmp_path):
    """The checker itself: a scheduler module that imports JAX, the model zoo and a tool is reported."""
    pkg = tmp_path / "libarena"
    (pkg / "schedule").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "schedule" / "__init__.py").write_text("")
    (pkg / "schedule" / "bad.py").write_text(
        "import numpy\nfrom libarena.hardware import get_gpu\n\n\ndef f():\n    import jax\n"
        "    from libarena.models import get_model\n    from arena_plan.main import app\n")
    problems = layer_violations(pkg, ALLOWED, JAX_PACKAGES)
    assert len(problems) == 3
    assert any("schedule imports jax" in p and "bad.py:6" in p for p in problems)
    assert any("schedule imports libarena.models" in p for p in problems)
    assert any("imports the tool arena_plan.main" in p for p in problems)


def test_the_planner_and_the_scheduler_start_without_jax():
    code = ("import sys, libarena.plan, libarena.schedule.api, libarena.schedule.live.server, libarena.pipeline; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib') or m.startswith('libarena.models')); "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
