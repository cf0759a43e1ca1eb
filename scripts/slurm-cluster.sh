#!/usr/bin/env bash
# A one-machine Slurm test cluster shaped like DEEP-EST's modules: partitions cm (cm01, cm02),
# esb (esb01, esb02), dam (dam01, with one "fpga" GRES) and nam (nam01, where a run's NAM
# server is placed), each node carrying its module's
# name as a node feature, and partition "all" holding every node (for the single-allocation
# launch mode). One slurmd per virtual node, all
# on 127.0.0.1 with their own ports (hetjob components are only placed on distinct nodes).
# Nothing outside the state directory is configured: clients use SLURM_CONF.
#
#   scripts/slurm-cluster.sh start    # idempotent; prints `export SLURM_CONF=...`
#   scripts/slurm-cluster.sh stop     # stops, by PID, only the daemons this script started
#   scripts/slurm-cluster.sh status
#
# MSAFLOW_SLURM_DIR (default .cache/slurm) holds slurm.conf, spool, logs and PID files.
# Needs root and Debian's slurmctld slurmd slurm-client munge (scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${MSAFLOW_SLURM_DIR:-$PWD/.cache/slurm}
mkdir -p "$STATE"
STATE=$(cd "$STATE" && pwd)
CONF=$STATE/etc/slurm.conf
export SLURM_CONF=$CONF
NODES=(cm01 cm02 esb01 esb02 dam01 nam01)
PORT0=${MSAFLOW_SLURM_PORT:-16817}
say() { printf '[slurm-cluster] %s\n' "$*"; }
alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_conf() {
  local host
  host=$(hostname -s)
  mkdir -p "$STATE/etc" "$STATE/ctld" "$STATE/log"
  for n in "${NODES[@]}"; do mkdir -p "$STATE/d-$n" "$STATE/tmp-$n"; done
  {
    echo "# msaflow one-machine test cluster (scripts/slurm-cluster.sh); generated, do not edit"
    echo "ClusterName=msaflow"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$PORT0"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "StateSaveLocation=$STATE/ctld"
    echo "SlurmdSpoolDir=$STATE/d-%n"
    echo "SlurmctldPidFile=$STATE/slurmctld.pid"
    echo "SlurmdPidFile=$STATE/slurmd-%n.pid"
    echo "SlurmctldLogFile=$STATE/log/slurmctld.log"
    echo "SlurmdLogFile=$STATE/log/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/filetxt"
    echo "JobCompLoc=$STATE/jobcomp.txt"
    echo "SchedulerType=sched/backfill"
    echo "SchedulerParameters=bf_interval=1"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "SlurmdParameters=config_overrides"
    echo "MpiDefault=none"
    echo "TmpFS=$STATE/tmp-%n"
    echo "MinJobAge=600"
    echo "KillWait=2"
    echo "GresTypes=fpga"
    echo "ReturnToService=2"
    echo "JobSubmitPlugins=lua"
    local p=$((PORT0 + 1))
    for n in "${NODES[@]}"; do
      local gres=""
      [[ $n == dam01 ]] && gres=" Gres=fpga:1"
      echo "NodeName=$n NodeHostname=$host NodeAddr=127.0.0.1 Port=$p CPUs=4 RealMemory=4000 Features=${n%%[0-9]*}$gres State=UNKNOWN"
      p=$((p + 1))
    done
    echo "PartitionName=cm Nodes=cm01,cm02 Default=YES MaxTime=INFINITE State=UP"
    echo "PartitionName=esb Nodes=esb01,esb02 MaxTime=INFINITE State=UP"
    echo "PartitionName=dam Nodes=dam01 MaxTime=INFINITE State=UP"
    echo "PartitionName=nam Nodes=nam01 MaxTime=INFINITE State=UP"
    echo "PartitionName=all Nodes=ALL MaxTime=INFINITE State=UP"
  } > "$CONF.tmp"
  mv "$CONF.tmp" "$CONF"
  echo "NodeName=dam01 Name=fpga Count=1" > "$STATE/etc/gres.conf"
  # A site policy, as real sites write them: this cluster refuses a round's hetjob (or single
  # allocation) when the job name says "nohet", so the tests meet a real refusal and msaflow's
  # automatic fallback to chained jobs (docs/slurm.md).
  cat > "$STATE/etc/job_submit.lua" <<'LUA'
function slurm_job_submit(job_desc, part_list, submit_uid)
  local name = job_desc.name or ""
  if string.find(name, "nohet", 1, true) and string.match(name, "%-r%d+$") then
    slurm.log_user("this cluster refuses heterogeneous jobs named like %s (msaflow test policy)", name)
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
LUA
}

start() {
  [[ $(id -u) == 0 ]] || { echo "slurm-cluster: needs root" >&2; exit 1; }
  for b in slurmctld slurmd sinfo munged; do
    command -v $b >/dev/null || [[ -x /usr/sbin/$b ]] || { echo "slurm-cluster: $b missing (run scripts/setup.sh)" >&2; exit 1; }
  done
  # munge: Debian's package made the key; /run/munge must exist on every boot.
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    cp /run/munge/munged.pid "$STATE/munged.pid.ours"
    say "munged started (pid $(cat "$STATE/munged.pid.ours"))"
  fi
  write_conf
  if ! alive "$STATE/slurmctld.pid"; then
    /usr/sbin/slurmctld -f "$CONF" -c
    for _ in $(seq 100); do alive "$STATE/slurmctld.pid" && break; sleep 0.1; done
    say "slurmctld started (pid $(cat "$STATE/slurmctld.pid"))"
  fi
  for n in "${NODES[@]}"; do
    if ! alive "$STATE/slurmd-$n.pid"; then
      /usr/sbin/slurmd -f "$CONF" -N "$n"
    fi
  done
  for _ in $(seq 200); do
    local idle
    idle=$(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2=="idle"' | sort -u | wc -l)
    [[ $idle == "${#NODES[@]}" ]] && break
    sleep 0.1
  done
  sinfo -h -N -o '%N %P %t' | sort -u | sed 's/^/[slurm-cluster]   /'
  local idle
  idle=$(sinfo -h -N -o '%N %t' | awk '$2=="idle"' | sort -u | wc -l)
  if [[ $idle != "${#NODES[@]}" ]]; then
    echo "slurm-cluster: only $idle of ${#NODES[@]} nodes idle; see $STATE/log" >&2
    exit 1
  fi
  echo "export SLURM_CONF=$CONF"
}

stop() {
  local pids=()
  for f in "$STATE"/slurmd-*.pid "$STATE/slurmctld.pid"; do
    alive "$f" && pids+=("$(cat "$f")")
  done
  ((${#pids[@]})) && kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 100); do
    local left=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
    ((left)) || break
    sleep 0.1
  done
  if alive "$STATE/munged.pid.ours"; then kill "$(cat "$STATE/munged.pid.ours")"; fi
  rm -f "$STATE/munged.pid.ours"
  say "stopped (${#pids[@]} Slurm daemons)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) alive "$STATE/slurmctld.pid" && sinfo -N -o '%N %P %t' || { echo "not running"; exit 1; } ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
