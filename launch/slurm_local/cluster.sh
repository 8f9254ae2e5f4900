#!/usr/bin/env bash
# A throw-away SLURM cluster on this machine, up for the duration of one command (a test fixture for
# launch/slurm.sbatch; launch/slurm_local/selftest.sh runs the launcher under it).
#
#   bash launch/slurm_local/cluster.sh [--nodes=2] [--dir=DIR] [--keep] [-- COMMAND [ARG...]]
#
# Installs slurm-wlm and munge with apt-get when slurmctld, slurmd, sbatch or munged is missing (root only;
# Debian 12 ships SLURM 22.05), writes a slurm.conf for this host, starts munged, slurmctld and one slurmd per
# node with every state, spool, log and pid file under DIR (default: a new /tmp/slurm_local.XXXXXX), waits
# until `sinfo` shows every node idle, then runs COMMAND with SLURM_CONF (and SLURM_LOCAL_DIR, SLURM_LOCAL_NODES)
# exported, so that sbatch / srun / squeue / scontrol talk to this cluster. Without a COMMAND it prints the
# export line and waits for Ctrl-C. On exit (normal, error, SIGINT, SIGTERM) it cancels the cluster's jobs and
# stops what it started, by pid: the daemons, and any job process left behind (every process that carries
# this cluster's marker variable in its environment). DIR is removed unless --dir or --keep was given. The
# exit status is COMMAND's.
#
# Nodes: --nodes=2 (default) runs two slurmd daemons on this one host (SLURM's multiple-slurmd mode:
# NodeName=n1,n2 with NodeHostname=localhost and a port each; Debian's 22.05 build accepts it), so srun spreads
# the tasks over two SLURM nodes exactly as over two machines, sharing this host's CPUs and filesystem. The
# node names must resolve for JAX (its SLURM detection uses the first node name of SLURM_STEP_NODELIST as the
# coordinator's host): when n1 does not resolve, the script re-runs itself in a private mount namespace
# (unshare -m) whose /etc/hosts is this host's plus "127.0.0.1 n1 n2 ..."; the host's own file is untouched.
# Plugins chosen for a container without cgroup control: ProctrackType=proctrack/linuxproc, TaskPlugin=task/none,
# SelectType=select/cons_tres (CR_Core); each node claims all of this host's CPUs (config_overrides).
set -euo pipefail

NODES=2
DIR=""
KEEP=0
while (($#)); do
  case "$1" in
    --nodes=*) NODES="${1#--nodes=}" ;;
    --dir=*) DIR="${1#--dir=}"; KEEP=1 ;;
    --keep) KEEP=1 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cluster.sh: unknown option $1 (options: --nodes=N --dir=DIR --keep -- COMMAND...)" >&2; exit 2 ;;
  esac
  shift
done
[[ "$NODES" =~ ^[1-9][0-9]?$ ]] || { echo "cluster.sh: --nodes=$NODES: must be 1..99" >&2; exit 2; }
SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
say() { echo "[slurm_local] $*" >&2; }

# --- 1. SLURM and munge installed? ------------------------------------------------------------------------
missing=()
for c in slurmctld slurmd slurmstepd sbatch srun sinfo scontrol munged mungekey; do
  command -v "$c" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$c" >/dev/null 2>&1 || missing+=("$c")
done
export PATH="$PATH:/usr/sbin:/sbin"
if ((${#missing[@]})); then
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "cluster.sh: missing ${missing[*]}; install slurm-wlm and munge (needs root and apt-get)" >&2
    exit 3
  fi
  say "installing slurm-wlm and munge with apt-get (missing: ${missing[*]}) ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  # the packages' own services (systemd units) are not used: this script starts its own daemons
  apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
  say "installed: $(slurmctld -V)"
fi

# --- 2. The node names resolve (JAX's coordinator is the first node's name) ---------------------------------
NAMES=()
for ((i = 1; i <= NODES; i++)); do NAMES+=("n$i"); done
if ! getent hosts n1 >/dev/null 2>&1; then
  if [[ -n "${SLURM_LOCAL_NS:-}" ]]; then
    echo "cluster.sh: n1 does not resolve even inside the private mount namespace" >&2
    exit 4
  fi
  if [[ "$(id -u)" != 0 ]] || ! command -v unshare >/dev/null; then
    echo "cluster.sh: node name n1 does not resolve; add '127.0.0.1 ${NAMES[*]}' to /etc/hosts or run as root" >&2
    exit 4
  fi
  hosts="$(mktemp /tmp/slurm_local_hosts.XXXXXX)"
  { cat /etc/hosts; echo "127.0.0.1 ${NAMES[*]}  # slurm_local"; } >"$hosts"
  chmod 644 "$hosts"
  args=(--nodes="$NODES")
  [[ -n "$DIR" ]] && args+=(--dir="$DIR")
  ((KEEP)) && [[ -z "$DIR" ]] && args+=(--keep)
  # a private mount namespace: /etc/hosts bind-mounted over for this script and everything it starts only
  SLURM_LOCAL_NS="$hosts" exec unshare --mount --propagation private bash -c \
    'mount --bind "$SLURM_LOCAL_NS" /etc/hosts && rm -f "$SLURM_LOCAL_NS" && exec bash "$@"' \
    cluster.sh "$SELF" "${args[@]}" -- "$@"
fi

# --- 3. The cluster's directory and configuration ----------------------------------------------------------
if [[ -z "$DIR" ]]; then DIR="$(mktemp -d /tmp/slurm_local.XXXXXX)"; fi
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
mkdir -p "$DIR"/{state,spool,log,run,munge,tmp}
chmod 700 "$DIR/munge"
chmod 755 "$DIR"
# every process started from here carries this marker: the teardown finds the job processes by it
export SLURM_LOCAL_MARK="$DIR"

# free TCP ports: slurmctld, then one per slurmd
read -r -a PORTS < <(python3 - "$((NODES + 1))" <<'PY' 2>/dev/null || echo ""
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)
if ((${#PORTS[@]} != NODES + 1)); then  # no python3: ports from a random base
  base=$((20000 + RANDOM % 20000)); PORTS=()
  for ((i = 0; i <= NODES; i++)); do PORTS+=($((base + i))); done
fi
CPUS="$(nproc)"
CONF="$DIR/slurm.conf"
{
  echo "# written by launch/slurm_local/cluster.sh for a throw-away cluster on $(hostname)"
  echo "ClusterName=grpolocal"
  # job ids from a random start: JAX's SLURM coordinator port is 61440 + job id % 4096, so two such
  # clusters on one host at once do not share it
  echo "FirstJobId=$((100 + RANDOM % 3900))"
  echo "SlurmctldHost=localhost(127.0.0.1)"
  echo "SlurmctldPort=${PORTS[0]}"
  echo "SlurmdPort=${PORTS[1]}"
  echo "SlurmUser=$(id -un)"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "CredType=cred/munge"
  # cred_expire: a requeued job waits this long before it runs again (default 120 s)
  echo "AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=10"
  echo "StateSaveLocation=$DIR/state"
  echo "SlurmdSpoolDir=$DIR/spool/slurmd.%n"
  echo "SlurmctldPidFile=$DIR/run/slurmctld.pid"
  echo "SlurmdPidFile=$DIR/run/slurmd.%n.pid"
  echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
  echo "SlurmdLogFile=$DIR/log/slurmd.%n.log"
  echo "TmpFS=$DIR/tmp"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_Core"
  echo "SchedulerType=sched/backfill"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobCompType=jobcomp/none"
  echo "MpiDefault=none"
  echo "MailProg=/bin/true"
  echo "SlurmdParameters=config_overrides"
  echo "ReturnToService=2"
  # a node whose slurmd stops answering is DOWN after this long, and its jobs end (NODE_FAIL)
  echo "SlurmdTimeout=20"
  echo "InactiveLimit=0"
  # SIGTERM to SIGKILL at a job's end (scancel, requeue, time limit): time for the job to save a checkpoint
  echo "KillWait=30"
  echo "MinJobAge=600"
  # a batch job is requeued only when submitted with --requeue
  echo "JobRequeue=0"
  for ((i = 0; i < NODES; i++)); do
    echo "NodeName=${NAMES[i]} NodeHostname=localhost NodeAddr=127.0.0.1 Port=${PORTS[i + 1]} CPUs=$CPUS RealMemory=1000 State=UNKNOWN"
  done
  echo "PartitionName=local Nodes=$(IFS=,; echo "${NAMES[*]}") Default=YES MaxTime=INFINITE State=UP"
} >"$CONF"
export SLURM_CONF="$CONF" SLURM_LOCAL_DIR="$DIR" SLURM_LOCAL_NODES="$NODES"

# --- 4. Teardown on exit: jobs, then daemons, then leftovers, all by pid ----------------------------------
PIDS=()
has_mark() { 2>/dev/null tr '\0' '\n' <"/proc/$1/environ" | grep -qxF "SLURM_LOCAL_MARK=$DIR"; }
marked_pids() {  # processes (other than this script) whose environment carries this cluster's marker
  local p
  for p in /proc/[0-9]*; do
    p="${p#/proc/}"
    [[ "$p" == "$$" || "$p" == "$BASHPID" ]] && continue
    has_mark "$p" && echo "$p" || true
  done
  return 0
}
CMD_PID=""
teardown() {
  local rc=$? p t
  trap - EXIT INT TERM
  if [[ -n "$CMD_PID" ]] && kill -0 "$CMD_PID" 2>/dev/null; then  # interrupted: the command first
    kill -TERM "$CMD_PID" 2>/dev/null || true
    for ((t = 0; t < 50; t++)); do kill -0 "$CMD_PID" 2>/dev/null || break; sleep 0.2; done
  fi
  if ((${#PIDS[@]})) && kill -0 "${PIDS[1]:-0}" 2>/dev/null; then
    scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    for ((t = 0; t < 40; t++)); do  # let the jobs end (KillWait 30 s at most)
      [[ -z "$(squeue -h -o %i 2>/dev/null)" ]] && break
      sleep 1
    done
  fi
  # the daemons, last started first; a pid is signalled only while it still carries the marker (a daemon
  # that died and whose pid was reused is left alone)
  for ((t = ${#PIDS[@]} - 1; t >= 0; t--)); do has_mark "${PIDS[t]}" && kill -TERM "${PIDS[t]}" 2>/dev/null || true; done
  for ((t = 0; t < 50; t++)); do
    local alive=0
    for p in "${PIDS[@]}"; do has_mark "$p" && alive=1 || true; done
    ((alive)) || break
    sleep 0.2
  done
  for p in "${PIDS[@]}"; do has_mark "$p" && kill -KILL "$p" 2>/dev/null || true; done
  for p in $(marked_pids); do kill -KILL "$p" 2>/dev/null || true; done  # job steps left behind
  if ((KEEP)); then say "stopped; state, logs and configuration kept in $DIR"; else rm -rf "$DIR"; fi
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 5. Start munged, slurmctld, the slurmds; wait until every node is idle -----------------------------------
dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$DIR/munge/munge.key"
munged --foreground --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
  --pid-file="$DIR/run/munged.pid" --seed-file="$DIR/munge/munged.seed" --log-file="$DIR/log/munged.log" \
  >>"$DIR/log/munged.out" 2>&1 &
PIDS+=($!); disown "$!"  # (no "Killed" notice from bash at the teardown)
for ((t = 0; t < 50; t++)); do [[ -S "$DIR/munge/munge.socket" ]] && break; sleep 0.1; done
if ! munge -S "$DIR/munge/munge.socket" -n </dev/null 2>/dev/null | unmunge -S "$DIR/munge/munge.socket" >/dev/null 2>&1; then
  echo "cluster.sh: munged did not start (log: $DIR/log/munged.out)" >&2
  tail -n 20 "$DIR/log/munged.out" >&2 || true
  exit 5
fi
slurmctld -D -i -f "$CONF" >>"$DIR/log/slurmctld.out" 2>&1 &
PIDS+=($!); disown "$!"
for ((t = 0; t < 100; t++)); do scontrol ping >/dev/null 2>&1 && break; sleep 0.2; done
scontrol ping >/dev/null 2>&1 || { echo "cluster.sh: slurmctld did not answer (log: $DIR/log/slurmctld.log)" >&2; tail -n 20 "$DIR/log/slurmctld.log" >&2 || true; exit 5; }
for n in "${NAMES[@]}"; do
  slurmd -D -N "$n" -f "$CONF" >>"$DIR/log/slurmd.$n.out" 2>&1 &
  PIDS+=($!); disown "$!"
done
for ((t = 0; t < 120; t++)); do
  states="$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u)"
  idle="$(grep -c ' idle$' <<<"$states" || true)"
  ((idle == NODES)) && break
  sleep 0.5
done
if ((idle != NODES)); then
  echo "cluster.sh: the nodes did not become idle within 60 s:" >&2
  echo "$states" >&2
  for n in "${NAMES[@]}"; do tail -n 5 "$DIR/log/slurmd.$n.log" >&2 2>/dev/null || true; done
  exit 5
fi
say "up: $NODES node(s) (${NAMES[*]}) with $CPUS CPU(s) each on $(hostname); SLURM $(sinfo -V | cut -d' ' -f2); state in $DIR"

# --- 6. The command ------------------------------------------------------------------------------------------
if (($# == 0)); then
  echo "export SLURM_CONF=$CONF   # then sbatch / srun / sinfo here; Ctrl-C stops the cluster"
  while true; do sleep 3600 & wait $!; done
fi
# in the background + wait: a SIGTERM / SIGINT to this script runs the teardown at once
"$@" &
CMD_PID=$!
set +e
wait "$CMD_PID"
rc=$?
set -e
exit "$rc"
