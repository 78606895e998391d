#!/usr/bin/env bash
# A real Slurm on this machine (a node with fake GPUs, CPU nodes for a reward fleet), for trying
# slurm/train.sbatch and for the Slurm test tier.
#
#   tools/slurm_local.sh up      # install slurm-wlm + munge if missing, start munged, slurmctld, slurmds
#   export SLURM_CONF=$SLURM_BASE/etc/slurm.conf   # then sbatch / srun / squeue talk to it
#   tools/slurm_local.sh down    # cancel its jobs, stop the daemons by their PID files
#   tools/slurm_local.sh status
#
# Everything lives under $SLURM_BASE (config, munge key and socket, state, spool, logs, PID files), so a
# second cluster (another test session) can run beside this one with other ports and another base.
# No systemd, no cgroups: proctrack/linuxproc, task/none, no accounting. Must run as root (the daemons
# run as root and munged needs --force for that).
#
# Settings (environment):
#   SLURM_BASE      state directory                       (default /tmp/megatron-rl-slurm)
#   SLURMCTLD_PORT  controller port                       (default 6817)
#   SLURMD_PORT     node daemon port                      (default 6818)
#   FAKE_GPUS       GPUs the local node advertises (GRES) (default 2; 0 = none)
#   RENDER_NODES    nodes in the `render` partition       (default 32; 0 = no such partition)
#   RENDER_GPUS     GPUs per render node                  (default 8)
#   FLEET_NODES     nodes in the `cpu` partition          (default 1; 0 = no such partition)
#   FLEET_SLURMD_PORT  port of the first of them          (default SLURMD_PORT + 1; then +1 each)
#   RENDER_CPU_NODES   DOWN 64-CPU nodes in `render-cpu`  (default 8; 0 = no such partition)
#   SIM_NODES       nodes of 1 fake GPU in the `sim` partition (default 0: none), for jobs that lose
#                   nodes and continue on spares (sim01, ...)
#   SIM_SLURMD_PORT port of the first of them             (default FLEET_SLURMD_PORT + FLEET_NODES)
#   FIRST_JOB_ID    first job id                          (default 1; two clusters on one host should
#                   differ: jobs derive their rendezvous port from their id)
#
# Why fake GPUs: sbatch refuses --gpus-per-node=N on a node without GPU GRES, so the script users run on
# GPU clusters could not be submitted here. Slurm 22.05 drops GRES without a device file and wants
# character devices, so each fake GPU is a mknod clone of /dev/null. The processes still run on CPU.
#
# Why a `render` partition: the big recipes ask for 8 to 32 nodes of 8 GPUs. Its nodes are DOWN (nothing
# answers on their port), so a job there is parsed and checked against the partition by the real
# controller, then stays pending; `sbatch --hold` + `scontrol show job` reads back what Slurm understood.
#
# Why a `cpu` partition: a recipe with a reward fleet (reward.fleet_nodes) is a heterogeneous job whose
# second component runs `megatron-rl reward-server` on CPU nodes. Its nodes (cpu01, ...) are more slurmd
# processes on this machine (`slurmd -N cpu01`, each on its own port, with its own spool, log and PID
# file): real nodes to the controller, sharing this machine's CPUs. `render-cpu` is the DOWN counterpart
# of `render` for the big recipes' fleets.
#
# Why a `sim` partition: a job spanning several nodes, some of them spares (cluster.spare_nodes), where a
# test kills or stops one node's rank and the job goes on without that node. Its nodes are slurmds
# like cpu01, each with one fake GPU of its own: to srun, --nodelist and --exclude, separate nodes.
set -euo pipefail

B=${SLURM_BASE:-/tmp/megatron-rl-slurm}
CTLD_PORT=${SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}
FAKE_GPUS=${FAKE_GPUS:-2}
RENDER_NODES=${RENDER_NODES:-32}
RENDER_GPUS=${RENDER_GPUS:-8}
FIRST_JOB_ID=${FIRST_JOB_ID:-1}
FLEET_NODES=${FLEET_NODES:-1}
FLEET_SLURMD_PORT=${FLEET_SLURMD_PORT:-$((SLURMD_PORT + 1))}
RENDER_CPU_NODES=${RENDER_CPU_NODES:-8}
SIM_NODES=${SIM_NODES:-0}
SIM_SLURMD_PORT=${SIM_SLURMD_PORT:-$((FLEET_SLURMD_PORT + FLEET_NODES))}
export SLURM_CONF="$B/etc/slurm.conf"

die() { echo "slurm_local.sh: $*" >&2; exit 1; }
alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
fleet_node() { printf 'cpu%02d' "$1"; }
sim_node() { printf 'sim%02d' "$1"; }
slurmd_pids() { local f; for f in "$B"/run/slurmd-*.pid; do [[ -e "$f" ]] && echo "$f"; done; }

install_if_missing() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null && return 0
  command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and apt-get is not available; install them by hand"
  echo "slurm_local.sh: installing slurm-wlm and munge (Debian packages, ~20 s once)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
}

start_munge() {
  mkdir -p "$B/munge"
  chmod 755 "$B/munge" # job processes must reach the socket
  [[ -s "$B/munge/munge.key" ]] || mungekey --create --keyfile="$B/munge/munge.key"
  chmod 600 "$B/munge/munge.key"
  alive "$B/munge/munged.pid" || munged --force --key-file="$B/munge/munge.key" \
    --socket="$B/munge/munge.socket" --pid-file="$B/munge/munged.pid" \
    --log-file="$B/munge/munged.log" --seed-file="$B/munge/munged.seed"
  munge -n -S "$B/munge/munge.socket" | unmunge -S "$B/munge/munge.socket" | grep -q 'STATUS:.*Success' \
    || die "munged does not answer on $B/munge/munge.socket (see $B/munge/munged.log)"
}

write_conf() {
  local host nodeline
  host=$(hostname -s)
  nodeline=$(slurmd -C | head -1) # NodeName=<host> CPUs=.. RealMemory=.. : the real hardware
  [[ "$FAKE_GPUS" -gt 0 ]] && nodeline="$nodeline Gres=gpu:$FAKE_GPUS"
  mkdir -p "$B"/{etc,state,spool,run,log}
  cat >"$SLURM_CONF" <<CONF
ClusterName=mrl
FirstJobId=$FIRST_JOB_ID
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$B/munge/munge.socket
StateSaveLocation=$B/state
SlurmdSpoolDir=$B/spool/%n
SlurmctldPidFile=$B/run/slurmctld.pid
SlurmdPidFile=$B/run/slurmd-%n.pid
SlurmctldLogFile=$B/log/slurmctld.log
SlurmdLogFile=$B/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_min_interval=0
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
GresTypes=gpu
$nodeline NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  # The fleet's nodes: more slurmds on this machine, each with its own port (`slurmd -N NAME` in up).
  local cpus names=() i
  cpus=$(slurmd -C | head -1 | grep -o 'CPUs=[0-9]*')
  for i in $(seq 1 "$FLEET_NODES"); do
    names+=("$(fleet_node "$i")")
    echo "NodeName=$(fleet_node "$i") $cpus RealMemory=4000 NodeAddr=127.0.0.1 NodeHostname=$host" \
      "Port=$((FLEET_SLURMD_PORT + i - 1)) State=UNKNOWN" >>"$SLURM_CONF"
  done
  if [[ "$FLEET_NODES" -gt 0 ]]; then
    echo "PartitionName=cpu Nodes=$(IFS=,; echo "${names[*]}") Default=NO MaxTime=INFINITE State=UP" >>"$SLURM_CONF"
  fi
  if [[ "$FAKE_GPUS" -gt 0 ]]; then
    mkdir -p "$B/fakegpu"
    for i in $(seq 0 $((FAKE_GPUS - 1))); do
      [[ -e "$B/fakegpu/nvidia$i" ]] || mknod "$B/fakegpu/nvidia$i" c 1 3
    done
    echo "NodeName=$host Name=gpu File=$B/fakegpu/nvidia[0-$((FAKE_GPUS - 1))]" >"$B/etc/gres.conf"
  else
    : >"$B/etc/gres.conf"
  fi
  # The sim nodes: one fake GPU each (a device file of its own), a slurmd each on its own port.
  names=()
  for i in $(seq 1 "$SIM_NODES"); do
    names+=("$(sim_node "$i")")
    echo "NodeName=$(sim_node "$i") $cpus RealMemory=4000 Gres=gpu:1 NodeAddr=127.0.0.1 NodeHostname=$host" \
      "Port=$((SIM_SLURMD_PORT + i - 1)) State=UNKNOWN" >>"$SLURM_CONF"
    mkdir -p "$B/fakegpu"
    [[ -e "$B/fakegpu/$(sim_node "$i")-nvidia0" ]] || mknod "$B/fakegpu/$(sim_node "$i")-nvidia0" c 1 3
    echo "NodeName=$(sim_node "$i") Name=gpu File=$B/fakegpu/$(sim_node "$i")-nvidia0" >>"$B/etc/gres.conf"
  done
  if [[ "$SIM_NODES" -gt 0 ]]; then
    echo "PartitionName=sim Nodes=$(IFS=,; echo "${names[*]}") Default=NO MaxTime=INFINITE State=UP" >>"$SLURM_CONF"
  fi
  if [[ "$RENDER_NODES" -gt 0 ]]; then
    # Port 9 (discard): nothing answers, so these nodes stay DOWN and never run anything.
    cat >>"$SLURM_CONF" <<CONF
NodeName=render[001-$(printf %03d "$RENDER_NODES")] CPUs=128 RealMemory=2000000 Gres=gpu:$RENDER_GPUS NodeAddr=127.0.0.1 Port=9 State=DOWN Reason=render_check_only
PartitionName=render Nodes=render[001-$(printf %03d "$RENDER_NODES")] Default=NO MaxTime=INFINITE State=UP
CONF
  fi
  if [[ "$RENDER_CPU_NODES" -gt 0 ]]; then
    cat >>"$SLURM_CONF" <<CONF
NodeName=render-cpu[001-$(printf %03d "$RENDER_CPU_NODES")] CPUs=64 RealMemory=256000 NodeAddr=127.0.0.1 Port=9 State=DOWN Reason=render_check_only
PartitionName=render-cpu Nodes=render-cpu[001-$(printf %03d "$RENDER_CPU_NODES")] Default=NO MaxTime=INFINITE State=UP
CONF
  fi
}

up() {
  [[ "$(id -u)" -eq 0 ]] || die "must run as root (slurmd and munged run as root here)"
  local t0 state=""
  t0=$(date +%s%N)
  install_if_missing
  start_munge
  write_conf
  alive "$B/run/slurmctld.pid" || slurmctld -f "$SLURM_CONF"
  local host i n=0 want
  host=$(hostname -s)
  alive "$B/run/slurmd-$host.pid" || slurmd -f "$SLURM_CONF"
  for i in $(seq 1 "$FLEET_NODES"); do
    alive "$B/run/slurmd-$(fleet_node "$i").pid" || slurmd -f "$SLURM_CONF" -N "$(fleet_node "$i")"
  done
  for i in $(seq 1 "$SIM_NODES"); do
    alive "$B/run/slurmd-$(sim_node "$i").pid" || slurmd -f "$SLURM_CONF" -N "$(sim_node "$i")"
  done
  want=$((1 + FLEET_NODES + SIM_NODES))
  local parts=debug
  [[ $FLEET_NODES -gt 0 ]] && parts=$parts,cpu
  [[ $SIM_NODES -gt 0 ]] && parts=$parts,sim
  for _ in $(seq 1 100); do
    n=$(sinfo -h -N -p "$parts" -t idle -o '%N' 2>/dev/null | sort -u | wc -l || true)
    [[ "$n" -eq "$want" ]] && break
    sleep 0.1
  done
  [[ "$n" -eq "$want" ]] || die "$n of $want nodes idle after 10 s; see $B/log/slurmctld.log and $B/log/slurmd-*.log"
  echo "slurm_local.sh: up in $(ms_since "$t0") ms; export SLURM_CONF=$SLURM_CONF"
}

down() {
  local t0 f p
  t0=$(date +%s%N)
  # Jobs first: a slurmd stopped under a running step would leave its processes behind.
  if alive "$B/run/slurmctld.pid"; then
    mapfile -t jobs < <(squeue -h -o '%i' 2>/dev/null || true)
    if [[ ${#jobs[@]} -gt 0 ]]; then
      scancel "${jobs[@]}" 2>/dev/null || true
      for _ in $(seq 1 150); do
        [[ -z "$(squeue -h -t RUNNING,COMPLETING -o '%i' 2>/dev/null)" ]] && break
        sleep 0.2
      done
    fi
  fi
  # All daemons at once, then wait: stopping them one by one costs seconds each.
  local -a pids=() files=()
  for f in $(slurmd_pids) "$B/run/slurmctld.pid" "$B/munge/munged.pid"; do
    alive "$f" || continue
    p=$(cat "$f")
    kill "$p"
    pids+=("$p")
    files+=("$f")
  done
  for i in "${!pids[@]}"; do
    p=${pids[$i]}
    # Seconds normally; longer on a busy machine while a cancelled job's processes wind down.
    for _ in $(seq 1 600); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    kill -0 "$p" 2>/dev/null && die "pid $p from ${files[$i]} did not stop within 30 s"
    echo "slurm_local.sh: stopped $(basename "${files[$i]}" .pid) (pid $p)"
  done
  echo "slurm_local.sh: down in $(ms_since "$t0") ms"
}

status() {
  local f
  for f in "$B/munge/munged.pid" "$B/run/slurmctld.pid" $(slurmd_pids); do
    if alive "$f"; then echo "$(basename "$f" .pid): pid $(cat "$f")"; else echo "$(basename "$f" .pid): stopped"; fi
  done
  alive "$B/run/slurmctld.pid" && sinfo
  return 0
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) die "usage: $0 up|down|status   (settings: the header of this file)" ;;
esac
