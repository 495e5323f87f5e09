# shellcheck shell=bash
# The accelerator and network settings every training process gets, from the instance type's facts
# (stacks/accelerators.py): sourced by env.sh on the cluster (the partition's facts) and by a
# SageMaker training job (sagemaker_job.py, the facts hpctl put in the job's environment), so both
# lanes set the same variables from the same table. Values already set win.
#
# Reads: HPL_ACCELERATOR (neuron|cuda|none), HPL_IMAGE_FAMILY (torchneuron: Trainium2's native runtime),
# HPL_EFA_INTERFACES (0: no EFA), HPL_EFA_DEVICE_RDMA (1|0), HPL_NODES (the job's node or host count),
# HPL_COMPILE_CACHE_DIR.
# Without partition facts (a local Slurm) the settings are the default Trainium partition's.
export HPL_ACCELERATOR="${HPL_ACCELERATOR:-neuron}"
case "$HPL_ACCELERATOR" in
  neuron)
    if [[ "${HPL_IMAGE_FAMILY:-neuron}" == torchneuron ]]; then
      # TorchNeuron (Trainium2) compiles each graph when it first runs and keeps the NEFF in the directory
      # torch-neuronx's persistent cache reads from this variable: on FSx, so the smoke run's graphs serve
      # the long run and every node. The torch-xla settings below mean nothing to it.
      export TORCH_NEURONX_NEFF_CACHE_DIR="${TORCH_NEURONX_NEFF_CACHE_DIR:-$HPL_COMPILE_CACHE_DIR/torchneuron}"
    else
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
    fi
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
if (( ${HPL_NODES:-1} > 1 && ${HPL_EFA_INTERFACES:-1} > 0 )); then
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
