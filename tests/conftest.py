"""Shared fixtures: paths to ../shared (tests skip cleanly without it) and small generated inputs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is not present")
    return SHARED


@pytest.fixture(scope="session")
def traces_dir(shared_dir: Path) -> Path:
    path = shared_dir / "traces"
    if not path.is_dir():
        pytest.skip("../shared/traces is not present")
    return path


@pytest.fixture(scope="session")
def paper_cluster(repo_root: Path):
    from libarena.hardware import load_cluster

    return load_cluster(repo_root / "examples" / "clusters" / "paper-sim-1280.yaml")
