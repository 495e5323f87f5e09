#!/usr/bin/env bash
# Install the Debian/Ubuntu packages the tests and the rehearsal need, when missing: a local Slurm
# (slurm-wlm) with munge and its accounting (slurmdbd, mariadb-server), graphviz (the architecture diagram),
# Prometheus and its node exporter (the
# observability rehearsal), the venv module of python3 and sudo (a normal user's make rehearse; the
# newcomer's journey test runs one).
# Uses sudo when not root. Does nothing when everything is there (make test runs it every time).
set -euo pipefail

# The daemons live in sbin folders, which a normal user's PATH on Debian leaves out: look there too, or
# every `make` would reinstall them with sudo.
sbin_dirs=${HPL_SBIN_DIRS-/usr/local/sbin:/usr/sbin:/sbin}
missing=()
for pair in slurmctld:slurm-wlm slurmd:slurm-wlm sbatch:slurm-wlm munged:munge dot:graphviz \
  prometheus:prometheus prometheus-node-exporter:prometheus-node-exporter \
  slurmdbd:slurmdbd mariadbd:mariadb-server sudo:sudo; do
  PATH="$PATH${sbin_dirs:+:$sbin_dirs}" command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
# The interpreter make makes .venv with (the Makefile's PYTHON): its venv module.
"${PYTHON:-python3}" -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u | sed '/^$/d')
if (( ${#missing[@]} == 0 )); then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "error: missing ${missing[*]} and no apt-get here: install them with your package manager" >&2
  exit 2
fi
as_root=()
if (( EUID != 0 )); then
  command -v sudo >/dev/null || { echo "error: installing ${missing[*]} needs root or sudo" >&2; exit 2; }
  as_root=(sudo)
fi
echo "installing system packages: ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
