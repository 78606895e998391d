#!/usr/bin/env bash
# System packages megatron-rl needs beyond Python wheels (Debian/Ubuntu, run as root).
#
# Idempotent: each entry is installed only when its command is missing, so re-running is cheap and
# `apt-get update` runs at most once, and only when something is actually missing.
# To add a dependency, append one `need COMMAND PACKAGE...` line to the list at the bottom.
set -euo pipefail

if [[ "$(id -u)" -ne 0 ]]; then
  echo "setup_system.sh: must run as root (it calls apt-get); try: sudo $0" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup_system.sh: apt-get not found; install the packages listed at the bottom of $0 by hand" >&2
  exit 1
fi

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
  if [[ "$updated" -eq 0 ]]; then
    apt-get update -q
    updated=1
  fi
  echo "setup_system.sh: installing $* (for $cmd)"
  apt-get install -y -q --no-install-recommends "$@"
  command -v "$cmd" >/dev/null 2>&1 || { echo "setup_system.sh: $cmd still missing after installing $*" >&2; exit 1; }
}

# --- dependencies: one line each -------------------------------------------------------------
need bwrap bubblewrap # reward sandbox: runs untrusted completions in unshared namespaces
