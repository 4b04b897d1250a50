#!/usr/bin/env bash
# A one-node SLURM on this machine, for the slow tier's SLURM test (tests/test_slurm.py) and for
# trying `executor: submitit` sweeps by hand (`make slurm`). As root (a container or a throwaway VM):
#   - installs Debian's slurmctld, slurmd, slurm-client and munge when a command is missing (apt);
#   - writes a munge key (when none exists) and /etc/slurm/slurm.conf: one node of `nproc` CPUs and
#     the machine's memory (MiB, as `slurmd -C` reads it), partition `debug` (the default),
#     ProctrackType=proctrack/linuxproc, TaskPlugin=task/none (no cgroups needed), accounting off
#     (no slurmdbd: `sacct` has nothing to read; zfree reads job states with squeue instead), the
#     machine's GPUs as the generic resource `gpu` (one placeholder where there is none);
#   - (re)starts munged, slurmctld and slurmd, and waits until `sinfo` shows the node idle.
# Idempotent: run it again to restart the daemons on the same configuration. `--stop` stops them.
# A slurm.conf this script did not write (a real cluster's) is never overwritten, unless `--force`.
# Exit status: 0 the node is idle; 1 not root, an install failed, or the node not idle in time (the
# daemons' logs under /var/log/slurm are named). Works without systemd (the daemons are started
# directly), so it runs in a container.
set -euo pipefail

CONF_DIR=/etc/slurm
LOG_DIR=/var/log/slurm
WAIT_S=${SLURM_WAIT_S:-60}
NODE=$(hostname -s)

die() { echo "start-local-slurm: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons); try: sudo $0"

stop_pid() {  # stop_pid PIDFILE: TERM the daemon a pid file names, wait for it to exit
  local f=$1 pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$f"
}

stop_all() {
  stop_pid /run/slurmd.pid
  stop_pid /run/slurmctld.pid
  stop_pid /run/munge/munged.pid
}

MARK="# written by zfree's etc/slurm/start-local-slurm.sh"
if [ -s "$CONF_DIR/slurm.conf" ] && [ "$(head -1 "$CONF_DIR/slurm.conf")" != "$MARK: a one-node cluster for tests" ] \
   && [ "${1:-}" != "--force" ]; then
  die "$CONF_DIR/slurm.conf exists and was not written by this script (a real cluster's?): left alone; move it away or pass --force"
fi

if [ "${1:-}" = "--stop" ]; then
  stop_all
  echo "start-local-slurm: stopped slurmd, slurmctld and munged"
  exit 0
fi

missing=()
for cmd in slurmctld slurmd sinfo munged; do
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("$cmd")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "start-local-slurm: installing slurmctld slurmd slurm-client munge (missing: ${missing[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null || die "apt-get update failed"
  apt-get install -y -q slurmctld slurmd slurm-client munge >/dev/null || die "apt-get install failed"
fi
export PATH=$PATH:/usr/sbin

# munge: the key the daemons and clients of this one node share
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  if command -v mungekey >/dev/null 2>&1; then mungekey --create --force >/dev/null
  else dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
fi
chown munge:munge /etc/munge /etc/munge/munge.key
chmod 700 /etc/munge && chmod 400 /etc/munge/munge.key

# GPUs as a generic resource: this machine's /dev/nvidiaN, else one placeholder (/dev/null) so that
# a spec asking for GPUs passes the scheduler's checks (`sbatch --test-only`); a job given the
# placeholder gets no device
gpus=$( (ls -d /dev/nvidia[0-9]* 2>/dev/null || true) | wc -l)
if [ "$gpus" -gt 0 ]; then gres_files="/dev/nvidia[0-$((gpus - 1))]"; else gpus=1; gres_files=/dev/null; fi
echo "$MARK
NodeName=$NODE Name=gpu File=$gres_files" > "$CONF_DIR/gres.conf"

# slurm.conf: one node, this machine's CPUs and memory
cpus=$(nproc)
mem_mb=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
[ -n "$mem_mb" ] || mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 ))
mkdir -p "$CONF_DIR" "$LOG_DIR" /var/spool/slurmctld /var/spool/slurmd /run/munge
chown munge:munge /run/munge
cat > "$CONF_DIR/slurm.conf.new" <<EOF
$MARK: a one-node cluster for tests
ClusterName=zfree-local
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
# no cgroups: processes are tracked by parent pid, tasks are not bound
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
GresTypes=gpu
SwitchType=switch/none
# CPUs and memory are consumable: several one-CPU jobs share the node
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
# accounting off: no slurmdbd, no job completion log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# a cancelled job's processes get SIGKILL 5 s after SIGTERM (default 30 s)
KillWait=5
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$NODE CPUs=$cpus RealMemory=$mem_mb Gres=gpu:$gpus State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
mv "$CONF_DIR/slurm.conf.new" "$CONF_DIR/slurm.conf"

stop_all
runuser -u munge -- /usr/sbin/munged || die "munged did not start (see /var/log/munge/munged.log)"
munge -n | unmunge >/dev/null || die "munge round trip failed (see /var/log/munge/munged.log)"
slurmctld || die "slurmctld did not start (see $LOG_DIR/slurmctld.log)"
slurmd || die "slurmd did not start (see $LOG_DIR/slurmd.log)"

state=""
for _ in $(seq $((WAIT_S * 2))); do
  state=$(sinfo -h -N -n "$NODE" -o %t 2>/dev/null || true)
  case "$state" in  # a trailing * (not responding yet), ~ (powered off), # or $ is not ready
    idle|mix|alloc) break ;;
    down*|drain*|drng*|inval*) scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
  esac
  sleep 0.5
done
case "$state" in
  idle|mix|alloc) ;;
  *) die "node $NODE is '${state:-not listed}' after ${WAIT_S} s (see $LOG_DIR/slurmctld.log, $LOG_DIR/slurmd.log)" ;;
esac
echo "start-local-slurm: node $NODE ($cpus CPUs, $mem_mb MiB, gres gpu:$gpus at $gres_files) is $state in partition debug"
