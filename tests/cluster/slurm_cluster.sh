#!/usr/bin/env bash
# A real two-node Slurm cluster on this machine, for the cluster tests:
# munged, slurmctld and two slurmd, each node in its own network namespace
# (its own address on a veth pair, its own host name, its own /etc/hosts
# through a private mount namespace),
# so srun, the rendezvous and Gloo cross a real link between two "hosts".
# Nothing appears in the host's own network namespace; everything lives
# under DIR and in namespaces named after it.
#
#   slurm_cluster.sh up DIR      start it; prints the variables to export
#                                (SLURM_CONF, DDP_CLUSTER_NS1, ...)
#   slurm_cluster.sh down DIR    stop every daemon and job, remove the
#                                namespaces, their /etc/netns entries and DIR's
#                                runtime files (logs stay for inspection)
#   slurm_cluster.sh exec DIR CMD...   run CMD on node1 (the login node)
#   slurm_cluster.sh sweep       take down clusters whose owner process
#                                (DDP_CLUSTER_OWNER at `up`, else the caller)
#                                has died, e.g. a test killed mid-way
#
# Needs root, iproute2, unshare (util-linux), munge and slurm-wlm (Debian's
# slurmctld/slurmd 22.05). Exit status 77 means "cannot run here" (a reason
# on stderr); anything else non-zero is a failure.
set -euo pipefail

cmd=${1:-}; dir=${2:-}
[[ "$cmd" == sweep ]] && dir=/nonexistent
[[ -n "$cmd" && -n "$dir" ]] || { echo "usage: $0 up|down|exec DIR [CMD...]" >&2; exit 2; }
dir=$(realpath -m "$dir")
# Namespace and interface names from DIR (40 bits of its SHA-256: clusters
# in distinct folders get distinct names; `up` refuses a name another live
# cluster holds), short enough for IFNAMSIZ.
tag=$(printf '%s' "$dir" | sha256sum | cut -c1-10)
ns1=ddpslurm${tag}a ns2=ddpslurm${tag}b
veth_host1=ds${tag}a veth_host2=ds${tag}b
net_b=$((100 + 16#${tag:0:4} % 100)) net_c=$((16#${tag:4:4} % 250))
addr1=10.$net_b.$net_c.1 addr2=10.$net_b.$net_c.2

skip() { echo "slurm_cluster: cannot run here: $*" >&2; exit 77; }
log() { echo "slurm_cluster: $*" >&2; }

on() {  # on NS CMD...: in that node's network and UTS namespaces, with its /etc/hosts
  local ns=$1; shift
  nsenter --net="/run/netns/$ns" --uts="$dir/uts-$ns" -- \
    unshare --mount --propagation private -- \
    sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$dir/hosts" "$@"
}

registry=/run/ddp-slurm-clusters

# A process is gone once /proc no longer has it or it is a zombie (its
# parent, the test that started the cluster, reaps it).
gone() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  [[ "${stat%% *}" == Z ]]
}

down() {
  rm -f "$registry/$tag"
  local killed=() pidfile pid ns round left
  for pidfile in "$dir"/run/*.pid; do
    [[ -f "$pidfile" ]] || continue
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [[ -n "$pid" ]] && kill -TERM "$pid" 2>/dev/null; then killed+=("$pid"); fi
  done
  sleep 0.5
  for ns in "$ns1" "$ns2"; do
    if [[ -e /run/netns/$ns ]]; then
      # Whatever still runs on the node (daemons, steps, workers), again
      # until nothing does: a step being torn down may still fork.
      for ((round = 0; round < 100; round++)); do
        left=0
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
          if kill -KILL "$pid" 2>/dev/null; then killed+=("$pid") left=1; fi
        done
        ((left)) || break
        sleep 0.1
      done
      ip netns del "$ns" 2>/dev/null || true
    fi
    if [[ -e "$dir/uts-$ns" ]]; then umount "$dir/uts-$ns" 2>/dev/null || true; rm -f "$dir/uts-$ns"; fi
  done
  for pidfile in "$dir"/run/*.pid; do
    [[ -f "$pidfile" ]] || continue
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null; then killed+=("$pid"); fi
    rm -f "$pidfile"
  done
  # A killed process takes a moment to end (a worker frees its memory): the
  # cluster is down once every one has, not when the signals are sent.
  for pid in "${killed[@]}"; do
    for ((round = 0; round < 100; round++)); do
      gone "$pid" && break
      sleep 0.05
    done
    gone "$pid" || log "process $pid did not end within 5 s of SIGKILL"
  done
  rm -rf "$dir/run"
}

up() {
  ((EUID == 0)) || skip "needs root (network namespaces, slurmd)"
  for tool in ip unshare nsenter munged slurmctld slurmd sbatch srun scontrol; do
    command -v "$tool" >/dev/null || skip "'$tool' is missing (deploy/install-deps.sh installs slurm-wlm, munge, iproute2)"
  done
  mkdir -p "$dir" && chmod 700 "$dir"
  local owner where
  if [[ -f "$registry/$tag" ]] && read -r owner where <"$registry/$tag" && [[ "$where" != "$dir" ]] &&
    kill -0 "$owner" 2>/dev/null; then
    log "the names of a cluster in $dir ($ns1, $ns2) are those of the live cluster in $where"
    exit 1
  fi
  down
  mkdir -p "$dir/run" "$dir/state" "$dir/log" "$registry"
  chmod 700 "$dir/run"
  echo "${DDP_CLUSTER_OWNER:-$PPID} $dir" >"$registry/$tag"

  # Network: node1 and node2 joined by a veth pair, each end named eth0.
  ip netns add "$ns1" || skip "ip netns add failed"
  ip netns add "$ns2"
  ip link add "$veth_host1" netns "$ns1" type veth peer name "$veth_host2" netns "$ns2" ||
    skip "cannot create a veth pair"
  ip -n "$ns1" link set "$veth_host1" name eth0
  ip -n "$ns2" link set "$veth_host2" name eth0
  ip -n "$ns1" addr add "$addr1/24" dev eth0
  ip -n "$ns2" addr add "$addr2/24" dev eth0
  for ns in "$ns1" "$ns2"; do
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
  # Host names: every command on a node sees this file as /etc/hosts.
  printf '127.0.0.1 localhost\n%s node1\n%s node2\n' "$addr1" "$addr2" >"$dir/hosts"
  # A UTS namespace per node, kept by a bind mount, with the node's name.
  local n=1
  for ns in "$ns1" "$ns2"; do
    touch "$dir/uts-$ns"
    unshare --uts="$dir/uts-$ns" hostname "node$n"
    n=$((n + 1))
  done

  # MUNGE: a daemon and a key of our own, on a socket under DIR.
  dd if=/dev/urandom of="$dir/run/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/run/munge.key"
  munged --force --socket="$dir/run/munge.sock" --key-file="$dir/run/munge.key" \
    --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/run/munge.seed" ||
    { log "munged failed: $(tail -3 "$dir/log/munged.log" 2>/dev/null)"; exit 1; }

  local cpus
  cpus=$(nproc)
  cat >"$dir/slurm.conf" <<CONF
ClusterName=ddptest
FirstJobId=$((1000 + 16#${tag:0:8} % 90000))
SlurmctldHost=node1($addr1)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/run/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/run/spool-%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=10
# sbatch --wait polls after 2 s, 8 s more, then every 32 s, unless MinJobAge/2 is less:
# 17 keeps its polls 8 s apart (a finished job's record stays at least 17 s).
MinJobAge=17
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=20
PlugStackConfig=$dir/plugstack.conf
NodeName=node1 NodeAddr=$addr1 CPUs=$cpus State=UNKNOWN
NodeName=node2 NodeAddr=$addr2 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
CONF
  : >"$dir/plugstack.conf"
  export SLURM_CONF=$dir/slurm.conf

  on "$ns1" slurmctld -f "$SLURM_CONF" -i || { log "slurmctld failed: $(tail -5 "$dir/log/slurmctld.log")"; exit 1; }
  on "$ns1" slurmd -f "$SLURM_CONF" -N node1 || { log "slurmd node1 failed: $(tail -5 "$dir/log/slurmd-node1.log")"; exit 1; }
  on "$ns2" slurmd -f "$SLURM_CONF" -N node2 || { log "slurmd node2 failed: $(tail -5 "$dir/log/slurmd-node2.log")"; exit 1; }

  # Both nodes idle, or fail saying what the controller thinks.
  local i state
  for ((i = 0; i < 120; i++)); do
    state=$(on "$ns1" sinfo -h -N -o '%N %t' 2>/dev/null | sort | tr '\n' ' ' || true)
    [[ "$state" == "node1 idle node2 idle " ]] && break
    sleep 0.5
  done
  if [[ "$state" != "node1 idle node2 idle " ]]; then
    log "the nodes did not become idle within 60 s: '$state'"
    tail -5 "$dir/log/slurmctld.log" "$dir"/log/slurmd-*.log >&2 || true
    exit 1
  fi
  echo "SLURM_CONF=$SLURM_CONF"
  echo "DDP_CLUSTER_NS1=$ns1"
  echo "DDP_CLUSTER_NS2=$ns2"
  echo "DDP_CLUSTER_ADDR1=$addr1"
  echo "DDP_CLUSTER_ADDR2=$addr2"
}

sweep() {
  local entry owner where
  for entry in "$registry"/*; do
    [[ -f "$entry" ]] || continue
    read -r owner where <"$entry" || continue
    if ! kill -0 "$owner" 2>/dev/null; then
      log "taking down the cluster of dead process $owner in $where"
      "$0" down "$where" || true
      rm -f "$entry"
    fi
  done
}

case "$cmd" in
  up) up ;;
  sweep) sweep ;;
  down) down ;;
  exec)
    shift 2
    export SLURM_CONF=$dir/slurm.conf
    on "$ns1" "$@"
    ;;
  *) echo "usage: $0 up|down|exec DIR [CMD...]" >&2; exit 2 ;;
esac
