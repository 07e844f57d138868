# Arena: the two set-up commands are `make demo` and `make test`; both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export RAY_AUTH_MODE := disabled
export PYTHONHASHSEED := 0

.PHONY: venv demo test test-slow test-all bench gpu-check schemas clean reproduce

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The paper's experiment (examples/paper/Makefile) on a small embedded workload, in a few minutes on a laptop.
demo: $(STAMP)
	$(BIN)/python -m libarena.demo --out demo-out

# The paper's experiment in full: philly, venus and pai traces (TRACES_DIR, default ../shared/traces/arena-ae),
# all policies, the 1,280-GPU simulated cluster; results in examples/paper/out/ (results.md, summary.png, plots).
reproduce: $(STAMP)
	$(MAKE) -C examples/paper BIN=$(abspath $(BIN))

# The suite without the slow end-to-end tests (7-10 minutes on a 2-core machine).
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q -m "not slow"

# The slow end-to-end tests alone (about 20 minutes there); CI runs them after `make test` (.ci/run).
test-slow: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q -m slow

# Everything in one pytest run.
test-all: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q

bench: $(STAMP)
	$(BIN)/python -m bench

# GPU validation on a machine with an NVIDIA GPU: installs JAX's CUDA plugin and cupti-python (the cuda12 or
# cuda13 extra, by the driver), times with CUPTI and the host timer, profiles and directly measures the 1-GPU
# plans of the tiny and small models: bench/results/gpu.json in under 10 minutes. Elsewhere: "no NVIDIA GPU visible".
gpu-check: $(STAMP)
	@$(BIN)/python -m bench gpu

# Regenerate schemas/ from the artifact registry (a test fails when they drift).
schemas: $(STAMP)
	$(BIN)/python -m libarena.artifacts.schema_docs schemas

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis demo-out
