"""Shared fixtures: paths to ../shared (tests skip cleanly without it) and small generated inputs."""

from __future__ import annotations

import os
import sys
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


# --------------------------------------------------------------------------------------------------
# The hostile-input report (tests/fuzz/test_hostile.py): every process (each xdist worker) leaves its
# statistics in .pytest_cache/arena-hostile/; the controller merges and prints them. Here, in the root
# conftest, because the controller of an xdist run loads no other conftest.


def _hostile_dir(config) -> Path:
    return Path(str(config.rootpath)) / ".pytest_cache" / "arena-hostile"


def pytest_sessionfinish(session):
    limits = sys.modules.get("tests.fuzz.limits")
    if limits is not None and limits.STATS:
        directory = _hostile_dir(session.config)
        directory.mkdir(parents=True, exist_ok=True)
        limits.write_report(directory)


def pytest_terminal_summary(terminalreporter):
    import json

    if hasattr(terminalreporter.config, "workerinput"):  # an xdist worker: its summary is shown nowhere
        return
    directory = _hostile_dir(terminalreporter.config)
    merged: dict[str, dict] = {}
    for path in sorted(directory.glob("hostile-*.json")) if directory.is_dir() else []:
        report = json.loads(path.read_text())
        path.unlink()  # read once: the next session starts from nothing
        for name, s in report.items():
            m = merged.setdefault(name, {**s, "cases": 0, "clean_errors": 0, "successes": 0, "quiet_pipe_ends": 0,
                                         "worst_wall_s": 0.0, "worst_rss_mib": 0.0})
            for key in ("cases", "clean_errors", "successes", "quiet_pipe_ends"):
                m[key] += s[key]
            for key, case in (("worst_wall_s", "worst_wall_case"), ("worst_rss_mib", "worst_rss_case")):
                if s[key] >= m[key]:
                    m[key], m[case] = s[key], s[case]
    if merged:
        from tests.fuzz.limits import summary_lines

        terminalreporter.write_line("hostile input by category (subprocesses under RLIMIT_AS/RLIMIT_CPU; wall times "
                                    "and peak RSS measured on this machine, which may be shared):")
        for line in summary_lines(merged):
            terminalreporter.write_line("  " + line)


def cuda_plugin_installed() -> bool:
    """Whether JAX's CUDA plugin is installed (without it JAX sees no NVIDIA GPU; checked without starting JAX)."""
    import importlib.util

    return any(importlib.util.find_spec(name) is not None for name in ("jax_cuda12_plugin", "jax_cuda13_plugin"))


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns the groups into node ids
def pytest_collection_modifyitems(config, items):
    """Tests marked ``ray`` run on one xdist worker, one after another: two local Ray clusters started at once
    can pick the same agent ports (ray-project/ray#18053). Tests marked ``gpu`` are skipped where JAX cannot have a
    GPU (the ``gpu_device`` fixture skips where it has none)."""
    for item in items:
        if item.get_closest_marker("ray") is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group("ray"))
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
