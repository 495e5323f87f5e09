#!/usr/bin/env bash
# HyperPod OnInitComplete: runs as root on every node after HyperPod's own setup (Slurm, Docker,
# Enroot/Pyxis, FSx mount), at create, scale-up and replacement. Adds only what this project needs:
# the shared FSx layout, the cluster facts as HPL_* environment (a compute node gets its own
# partition's: accelerator, devices, EFA, image), device checks on compute nodes (Neuron devices on
# Trainium; nvidia-smi and the EFA count on GPU nodes) and a message of the day on controller/login
# nodes, and the metrics exporters and collector (observability.sh). Idempotent: a second run changes nothing.
#
# Overrides (for tests and unusual nodes):
#   LIFECYCLE_ROOT                  prefix for every system path (default: none, i.e. /)
#   LIFECYCLE_FACTS_FILE            cluster facts (default: cluster-facts.json next to this script)
#   SAGEMAKER_RESOURCE_CONFIG_PATH  HyperPod's resource config (default: /opt/ml/config/resource_config.json)
#   LIFECYCLE_NODE_IPS              this node's addresses (default: `hostname -I`)
#   LIFECYCLE_FSX_TIMEOUT, LIFECYCLE_FSX_POLL  seconds to wait for the FSx mount, and between checks
#   LIFECYCLE_SLURM_CONF            the controller's slurm.conf (default: /opt/slurm/etc/slurm.conf)
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi  # in case it is started with sh
set -Eeuo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="${LIFECYCLE_ROOT:-}"
FACTS_FILE="${LIFECYCLE_FACTS_FILE:-$HERE/cluster-facts.json}"
RESOURCE_CONFIG="${SAGEMAKER_RESOURCE_CONFIG_PATH:-$ROOT/opt/ml/config/resource_config.json}"
FSX_TIMEOUT="${LIFECYCLE_FSX_TIMEOUT:-600}"
FSX_POLL="${LIFECYCLE_FSX_POLL:-5}"
PROFILE_FILE="$ROOT/etc/profile.d/hyperpod-lora.sh"
MOTD_FILE="$ROOT/etc/update-motd.d/99-hyperpod-lora"
ENROOT_CONF="$ROOT/etc/enroot/enroot.conf"
INSTALLED_FACTS="$ROOT/etc/hyperpod-lora/cluster-facts.json"  # every partition's facts, for submit
EFA_DEVICES_DIR="$ROOT/sys/class/infiniband"  # one entry per EFA device (rdmap*)
SLURM_CONF="${LIFECYCLE_SLURM_CONF:-$ROOT/opt/slurm/etc/slurm.conf}"  # /opt/slurm is the AMI's active-version link
PATH="$PATH:$ROOT/opt/aws/neuron/bin"  # neuron-ls lives here on the HyperPod AMI
STEP="start"
SLURM_VERSION=unknown

# The time from printf's own clock (no date process per line: the script logs hundreds of lines).
log() { TZ=UTC printf '[hyperpod-lora] %(%Y-%m-%dT%H:%M:%SZ)T [%s] %s\n' -1 "$STEP" "$*"; }
die() {
  printf '[hyperpod-lora] ERROR in step %s: %s\n' "$STEP" "$*" >&2
  exit 1
}
trap 'die "command failed (exit $?) at line $LINENO: $BASH_COMMAND"' ERR
step() {
  STEP="$1"
  log "begin"
}

# Install stdin at $1 with mode $2 unless the file already holds exactly that (no temp file then,
# so a second run leaves even directory timestamps alone). Sets INSTALLED_CHANGED to 1 if it wrote.
install_if_changed() {
  local dest="$1" mode="$2" content tmp
  content="$(cat; printf x)"
  content="${content%x}"
  if [[ -f "$dest" ]] && printf '%s' "$content" | cmp -s - "$dest"; then
    if [[ "$(stat -c %a "$dest")" != "${mode#0}" ]]; then
      chmod "$mode" "$dest"
      log "mode of ${dest#"$ROOT"} set to $mode"
    fi
    log "unchanged: ${dest#"$ROOT"}"
    INSTALLED_CHANGED=0
    return
  fi
  mkdir -p "$(dirname "$dest")"
  tmp="$(mktemp "$dest.XXXXXX")"
  printf '%s' "$content" >"$tmp"
  chmod "$mode" "$tmp"
  mv -f "$tmp" "$dest"
  log "wrote: ${dest#"$ROOT"}"
  # shellcheck disable=SC2034  # read by observability.sh's ensure_unit
  INSTALLED_CHANGED=1
}

read_facts() {
  step read-facts
  local profile
  profile="$(python3 "$HERE/node_facts.py" profile "$FACTS_FILE")" || die "cannot use the cluster facts (see error above)"
  PROFILE_TEXT="$profile"
  # shellcheck source=/dev/null
  source <(printf '%s\n' "$profile")
  log "cluster $HPL_CLUSTER_NAME, facts from $FACTS_FILE"
}

identify_node() {
  step identify-node
  local ips identity
  read -r -a ips <<<"${LIFECYCLE_NODE_IPS:-$(hostname -I)}"
  identity="$(python3 "$HERE/node_facts.py" identify "$FACTS_FILE" "$RESOURCE_CONFIG" "${ips[@]}")" \
    || die "cannot find this node in the resource config (see error above)"
  IFS=$'\t' read -r NODE_ROLE NODE_GROUP NODE_NAME <<<"$identity"
  log "addresses ${ips[*]} -> instance $NODE_NAME, group $NODE_GROUP, role $NODE_ROLE"
}

# On a compute node its own partition's facts (accelerator, devices, EFA, image) replace the default's.
# The whole facts file is kept too: submit reads every partition's facts from it (HPL_CLUSTER_FACTS_FILE).
write_profile() {
  step write-profile
  PROFILE_TEXT="$(python3 "$HERE/node_facts.py" profile "$FACTS_FILE" "$NODE_GROUP")" \
    || die "cannot use the cluster facts for group $NODE_GROUP (see error above)"
  PROFILE_TEXT+=$'\n'"export HPL_CLUSTER_FACTS_FILE=${INSTALLED_FACTS#"$ROOT"}"
  PROFILE_TEXT+=$'\n'"$(teams user-outputs)"  # a team user's runs go to their own outputs folder
  # shellcheck source=/dev/null
  source <(printf '%s\n' "$PROFILE_TEXT")
  install_if_changed "$INSTALLED_FACTS" 0644 <"$FACTS_FILE"
  printf '%s\n' "$PROFILE_TEXT" | install_if_changed "$PROFILE_FILE" 0644
  log "partition $HPL_PARTITION: $HPL_COMPUTE_INSTANCE_TYPE, accelerator $HPL_ACCELERATOR, $HPL_DEVICES_PER_NODE devices, $HPL_EFA_INTERFACES EFA"
}

wait_for_fsx() {
  step wait-fsx
  local mount="$ROOT$HPL_FSX_MOUNT_PATH" deadline=$((SECONDS + FSX_TIMEOUT))
  until mountpoint -q "$mount" && [[ -w "$mount" ]]; do
    if ((SECONDS >= deadline)); then
      if mountpoint -q "$mount"; then
        die "$HPL_FSX_MOUNT_PATH is mounted but not writable after ${FSX_TIMEOUT}s"
      fi
      die "$HPL_FSX_MOUNT_PATH is not mounted after ${FSX_TIMEOUT}s; HyperPod mounts it from the instance group's" \
        "FsxLustreConfig: check the file system is AVAILABLE and its security group allows TCP 988 and 1021-1023"
    fi
    log "waiting for $HPL_FSX_MOUNT_PATH to be mounted and writable ($((deadline - SECONDS))s left)"
    sleep "$FSX_POLL"
  done
  log "$HPL_FSX_MOUNT_PATH is mounted and writable"
}

# The folders jobs write to: shared inputs for every cluster user, the default user's outputs, each team
# user's own home and outputs (lifecycle/slurm_teams.py `layout` says who owns what, and why). Existing folders
# keep their content. After the teams step, which creates the cluster group the shared folders belong to.
create_fsx_layout() {
  step fsx-layout
  local owner out
  owner="$(id -u "$HPL_DEFAULT_USER"):$(id -g "$HPL_DEFAULT_USER")" \
    || die "default user $HPL_DEFAULT_USER does not exist on this node (HyperPod creates it; check default_user in the facts)"
  out="$(teams layout "$USERS_FILE" "$owner" "$ROOT$HPL_FSX_MOUNT_PATH" "$ROOT$HPL_OUTPUTS_DIR" "$ROOT$HPL_MODELS_DIR" \
    "$ROOT$HPL_COMPILE_CACHE_DIR" "$ROOT$HPL_IMAGES_DIR" "$ROOT$HPL_SCRATCH_DIR")" \
    || die "cannot make the FSx layout (see error above)"
  log_lines "set " "${out//"$ROOT"/}"
  log "layout ready under $HPL_FSX_MOUNT_PATH"
}

check_neuron_devices() {
  step neuron-devices
  local devices=("$ROOT"/dev/neuron[0-9]*)
  [[ -e "${devices[0]}" ]] \
    || die "no /dev/neuron* devices on this $HPL_COMPUTE_INSTANCE_TYPE node: the Neuron driver (aws-neuronx-dkms) is not loaded"
  log "${#devices[@]} Neuron devices: ${devices[*]#"$ROOT"}"
  if command -v neuron-ls >/dev/null; then
    # A diagnostic only: the device files above are the check, so a failing neuron-ls is logged
    # and provisioning goes on (a non-zero exit here would fail the node and the whole cluster).
    local report line status=0
    report="$(neuron-ls 2>&1)" || status=$?
    while IFS= read -r line; do log "neuron-ls: $line"; done <<<"$report"
    if ((status != 0)); then
      log "neuron-ls failed (exit $status); continuing: it is a diagnostic, the /dev/neuron* check passed"
    fi
  else
    log "neuron-ls not installed; relying on /dev/neuron*"
  fi
}

# Diagnostics from here on: a failure is logged as WARNING and provisioning goes on, because a
# non-zero exit fails the node and with it the whole cluster create; HyperPod's own health checks
# (and deep health checks, where configured) replace a bad node.
warn() { log "WARNING: $*"; }

check_gpus() {
  step gpu-devices
  local report status=0 count
  if ! command -v nvidia-smi >/dev/null; then
    warn "nvidia-smi not found on this $HPL_COMPUTE_INSTANCE_TYPE node: the NVIDIA driver is missing"
    return
  fi
  report="$(nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>&1)" || status=$?
  if ((status != 0)); then
    warn "nvidia-smi failed (exit $status): ${report//$'\n'/; }"
    return
  fi
  count="$(grep -c . <<<"$report" || true)"
  while IFS= read -r line; do log "nvidia-smi: $line"; done <<<"$report"
  if ((count == HPL_DEVICES_PER_NODE)); then
    log "$count GPUs, as $HPL_COMPUTE_INSTANCE_TYPE has"
  else
    warn "$count GPUs visible, $HPL_COMPUTE_INSTANCE_TYPE has $HPL_DEVICES_PER_NODE"
  fi
}

check_efa() {
  step efa-devices
  local devices=() count
  if [[ -d "$EFA_DEVICES_DIR" ]]; then
    devices=("$EFA_DEVICES_DIR"/*)
    [[ -e "${devices[0]}" ]] || devices=()
  fi
  count="${#devices[@]}"
  if ((count == HPL_EFA_INTERFACES)); then
    log "$count EFA devices, as $HPL_COMPUTE_INSTANCE_TYPE has"
  else
    warn "$count EFA devices under ${EFA_DEVICES_DIR#"$ROOT"}, $HPL_COMPUTE_INSTANCE_TYPE has $HPL_EFA_INTERFACES:" \
      "multi-node jobs will be slow or fail (check the security group allows all traffic within itself)"
  fi
}

# The node's Slurm version, for reading a failure against HyperPod's AMI release notes. The client
# commands need a configuration source even for --version (Slurm 22.05 does), the daemons do not.
report_slurm_version() {
  step slurm-version
  local probe version failures=()
  for probe in "sinfo --version" "scontrol --version" "slurmd -V" "slurmctld -V"; do
    command -v "${probe%% *}" >/dev/null || continue
    if version="$($probe 2>&1)"; then  # word-split on purpose: "tool flag"
      log "${version##*$'\n'} (from $probe)"
      # shellcheck disable=SC2034  # read by observability.sh: it picks Slurm's metrics source by the version
      SLURM_VERSION="${version##* }"  # "slurm 25.11.2" -> 25.11.2
      return
    fi
    failures+=("$probe: ${version##*$'\n'}")
  done
  if ((${#failures[@]} == 0)); then
    warn "no Slurm command (sinfo, scontrol, slurmd, slurmctld) on PATH: HyperPod's Slurm is not installed on this node"
  else
    warn "Slurm version unknown: $(IFS=';'; echo "${failures[*]}")"
  fi
}

# HyperPod manages Slurm topology itself since April 2026. On AMIs with Slurm 25.11 other projects
# found it enabling topology with no topology to use: TopologyPlugin=topology/tree with no topology.conf
# (sbatch then fails "Requested topology configuration is not available"), or PartitionName ...
# Topology=tree with an empty topology.yaml (slurmctld crash-loops). Either way no job can run, so the
# controller's provisioning stops here with the line and the way out, rather than a cluster that looks
# InService. slurm.conf is HyperPod's (its agent rewrites it), so it is not edited here (lifecycle/README.md).
has_topology() {
  local dir="$1"
  [[ -f "$dir/topology.conf" ]] && grep -Eq '^[[:space:]]*(SwitchName|BlockName)=' "$dir/topology.conf" && return 0
  # A topology.yaml with content beyond comments, blanks and an empty list.
  [[ -f "$dir/topology.yaml" ]] && grep -Ev '^[[:space:]]*(#.*)?$|^[[:space:]]*\[[[:space:]]*\][[:space:]]*$' \
    "$dir/topology.yaml" | grep -q .
}

check_slurm_topology() {
  step slurm-topology
  if [[ ! -f "$SLURM_CONF" ]]; then
    warn "${SLURM_CONF#"$ROOT"} not found: Slurm's topology setup not checked"
    return
  fi
  local dir line
  dir="$(dirname "$SLURM_CONF")"
  line="$(grep -nEi '^[[:space:]]*TopologyPlugin[[:space:]]*=[[:space:]]*topology/(tree|block)\b' "$SLURM_CONF" \
    || grep -nEi '^[[:space:]]*PartitionName[[:space:]]*=.*[[:space:]]Topology[[:space:]]*=' "$SLURM_CONF" || true)"
  line="${line%%$'\n'*}"
  if [[ -z "$line" ]]; then
    log "no topology plugin or partition topology in ${SLURM_CONF#"$ROOT"}; nothing to check"
    return
  fi
  if has_topology "$dir"; then
    log "topology in use (${SLURM_CONF#"$ROOT"}:${line%%:*}) and described in ${dir#"$ROOT"}/topology.conf or topology.yaml"
    return
  fi
  die "${SLURM_CONF#"$ROOT"}:${line%%:*} enables topology ('${line#*:}') but ${dir#"$ROOT"} has no topology.conf" \
    "with SwitchName=/BlockName= lines and no non-empty topology.yaml: Slurm then refuses every job (sbatch:" \
    "'Requested topology configuration is not available') or slurmctld crash-loops. This is the known fault of" \
    "HyperPod's automatic topology on Slurm 25.11 AMIs; HyperPod owns slurm.conf, so this script does not edit it." \
    "Fix: move the cluster to an AMI without the fault (aws sagemaker update-cluster-software) or ask AWS Support," \
    "then redeploy; see the Slurm topology section of lifecycle/README.md"
}

# Pyxis starts containers through Enroot; Enroot shows the host's /dev (so /dev/neuron*) unless
# ENROOT_RESTRICT_DEV is on, in which case it would expose only a minimal device set.
expose_neuron_to_enroot() {
  step enroot-devices
  if [[ "$HPL_RUNTIME" != pyxis ]]; then
    log "runtime is $HPL_RUNTIME; containers are not used"
    return
  fi
  command -v enroot >/dev/null || die "runtime is pyxis but enroot is not installed on this node"
  log "enroot $(enroot version)"
  local restrict='^[[:space:]]*ENROOT_RESTRICT_DEV[[:space:]]+"?([Yy]([Ee][Ss])?|[Tt][Rr][Uu][Ee]|1|[Oo][Nn])"?[[:space:]]*$'
  if [[ -f "$ENROOT_CONF" ]] && grep -Eq "$restrict" "$ENROOT_CONF"; then
    sed -E "s/$restrict/ENROOT_RESTRICT_DEV no/" "$ENROOT_CONF" | install_if_changed "$ENROOT_CONF" 0644
    log "ENROOT_RESTRICT_DEV turned off so containers see /dev/neuron*"
  else
    log "enroot does not restrict /dev; containers see /dev/neuron*"
  fi
}

write_motd() {
  step motd
  install_if_changed "$MOTD_FILE" 0755 <<EOF
#!/bin/sh
cat <<'MOTD'

  HyperPod cluster $HPL_CLUSTER_NAME: Llama fine-tuning and pretraining on $HPL_COMPUTE_INSTANCE_TYPE ($NODE_ROLE node)

  Submit the pipeline (as $HPL_DEFAULT_USER):
    cd $HPL_PAYLOADS_DIR && python3 -m llm_pipeline.submit --config $HPL_PAYLOADS_DIR/configs/default.toml
  or from your laptop:  hpctl submit

  Watch it:     squeue; sinfo -p $HPL_PARTITION
  Run outputs:  $HPL_OUTPUTS_DIR/<run>/ (job logs in its logs/), exported to s3://$HPL_BUCKET/outputs/
  Node setup:   /var/log/provision/provisioning.log (CloudWatch stream LifecycleConfig/<group>/<instance-id>)

MOTD
EOF
}

# shellcheck source=/dev/null
source "$HERE/observability.sh"
# shellcheck source=/dev/null
source "$HERE/teams.sh"

main() {
  log "on_init_complete.sh on $(hostname)"
  read_facts
  identify_node
  write_profile
  wait_for_fsx
  report_slurm_version
  setup_teams
  create_fsx_layout
  case "$NODE_ROLE" in
    Compute)
      case "$HPL_ACCELERATOR" in
        neuron)
          check_neuron_devices
          expose_neuron_to_enroot
          ;;
        cuda) check_gpus ;;
        *) log "$HPL_COMPUTE_INSTANCE_TYPE has no accelerator; nothing to check" ;;
      esac
      if ((HPL_EFA_INTERFACES > 0)); then check_efa; fi
      ;;
    Controller)
      check_slurm_topology
      write_motd
      ;;
    Login) write_motd ;;
  esac
  setup_observability
  STEP="done"
  log "node $NODE_NAME ($NODE_ROLE) is ready"
}

main "$@"
