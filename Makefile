# kernelzoo: `make sweep` and `make test` are all a fresh machine needs.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
EXPERIMENT ?= quick
ARGS ?=
RESULTS ?= results/local
# one results directory for every target: a results_dir=... given in ARGS wins over RESULTS
RESULTS := $(or $(lastword $(patsubst results_dir=%,%,$(filter results_dir=%,$(ARGS)))),$(RESULTS))
# quoted for the shell: RESULTS="a dir" is one path (ARGS stay split at spaces, one override each)
OVERRIDES = "results_dir=$(RESULTS)" $(filter-out results_dir=%,$(ARGS))
# what the analysis takes of ARGS, so that `make plots` takes the ARGS of the sweep it analyses
ANALYZE_ARGS = $(filter logger=% logger.% threshold=% accuracy_threshold=% reference_dir=% figures=%,$(ARGS))
# the experiment analysed: an experiment=... in ARGS (a sweep stored under another name) wins
NAME = $(or $(lastword $(patsubst experiment=%,%,$(filter experiment=%,$(ARGS)))),$(EXPERIMENT))
SYNC_TIMEOUT ?= 900
TORCH_CPU ?= torch==2.13.0
# pytest-xdist workers of `make test`: auto (one per core), a number, or 0 (one process)
TEST_WORKERS ?= auto
STAMP := $(VENV)/.installed
# two installs at once take turns at pip (flock, where there is one) instead of mixing files
LOCKED := $(if $(shell command -v flock 2>/dev/null),flock $(VENV).lock,)

.PHONY: help install venv-check sweep run plots compare docs test test-slow calibrate bench sync wheels clean-venv

help:  ## list the targets and the variables they take
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "variables: EXPERIMENT=$(EXPERIMENT) RESULTS=$(RESULTS) ARGS='<hydra overrides>' QUICK=1 (bench)"

install: venv-check $(STAMP)  ## create .venv and install the project (seconds when nothing changed)

venv-check:
	@if [ -L $(PY) ] && [ ! -e $(PY) ]; then echo "error: $(PY) links to a Python that is gone;" \
	  "valid: make clean-venv, then make install" >&2; exit 1; fi
	@# a stamp without the project importable (a venv made by hand, a failed install): redo it
	@if [ -f $(STAMP) ] && ! $(PY) -c "import kernelzoo" 2>/dev/null; then rm -f $(STAMP); \
	  echo "$(VENV) cannot import kernelzoo: installing it again"; fi

$(STAMP): pyproject.toml
	@test -x $(PY) || $(LOCKED) python3 -m venv $(VENV)
	@$(LOCKED) $(PY) -m pip install -q --upgrade pip
	@# a plain `torch` requirement pulls a multi-GB CUDA build; start from the CPU wheel here
	@$(PY) -c "import torch" 2>/dev/null || $(LOCKED) $(PY) -m pip install -q "$(TORCH_CPU)" || $(LOCKED) $(PY) -m pip install -q torch
	@# setuptools' notice that an editable install maps conf/ into the package by a finder: known
	@echo "installing kernelzoo (editable) and its dependencies into $(VENV)"
	@PYTHONWARNINGS="ignore:Editable installation:UserWarning" $(LOCKED) $(PY) -m pip install -q -e ".[test]"
	@touch $(STAMP)

sweep: install  ## run a named sweep end to end, then its analysis if a run changed: make sweep EXPERIMENT=quick
	$(PY) -m kernelzoo.sweep $(EXPERIMENT) $(OVERRIDES)

run: install  ## train one configuration: make run ARGS="feature_map=dpfp feature_map.nu=2 n_keys=260"
	$(PY) -m kernelzoo.train $(OVERRIDES)

plots: install  ## regenerate tables, figures and report of an experiment from the store
	$(PY) -m kernelzoo.analyze experiment=$(NAME) "results_dir=$(RESULTS)" $(ANALYZE_ARGS)

wheels: install  ## .whl/: the dependencies a GPU machine with torch may lack, as wheels (scripts/gpu_check.sh)
	rm -rf .whl
	$(PY) -m pip wheel -q --no-deps -w .whl $$($(PY) -m pip freeze | grep -iE \
	    '^(hydra-core|omegaconf|antlr4-python3-runtime|hydra-joblib-launcher|joblib)==')

compare: install  ## compare two configurations: make compare STORE=results/reference/zoo A="ELU+1 d_key=64" B="ReLU d_key=64"
	$(PY) -m kernelzoo.compare "$(STORE)" "$(A)" "$(B)"

docs: install  ## rewrite docs/results.md and README's results summary from results/reference
	$(PY) scripts/results_doc.py

test: install  ## the default test suite, one pytest worker per core (a few minutes on 2 cores)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal

test-slow: install  ## the slower tests kept out of `make test`
	$(PY) -m pytest -m slow

calibrate: install  ## every verdict kind against its error bounds on simulated stores -> results/calibration.{csv,md}
	$(PY) tests/calibrate.py $(if $(QUICK),--quick,)

bench: install  ## speed and memory benchmark, memory estimate -> results/bench/; QUICK=1 for a subset
	$(PY) -m kernelzoo.bench $(if $(QUICK),--quick,)
	$(PY) -m kernelzoo.bench --estimate $(if $(QUICK),--quick,)
	$(PY) -m kernelzoo.bench --scaleout $(if $(QUICK),--quick,)

sync: install  ## upload offline wandb runs; gives up after SYNC_TIMEOUT seconds (no network)
	@shopt -s nullglob; runs=($(RESULTS)/wandb/offline-run-*); \
	if (( ! $${#runs[@]} )); then echo "no offline wandb runs under $(RESULTS)/wandb"; exit 0; fi; \
	timeout $(SYNC_TIMEOUT) $(VENV)/bin/wandb sync "$${runs[@]}"; code=$$?; \
	if (( code == 124 )); then echo "error: wandb sync gave up after $(SYNC_TIMEOUT) s (is the" \
	  "wandb server reachable?); the runs stay under $(RESULTS)/wandb, make sync retries them" >&2; fi; \
	exit $$code

clean-venv:  ## remove .venv
	rm -rf $(VENV)
