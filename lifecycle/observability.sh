# shellcheck shell=bash
# Sourced by on_init_complete.sh (uses its log, step, warn and install_if_changed). With
# observability = prometheus, each node runs, from the stack's own ECR images (HPL_*_IMAGE):
#   every node      node exporter (:9100; its textfile collector reads HPL_METRICS_TEXTFILE_PATH, where the
#                   training steps write their own metrics)
#   EFA nodes       the EFA devices' port counters (hw_counters) into that folder (slurm_metrics.py efa, a
#                   timer): node exporter's infiniband collector does not read EFA's counters
#   GPU nodes       DCGM exporter (:9400) with the Slurm job id of each GPU (slurm_metrics.py gpu-jobs, a timer:
#                   the AMI's own /run/slurm/dcgm-job-mapping where it exists, else Slurm's GPU allocation)
#   Trainium nodes  neuron-monitor piped into its Prometheus bridge (:8000), both from aws-neuronx-tools
#   controller      Slurm nodes and jobs by state per partition: slurmctld's own OpenMetrics endpoints where
#                   Slurm is 25.11+ and slurm.conf enables them, else slurm_metrics.py cluster (a timer)
#   compute nodes   a run's metrics end with its job: Slurm's epilog removes them (where slurm.conf's Epilog is a
#                   folder glob) and a 15 s timer sweeps those of jobs no longer on the node, writing a heartbeat
#                   for the others (slurm_metrics.py run-ended, sweep)
#   every node      Prometheus in agent mode: scrapes the above every 30 s, remote-writes to the stack's
#                   AMP workspace with SigV4 (the node role may write there and nowhere else)
# Idempotent: a container is recreated only when its image or arguments change (label hpl.spec), a
# unit restarted only when its file changes or it is not running.

OBS_ETC="$ROOT/etc/hyperpod-lora"
OBS_BIN="$ROOT/opt/hyperpod-lora"
UNIT_DIR="$ROOT/etc/systemd/system"
GPU_JOBS_DIR="$ROOT/var/lib/hyperpod-lora/gpu-jobs"
SCRAPE_INTERVAL=30s
RUN_SWEEP_INTERVAL=15s  # a run that ended without its epilog leaves the dashboard within a minute
RUN_METRICS_EPILOG=hpl-run-metrics.sh
SLURMCTLD_METRICS_ENDPOINTS="jobs nodes partitions scheduler"  # slurmctld's /metrics/<endpoint> (Slurm 25.11)
LOGGED_IN=""

# Pull from the stack's ECR repository once per run, and only when a container must be (re)created.
ecr_login() {
  [[ -n "$LOGGED_IN" ]] && return
  local registry="${1%%/*}"
  aws ecr get-login-password --region "$HPL_REGION" | docker login --username AWS --password-stdin "$registry" >/dev/null
  LOGGED_IN=1
}

# ensure_container NAME IMAGE [docker run options...] -- [container args...]
ensure_container() {
  local name="$1" image="$2" spec current
  shift 2
  spec="$(printf '%s\n' "$image" "$@" | sha256sum | cut -c1-16)"
  current="$(docker inspect --format '{{index .Config.Labels "hpl.spec"}} {{.State.Running}}' "$name" 2>/dev/null || true)"
  if [[ "$current" == "$spec true" ]]; then
    log "unchanged: container $name"
    return
  fi
  local -a options=() args=()
  while (($#)) && [[ "$1" != -- ]]; do
    options+=("$1")
    shift
  done
  (($#)) && shift
  args=("$@")
  if [[ -n "$current" ]]; then docker rm -f "$name" >/dev/null; fi
  ecr_login "$image"
  docker pull --quiet "$image" >/dev/null
  docker run --detach --name "$name" --restart unless-stopped --network host --label "hpl.spec=$spec" \
    "${options[@]}" "$image" "${args[@]}" >/dev/null
  log "started container $name ($image)"
}

# ensure_unit NAME: the unit file comes on stdin; enabled and (re)started when new, changed or stopped.
ensure_unit() {
  local name="$1"
  install_if_changed "$UNIT_DIR/$name" 0644
  if ((INSTALLED_CHANGED)); then
    systemctl daemon-reload
    systemctl enable "$name" >/dev/null 2>&1
    systemctl restart "$name"
    log "started $name"
  elif ! systemctl is-active --quiet "$name"; then
    systemctl enable --now "$name" >/dev/null 2>&1
    log "started $name (was not running)"
  fi
}

# A oneshot service run by its timer, every $3 (default the scrape interval).
ensure_timer() {
  local name="$1" command="$2" interval="${3:-$SCRAPE_INTERVAL}"
  ensure_unit "$name.service" <<EOF
[Unit]
Description=hyperpod-lora: $name

[Service]
Type=oneshot
ExecStart=$command
EOF
  ensure_unit "$name.timer" <<EOF
[Unit]
Description=hyperpod-lora: $name every $interval

[Timer]
OnBootSec=10s
OnUnitActiveSec=$interval
AccuracySec=1s

[Install]
WantedBy=timers.target
EOF
}

# Slurm's epilog on a compute node. slurm.conf is HyperPod's (lifecycle/README.md), so it is not edited: where its
# Epilog is a folder glob (Epilog=/dir/*) ours joins that folder; otherwise the sweep timer alone ends the series.
install_run_metrics_epilog() {
  local textfile="$1" epilog
  epilog="$(sed -nE 's/^[[:space:]]*Epilog[[:space:]]*=[[:space:]]*([^[:space:]#]*).*/\1/p' "$SLURM_CONF" 2>/dev/null | tail -n1)"
  if [[ "$epilog" == /*/\* ]]; then
    python3 "$HERE/slurm_metrics.py" epilog-script "$textfile" /usr/bin/python3 "${OBS_BIN#"$ROOT"}/slurm_metrics.py" \
      | install_if_changed "$ROOT${epilog%/\*}/$RUN_METRICS_EPILOG" 0755
  else
    log "slurm.conf's Epilog is ${epilog:-not set}, not a folder glob: the hpl-run-sweep timer alone removes an" \
      "ended job's run metrics (within $RUN_SWEEP_INTERVAL)"
  fi
}

# neuron-monitor piped into its Prometheus bridge, both from aws-neuronx-tools. The bridge imports prometheus_client,
# which the AMI's Python may lack: checked here, so a missing module is one WARNING in this log and a series
# hpctl status reports (hpl_exporter_failed), not a unit restarting forever.
setup_neuron_bridge() {
  local textfile="$1" python reason=""
  python="$(command -v python3)"
  if ! command -v neuron-monitor >/dev/null || ! command -v neuron-monitor-prometheus.py >/dev/null; then
    reason="neuron-monitor or neuron-monitor-prometheus.py (aws-neuronx-tools) not found"
  elif ! "$python" -c 'import prometheus_client' 2>/dev/null; then
    reason="python module prometheus_client missing for neuron-monitor-prometheus.py ($python -m pip install prometheus-client)"
  fi
  python3 "$HERE/slurm_metrics.py" exporter-state "$ROOT$textfile" neuron "$reason"
  if [[ -n "$reason" ]]; then
    warn "$reason: no NeuronCore metrics"
    if [[ -f "$UNIT_DIR/hpl-neuron-monitor.service" ]]; then
      systemctl disable --now hpl-neuron-monitor.service >/dev/null 2>&1 || true
      rm -f "$UNIT_DIR/hpl-neuron-monitor.service"
      log "removed hpl-neuron-monitor.service"
    fi
    return
  fi
  ensure_unit hpl-neuron-monitor.service <<EOF
[Unit]
Description=hyperpod-lora: neuron-monitor as Prometheus metrics on :8000
StartLimitIntervalSec=600
StartLimitBurst=5

[Service]
ExecStart=/bin/sh -c '$(command -v neuron-monitor) | $python $(command -v neuron-monitor-prometheus.py) --port 8000'
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
EOF
}

# The controller's Slurm series: slurmctld's own OpenMetrics endpoints where Slurm is 25.11 or newer and slurm.conf
# turns them on (the agent scrapes them), else the sinfo/squeue poll every 30 s (slurm_metrics.py slurm-source decides).
SLURM_SOURCE=poll
SLURMCTLD_METRICS_PORT=""
setup_slurm_metrics() {
  local textfile="$1" why
  read -r SLURM_SOURCE why < <(python3 "$HERE/slurm_metrics.py" slurm-source "$SLURM_CONF" "$SLURM_VERSION")
  if [[ "$SLURM_SOURCE" == openmetrics ]]; then
    SLURMCTLD_METRICS_PORT="$why"
    log "Slurm $SLURM_VERSION serves its own metrics: the agent scrapes slurmctld's /metrics/* on port $why; no sinfo/squeue poll"
    remove_timer hpl-slurm-metrics
    return
  fi
  log "Slurm's series from the sinfo/squeue poll: $why"
  ensure_timer hpl-slurm-metrics "/usr/bin/python3 ${OBS_BIN#"$ROOT"}/slurm_metrics.py cluster $textfile"
}

remove_timer() {
  local name="$1"
  [[ -f "$UNIT_DIR/$name.timer" ]] || return 0
  systemctl disable --now "$name.timer" >/dev/null 2>&1 || true
  rm -f "$UNIT_DIR/$name.timer" "$UNIT_DIR/$name.service"
  systemctl daemon-reload
  log "removed $name.timer"
}

write_collector_config() {
  local targets=("node:localhost:9100")
  [[ "$NODE_ROLE" == Compute && "$HPL_ACCELERATOR" == cuda ]] && targets+=("dcgm:localhost:9400")
  [[ "$NODE_ROLE" == Compute && "$HPL_ACCELERATOR" == neuron ]] && targets+=("neuron:localhost:8000")
  {
    printf '# Prometheus agent on %s (%s): written by lifecycle/observability.sh\n' "$NODE_NAME" "$NODE_ROLE"
    printf 'global:\n  scrape_interval: %s\n  external_labels:\n' "$SCRAPE_INTERVAL"
    printf '    cluster: %s\n    node: %s\n    instance_group: %s\n    node_role: %s\n    instance_type: %s\n' \
      "$HPL_CLUSTER_NAME" "$NODE_NAME" "$NODE_GROUP" "$NODE_ROLE" "$HPL_COMPUTE_INSTANCE_TYPE"
    [[ "$NODE_ROLE" == Compute ]] && printf '    partition: %s\n' "$HPL_PARTITION"
    printf 'scrape_configs:\n'
    local target
    for target in "${targets[@]}"; do
      printf '  - job_name: %s\n    static_configs:\n      - targets: ["%s"]\n' "${target%%:*}" "${target#*:}"
    done
    if [[ "$SLURM_SOURCE" == openmetrics ]]; then
      local endpoint
      for endpoint in $SLURMCTLD_METRICS_ENDPOINTS; do
        printf '  - job_name: slurm-%s\n    metrics_path: /metrics/%s\n    static_configs:\n      - targets: ["localhost:%s"]\n' \
          "$endpoint" "$endpoint" "$SLURMCTLD_METRICS_PORT"
      done
    fi
    printf 'remote_write:\n  - url: %s\n    sigv4:\n      region: %s\n' "$HPL_METRICS_REMOTE_WRITE_URL" "$HPL_REGION"
  } | install_if_changed "$OBS_ETC/prometheus-agent.yml" 0644
}

setup_observability() {
  step observability
  case "${HPL_OBSERVABILITY:-off}" in
    prometheus) ;;
    managed)
      log "observability is managed: AWS's sagemaker-observability extension installs its own agents"
      return
      ;;
    *)
      log "observability is off: no exporters"
      return
      ;;
  esac
  local textfile="$HPL_METRICS_TEXTFILE_PATH" owner
  owner="$(id -u "$HPL_DEFAULT_USER"):$(id -g "$HPL_DEFAULT_USER")"
  if [[ ! -d "$ROOT$textfile" ]]; then
    install -d -m 0755 "$ROOT$textfile"
    log "created $textfile (the training steps' metrics)"
  fi
  [[ "$(stat -c %u:%g "$ROOT$textfile")" == "$owner" ]] || chown "$owner" "$ROOT$textfile"
  install_if_changed "$OBS_BIN/slurm_metrics.py" 0755 <"$HERE/slurm_metrics.py"

  ensure_container hpl-node-exporter "$HPL_NODE_EXPORTER_IMAGE" --pid host --volume /:/host:ro,rslave -- \
    --path.rootfs=/host --web.listen-address=:9100 "--collector.textfile.directory=/host$textfile" \
    --no-collector.infiniband
  if [[ "$NODE_ROLE" == Compute ]] && ((HPL_EFA_INTERFACES > 0)); then
    ensure_timer hpl-efa-counters "/usr/bin/python3 ${OBS_BIN#"$ROOT"}/slurm_metrics.py efa $textfile"
  fi

  if [[ "$NODE_ROLE" == Compute ]]; then
    install_run_metrics_epilog "$textfile"
    ensure_timer hpl-run-sweep "/usr/bin/python3 ${OBS_BIN#"$ROOT"}/slurm_metrics.py sweep $textfile" "$RUN_SWEEP_INTERVAL"
  fi
  if [[ "$NODE_ROLE" == Compute && "$HPL_ACCELERATOR" == cuda ]]; then
    ensure_timer hpl-gpu-jobs "/usr/bin/python3 ${OBS_BIN#"$ROOT"}/slurm_metrics.py gpu-jobs ${GPU_JOBS_DIR#"$ROOT"} $HPL_DEVICES_PER_NODE"
    ensure_container hpl-dcgm-exporter "$HPL_DCGM_EXPORTER_IMAGE" --gpus all --cap-add SYS_ADMIN \
      --volume "${GPU_JOBS_DIR#"$ROOT"}:/hpc-jobs:ro" -- \
      dcgm-exporter --address=:9400 --hpc-job-mapping-dir=/hpc-jobs
  fi
  if [[ "$NODE_ROLE" == Compute && "$HPL_ACCELERATOR" == neuron ]]; then
    setup_neuron_bridge "$textfile"
  fi
  if [[ "$NODE_ROLE" == Controller ]]; then
    setup_slurm_metrics "$textfile"
  fi

  write_collector_config
  local config_hash
  config_hash="$(sha256sum <"$OBS_ETC/prometheus-agent.yml" | cut -c1-16)"  # a new config recreates the agent
  ensure_container hpl-collector "$HPL_COLLECTOR_IMAGE" --volume "${OBS_ETC#"$ROOT"}:/etc/hpl:ro" \
    --label "hpl.config=$config_hash" -- \
    --agent --config.file=/etc/hpl/prometheus-agent.yml --storage.agent.path=/prometheus --web.listen-address=:9095
  log "metrics go to $HPL_METRICS_REMOTE_WRITE_URL"
}
