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
# Without partition facts (a local Slurm) the settings are the default Trainium partition's.
export HPL_ACCELERATOR="${HPL_ACCELERATOR:-neuron}"
case "$HPL_ACCELERATOR" in
  neuron)
    # The compile cache lives on FSx so every node and every later run reuses compiled graphs.
    export NEURON_CC_FLAGS="${NEURON_CC_FLAGS:---model-type transformer --retry_failed_compilation}"
    if [[ "$NEURON_CC_FLAGS" != *--cache_dir* ]]; then
      NEURON_CC_FLAGS+=" --cache_dir=$HPL_COMPILE_CACHE_DIR"
    fi
    export NEURON_FUSE_SOFTMAX=1
    export NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS=3
    # bf16 with stochastic rounding, as AWS's trn1 full fine-tuning reference trains. optimum-neuron
    # 0.4.5 also sets it from stochastic_rounding_enabled when its trainer starts; exported here so the
    # runtime has it from the first device use on (bf16 = false: optimum-neuron sets it to 0 itself).
    export NEURON_RT_STOCHASTIC_ROUNDING_EN="${NEURON_RT_STOCHASTIC_ROUNDING_EN:-1}"
    ;;
  cuda)
    # NCCL over EFA through the aws-ofi-nccl plugin in the CUDA image, with the libfabric settings
    # AWS's HyperPod GPU recipes use; NCCL's own sockets stay off container and loopback interfaces.
    export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-^docker,lo,veth}"
    export FI_EFA_USE_HUGE_PAGE="${FI_EFA_USE_HUGE_PAGE:-0}"
    export FI_EFA_SET_CUDA_SYNC_MEMOPS="${FI_EFA_SET_CUDA_SYNC_MEMOPS:-0}"
    ;;
  none) ;;
  *)
    echo "error: HPL_ACCELERATOR=$HPL_ACCELERATOR is not an accelerator (use neuron, cuda or none)" >&2
    exit 2
    ;;
esac
# Across nodes, collectives go over EFA; device RDMA (accelerator memory straight to the wire) only
# where the instance supports it (p4d, p5, trn; g5's EFA does not).
if (( ${SLURM_JOB_NUM_NODES:-1} > 1 && ${HPL_EFA_INTERFACES:-1} > 0 )); then
  export FI_PROVIDER="${FI_PROVIDER:-efa}"
  # libfabric's EFA provider registers memory; without fork safety a forked child (a data loader
  # worker, a checkpoint writer) can corrupt it. AWS's Trainium EFA jobs set it.
  export FI_EFA_FORK_SAFE="${FI_EFA_FORK_SAFE:-1}"
  if [[ "${HPL_EFA_DEVICE_RDMA:-1}" == 1 ]]; then
    export FI_EFA_USE_DEVICE_RDMA="${FI_EFA_USE_DEVICE_RDMA:-1}"
  fi
fi
# Must be in the environment before torchrun starts: glibc arenas otherwise exhaust host memory
# when checkpoints are written.
export MALLOC_ARENA_MAX=64
# Only the steps that fetch (download, data, the ladder's tokenizer and dataset, and the ladder's
# rungs, which stream c4 from the Hub when torchtitan.dataset_source is empty) may reach
# the Hugging Face Hub: later steps read local folders, and a Hub error (network, HTTP 429) must not
# fail a step after the work is done.
case "$HPL_STEP" in
  download | data | tokenizer | dataset | rung-*) ;;
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
    # One squashfs per image tag on FSx, imported once by the prepare step.
    HPL_IMAGE_FILE="$HPL_IMAGES_DIR/$(printf '%s' "${HPL_IMAGE_URI##*/}" | tr -c 'A-Za-z0-9._-' '_').sqsh"
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
    opts+=(--container-image="$HPL_IMAGE_FILE"
           --container-mounts="$HPL_FSX_MOUNT_PATH:$HPL_FSX_MOUNT_PATH"
           --container-workdir="$HPL_PAYLOADS_DIR")
  fi
  echo "+ srun ${opts[*]} $*"
  srun "${opts[@]}" "$@"
}

# One process on the first node: python -m <module> --config <run config> [args].
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
hpl_torchrun() {
  hpl_torchrun_command "$@"
  hpl_srun --ntasks-per-node=1 "${HPL_LAUNCH[@]}"
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
  if [[ -n "${HPL_SIGNAL:-}" ]]; then
    state=CANCELLED
  elif (( rc != 0 )); then
    state=FAILED
  fi
  hpl_mark "$state" "$rc"
  echo "== $HPL_CHAIN_STEP: $state (exit $rc) after $SECONDS s at $(date -u +%FT%TZ)"
}

trap 'HPL_SIGNAL=TERM; exit 143' TERM
trap 'HPL_SIGNAL=INT; exit 130' INT
trap 'hpl_on_exit $?' EXIT
hpl_mark RUNNING
echo "== $HPL_CHAIN_STEP: job ${SLURM_JOB_ID:-?} on ${SLURM_JOB_NODELIST:-$(hostname)} (${SLURM_JOB_NUM_NODES:-1} node(s)), runtime $HPL_RUNTIME, partition ${HPL_PARTITION:-default} ($HPL_ACCELERATOR)"
echo "== config $HPL_RUN_CONFIG, run folder $HPL_RUN_DIR, started $(date -u +%FT%TZ)"
