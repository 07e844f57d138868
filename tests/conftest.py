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


def cuda_plugin_installed() -> bool:
    """Whether JAX's CUDA plugin is installed (without it JAX sees no NVIDIA GPU; checked without starting JAX)."""
    import importlib.util

    return any(importlib.util.find_spec(name) is not None for name in ("jax_cuda12_plugin", "jax_cuda13_plugin"))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped where JAX cannot have a GPU (the ``gpu_device`` fixture skips where it has none)."""
    if cuda_plugin_installed():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (JAX's CUDA plugin is not installed: make gpu-check installs it)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_device():
    import jax

    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("JAX sees no NVIDIA GPU")
    return gpus[0]
