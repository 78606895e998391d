#!/usr/bin/env bash
# System packages megatron-rl needs beyond Python wheels (Debian/Ubuntu).
#
# Idempotent: a package is installed only when its command is missing, so re-running is cheap, needs
# no root when everything is present, and runs `apt-get update` at most once.
# To add a dependency, append one `need COMMAND PACKAGE...` line to the list at the bottom.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
updated=0

# need COMMAND PACKAGE...: apt-install PACKAGE(s) unless COMMAND is already on PATH.
need() {
  local cmd="$1"
  shift
  if command -v "$cmd" >/dev/null 2>&1; then
    echo "setup_system.sh: $cmd present"
    return 0
  fi
  if [[ "$(id -u)" -ne 0 ]]; then
    echo "setup_system.sh: $cmd is missing and installing $* needs root; run: sudo $0" >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup_system.sh: $cmd is missing and apt-get is not available; install $* by hand" >&2
    exit 1
  fi
  if [[ "$updated" -eq 0 ]]; then
    apt-get update -q
    updated=1
  fi
  echo "setup_system.sh: installing $* (for $cmd)"
  apt-get install -y -q --no-install-recommends "$@"
  if ! command -v "$cmd" >/dev/null 2>&1; then
    echo "setup_system.sh: $cmd still missing after installing $*" >&2
    exit 1
  fi
}

# --- dependencies: one line each -----------------------------------------------------------------
need bwrap bubblewrap # the reward sandbox: runs model-written programs in unshared namespaces
need slurmctld slurm-wlm # the Slurm test tier: a real single-node cluster (tools/slurm_local.sh)
need munged munge        # Slurm's authentication daemon, same tier
