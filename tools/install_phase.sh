#!/usr/bin/env bash
# One step of an install: a line naming it, then the packages pip collects (one line each, its progress) and
# how long the step took, where `pip -q` would be minutes of silence. pip's other chatter is left out.
#   tools/install_phase.sh "<what>" <command> [args...]
set -euo pipefail

what=$1
shift
echo "==> $what"
started=$SECONDS
"$@" | sed -u \
  -e '/^\( \|Requirement already satisfied\|Successfully \|Installing collected\|Looking in\|Obtaining\)/d' \
  -e '/^\(Building\|Created wheel\|Stored in\|Preparing\|Checking\|Attempting\|Found existing\|Using cached\)/d' \
  -e 's/ (from .*)$//' -e 's|^Processing \(.*/\)\{0,1\}|    |' -e 's/^Collecting /    /'
echo "    $what: done in $((SECONDS - started)) s"
