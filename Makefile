# One entry point for every workflow. `make help` lists them.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
PIP   := $(VENV)/bin/pip
CDK   := npx --no-install cdk
# cdk.json's app runs this interpreter (default .venv's), so `make synth VENV=...` synthesizes with that venv.
export CDK_PYTHON := $(PY)
STAMP := $(VENV)/.installed
# This checkout's code wins over whatever an editable install points at (as in pytest's pythonpath).
export PYTHONPATH := $(CURDIR):$(CURDIR)/payloads
# The rehearsals' local Slurm daemons run as root: sudo (asked once, up front, by tools/need_root.sh) when not root.
AS_ROOT := $(if $(filter 0,$(shell id -u)),,sudo env PYTHONPATH=$(PYTHONPATH))

.DEFAULT_GOAL := help
.PHONY: help need-root system-packages venv synth lint doc-tables test test-fast test-engine test-trn1 snapshot-update deploy diff destroy rehearse rehearse-config rehearse-ladder bench bench-train diagram clean

help:  ## list the targets
	@grep -E '^[a-z0-9-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

$(STAMP): requirements.txt requirements-dev.txt requirements-checkov.txt requirements-torchtitan-cpu.txt requirements-trn1-cpu.txt requirements-sagemaker.txt payloads/requirements-gpu.txt payloads/requirements-cluster.txt pyproject.toml package-lock.json
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements-dev.txt
	$(PIP) install -q --no-deps -r requirements-sagemaker.txt
	# bitsandbytes has a CPU backend: the QLoRA tests load real 4-bit layers (pin: requirements-gpu.txt).
	$(PIP) install -q --no-deps bitsandbytes==0.50.2
	$(PIP) install -q --no-deps -e .
	# torchtitan 0.2.2 in its own folder: its tyro needs typeguard 4, jsii pins 2 (see the file).
	$(PIP) install -q --no-deps --upgrade --target $(VENV)/torchtitan-site -r requirements-torchtitan-cpu.txt
	# The frozen trn1 lane (optimum-neuron 0.4.5 and its pins) in its own folder; `pytest -m trn1` runs there.
	$(PIP) install -q --no-deps --upgrade --target $(VENV)/trn1-site -r requirements-trn1-cpu.txt
	# checkov in a venv of its own (its pins clash with the main stack's); tests/infra runs it on every app shape.
	test -x $(VENV)/checkov/bin/checkov || $(PY) -m venv $(VENV)/checkov
	$(VENV)/checkov/bin/pip install -q -r requirements-checkov.txt
	npm ci --no-audit --no-fund --loglevel=error
	touch $(STAMP)

need-root:  # the rehearsals' first prerequisite (not in `make help`): says why root, and asks sudo once, before installing
	@tools/need_root.sh "make $(firstword $(filter rehearse%,$(MAKECMDGOALS)) rehearse)"

system-packages:  ## install slurm-wlm, munge, graphviz, python3-venv when missing (apt-get; sudo when not root)
	tools/system_packages.sh

venv: $(STAMP)  ## create .venv and node_modules from the pinned files

synth: $(STAMP)  ## synthesize every stack offline, cfn-lint it, print a summary
	$(CDK) synth --quiet
	$(PY) -m stacks.summary cdk.out

lint: $(STAMP)  ## ruff lint and format check (shellcheck and hadolint run inside the tests)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

doc-tables: $(STAMP)  ## rewrite the run-config table in docs/training.md from config.py
	$(PY) -m tools.doc_tables

# Make builds prerequisites left to right: system packages, then .venv (inside lint), then lint.
test: system-packages lint  ## set up a fresh Debian/Ubuntu machine as needed, lint, then run the whole suite (both stacks)
	$(PY) -m pytest -n 2 --dist loadgroup
	$(MAKE) --no-print-directory test-trn1
	tools/check_python312.sh  # the laptop side on Ubuntu 24.04's Python: a fresh 3.12 venv installs and synthesizes

test-trn1: $(STAMP)  ## the frozen trn1 lane's tests (and the payload code shared with it) on .venv/trn1-site
	PYTHONPATH=$(CURDIR)/$(VENV)/trn1-site:$(PYTHONPATH) $(PY) -m pytest -n 2 --dist loadgroup

test-fast: $(STAMP)  ## the main stack's tests but the local-Slurm ones, whole-job rehearsals and engine runs (make test runs all)
	$(PY) -m pytest -n 2 --dist loadgroup -m "not slurm and not rehearsal and not engine"

test-engine: $(STAMP)  ## only the tests that train through a real engine (torch, torchtitan) on the main stack
	$(PY) -m pytest -n 2 --dist loadgroup -m "engine and not slurm and not rehearsal"

snapshot-update: $(STAMP)  ## rewrite the template snapshots after an intended change
	$(PY) -m pytest tests/infra -k snapshot --snapshot-update

deploy: $(STAMP)  ## deploy to the AWS account of your credentials (needs Docker; DEPLOY_ARGS="-c KEY=VALUE" overrides cdk.json for predeploy and the deploy, DEPLOY_ARGS=--no-rollback keeps a failed create; PREDEPLOY_ARGS=--allow-... lets a refused change through)
	$(PY) -m stacks.predeploy $(DEPLOY_ARGS) $(PREDEPLOY_ARGS)  # refuses changes the deployed stack cannot take or that lose data
	$(CDK) deploy --require-approval never $(DEPLOY_ARGS)

diff: $(STAMP)  ## show what a deploy would change
	$(CDK) diff

destroy: $(STAMP)  ## delete everything the stack created, then list what outlives it by design
	$(CDK) destroy --force
	$(PY) -m stacks.leftovers $(DEPLOY_ARGS)

rehearse: $(if $(CONFIG),rehearse-config) need-root system-packages $(STAMP)  ## run the whole pipeline on a local single-node Slurm with a tiny model (root or sudo); CONFIG=payloads/configs/<run>.toml: that run config at tiny shape
	$(AS_ROOT) $(PY) -m tools.rehearse $(if $(CONFIG),--config $(CONFIG) --tiny)

rehearse-config:  # make rehearse CONFIG=...: a missing file stops it before anything is installed
	@test -f "$(CONFIG)" || { echo "error: CONFIG=$(CONFIG): no such run config file (e.g. CONFIG=payloads/configs/llama3-8b-lora-g5.toml)" >&2; exit 2; }

rehearse-ladder: need-root system-packages $(STAMP)  ## run the torchtitan ladder chain on a local Slurm (CPU stand-in trainer; root or sudo)
	$(AS_ROOT) $(PY) -m tools.rehearse_ladder

bench: $(STAMP)  ## merge benchmark: streaming merge vs reference vs copy floor
	$(PY) bench/merge_bench.py

bench-train: $(STAMP)  ## training benchmark: our torch engine and its levers vs plain TRL (docs/train-benchmark.md)
	$(PY) bench/train_bench.py

diagram: $(STAMP)  ## draw docs/architecture.svg (and .dot) from the synthesized template
	$(CDK) synth --quiet
	$(PY) tools/diagram.py cdk.out docs/architecture

clean:  ## remove build outputs (keeps .venv)
	rm -rf cdk.out .pytest_cache .bench .bench-train .rehearsal .rehearsal-ladder
