# shellcheck shell=bash
# How a step enters the training image under Pyxis/enroot, written once: sourced by env.sh (every step of a
# chain) and run by the Trainium2 acceptance's launch (llm_pipeline.jobs.acceptance_launch), so both give
# srun the same image, mounts and variables.
#
# Reads: HPL_IMAGE_URI, HPL_IMAGES_DIR, HPL_FSX_MOUNT_PATH, HPL_PAYLOADS_DIR, HPL_METRICS_TEXTFILE_PATH.

# The squashfs the prepare step imports an image into (default HPL_IMAGE_URI): one per image tag, on FSx.
hpl_image_file() {
  local uri="${1:-$HPL_IMAGE_URI}"
  printf '%s/%s.sqsh\n' "$HPL_IMAGES_DIR" "$(printf '%s' "${uri##*/}" | tr -c 'A-Za-z0-9._-' '_')"
}

# docker://<registry>#<repository>:<tag> into its squashfs on FSx, once per tag: hpl_import_image URI. ECR
# credentials come from the node's role and live in a private enroot config folder only for the import.
hpl_import_image() {
  local uri="$1" file
  file="$(hpl_image_file "$uri")"
  if [[ -s "$file" ]]; then
    echo "image already imported: $file"
    return
  fi
  local registry="${uri%%/*}" repository="${uri#*/}"
  local partial="$file.partial-${SLURM_JOB_ID:-$$}" enroot_config
  enroot_config="$(mktemp -d)"
  mkdir -p "$HPL_IMAGES_DIR"
  if [[ "$registry" == *.dkr.ecr.*.amazonaws.com ]]; then
    local region="${HPL_REGION:-$(cut -d. -f4 <<<"$registry")}" password
    password="$(aws ecr get-login-password --region "$region")"
    (umask 077 && printf 'machine %s login AWS password %s\n' "$registry" "$password" >"$enroot_config/.credentials")
  fi
  echo "importing $uri into $file"
  if ! ENROOT_CONFIG_PATH="$enroot_config" enroot import --output "$partial" "docker://$registry#$repository"; then
    rm -rf "$enroot_config" "$partial"
    echo "error: enroot could not import $uri (see above)" >&2
    return 1
  fi
  rm -rf "$enroot_config"
  mv -f "$partial" "$file"
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
