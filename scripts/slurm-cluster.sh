#!/usr/bin/env bash
# A one-machine Slurm test cluster shaped like DEEP-EST's modules: partitions cm (cm01, cm02),
# esb (esb01, esb02), dam (dam01, with one "fpga" GRES) and nam (nam01, where a run's NAM
# server is placed), each node carrying its module's
# name as a node feature, and partition "all" holding every node (for the single-allocation
# launch mode). One slurmd per virtual node, all
# on 127.0.0.1 with their own ports (hetjob components are only placed on distinct nodes).
# Nothing outside the state directory is configured: clients use SLURM_CONF.
#
# With --hosts every node is a host of its own: a network namespace (`ip netns`) with its own
# hostname (`unshare --uts`) and address on a bridge (msaflow-br0, 10.99.0.0/24; this machine,
# the "login" host of slurmctld and the coordinator, is 10.99.0.1), its slurmd inside. Nodes:
# cm01; esb01, esb02; dam01, dam02 (one fpga GRES each); nam01. Munge and the filesystem are
# shared, as on a real cluster; MPI ranks and the NAM on other nodes are reached over TCP.
#
#   scripts/slurm-cluster.sh start [--hosts]   # idempotent; prints `export SLURM_CONF=...`
#   scripts/slurm-cluster.sh stop [--hosts]    # stops, by PID, only the daemons this script started
#   scripts/slurm-cluster.sh status [--hosts]
#   scripts/slurm-cluster.sh link NODE up|down --hosts  # a node's link to the bridge (faults)
#   scripts/slurm-cluster.sh login --hosts -- CMD...     # CMD on the login host (the nodes' names known)
#
# MSAFLOW_SLURM_DIR (default .cache/slurm, .cache/slurm-hosts with --hosts) holds slurm.conf,
# spool, logs and PID files. Needs root and Debian's slurmctld slurmd slurm-client munge
# (MSAFLOW_TESTS=1 scripts/setup.sh, or scripts/test.sh, installs them) and iproute2.
set -euo pipefail
cd "$(dirname "$0")/.."
HOSTS=0
for a in "$@"; do [[ $a == --hosts ]] && HOSTS=1; done
if ((HOSTS)); then
  STATE=${MSAFLOW_SLURM_DIR:-$PWD/.cache/slurm-hosts}
  NODES=(cm01 esb01 esb02 dam01 dam02 nam01)
  PORT0=${MSAFLOW_SLURM_PORT:-16917}
else
  STATE=${MSAFLOW_SLURM_DIR:-$PWD/.cache/slurm}
  NODES=(cm01 cm02 esb01 esb02 dam01 nam01)
  PORT0=${MSAFLOW_SLURM_PORT:-16817}
fi
mkdir -p "$STATE"
STATE=$(cd "$STATE" && pwd)
CONF=$STATE/etc/slurm.conf
export SLURM_CONF=$CONF
BRIDGE=msaflow-br0
NET=10.99.0
LOGIN=$NET.1
node_ip() {  # cm01 -> 10.99.0.11, in the order of NODES
  local i
  for i in "${!NODES[@]}"; do [[ ${NODES[$i]} == "$1" ]] && { echo "$NET.$((11 + i))"; return; }; done
  return 1
}
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
    if ((HOSTS)); then echo "SlurmctldHost=$host($LOGIN)"; else echo "SlurmctldHost=$host(127.0.0.1)"; fi
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
    # A host cut off is a node that stops answering: slurmctld pings every SlurmdTimeout/3 and
    # sets it DOWN after SlurmdTimeout, failing its jobs (NODE_FAIL). Seconds here, not minutes.
    ((HOSTS)) && echo "SlurmdTimeout=10"
    echo "KillWait=2"
    echo "GresTypes=fpga"
    echo "ReturnToService=2"
    echo "JobSubmitPlugins=lua"
    local p=$((PORT0 + 1))
    for n in "${NODES[@]}"; do
      local gres=""
      [[ $n == dam0* ]] && gres=" Gres=fpga:1"
      if ((HOSTS)); then  # a host of its own: its name, its address, slurmd's usual port
        echo "NodeName=$n NodeHostname=$n NodeAddr=$(node_ip "$n") Port=6818 CPUs=4 RealMemory=4000 Features=${n%%[0-9]*}$gres State=UNKNOWN"
      else
        echo "NodeName=$n NodeHostname=$host NodeAddr=127.0.0.1 Port=$p CPUs=4 RealMemory=4000 Features=${n%%[0-9]*}$gres State=UNKNOWN"
      fi
      p=$((p + 1))
    done
    local list
    for m in cm esb dam nam; do
      list=$(printf '%s\n' "${NODES[@]}" | grep "^$m" | paste -sd,)
      echo "PartitionName=$m Nodes=$list$([[ $m == cm ]] && echo " Default=YES") MaxTime=INFINITE State=UP"
    done
    echo "PartitionName=all Nodes=ALL MaxTime=INFINITE State=UP"
  } > "$CONF.tmp"
  mv "$CONF.tmp" "$CONF"
  printf '%s\n' "${NODES[@]}" | grep '^dam' | sed 's/.*/NodeName=& Name=fpga Count=1/' > "$STATE/etc/gres.conf"
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
    command -v $b >/dev/null || [[ -x /usr/sbin/$b ]] || { echo "slurm-cluster: $b missing (run MSAFLOW_TESTS=1 scripts/setup.sh)" >&2; exit 1; }
  done
  # munge: Debian's package made the key; /run/munge must exist on every boot.
  # Both clusters may start at once (their tests run side by side): one starts munged, under a
  # lock, and the other finds it answering.
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
    (
      flock 9
      if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        runuser -u munge -- /usr/sbin/munged 9>&-  # the daemon must not keep the lock
        for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
        cp /run/munge/munged.pid "$STATE/munged.pid.ours"
        say "munged started (pid $(cat "$STATE/munged.pid.ours"))"
      fi
    ) 9>/run/munge/msaflow-start.lock
  fi
  write_conf
  ((HOSTS)) && make_hosts
  if ! alive "$STATE/slurmctld.pid"; then
    /usr/sbin/slurmctld -f "$CONF" -c
    for _ in $(seq 100); do alive "$STATE/slurmctld.pid" && break; sleep 0.1; done
    say "slurmctld started (pid $(cat "$STATE/slurmctld.pid"))"
  fi
  for n in "${NODES[@]}"; do
    if ! alive "$STATE/slurmd-$n.pid"; then
      if ((HOSTS)); then  # in the node's namespace, under its own hostname
        # (nsenter, not `ip netns exec`, which mounts a sysfs of its own without cgroups)
        nsenter --net="/run/netns/msaflow-$n" unshare --uts --mount -- sh -c \
          "mount --bind /etc/netns/msaflow-$n/hosts /etc/hosts && hostname $n && exec /usr/sbin/slurmd -f '$CONF' -N $n"
      else
        /usr/sbin/slurmd -f "$CONF" -N "$n"
      fi
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

# The hosts: a bridge on this machine (the login host, $LOGIN), a namespace per node with a
# veth to it, its address, and the names of every host in its /etc/hosts (/etc/netns/NAME/hosts,
# bound over /etc/hosts in the node's mount namespace). Idempotent.
make_hosts() {
  command -v ip >/dev/null || { echo "slurm-cluster: ip missing (apt-get install iproute2)" >&2; exit 1; }
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$LOGIN/24" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
  local n names="127.0.0.1 localhost"$'\n'"$LOGIN login $(hostname -s)"
  for n in "${NODES[@]}"; do names+=$'\n'"$(node_ip "$n") $n"; done
  for n in "${NODES[@]}"; do
    local ns=msaflow-$n
    ip netns list | grep -qw "$ns" || ip netns add "$ns"
    if ! ip link show "mv-$n" >/dev/null 2>&1; then  # new, or left without its link by a crash
      ip link add "mv-$n" type veth peer name eth0 netns "$ns"
      ip -n "$ns" addr add "$(node_ip "$n")/24" dev eth0
    fi
    ip link set "mv-$n" master "$BRIDGE"
    ip link set "mv-$n" up
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    mkdir -p "/etc/netns/$ns"
    printf '%s\n' "$names" > "/etc/netns/$ns/hosts"
  done
  say "hosts: ${NODES[*]} on $BRIDGE ($NET.0/24), login $LOGIN"
}

remove_hosts() {
  local n
  for n in "${NODES[@]}"; do
    ip link del "mv-$n" 2>/dev/null || true
    ip netns del "msaflow-$n" 2>/dev/null || true
    rm -rf "/etc/netns/msaflow-$n"
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

stop() {
  local pids=()
  for f in "$STATE"/slurmd-*.pid "$STATE/slurmctld.pid"; do
    alive "$f" && pids+=("$(cat "$f")")
  done
  # A daemon of this cluster whose PID file is gone (a slurmd removes it as it starts to shut
  # down, and one was seen to linger after SIGTERM): found by its config file, which is ours.
  local p
  for p in $(pgrep -f "^/usr/sbin/slurm(ctld|d) -f $CONF( |\$)" || true); do
    [[ " ${pids[*]} " == *" $p "* ]] || pids+=("$p")
  done
  ((${#pids[@]})) && kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 100); do
    local left=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
    ((left)) || break
    sleep 0.1
  done
  for p in "${pids[@]}"; do  # still there after 10 s: SIGKILL
    kill -0 "$p" 2>/dev/null && { say "daemon $p ignored SIGTERM for 10 s: SIGKILL"; kill -9 "$p" 2>/dev/null || true; }
  done
  # munged serves both clusters: the one still running inherits it.
  local other=$PWD/.cache/slurm
  ((HOSTS)) || other=$PWD/.cache/slurm-hosts
  if alive "$STATE/munged.pid.ours"; then
    if alive "$other/slurmctld.pid"; then mv "$STATE/munged.pid.ours" "$other/munged.pid.ours"
    else kill "$(cat "$STATE/munged.pid.ours")"; fi
  fi
  rm -f "$STATE/munged.pid.ours"
  ((HOSTS)) && remove_hosts
  say "stopped (${#pids[@]} Slurm daemons)"
}

link() {  # link NODE up|down: the node's veth on the bridge
  ((HOSTS)) || { echo "slurm-cluster: link is for --hosts" >&2; exit 2; }
  node_ip "$1" >/dev/null || { echo "slurm-cluster: no node '$1' (${NODES[*]})" >&2; exit 2; }
  [[ ${2:-} == up || ${2:-} == down ]] || { echo "usage: $0 link NODE up|down --hosts" >&2; exit 2; }
  ip link set "mv-$1" "$2"
  say "link of $1 $2"
}

login() {  # login -- CMD...: CMD on the login host, which knows the nodes' names as they do
  ((HOSTS)) || { echo "slurm-cluster: login is for --hosts" >&2; exit 2; }
  [[ -f /etc/netns/msaflow-${NODES[0]}/hosts ]] || { echo "slurm-cluster: the hosts are not up (start --hosts)" >&2; exit 1; }
  local hosts=/etc/netns/msaflow-${NODES[0]}/hosts
  exec unshare --mount -- sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$hosts" "$@"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) alive "$STATE/slurmctld.pid" && sinfo -N -o '%N %P %t' || { echo "not running"; exit 1; } ;;
  link) link "${2:-}" "${3:-}" ;;
  login)
    shift
    args=()
    for a in "$@"; do [[ $a == --hosts ]] || args+=("$a"); done
    [[ ${args[0]:-} == -- ]] && args=("${args[@]:1}")
    login "${args[@]}" ;;
  *) echo "usage: $0 start|stop|status [--hosts] | link NODE up|down --hosts" >&2; exit 2 ;;
esac
