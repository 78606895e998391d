#!/usr/bin/env bash
# System packages megatron-rl needs beyond Python wheels (Debian/Ubuntu).
#
#   tools/setup_system.sh           install what is missing (as root, through apt-get)
#   tools/setup_system.sh --check   install nothing; exit 1 with one line naming what is missing
#
# Idempotent: a package is installed only when its command is missing, so re-running is cheap, needs
# no root when everything is present, and runs `apt-get update` at most once. Without root, without
# apt-get, or with MEGATRON_RL_NO_INSTALL=1 it installs nothing and says, in one line, what to run.
# To add a dependency, append one `need COMMAND PACKAGE...` line to the list at the bottom.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
check_only=0
[[ "${1:-}" == "--check" ]] && check_only=1
updated=0
missing=()   # "COMMAND (PACKAGE...)" of every command that is absent, for the one-line message

may_install() {
  [[ "$check_only" -eq 0 && "${MEGATRON_RL_NO_INSTALL:-0}" != "1" && "$(id -u)" -eq 0 ]] \
    && command -v apt-get >/dev/null 2>&1
}

# need COMMAND PACKAGE...: apt-install PACKAGE(s) unless COMMAND is already on PATH.
need() {
  local cmd="$1"
  shift
  if command -v "$cmd" >/dev/null 2>&1; then
    return 0
  fi
  if ! may_install; then
    missing+=("$cmd ($*)")
    return 0
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
need bwrap bubblewrap    # the reward sandbox: runs model-written programs in unshared namespaces
need slurmctld slurm-wlm # the Slurm test tier: a real single-node cluster (tools/slurm_local.sh)
need munged munge        # Slurm's authentication daemon, same tier

if [[ "${#missing[@]}" -gt 0 ]]; then
  list=$(IFS=,; echo "${missing[*]}" | sed 's/,/, /g')
  if [[ "$(id -u)" -ne 0 ]]; then
    how="sudo make system"
  elif command -v apt-get >/dev/null 2>&1; then
    how="make system"
  else
    how="install those packages with this system's package manager"
  fi
  echo "megatron-rl: missing system packages: $list; run: $how" >&2
  exit 1
fi
