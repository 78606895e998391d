#!/usr/bin/env bash
# Everything `make demo` and `make test` need, checked before anything is built: fails within a second
# with one line that says what to run, so a fresh machine never spends minutes building .venv (or
# starting torchrun) only to stop at a missing sandbox.
#
#   PY=python3 tools/check_prereqs.sh
#
# 1. system packages (tools/setup_system.sh installs the missing ones when it may, else names them),
#    and a bwrap that can actually create its sandbox (user namespaces allowed);
# 2. a Python >= 3.10 with venv and ensurepip, and room on disk, when .venv is still to be built.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}

bash tools/setup_system.sh

# bwrap being installed is not enough: where unprivileged user namespaces are blocked (a sysctl, or
# Ubuntu 24.04's AppArmor restriction) it cannot start, and the reward sandbox would fail minutes later.
# The same namespaces as megatron_rl/reward/sandbox.py asks for (a user namespace unless root).
userns=()
[[ "$(id -u)" -ne 0 ]] && userns=(--unshare-user)
if ! why=$(bwrap --die-with-parent --new-session --unshare-ipc --unshare-pid --unshare-net --unshare-uts \
  "${userns[@]}" --ro-bind / / "$BASH" -c : 2>&1); then
  why=${why%%$'\n'*}
  echo "megatron-rl: bwrap is installed but cannot create its sandbox (${why:-no message}); allow unprivileged user namespaces: sudo sysctl -w kernel.unprivileged_userns_clone=1, and on Ubuntu 24.04 sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (or an AppArmor profile for bwrap)" >&2
  exit 1
fi

if [[ ! -x .venv/bin/python ]]; then
  if ! command -v "$PY" >/dev/null 2>&1; then
    echo "megatron-rl: $PY not found; install Python >= 3.10 (Debian: sudo apt-get install python3 python3-venv) or run make PY=/path/to/python3" >&2
    exit 1
  fi
  if ! "$PY" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "megatron-rl: $PY ($("$PY" -V 2>&1)) cannot build .venv: it needs Python >= 3.10 with venv and ensurepip; run: sudo apt-get install python3-venv, or make PY=/path/to/python3.11" >&2
    exit 1
  fi
  free_kib=$(df -Pk . | awk 'NR == 2 {print $4}')
  if [[ "$free_kib" -lt $((6 * 1024 * 1024)) ]]; then
    echo "megatron-rl: .venv needs about 6 GiB of disk and $(pwd) has $((free_kib / 1024 / 1024)) GiB free; free some space first" >&2
    exit 1
  fi
fi
