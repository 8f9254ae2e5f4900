#!/usr/bin/env bash
# Run experiments.codegen on every worker (host) of an existing Cloud TPU VM slice, one process per worker, on
# JAX's own distributed runtime. Creates no cloud resource; needs gcloud, authenticated, on this machine.
#
#   export TPU_NAME=my-v4-32 ZONE=us-central2-b PROJECT=my-project
#   REPO_URL=https://example.org/you/grpo_jax.git bash launch/tpu_pod.sh setup  # clone/pull + venv everywhere
#   WORKDIR=/mnt/shared/runs/r1 bash launch/tpu_pod.sh run --flagfile=experiments/flagfiles/r1.flags
#   WORKDIR=/mnt/shared/runs/r1 bash launch/tpu_pod.sh tail [WORKER]   # follow one worker's log (default 0)
#   WORKDIR=/mnt/shared/runs/r1 bash launch/tpu_pod.sh logs [DEST]     # copy every worker's log here
#   WORKDIR=/mnt/shared/runs/r1 bash launch/tpu_pod.sh stop            # end the processes `run` started
# Arguments after `run` are passed to experiments.codegen unchanged ("$@").
#
# Read here: TPU_NAME, ZONE, PROJECT (required); WORKDIR (required by run, tail, logs, stop); REPO_URL (setup,
# first time); GIT_REF (setup: branch, tag or commit to check out; default: pull the current branch);
# REMOTE_DIR (the clone on each worker, relative to the remote home unless absolute; default grpo_jax);
# TPU_PYTHON (setup: the venv's interpreter; default python3.11: the project needs Python >= 3.11, and Ubuntu
# 22.04 based TPU VM images ship python3 3.10, so install one first, e.g. python3.11 + python3.11-venv).
# Forwarded to the workers when set here: JAX_COORDINATOR_PORT, XLA_FLAGS, LIBTPU_INIT_ARGS,
# TF_CPP_MIN_LOG_LEVEL. Set on the workers: PYTHONUNBUFFERED=1 and, unless forwarded, TF_CPP_MIN_LOG_LEVEL=1
# (XLA's C++ logging without INFO).
#
# How JAX finds the cluster (--dist_cluster=auto -> jax.distributed.initialize() without arguments; jax
# 0.10.2, jax/_src/clusters/cloud_tpu_cluster.py, GceTpuCluster): on a Cloud TPU VM (libtpu installed, TPU
# chips present) it asks the metadata server: agent-worker-number is the process id, worker-network-endpoints
# the list of hosts (its length is the process count, its first entry the coordinator, port 8482 unless
# JAX_COORDINATOR_PORT is set); tpu-env's MEGASCALE_* entries add multislice. This needs the `requests`
# package (installed with jax[tpu]). JAX never restricts local devices on TPU: each process uses all the chips
# of its host. Every worker must start at the same time, hence --worker=all.
#
# Logs: each worker writes stdout+stderr to $WORKDIR/logs/worker_<agent-worker-number>.log (its pid to
# worker_<n>.pid); process 0 writes the run's logs, TensorBoard events, run.json and results.json into
# $WORKDIR. Checkpoints: orbax writes $WORKDIR/checkpoints collectively from every worker, so on a slice with
# more than one worker WORKDIR must be a filesystem mounted at the same path on every worker (e.g.
# Filestore/NFS); a gs:// path is not supported yet. A relative WORKDIR is relative to REMOTE_DIR.
# Resume: `run` again with the same WORKDIR: the run resumes from the latest checkpoint in
# $WORKDIR/checkpoints. The processes run under nohup, so they outlive the ssh session; a process that dies
# ends the run through JAX's heartbeat (--dist_heartbeat_s) or the per-step barrier (--dist_step_timeout_s).
# A process that still holds the TPU keeps a new run from opening it: `stop` first.
set -euo pipefail

usage() { sed -n '2,11p' "$0" >&2; exit 2; }

: "${TPU_NAME:?set TPU_NAME to the name of an existing TPU VM (gcloud compute tpus tpu-vm list)}"
: "${ZONE:?set ZONE to the zone of the TPU VM, e.g. us-central2-b}"
: "${PROJECT:?set PROJECT to the Google Cloud project of the TPU VM}"
REMOTE_DIR="${REMOTE_DIR:-grpo_jax}"

mode="${1:-}"
[[ $# -gt 0 ]] && shift

# Run a bash script on the workers. It travels base64-encoded, so that no shell quoting stands between the
# values (quoted here with printf %q) and the remote bash, and as an argument of bash -c, not on its stdin.
on_workers() {  # on_workers WORKER|all SCRIPT
  local b64
  b64="$(printf '%s' "$2" | base64 | tr -d '\n')"
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" --worker="$1" \
    --command="bash -c \"\$(echo $b64 | base64 -d)\""
}

# Lines that set these shell variables on the worker, values quoted for bash.
remote_vars() {
  local name
  for name in "$@"; do printf '%s=%q\n' "$name" "${!name}"; done
}

# Run first on every worker: strict mode, REMOTE_DIR made absolute, the worker's index.
remote_prelude='set -euo pipefail
case "$REMOTE_DIR" in /*) ;; *) REMOTE_DIR="$HOME/$REMOTE_DIR" ;; esac
worker_number() {
  curl -sf -H "Metadata-Flavor: Google" \
    http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number || hostname
}'

need_workdir() {
  : "${WORKDIR:?set WORKDIR to the run directory (shared by all workers on a multi-host slice)}"
  LOG_DIR="$WORKDIR/logs"
}

# The log directory as scp names it: a relative path there is relative to the remote home.
remote_log_dir() {
  case "$WORKDIR" in
    /*) printf '%s' "$LOG_DIR" ;;
    *) printf '%s/%s' "$REMOTE_DIR" "$LOG_DIR" ;;
  esac
}

num_workers() {
  gcloud compute tpus tpu-vm describe "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" --format=json \
    | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["networkEndpoints"]))'
}

case "$mode" in
  setup)
    REPO_URL="${REPO_URL:-}"
    GIT_REF="${GIT_REF:-}"
    TPU_PYTHON="${TPU_PYTHON:-python3.11}"
    script="$(remote_vars REMOTE_DIR REPO_URL GIT_REF TPU_PYTHON)
$remote_prelude"'
if [[ -d "$REMOTE_DIR/.git" ]]; then
  if [[ -n "$GIT_REF" ]]; then
    git -C "$REMOTE_DIR" fetch --quiet origin
    git -C "$REMOTE_DIR" checkout --quiet "$GIT_REF"
  else
    git -C "$REMOTE_DIR" pull --ff-only --quiet
  fi
else
  [[ -n "$REPO_URL" ]] || { echo "$(hostname): no clone at $REMOTE_DIR; set REPO_URL" >&2; exit 2; }
  git clone --quiet "$REPO_URL" "$REMOTE_DIR"
  [[ -z "$GIT_REF" ]] || git -C "$REMOTE_DIR" checkout --quiet "$GIT_REF"
fi
cd "$REMOTE_DIR"
if ! command -v "$TPU_PYTHON" >/dev/null; then
  echo "$(hostname): no $TPU_PYTHON; Python >= 3.11 is needed (e.g. python3.11 + python3.11-venv)" >&2
  exit 2
fi
[[ -x .venv/bin/python ]] || "$TPU_PYTHON" -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet -r requirements.txt
# jax[tpu] at the version requirements.txt pins adds libtpu, and requests (used by the TPU cluster detection).
jax_version="$(sed -n "s/^jax==//p" requirements.txt)"
.venv/bin/pip install --quiet "jax[tpu]==$jax_version"
versions="$(.venv/bin/pip show jax libtpu | sed -n "s/^Version: //p" | paste -sd " " -)"
echo "worker $(worker_number) ($(hostname)): $(git rev-parse --short HEAD), jax libtpu: $versions"
'
    on_workers all "$script"
    ;;

  run)
    need_workdir
    fwd=""
    for name in JAX_COORDINATOR_PORT XLA_FLAGS LIBTPU_INIT_ARGS TF_CPP_MIN_LOG_LEVEL; do
      [[ -n "${!name:-}" ]] && fwd+="export $(printf '%s=%q' "$name" "${!name}")"$'\n'
    done
    args=""
    [[ $# -eq 0 ]] || args="$(printf '%q ' "$@")"
    script="$(remote_vars REMOTE_DIR WORKDIR LOG_DIR)
$remote_prelude
$fwd
args=($args)"'
cd "$REMOTE_DIR"
if [[ ! -x .venv/bin/python ]]; then
  echo "$(hostname): no $REMOTE_DIR/.venv: run launch/tpu_pod.sh setup" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}"
worker="$(worker_number)"
mkdir -p "$LOG_DIR"
log="$LOG_DIR/worker_$worker.log"
# --workdir after the passed flags: a flagfile'"'"'s own --workdir must not win over WORKDIR (last one wins).
nohup .venv/bin/python -m experiments.codegen --dist_cluster=auto "${args[@]}" --workdir="$WORKDIR" \
  >"$log" 2>&1 </dev/null &
echo "$!" >"$LOG_DIR/worker_$worker.pid"
echo "worker $worker ($(hostname)): pid $!, log $log"
'
    on_workers all "$script"
    echo "follow worker 0: WORKDIR=$WORKDIR bash $0 tail 0; copy all logs: WORKDIR=$WORKDIR bash $0 logs"
    ;;

  tail)
    need_workdir
    w="${1:-0}"
    script="$(remote_vars REMOTE_DIR LOG_DIR w)
$remote_prelude"'
cd "$REMOTE_DIR"
exec tail -n 100 -F "$LOG_DIR/worker_$w.log"
'
    on_workers "$w" "$script"
    ;;

  logs)
    need_workdir
    dest="${1:-tpu_logs/$TPU_NAME}"
    mkdir -p "$dest"
    src="$(remote_log_dir)"
    n="$(num_workers)"
    for ((i = 0; i < n; i++)); do
      gcloud compute tpus tpu-vm scp "$TPU_NAME:$src/worker_$i.log" "$dest/" \
        --zone="$ZONE" --project="$PROJECT" --worker="$i" || echo "warning: no log from worker $i" >&2
    done
    echo "logs of $n worker(s) in $dest"
    ;;

  stop)
    need_workdir
    script="$(remote_vars REMOTE_DIR LOG_DIR)
$remote_prelude"'
cd "$REMOTE_DIR"
worker="$(worker_number)"
pidfile="$LOG_DIR/worker_$worker.pid"
pid="$(cat "$pidfile" 2>/dev/null || true)"
# only the recorded pid, and only while it is still experiments.codegen (a pid can be reused)
if [[ -n "$pid" ]] && tr "\0" " " 2>/dev/null <"/proc/$pid/cmdline" | grep -q "experiments.codegen"; then
  kill "$pid" && echo "worker $worker: sent SIGTERM to pid $pid"
else
  echo "worker $worker: no running process recorded in $pidfile"
fi
'
    on_workers all "$script"
    ;;

  *) usage ;;
esac
