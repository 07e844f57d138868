"""Which code a benchmark measured with.

A results file says what it measured, and also with which code, so that a figure can be traced to a commit and
two runs' rows are only put together when the same code produced them (``bench_profile --resume``). The identity
is a digest of the source that does the measuring (the benchmark's own modules and every Python file of
``libarena`` and ``bench`` they can run: :func:`reachable_source`), not the git commit alone: a run from a
checkout with uncommitted edits is told apart, and a checkout without git (an unpacked archive) still has one.
The commit is recorded beside it where git can tell it. Other benchmarks' modules, and library code the
benchmark cannot reach (the scheduler, for the profiler's benchmark), are left out, so that editing them does
not part two runs of it.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path
from typing import Any

from libarena.artifacts.source import source_digest, source_files

#: The packages whose Python files a benchmark's modules can run (and so measure with): the library and bench.
PACKAGES = ("libarena", "bench")
#: A string naming one of their modules (``python -m libarena.profile.measure``, run by a child)
_MODULE_NAME = re.compile(rf"({'|'.join(PACKAGES)})(\.\w+)+")
#: The repository root: bench/ is one of its folders.
REPO_ROOT = Path(__file__).resolve().parent.parent


def git_commit(root: Path, source: tuple[str, ...]) -> dict[str, Any] | None:
    """The checkout's commit and whether ``source``'s Python files differ from it (``dirty``); None without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30)
        if head.returncode != 0:
            return None
        # Python files only: a results file written beside the source is not an edit of it
        spec = [f"{entry}/*.py" if (root / entry).is_dir() else entry for entry in source]
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", *spec], cwd=root, capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


def _module_files(root: Path, name: str) -> list[str]:
    """The files importing the module (or package) ``name`` runs: the packages' ``__init__.py`` above it and its own
    file, those that exist under ``root``."""
    parts = name.split(".")
    files = [Path(*parts[:k], "__init__.py") for k in range(1, len(parts))]
    files += [Path(*parts[:-1], parts[-1] + ".py"), Path(*parts, "__init__.py")]
    return [f.as_posix() for f in files if (root / f).is_file()]


def _named_modules(root: Path, relative: str) -> tuple[set[str], bool]:
    """The modules of :data:`PACKAGES` one file names: in its imports (anywhere in it: a function's deferred import too,
    relative ones resolved) and in strings (a module a child runs with ``-m``); and whether it imports modules by a
    name it builds (a call of ``import_module``)."""
    path = root / relative
    tree = ast.parse(path.read_text(), filename=str(path))
    package = Path(relative).parent.parts  # a module's package; an __init__.py's own
    names: set[str] = set()
    builds_names = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from a import b`` runs a, and a.b too where b is a module
            names.update([base, *(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_NAME.fullmatch(node.value):
            names.add(node.value)
        elif isinstance(node, ast.Call) and "import_module" in (getattr(node.func, "attr", None), getattr(node.func, "id", None)):
            builds_names = True
    return {n for n in names if n.split(".", 1)[0] in PACKAGES}, builds_names


def reachable_source(entries: tuple[str, ...], root: Path = REPO_ROOT) -> list[str]:
    """The Python files of :data:`PACKAGES` that the files ``entries`` (relative to ``root``) can run: ``entries``
    themselves, the modules they import or name, the packages above those, what those import in turn, and so on.
    A file that imports modules by a name it builds (``importlib.import_module``) brings every module of its own
    package. Sorted relative POSIX paths. A missing entry is refused (``FileNotFoundError`` naming it): an identity
    without the benchmark's own module would not tell its runs apart."""
    missing = [e for e in entries if not (root / e).is_file()]
    if missing:
        raise FileNotFoundError(f"benchmark module not found under {root}: {', '.join(missing)}")
    todo = list(entries)
    reached = set(todo)
    while todo:
        relative = todo.pop()
        names, builds_names = _named_modules(root, relative)
        found = {f for name in names for f in _module_files(root, name)}
        if builds_names:
            found.update(source_files(root, (Path(relative).parent.as_posix(),)))
        for f in sorted(found - reached):
            if f.split("/", 1)[0] in PACKAGES:
                reached.add(f)
                todo.append(f)
    return sorted(reached)


def code_identity(modules: tuple[str, ...], root: Path = REPO_ROOT) -> dict[str, Any]:
    """What a results file records as the code it was measured with: the benchmark's own ``modules`` (paths
    relative to ``root``, e.g. ``bench/bench_profile.py``) and the files of the library and the benchmarks they can
    run (:func:`reachable_source`)."""
    source = tuple(reachable_source(tuple(modules), root))
    return {"source_sha256": source_digest(root, source), "source": list(source), "git": git_commit(root, source)}
