# shellcheck shell=bash
# Sourced by every step script: paths, accelerator and network settings, the runtime switch and the launch logic,
# written once. `source env.sh <step>`; then `hpl_step_python <module> [args]` (one process) or
# `hpl_torchrun <module> [args]` (torchrun on every node of the allocation).
#
# Set by submit (python -m llm_pipeline.submit): HPL_PAYLOADS_DIR, HPL_RUN_CONFIG, HPL_RUN_DIR.
# Cluster facts (/etc/profile.d/hyperpod-lora.sh on HyperPod nodes): HPL_FSX_MOUNT_PATH,
# HPL_MODELS_DIR, HPL_DATASETS_DIR, HPL_OUTPUTS_DIR, HPL_COMPILE_CACHE_DIR, HPL_IMAGES_DIR,
# HPL_SCRATCH_DIR, HPL_IMAGE_URI, HPL_RUNTIME (pyxis|host), HPL_DEVICES_PER_NODE, HPL_REGION.
# HPL_IMAGE_URI and HPL_RUNTIME change with each deploy: submit reads them from the payloads'
# deploy-facts.json (llm_pipeline.jobs.deploy_facts) and exports them to every job of the chain.
# The run's partition (llm_pipeline.jobs.partitions) comes with it: HPL_PARTITION, HPL_ACCELERATOR
# (neuron|cuda|none), HPL_DEVICES_PER_NODE (processes per node), HPL_EFA_INTERFACES, HPL_EFA_DEVICE_RDMA.
# HPL_METRICS_TEXTFILE_PATH (cluster facts, observability = prometheus): where the training step writes its
# figures for node exporter (llm_pipeline.jobs.prom_textfile); mounted into the container.
# Local fallbacks: paths under HPL_FSX_MOUNT_PATH (default /fsx), runtime host, PYTHON or python3.
set -euo pipefail

HPL_STEP="${1:?usage: source env.sh <step>}"
# The job's name in the submission record (smoke-train for the smoke stage's copy of train): its marker.
HPL_CHAIN_STEP="${HPL_CHAIN_STEP:-$HPL_STEP}"
: "${HPL_PAYLOADS_DIR:?is not set: submit with python3 -m llm_pipeline.submit --config <run.toml>}"
: "${HPL_RUN_CONFIG:?is not set: submit with python3 -m llm_pipeline.submit --config <run.toml>}"
: "${HPL_RUN_DIR:?is not set: submit with python3 -m llm_pipeline.submit --config <run.toml>}"

# -- paths: cluster facts, with local fallbacks; exported so the Python config sees the same ------
export HPL_FSX_MOUNT_PATH="${HPL_FSX_MOUNT_PATH:-/fsx}"
export HPL_MODELS_DIR="${HPL_MODELS_DIR:-$HPL_FSX_MOUNT_PATH/models}"
export HPL_DATASETS_DIR="${HPL_DATASETS_DIR:-$HPL_FSX_MOUNT_PATH/datasets}"
export HPL_OUTPUTS_DIR="${HPL_OUTPUTS_DIR:-$HPL_FSX_MOUNT_PATH/outputs}"
export HPL_COMPILE_CACHE_DIR="${HPL_COMPILE_CACHE_DIR:-$HPL_FSX_MOUNT_PATH/neuron-cache}"
export HPL_IMAGES_DIR="${HPL_IMAGES_DIR:-$HPL_FSX_MOUNT_PATH/images}"
export HPL_SCRATCH_DIR="${HPL_SCRATCH_DIR:-$HPL_FSX_MOUNT_PATH/scratch}"
export HPL_RUNTIME="${HPL_RUNTIME:-host}"
export PYTHONPATH="$HPL_PAYLOADS_DIR${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# Host-side helpers (reports: sweep_report.sbatch) run on the node's own Python: stdlib only.
export HPL_HOST_PYTHON="${PYTHON:-python3}"
HPL_STATE_DIR="$HPL_RUN_DIR/logs/state"

# -- accelerator and network: from the partition's facts; values already set win ---------------
# One file for both lanes: a SageMaker training job sources the same settings (sagemaker_job.py).
HPL_NODES="${SLURM_JOB_NUM_NODES:-1}"
# shellcheck source=payloads/slurm/accelerator_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/accelerator_env.sh"
# Only prepare (it checks that model.id and a Hub data.dataset can be fetched, before any work) and
# the steps that fetch (download, data, the ladder's tokenizer and dataset, and the ladder's rungs,
# which stream c4 from the Hub when torchtitan.dataset_source is empty) may reach the Hugging Face
# Hub: later steps read local folders, and a Hub error (network, HTTP 429) must not fail a step after
# the work is done. A value the caller set (HF_HUB_OFFLINE=1 on a node without Hub access) stays.
case "$HPL_STEP" in
  prepare | download | data | tokenizer | dataset | rung-*) ;;
  *) export HF_HUB_OFFLINE=1 ;;
esac

# -- runtime switch: host Python, or the training image through Pyxis ---------------------------
case "$HPL_RUNTIME" in
  host)
    HPL_PYTHON="${PYTHON:-python3}"
    ;;
  pyxis)
    : "${HPL_IMAGE_URI:?is not set: the cluster facts name the training image (HPL_IMAGE_URI)}"
    HPL_PYTHON=python3  # the image's interpreter
    # One squashfs per image tag on FSx, imported once by the prepare step (container.sh names it).
    # shellcheck source=payloads/slurm/container.sh
    source "$(dirname "${BASH_SOURCE[0]}")/container.sh"
    HPL_IMAGE_FILE="$(hpl_image_file)"
    export HPL_IMAGE_FILE
    ;;
  *)
    echo "error: HPL_RUNTIME=$HPL_RUNTIME is not a runtime (use host or pyxis)" >&2
    exit 2
    ;;
esac

# srun with what every step launch shares: HyperPod auto-resume and, with Pyxis, the image.
hpl_srun() {
  local -a opts=(--kill-on-bad-exit=1)
  if [[ -d "${HPL_SAGEMAKER_CLUSTER_DIR:-/opt/sagemaker_cluster}" ]]; then
    opts+=(--auto-resume=1)  # on HyperPod: replace a faulty node and restart the step
  fi
  if [[ "$HPL_RUNTIME" == pyxis ]]; then
    local -a container
    mapfile -t container < <(hpl_container_options)
    opts+=("${container[@]}")
  fi
  echo "+ srun ${opts[*]} $*"
  srun "${opts[@]}" "$@"
}

# One process on the first node: python -m <module> --config <run config> [args].
# The vLLM site's Python (the benchmark step's, and the download step's for the benchmark datasets): on a host,
# HPL_VLLM_PYTHON, else the one beside the step's Python (make venv: .venv/vllm-cpu); in a container, the serving
# image's (hpl_vllm_srun runs it there).
hpl_vllm_python() {
  if [[ "$HPL_RUNTIME" == host ]]; then
    echo "${HPL_VLLM_PYTHON:-$("$HPL_PYTHON" -c 'import sys; print(sys.prefix)')/vllm-cpu/bin/python}"
  else
    echo python3
  fi
}

# hpl_srun for a process that starts or talks to vLLM: under Pyxis in the partition's serving image
# (HPL_SERVING_IMAGE_URI, imported by the prepare step or the serve job), on a host as hpl_srun.
hpl_vllm_srun() {
  if [[ "$HPL_RUNTIME" == pyxis ]]; then
    : "${HPL_SERVING_IMAGE_URI:?is not set: the deploy facts name no serving image for this partition (deploy again)}"
    HPL_IMAGE_URI="$HPL_SERVING_IMAGE_URI" hpl_srun "$@"
  else
    hpl_srun "$@"
  fi
}

# hpl_step_python in the vLLM site (host) or the serving image (Pyxis): hpl_vllm_step_python <module> [args].
hpl_vllm_step_python() {
  local module="$1"
  shift
  hpl_vllm_srun --nodes=1 --ntasks=1 "$(hpl_vllm_python)" -m "$module" --config "$HPL_RUN_CONFIG" "$@"
}

hpl_step_python() {
  local module="$1"
  shift
  hpl_srun --nodes=1 --ntasks=1 "$HPL_PYTHON" -m "$module" --config "$HPL_RUN_CONFIG" "$@"
}

# The command srun runs for a torchrun step: jobs/launch.py computes the torchrun arguments inside
# each srun task, from the step's own node list, then execs torchrun. Computed here instead, the
# rendezvous address would be baked into the command that auto-resume re-runs after replacing a
# node, and the re-run would wait for the old first node. Sets HPL_LAUNCH (an array):
# hpl_torchrun_command [--wrap <command>] [--no-config] <module> [args].
hpl_torchrun_command() {
  local -a wrap=() config=(--config "$HPL_RUN_CONFIG")
  if [[ "$1" == --wrap ]]; then
    wrap=(--wrap "$2")
    shift 2
  fi
  if [[ "$1" == --no-config ]]; then
    config=()
    shift
  fi
  local module="$1"
  shift
  HPL_LAUNCH=("$HPL_PYTHON" -m llm_pipeline.jobs.launch --exec "${wrap[@]}" -- -m "$module" "${config[@]}" "$@")
}

# torchrun on every node of the allocation, optionally under a wrapper (neuron_parallel_compile):
# hpl_torchrun [--wrap <command>] [--no-config] <module> [args]. --no-config: the module takes only
# its own arguments (torchtitan.train --job.config_file <file>), not --config <run config>.
# The precompile step's wrapper: torch-xla's neuron_parallel_compile on trn1, none on Trainium2
# (HPL_IMAGE_FAMILY=torchneuron: TorchNeuron has no ahead-of-time tool; the steps compile as they run).
hpl_precompile_wrap() {
  if [[ "${HPL_IMAGE_FAMILY:-neuron}" != torchneuron ]]; then
    echo "--wrap neuron_parallel_compile"
  fi
}

HPL_TRAIN_NODES=()  # srun options of hpl_torchrun's nodes: all of the allocation, less a GRPO run's rollout node
hpl_torchrun() {
  hpl_torchrun_command "$@"
  hpl_srun "${HPL_TRAIN_NODES[@]}" --ntasks-per-node=1 "${HPL_LAUNCH[@]}"
}

# -- GRPO's rollout server (llm_pipeline.rollout_server; docs/training.md, GRPO) ----------------------------
# grpo.rollout: node (a step on the allocation's last node; the trainer's torchrun on the others, whose step node
# list jobs/launch.py reads), colocated (a step beside the trainer on the first node: --overlap shares its CPUs and
# memory), none (not a GRPO run). The server runs in the vLLM site (under Pyxis: the serving image); the trainer
# starts once it answers, and hpl_on_exit stops it whichever way the step ends.
hpl_rollout_start() {
  local placement node training="$HPL_NODES" vllm
  placement="$("$HPL_HOST_PYTHON" -m llm_pipeline.rollout_server --placement "$HPL_RUN_CONFIG")"
  if [[ "$placement" == none ]]; then return 0; fi
  local -a nodes
  mapfile -t nodes < <(scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname)}")
  node="${nodes[0]}"
  if [[ "$placement" == node ]]; then
    node="${nodes[-1]}"
    training=$((HPL_NODES - 1))
    HPL_TRAIN_NODES=(--nodes="$training" --exclude="$node")
  fi
  echo "== GRPO: the rollout server ($placement) on $node, training on $training node(s)"
  vllm="$(hpl_vllm_python)"
  hpl_vllm_srun --nodes=1 --ntasks=1 --overlap --nodelist="$node" \
    "$vllm" -m llm_pipeline.rollout_server --config "$HPL_RUN_CONFIG" &
  HPL_ROLLOUT_SERVER=$!
  "$HPL_HOST_PYTHON" -m llm_pipeline.rollout_server --wait "$HPL_RUN_CONFIG" "$HPL_ROLLOUT_SERVER"
}

hpl_rollout_stop() {
  if [[ -n "${HPL_ROLLOUT_SERVER:-}" ]] && kill -0 "$HPL_ROLLOUT_SERVER" 2>/dev/null; then
    echo "== stopping the rollout server"
    # the background launch is a subshell running srun, which passes SIGTERM on to the server
    pkill -TERM -P "$HPL_ROLLOUT_SERVER" -x srun 2>/dev/null || true
    wait "$HPL_ROLLOUT_SERVER" 2>/dev/null || true
  fi
}

# -- step state markers (read by `submit status` once Slurm has forgotten the job) ---------------
hpl_mark() {
  local state="$1" exit_code="${2:-null}"
  mkdir -p "$HPL_STATE_DIR"
  printf '{"step": "%s", "job": "%s", "state": "%s", "exit": %s, "node": "%s", "time": "%s"}\n' \
    "$HPL_CHAIN_STEP" "${SLURM_JOB_ID:-none}" "$state" "$exit_code" "$(hostname)" "$(date -u +%FT%TZ)" \
    >"$HPL_STATE_DIR/$HPL_CHAIN_STEP.json.tmp"
  mv -f "$HPL_STATE_DIR/$HPL_CHAIN_STEP.json.tmp" "$HPL_STATE_DIR/$HPL_CHAIN_STEP.json"
}

hpl_on_exit() {
  local rc="$1" state=COMPLETED
  hpl_rollout_stop
  if [[ -n "${HPL_SIGNAL:-}" ]]; then
    state=CANCELLED
  elif (( rc != 0 )); then
    state=FAILED
  fi
  hpl_mark "$state" "$rc"
  if [[ -n "${HPL_STALL_WATCH:-}" ]]; then kill "$HPL_STALL_WATCH" 2>/dev/null || true; fi
  # A run's state changes reach its alerts file and topic (llm_pipeline.jobs.alerts); a cancel was asked for.
  if [[ "$state" != CANCELLED ]]; then
    "$HPL_HOST_PYTHON" -m llm_pipeline.jobs.alerts step-end --state "$state" --exit "$rc" || true
  fi
  echo "== $HPL_CHAIN_STEP: $state (exit $rc) after $SECONDS s at $(date -u +%FT%TZ)"
}

# A training step that prints no progress line for HPL_ALERT_STALL_MINUTES (cluster facts; 0: off) is reported
# stalled: a watch beside the step reads its log (llm_pipeline.jobs.alerts watch) and ends with this script.
hpl_watch_stall() {
  local minutes="${HPL_ALERT_STALL_MINUTES:-0}"
  if [[ "$minutes" != 0 ]]; then
    "$HPL_HOST_PYTHON" -m llm_pipeline.jobs.alerts watch --pid $$ --stall-minutes "$minutes" &
    HPL_STALL_WATCH=$!
  fi
}

# The health gate before a multi-node step trains (llm_pipeline.jobs.health; docs/operations.md): on HyperPod, or
# where HPL_HEALTH_GATE=1. A node that fails is drained and the job requeued without it: Slurm then ends this
# start (SIGTERM, below), which waits for it; the job starts again on healthy nodes.
hpl_health_gate() {
  local rc=0
  "$HPL_HOST_PYTHON" -m llm_pipeline.jobs.health gate || rc=$?
  if (( rc == 4 )); then
    sleep 600 &
    wait $!
    exit 1  # Slurm did not end it: the requeue did not take
  fi
  return "$rc"
}

trap 'HPL_SIGNAL=TERM; exit 143' TERM
trap 'HPL_SIGNAL=INT; exit 130' INT
trap 'hpl_on_exit $?' EXIT
hpl_mark RUNNING
echo "== $HPL_CHAIN_STEP: job ${SLURM_JOB_ID:-?} on ${SLURM_JOB_NODELIST:-$(hostname)} (${SLURM_JOB_NUM_NODES:-1} node(s)), runtime $HPL_RUNTIME, partition ${HPL_PARTITION:-default} ($HPL_ACCELERATOR)"
echo "== config $HPL_RUN_CONFIG, run folder $HPL_RUN_DIR, started $(date -u +%FT%TZ)"
if [[ -n "${TORCH_NEURONX_NEFF_CACHE_DIR:-}" ]]; then
  echo "== TorchNeuron compile cache $TORCH_NEURONX_NEFF_CACHE_DIR (shared by the smoke and long runs)"
fi
