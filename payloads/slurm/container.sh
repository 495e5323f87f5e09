# shellcheck shell=bash
# How a step enters the training image under Pyxis/enroot, written once: sourced by env.sh (every step of a
# chain) and run by the Trainium2 acceptance's launch (llm_pipeline.jobs.acceptance_launch), so both give
# srun the same image, mounts and variables.
#
# Reads: HPL_IMAGE_URI, HPL_IMAGES_DIR, HPL_FSX_MOUNT_PATH, HPL_PAYLOADS_DIR, HPL_METRICS_TEXTFILE_PATH.

# The squashfs the prepare step imports HPL_IMAGE_URI into: one per image tag, on FSx.
hpl_image_file() {
  printf '%s/%s.sqsh\n' "$HPL_IMAGES_DIR" "$(printf '%s' "${HPL_IMAGE_URI##*/}" | tr -c 'A-Za-z0-9._-' '_')"
}

# Pyxis sets the host's exported variables in the container, but where the image sets one too the image's value
# wins; --container-env keeps the host's. These are the variables the images set and a chain sets otherwise
# (TorchNeuron's compile cache: the image's folder, the chain's on FSx).
HPL_CONTAINER_ENV_NAMES=(TORCH_NEURONX_NEFF_CACHE_DIR)

# The srun options that run a step in the image, one per line.
hpl_container_options() {
  local mounts="$HPL_FSX_MOUNT_PATH:$HPL_FSX_MOUNT_PATH" name keep=()
  # The node-local folder node exporter reads the run's metrics from (observability = prometheus).
  if [[ -n "${HPL_METRICS_TEXTFILE_PATH:-}" ]]; then mounts+=",$HPL_METRICS_TEXTFILE_PATH:$HPL_METRICS_TEXTFILE_PATH"; fi
  for name in "${HPL_CONTAINER_ENV_NAMES[@]}"; do
    if [[ -n "${!name:-}" ]]; then keep+=("$name"); fi
  done
  printf '%s\n' "--container-image=$(hpl_image_file)" "--container-mounts=$mounts" \
    "--container-workdir=$HPL_PAYLOADS_DIR"
  if (( ${#keep[@]} )); then
    local IFS=,
    printf '%s\n' "--container-env=${keep[*]}"
  fi
}
