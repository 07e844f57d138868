"""The digest of a source tree: which code produced an output.

One recipe for both users: the stage cache keys its entries on Arena's own source (an entry made by other code
is never served), and the benchmarks record the code they measured with (two runs' rows are only put together
when the same code produced them). Caches (``__pycache__``) and non-Python files are not source.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def source_files(root: Path, entries: tuple[str, ...]) -> list[str]:
    """The ``*.py`` files of ``entries`` (folders, searched through, and files; relative to ``root``), as sorted
    relative POSIX paths."""
    found: set[str] = set()
    for entry in entries:
        path = root / entry
        candidates = path.rglob("*.py") if path.is_dir() else [path] if path.is_file() else []
        found.update(p.relative_to(root).as_posix() for p in candidates if "__pycache__" not in p.parts)
    return sorted(found)


def source_digest(root: Path, entries: tuple[str, ...]) -> str:
    """sha256 over the files of ``entries`` under ``root``: each file's relative path and contents, in path order.
    Not cached: a caller that re-checks the tree later (a benchmark at its end) sees edits made meanwhile."""
    digest = hashlib.sha256()
    for relative in source_files(root, entries):
        data = (root / relative).read_bytes()
        # length-prefixed, so that no two different trees hash alike by shifting bytes between files
        digest.update(f"{relative}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()
