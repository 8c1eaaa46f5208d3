#!/usr/bin/env bash
# Start a single-node Slurm cluster on 127.0.0.1 for the `slurm`-marked tests (CI runs as root, no systemd).
#
#   .ci/slurm_setup.sh            install (Debian slurmctld slurmd slurm-client munge) if missing, then start
#   .ci/slurm_setup.sh --stop     stop the daemons this script started
#
# Never fails the caller: on any problem it prints `slurm_setup: unavailable: <reason>`, writes the reason to
# $SLURM_SETUP_STATUS (default /tmp/nemo_jetrl_slurm/status) and exits 0; the slurm tests then skip with that reason.
# Facts (DESIGN.md §5): munged first; proctrack/linuxproc + task/none need no cgroups; fake GPUs via gres.conf
# File= entries on dummy files so `--gres=gpu:N` can be exercised.
set -uo pipefail

STATE_DIR="${SLURM_SETUP_DIR:-/tmp/nemo_jetrl_slurm}"
STATUS_FILE="${SLURM_SETUP_STATUS:-$STATE_DIR/status}"
CONF_DIR=/etc/slurm
FAKE_GPUS="${SLURM_FAKE_GPUS:-2}"
APT_TIMEOUT="${SLURM_APT_TIMEOUT:-180}"
mkdir -p "$STATE_DIR"

unavailable() {
  echo "slurm_setup: unavailable: $*"
  echo "unavailable: $*" >"$STATUS_FILE"
  exit 0
}

if [ "${1:-}" = "--stop" ]; then
  for name in slurmd slurmctld munged; do
    if [ -f "$STATE_DIR/$name.pid" ]; then kill "$(cat "$STATE_DIR/$name.pid")" 2>/dev/null || true; fi
  done
  echo "stopped" >"$STATUS_FILE"
  exit 0
fi

[ "$(id -u)" = 0 ] || unavailable "needs root (runs slurmctld/slurmd/munged as root)"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
  || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || unavailable "slurm is not installed and apt-get is absent"
  echo "slurm_setup: installing slurmctld slurmd slurm-client munge (apt-get, timeout ${APT_TIMEOUT}s)"
  export DEBIAN_FRONTEND=noninteractive
  timeout "$APT_TIMEOUT" apt-get update -qq >"$STATE_DIR/apt.log" 2>&1 || unavailable "apt-get update failed (see $STATE_DIR/apt.log)"
  timeout "$APT_TIMEOUT" apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge \
    >>"$STATE_DIR/apt.log" 2>&1 || unavailable "apt-get install failed (see $STATE_DIR/apt.log)"
fi

# Already up (a second call in the same CI job): nothing to do.
if [ -f "$STATE_DIR/slurmctld.pid" ] && kill -0 "$(cat "$STATE_DIR/slurmctld.pid")" 2>/dev/null \
  && timeout 5 sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
  echo "ok" >"$STATUS_FILE"
  echo "slurm_setup: already running"
  exit 0
fi

NODE="$(hostname -s)"
CPUS="$(nproc)"
MEM_MB="$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)"

# munge: key + daemon (runs as root here; --force accepts root-owned dirs).
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chmod 400 /etc/munge/munge.key
munged --force --pid-file="$STATE_DIR/munged.pid" --socket=/run/munge/munge.socket.2 \
  >"$STATE_DIR/munged.log" 2>&1 || unavailable "munged did not start (see $STATE_DIR/munged.log)"

# fake GPUs: gres.conf File= entries on dummy device files.
GRES_NODE=""
GRES_TYPES=""
: >"$STATE_DIR/gres.conf"
if [ "$FAKE_GPUS" -gt 0 ]; then
  for i in $(seq 0 $((FAKE_GPUS - 1))); do
    touch "$STATE_DIR/fake_gpu$i"
    echo "NodeName=$NODE Name=gpu File=$STATE_DIR/fake_gpu$i" >>"$STATE_DIR/gres.conf"
  done
  GRES_NODE="Gres=gpu:$FAKE_GPUS"
  GRES_TYPES="GresTypes=gpu"
fi

mkdir -p "$CONF_DIR" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cp "$STATE_DIR/gres.conf" "$CONF_DIR/gres.conf"
cat >"$CONF_DIR/slurm.conf" <<EOF
# written by nemo-jetrl .ci/slurm_setup.sh: single node on 127.0.0.1, no systemd, no cgroups
ClusterName=ci
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmdPidFile=$STATE_DIR/slurmd.pid
SlurmctldLogFile=$STATE_DIR/slurmctld.log
SlurmdLogFile=$STATE_DIR/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
$GRES_TYPES
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB $GRES_NODE State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF

slurmctld -c >>"$STATE_DIR/slurmctld.log" 2>&1 || unavailable "slurmctld did not start (see $STATE_DIR/slurmctld.log)"
slurmd >>"$STATE_DIR/slurmd.log" 2>&1 || unavailable "slurmd did not start (see $STATE_DIR/slurmd.log)"

for _ in $(seq 1 30); do
  state="$(timeout 5 sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1)"
  case "$state" in
    idle* | mixed* | allocated*)
      echo "ok" >"$STATUS_FILE"
      echo "slurm_setup: single-node cluster up ($NODE, $CPUS CPUs, $FAKE_GPUS fake GPUs)"
      exit 0
      ;;
  esac
  sleep 1
done
unavailable "node $NODE did not come up (state '${state:-none}'; see $STATE_DIR/slurmctld.log, slurmd.log)"
