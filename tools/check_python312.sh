#!/usr/bin/env bash
# CI step: the laptop side (the CDK app, hpctl, predeploy) installs into a fresh Python 3.12 venv from
# requirements.txt alone and `make synth` passes with it (Ubuntu 24.04's Python; the main .venv may run
# another version). Python 3.12 is the first that runs of $PYTHON312, `python3.12` on PATH and pyenv's
# newest 3.12. Run from anywhere; needs node_modules (make venv). Leaves nothing behind but cdk.out.
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
if [[ ! -d node_modules/aws-cdk ]]; then
  echo "error: node_modules has no CDK CLI; run \`make venv\` (npm ci) first" >&2
  exit 2
fi

started=$SECONDS
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
echo "== fresh venv on $("$python312" --version) in $venv"
"$python312" -m venv "$venv"
"$venv/bin/python" -m pip install -q -r requirements.txt
"$venv/bin/python" -m pip install -q --no-deps -e .

# The installed commands, without this checkout on PYTHONPATH: only what the install put in the venv.
echo "== hpctl --help, python -m stacks.predeploy --help"
env -u PYTHONPATH "$venv/bin/hpctl" --help >/dev/null
env -u PYTHONPATH "$venv/bin/python" -m stacks.predeploy --help >/dev/null

# make synth on this venv: the stamp says it is installed (make would otherwise install the whole test
# environment into it), and cdk.json's app runs $CDK_PYTHON, which the Makefile sets from VENV.
echo "== make synth VENV=<the 3.12 venv>"
touch "$venv/.installed"
make --no-print-directory synth VENV="$venv" >/dev/null

echo "ok: Python 3.12 venv installs the laptop side and synthesizes ($((SECONDS - started)) s)"
