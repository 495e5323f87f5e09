#!/usr/bin/env bash
# Before `make rehearse` or `make rehearse-ladder` installs anything: their local Slurm runs its daemons
# (munged, slurmctld, slurmd) as root. Root: nothing to do. Otherwise say so and let sudo ask for the
# password once now (apt-get and the rehearsal reuse it), or stop with what to do when there is no sudo or
# no terminal to ask the password in.
set -euo pipefail

what=${1:-the rehearsal}
if (( $(id -u) == 0 )); then
  exit 0
fi
why="$what runs a local Slurm whose daemons (munged, slurmctld, slurmd) must run as root"
if ! command -v sudo >/dev/null; then
  echo "error: $why, and there is no sudo here; nothing was installed: run it as root (e.g. in a root container)" >&2
  exit 2
fi
# sudo already needs no password (credentials cached by `sudo -v`, or a NOPASSWD sudoers entry): use it.
if sudo -n true 2>/dev/null; then
  echo "note: $why; it uses sudo, which needs no password now." >&2
  exit 0
fi
# No terminal for sudo's prompt (an IDE's run button, CI, `sudo -S` in a pipe): say the ways that need none.
if ! { : </dev/tty; } 2>/dev/null; then
  echo "error: $why, and sudo needs a password but there is no terminal to ask it in; nothing was installed:" \
    "run \`sudo -v\` in a terminal first (sudo then remembers it for some minutes), or run it as root" \
    "(README: Quick start)" >&2
  exit 2
fi
echo "note: $why; it installs missing system packages with sudo too. sudo asks for your password once, now." >&2
sudo -v || { echo "error: sudo refused; nothing was installed: $what needs root" >&2; exit 2; }
