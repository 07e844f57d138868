"""Package discovery: the library under libarena/, one thin CLI package per hyphenated tools/ folder."""

from setuptools import find_packages, setup

# Each tools/arena-<stage>/ folder is itself the package arena_<stage> (the folder name has a hyphen).
TOOL_PACKAGES = {f"arena_{stage}": f"tools/arena-{stage}" for stage in ("analyze", "plan", "profile", "schedule", "run")}
TOOL_PACKAGES["arena_cupti"] = "cupti"

setup(
    packages=find_packages(include=["libarena", "libarena.*"]) + sorted(TOOL_PACKAGES),
    package_dir=TOOL_PACKAGES,
    package_data={"libarena": ["data/*.yaml", "data/*.json"]},
)
