# Two commands for a newcomer: `make run` (set up, then sweep the default
# experiment) and `make test` (set up, then run the tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel by default (it lies on the dev machines' disk); GPU users:
#   make setup TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
# Without a folder of wheels, the default spec comes from PyTorch's CPU index (the package index's Linux torch is
# the CUDA build, several GB); a TORCH_SPEC of your own is installed as you give it.
DEFAULT_TORCH_INDEX := $(if $(filter file,$(origin TORCH_SPEC)),--index-url https://download.pytorch.org/whl/cpu)
STAMP := $(VENV)/.installed
# uv installs from the same package index as pip, several times faster. torch goes through uv only where pip
# is configured with find-links (a folder of wheels, such as the CPU build lying on disk), which uv is then
# given; elsewhere pip installs it, as pip would have.
UV = $(VENV)/bin/uv pip install --quiet --python $(PY)
# Every version but torch's is pinned by requirements.lock (`make lock` writes it), given to each install as
# constraints: an install takes from it only what it needs, and CI and a new user get the same versions.
LOCK := requirements.lock
SETUP_KEY := $(TORCH_SPEC) $(shell cat pyproject.toml $(LOCK) 2>/dev/null | cksum)
ARGS ?=
# uv does not byte-compile what it installs (pip does, at several times the install time). Where the
# environment sets PYTHONDONTWRITEBYTECODE, every process (each rank of each job) would then compile
# torch's modules again at import: ~3 s a rank. Unset here, the first import writes them once.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup setup-trainers setup-verl lock run test test-fast analyze bench sync clean

setup:
	@if [ -x "$(PY)" ] && [ -f "$(STAMP)" ] && [ "$$(cat $(STAMP))" = "$(SETUP_KEY)" ]; then \
		echo "setup: $(VENV) is up to date"; \
	else \
		set -e; \
		[ -x "$(PY)" ] || $(PYTHON) -m venv $(VENV); \
		$(PY) -m pip install --quiet --disable-pip-version-check "uv>=0.8"; \
		links="$${PIP_FIND_LINKS:-$$($(PY) -m pip config get global.find-links 2>/dev/null || true)}"; \
		if [ -n "$$links" ]; then \
			$(UV) $$(for l in $$links; do printf -- '--find-links %s ' "$$l"; done) $(TORCH_SPEC); \
		else \
			$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH_SPEC) $(DEFAULT_TORCH_INDEX); \
		fi; \
		$(UV) -c $(LOCK) -e ".[dev]"; \
		echo "$(SETUP_KEY)" > $(STAMP); \
	fi

# The [trainers] extra (pyproject.toml: torchtitan, whose own loss code trainer=torchtitan calls) on top of
# setup, with the installed torch pinned to itself so that no resolution can replace it, and `pip check` after it
# (torchtitan's datasets caps huggingface_hub and fsspec: a resolution that broke transformers fails here). `make test` needs it;
# `make run` does not (a rule whose package is missing is refused before launch, naming this install).
TRAINERS_STAMP := $(VENV)/.installed-trainers
setup-trainers: setup
	@if [ -f "$(TRAINERS_STAMP)" ] && [ "$$(cat $(TRAINERS_STAMP))" = "$(SETUP_KEY)" ]; then \
		echo "setup-trainers: the [trainers] extra is up to date"; \
	else \
		set -e; \
		torch_version="$$($(PY) -c 'import importlib.metadata as m; print(m.version("torch"))')"; \
		$(UV) -c $(LOCK) -e ".[dev,trainers]" "torch==$$torch_version"; \
		$(VENV)/bin/uv pip check --python $(PY); \
		echo "$(SETUP_KEY)" > $(TRAINERS_STAMP); \
	fi

# verl's own agg_loss for the trainer=verl_* rules (runner/trainers/verl.py; without it they run a paraphrase
# pinned to verl's commit, and each run records which ran). In neither setup nor test: verl's requirements
# (ray[default], transformers < 5.11) conflict with this project's transformers, so verl goes in without its
# dependencies, with the few its import needs (ray alone is about 200 MB; the import takes about 5 s).
VERL_STAMP := $(VENV)/.installed-verl
setup-verl: setup
	@if [ -f "$(VERL_STAMP)" ] && [ "$$(cat $(VERL_STAMP))" = "$(SETUP_KEY)" ]; then \
		echo "setup-verl: verl is up to date"; \
	else \
		set -e; \
		$(UV) --no-deps verl==0.9.1 ray==2.60.0 tensordict==0.10.0 pyvers codetiming orjson msgpack jsonschema \
			attrs referencing rpds-py jsonschema-specifications; \
		$(PY) -c "from verl.trainer.ppo.core_algos import agg_loss"; \
		echo "$(SETUP_KEY)" > $(VERL_STAMP); \
	fi

# Resolve every dependency of pyproject.toml (all extras but verl's) anew and write requirements.lock: run it
# after changing a dependency, and commit the lock. Resolved for CPython 3.11 on Linux x86-64 against the CPU
# build of the installed torch (torch itself is left out: TORCH_SPEC installs it, so a CUDA build brings its own
# CUDA packages); the CPU build comes from pip's find-links where configured, else from PyTorch's CPU index.
lock: setup
	@set -e; \
	torch_version="$$($(PY) -c 'import importlib.metadata as m; print(m.version("torch").split("+")[0])')"; \
	echo "torch==$$torch_version+cpu" > $(VENV)/torch-cpu.txt; \
	links="$${PIP_FIND_LINKS:-$$($(PY) -m pip config get global.find-links 2>/dev/null || true)}"; \
	if [ -n "$$links" ]; then source="$$(for l in $$links; do printf -- '--find-links %s ' "$$l"; done)"; \
	else source="--extra-index-url https://download.pytorch.org/whl/cpu"; fi; \
	$(VENV)/bin/uv pip compile --quiet pyproject.toml --extra dev --extra trainers --python-version 3.11 \
		$$source -c $(VENV)/torch-cpu.txt --no-emit-package torch --no-emit-find-links --no-emit-index-url \
		--custom-compile-command "make lock" -o $(LOCK); \
	echo "lock: $$(grep -c '==' $(LOCK)) pins in $(LOCK)"

# The sweep, the interleaved cost measurement into the same sweep directory,
# then their analysis. ARGS are the sweep's overrides (`make run ARGS="model=small
# train.steps=200"`); those that set one value (not a list, not experiment= or
# hydra.*) reach the cost job too. The sweep exits 1 when a job failed; the
# analysis still runs (and reports it).
RUN_DIR := multirun/$(shell date +%Y-%m-%d_%H-%M-%S)
run: setup
	-$(PY) -m runner -m $(ARGS) hydra.sweep.dir=$(RUN_DIR)
	-$(PY) -m runner experiment=cost $$($(PY) -m runner.sweep.cost_overrides $(ARGS)) hydra.run.dir=$(RUN_DIR)/cost
	$(PY) -m analysis $(RUN_DIR)
	@echo "results: $(RUN_DIR)  (report: analysis/report.md; upload the W&B runs: make sync)"

# Lint and format check (ruff, configured in pyproject.toml), then the tests.
test: setup-trainers
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q $(ARGS)

# The in-process tier: the suite less its slow-marked tests and those in modules that start processes (worlds of
# ranks, launches: tests/conftest.py marks them `launches`), for a contributor's inner loop; `make test` and CI
# run everything.
test-fast: setup-trainers
	$(PY) -m pytest -q -m "not slow and not launches" $(ARGS)

analyze: setup
	$(PY) -m analysis $(ARGS)

bench: setup
	$(PY) -m bench $(ARGS)

# Upload a sweep's offline W&B runs (the jobs' and the analysis's):
#   make sync [SWEEP=multirun/<date_time>] [WANDB_PROJECT=...] [WANDB_ENTITY=...] [DRY_RUN=1]
# Needs WANDB_API_KEY (or `wandb login`), except with DRY_RUN=1 (lists what would go).
SWEEP ?= $(shell ls -td multirun/*/ 2>/dev/null | head -n 1)
sync: setup
	@[ -n "$(SWEEP)" ] && [ -d "$(SWEEP)" ] || { echo "sync: no sweep found; give SWEEP=multirun/<date_time>"; exit 2; }
	@[ -n "$(DRY_RUN)" ] || [ -n "$$WANDB_API_KEY" ] || grep -qs api.wandb.ai ~/.netrc || \
		{ echo "sync: set WANDB_API_KEY (https://wandb.ai/authorize) or run '$(VENV)/bin/wandb login' first"; exit 2; }
	@all="$$(find $(SWEEP) -type d -name 'offline-run-*' | sort)"; \
	[ -n "$$all" ] || { echo "sync: no offline W&B runs under $(SWEEP) (were they run with wandb.mode=disabled?)"; exit 2; }; \
	runs=""; empty=0; \
	for run in $$all; do \
		log="$$(ls $$run/run-*.wandb 2>/dev/null | head -1)"; \
		if [ -n "$$log" ] && [ "$$(wc -c < "$$log")" -gt 7 ]; then runs="$$runs $$run"; else empty=$$((empty + 1)); fi; \
	done; \
	[ $$empty -eq 0 ] || echo "sync: $$empty run folder(s) left out: no run record (an attempt killed before W&B wrote its log: its steps are in metrics.jsonl, and a resumed attempt logs them again)"; \
	[ -n "$$runs" ] || { echo "sync: no offline W&B run under $(SWEEP) holds a run record"; exit 2; }; \
	echo "sync: $$(echo $$runs | wc -w) runs from $(SWEEP)"; \
	$(VENV)/bin/wandb sync $(if $(DRY_RUN),--dry-run) \
		$(if $(WANDB_PROJECT),--project $(WANDB_PROJECT)) $(if $(WANDB_ENTITY),--entity $(WANDB_ENTITY)) $$runs

clean:
	rm -rf outputs multirun .pytest_cache
	find . -name __pycache__ -type d -prune -not -path "./$(VENV)/*" -exec rm -rf {} +
