# genalign developer commands. Everything installs itself into .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.genalign-installed
DEMO_STAMP := $(VENV)/.genalign-demo-installed
PYTEST_ARGS ?=
# pip skips byte-compiling every installed file (about a minute on 2 cores); Python compiles the
# modules a run imports on first use and caches them. That cache needs PYTHONDONTWRITEBYTECODE
# unset: where a shell or container sets it, every process (each `genalign` command, each test
# subprocess) compiled torch, diffusers and transformers again, about 11 s each on 2 cores. The
# cache goes into .venv and the checkout's (git-ignored) __pycache__ folders only.
PIP_INSTALL := $(PIP) install -q --no-compile
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install test test-fast lint format demo bench clean

install: $(STAMP)

# torch/torchvision first (their pair must match: see shared DESIGN.md), then the package
# under a constraints file so no dependency can swap the torch build. The demo needs only the
# package and skia (the toy renderer); tests and the rest add the other extras.
$(DEMO_STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) torch==2.14.1 torchvision==0.29.1
	$(PIP_INSTALL) -c constraints.txt -e ".[fast-svg]"
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	$(PIP_INSTALL) -c constraints.txt -e ".[dev,fast-svg,eval,quantization]"
	touch $(STAMP)

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check genalign tests benchmarks
	$(PY) -m ruff format --check genalign tests benchmarks

format: install
	$(PY) -m ruff format genalign tests benchmarks
	$(PY) -m ruff check --fix genalign tests benchmarks

# the toy-world demo: RL-held-out ShapesEval before/after DiffusionNFT on a learned reward, report in runs/
demo: $(DEMO_STAMP)
	HF_HUB_OFFLINE=1 WANDB_MODE=offline $(VENV)/bin/genalign demo configs/toy/demo.yaml

bench: install
	$(PY) benchmarks/rollout.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache runs
