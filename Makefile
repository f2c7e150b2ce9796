# kernelzoo: `make sweep` and `make test` are all a fresh machine needs.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
EXPERIMENT ?= quick
ARGS ?=
RESULTS ?= results/local
# one results directory for every target: a results_dir=... given in ARGS wins over RESULTS
RESULTS := $(or $(lastword $(patsubst results_dir=%,%,$(filter results_dir=%,$(ARGS)))),$(RESULTS))
OVERRIDES = results_dir=$(RESULTS) $(filter-out results_dir=%,$(ARGS))
DRY_RUN = $(filter dry_run=true,$(ARGS))
SYNC_TIMEOUT ?= 900
TORCH_CPU ?= torch==2.13.0
# pytest-xdist workers of `make test`: auto (one per core), a number, or 0 (one process)
TEST_WORKERS ?= auto
STAMP := $(VENV)/.installed

.PHONY: help install sweep run plots docs test test-slow bench sync wheels clean-venv

help:  ## list the targets and the variables they take
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "variables: EXPERIMENT=$(EXPERIMENT) RESULTS=$(RESULTS) ARGS='<hydra overrides>' QUICK=1 (bench)"

install: $(STAMP)  ## create .venv and install the project (seconds when nothing changed)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@# a plain `torch` requirement pulls a multi-GB CUDA build; start from the CPU wheel here
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_CPU)" || $(PY) -m pip install -q torch
	$(PY) -m pip install -q -e ".[test]"
	@touch $(STAMP)

# the analysis `make sweep` runs, and where it checks whether the store changed since the last
ANALYSIS = experiment=$(EXPERIMENT) results_dir=$(RESULTS) $(filter logger=%,$(ARGS))
ANALYSED = $(PY) -m kernelzoo.records.analysed

sweep: install  ## run a named sweep end to end, then its analysis if a run changed: make sweep EXPERIMENT=quick
	$(PY) -m kernelzoo.sweep $(EXPERIMENT) $(OVERRIDES)
	$(if $(DRY_RUN),@echo "dry run: nothing was trained and there is nothing to analyse",$(ANALYSED) check $(RESULTS)/$(EXPERIMENT) $(ANALYSIS) || { $(PY) -m kernelzoo.analyze $(ANALYSIS) && $(ANALYSED) mark $(RESULTS)/$(EXPERIMENT) $(ANALYSIS); })

run: install  ## train one configuration: make run ARGS="feature_map=dpfp feature_map.nu=2 n_keys=260"
	$(PY) -m kernelzoo.train $(OVERRIDES)

plots: install  ## regenerate tables, figures and report of an experiment from the store
	$(PY) -m kernelzoo.analyze experiment=$(EXPERIMENT) $(OVERRIDES)

wheels: install  ## .whl/: the dependencies a GPU machine with torch may lack, as wheels (scripts/gpu_check.sh)
	rm -rf .whl
	$(PY) -m pip wheel -q --no-deps -w .whl $$($(PY) -m pip freeze | grep -iE \
	    '^(hydra-core|omegaconf|antlr4-python3-runtime|hydra-joblib-launcher|joblib)==')

docs: install  ## rewrite docs/results.md and README's results summary from results/reference
	$(PY) -m kernelzoo.results_doc

test: install  ## the default test suite, one pytest worker per core (a few minutes on 2 cores)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal

test-slow: install  ## the slower tests kept out of `make test`
	$(PY) -m pytest -m slow

bench: install  ## speed and memory benchmark, memory estimate -> results/bench/; QUICK=1 for a subset
	$(PY) -m kernelzoo.bench $(if $(QUICK),--quick,)
	$(PY) -m kernelzoo.bench --estimate $(if $(QUICK),--quick,)

sync: install  ## upload offline wandb runs; gives up after SYNC_TIMEOUT seconds (no network)
	@shopt -s nullglob; runs=($(RESULTS)/wandb/offline-run-*); \
	if (( ! $${#runs[@]} )); then echo "no offline wandb runs under $(RESULTS)/wandb"; exit 0; fi; \
	timeout $(SYNC_TIMEOUT) $(VENV)/bin/wandb sync "$${runs[@]}"; code=$$?; \
	if (( code == 124 )); then echo "error: wandb sync gave up after $(SYNC_TIMEOUT) s (is the" \
	  "wandb server reachable?); the runs stay under $(RESULTS)/wandb, make sync retries them" >&2; fi; \
	exit $$code

clean-venv:  ## remove .venv
	rm -rf $(VENV)
