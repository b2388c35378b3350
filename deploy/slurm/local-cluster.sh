#!/usr/bin/env bash
# Starts a one-node Slurm on this machine in DIR, for tests of `flotilla alloc` (run as root;
# Debian's slurm-wlm and munge installed). Prints the SLURM_CONF to export; stop it with
# `deploy/slurm/local-cluster.sh stop DIR`.
#
#   deploy/slurm/local-cluster.sh start DIR     # munged, slurmctld, slurmd; waits for the node
#   deploy/slurm/local-cluster.sh stop DIR      # stops the three by their pid files
#
# The settings that make Slurm 22.05 run in a container as root: SlurmUser=root,
# ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, no accounting. Its ports are not
# the defaults (SLURM_TEST_PORT, default 16817, for slurmctld and the next for slurmd), so it
# never meets a site's Slurm, and clusters on other ports run beside it.
set -euo pipefail
cmd="${1:?start|stop}"
dir="$(realpath -m "${2:?DIR}")"
conf="$dir/slurm.conf"
port="${SLURM_TEST_PORT:-16817}"

stop() {
  for p in "$dir/run/slurmd.pid" "$dir/run/slurmctld.pid" "$dir/run/munged.pid"; do
    if [ -f "$p" ]; then
      kill "$(cat "$p")" 2>/dev/null || true
      rm -f "$p"
    fi
  done
  # Job steps still running outlive slurmd: this cluster's are those writing to its folder.
  for p in $(pgrep -x slurmstepd || true); do
    if readlink "/proc/$p/fd/"* 2>/dev/null | grep -F "$dir/" >/dev/null; then
      kill -9 "$p" 2>/dev/null || true
    fi
  done
}

case "$cmd" in
  stop) stop; exit 0 ;;
  start) ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac

for b in munged slurmctld slurmd sinfo; do
  command -v "$b" >/dev/null 2>&1 || { echo "$b not found: apt-get install slurm-wlm munge" >&2; exit 1; }
done
mkdir -p "$dir"/{state,spool,log,run,munge}
host="$(hostname)"
cpus="$(nproc)"
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
cat > "$conf" <<EOF
ClusterName=flotilla-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
MinJobAge=3600
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
# munge: a key of this cluster's own, its socket in DIR.
if [ ! -f "$dir/munge/munge.key" ]; then
  dd if=/dev/urandom bs=1 count=1024 of="$dir/munge/munge.key" 2>/dev/null
fi
chmod 700 "$dir/munge"
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
  --seed-file="$dir/munge/munge.seed"
slurmctld -f "$conf"
slurmd -f "$conf"
# Ready when the node is idle (a few seconds).
for _ in $(seq 600); do
  if SLURM_CONF="$conf" sinfo -h -o '%t' 2>/dev/null | grep -qx 'idle'; then
    echo "SLURM_CONF=$conf"
    exit 0
  fi
  sleep 0.1
done
echo "Slurm did not come up; logs in $dir/log" >&2
stop
exit 1
