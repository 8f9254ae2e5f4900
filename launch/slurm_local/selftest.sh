#!/usr/bin/env bash
# launch/slurm.sbatch run for real under SLURM, on a throw-away cluster on this machine (cluster.sh), with a
# task killed, a node lost and a requeue; one summary line at the end.
#
#   bash launch/slurm_local/selftest.sh [--nodes=2] [--keep]
#
# Stages (a progress line each; a failure names its stage, prints the logs' tails, keeps the logs in a
# /tmp/slurm_selftest_logs.* directory and exits 1):
#   cluster    cluster.sh: slurm-wlm + munge (apt-get when missing), munged, slurmctld, one slurmd per node
#   reference  experiments.codegen in ONE process (no SLURM) on the flags below with --mesh_cpu_devices=2: the
#              same data-2 mesh as two 1-device processes; its results.json final_params_sha256 is the
#              reference (a 1-device run differs in the last bits: the gradient's all-reduce sums in another
#              order; tests/test_distributed.py compares that one to 1e-6)
#   clean      `sbatch launch/slurm.sbatch` as 2 srun tasks over the nodes: final SHA = reference
#   kill       the same command in a new WORKDIR; after its step-1 checkpoint task 1's process is SIGKILLed:
#              srun --kill-on-bad-exit ends the job, its batch log names the task ("srun: error: n2: task 1:
#              Killed")
#   node loss  the same submission again: it resumes from step 1; after its step-2 checkpoint the node of task
#              1 is lost (its slurmd, slurmstepd and task SIGKILLed at once, so SLURM hears nothing): task 0's
#              watchdog ends it within --dist_heartbeat_s with "error: lost process 1 of 2: no heartbeat ...",
#              SLURM declares the node DOWN (SlurmdTimeout) and ends the job (NODE_FAIL); the node's slurmd is
#              started again (ReturnToService=2 brings it back)
#   resume     the same submission again: resumes from step 2 and finishes; final SHA = reference
#   requeue    `sbatch --requeue` in a new WORKDIR; after its step-1 checkpoint `scontrol requeue`: the tasks
#              get SIGTERM, save and stop; SLURM reruns the script (same job id); it resumes and finishes;
#              final SHA = reference
# With --nodes=1 both tasks run on one node and the node-loss stage is skipped (the resume follows the kill).
# Flags: experiments/flagfiles/dist_test.flags (the tiny model, 3 steps, a checkpoint after each,
# --dist_heartbeat_s=10; tests/test_distributed.py's) and --dist_step_timeout_s=180. Tasks use CPU devices
# (one each) and gloo. About 6 minutes on a 2-core machine; everything lives under the cluster's temporary
# directory (removed at the end unless --keep).
set -euo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
HERE="$(dirname "$SELF")"
ROOT="$(cd "$HERE/../.." && pwd)"

# --- outside the cluster: start it around this script's inner part -----------------------------------------
if [[ "${1:-}" != --inner ]]; then
  NODES=2
  KEEP=()
  for a in "$@"; do
    case "$a" in
      --nodes=*) NODES="${a#--nodes=}" ;;
      --keep) KEEP=(--keep) ;;
      *) echo "selftest.sh: unknown option $a (options: --nodes=1|2 --keep)" >&2; exit 2 ;;
    esac
  done
  [[ "$NODES" == 1 || "$NODES" == 2 ]] || { echo "selftest.sh: --nodes must be 1 or 2" >&2; exit 2; }
  STATUS="$(mktemp /tmp/slurm_selftest_status.XXXXXX)"
  export SELFTEST_STATUS="$STATUS" SELFTEST_T0="$(date +%s)"
  echo "[selftest +0s] cluster: starting $NODES node(s) (launch/slurm_local/cluster.sh)"
  bash "$HERE/cluster.sh" --nodes="$NODES" "${KEEP[@]}" -- bash "$SELF" --inner &
  pid=$!
  trap 'kill -TERM "$pid" 2>/dev/null || true' INT TERM
  set +e
  wait "$pid"; rc=$?
  while kill -0 "$pid" 2>/dev/null; do wait "$pid"; rc=$?; done  # a signal interrupted the first wait
  set -e
  if ((rc != 0)) && ! grep -q . "$STATUS"; then  # the inner part never ran: the cluster did not start
    echo "selftest: FAILED at stage cluster (cluster.sh exit $rc; see its messages above)" >&2
  fi
  rm -f "$STATUS"
  exit "$rc"
fi

# --- inside the cluster (SLURM_CONF points at it) ----------------------------------------------------------
cd "$ROOT"
NODES="${SLURM_LOCAL_NODES:?run selftest.sh without --inner}"
RUNS="$SLURM_LOCAL_DIR/runs"
mkdir -p "$RUNS"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then PY=python3; [[ -x .venv/bin/python ]] && PY="$PWD/.venv/bin/python"; fi
export PYTHON="$PY"
# one CPU device per task (a forced device count from the caller would change the mesh)
XLA_FLAGS="$(tr ' ' '\n' <<<"${XLA_FLAGS:-}" | grep -v device_count | tr '\n' ' ' | sed 's/ *$//')"
if [[ -n "$XLA_FLAGS" ]]; then export XLA_FLAGS; else unset XLA_FLAGS; fi
FLAGS=(--flagfile=experiments/flagfiles/dist_test.flags --dist_step_timeout_s=180)
HEARTBEAT=10  # dist_test.flags' --dist_heartbeat_s
SB=(--nodes="$NODES" --ntasks-per-node=$((2 / NODES)) --cpus-per-task=1 --gpus-per-task=0 --time=00:15:00
  --output="$RUNS/%x-%j.out")
STAGE=setup
T_STAGE=$(date +%s)
TIMES=()

say() { [[ -z "$*" ]] || echo "[selftest +$(($(date +%s) - SELFTEST_T0))s] $STAGE: $*"; }
stage() {
  if [[ "$STAGE" != setup ]]; then TIMES+=("$STAGE $(($(date +%s) - T_STAGE)) s"); fi
  STAGE="$1"; T_STAGE=$(date +%s)
  echo "$STAGE" >>"$SELFTEST_STATUS"
  say "${*:2}"
}
fail() {
  echo "selftest: FAILED at stage $STAGE: $*" >&2
  local keep f
  keep="$(mktemp -d /tmp/slurm_selftest_logs.XXXXXX)"
  (cd "$SLURM_LOCAL_DIR" && find log runs -name '*.out' -o -name '*.log' -o -name 'results.json' \
    | grep -v checkpoints | xargs -r cp --parents -t "$keep" 2>/dev/null) || true
  for f in "$RUNS"/*.out "$RUNS"/*/logs/*.out "$RUNS"/*.log; do
    [[ -f "$f" ]] || continue
    echo "----- ${f#"$SLURM_LOCAL_DIR"/} (last 15 lines)" >&2
    tail -n 15 "$f" >&2
  done
  echo "----- slurmctld.log (last 10 lines)" >&2
  tail -n 10 "$SLURM_LOCAL_DIR/log/slurmctld.log" >&2 || true
  echo "selftest: FAILED at stage $STAGE: $* (logs kept in $keep)" >&2
  exit 1
}

field() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
submit() {  # submit WORKDIR NAME [sbatch options...] -> the job id
  local wd="$1" name="$2"
  shift 2
  WORKDIR="$wd" sbatch --parsable --job-name="$name" "${SB[@]}" "$@" launch/slurm.sbatch "${FLAGS[@]}" \
    | cut -d';' -f1
}
wait_end() {  # wait_end JOBID TIMEOUT_S -> the final JobState (a requeued job is followed through)
  local jid="$1" t0 st
  t0=$(date +%s)
  while (($(date +%s) - t0 < $2)); do
    st="$(field "$jid" JobState)"
    case "$st" in
      COMPLETED | FAILED | CANCELLED | NODE_FAIL | TIMEOUT | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        echo "$st"; return 0 ;;
    esac
    sleep 0.5
  done
  echo "TIMEOUT_WAITING($(field "$jid" JobState))"
}
# submit_until_ckpt WORKDIR NAME STEP [sbatch options...]: submit, JID = the job id, wait for its step's checkpoint
submit_until_ckpt() {
  JID="$(submit "$1" "$2" "${@:4}")" || fail "sbatch refused the job"
  wait_ckpt "$1" "$3" "$JID"
}
wait_ckpt() {  # wait_ckpt WORKDIR STEP JOBID: until the step's checkpoint directory exists
  local t0
  t0=$(date +%s)
  until [[ -d "$1/checkpoints/$2" ]]; do
    case "$(field "$3" JobState)" in
      PENDING | CONFIGURING | RUNNING | COMPLETING | REQUEUED) ;;
      *) fail "job $3 ended ($(field "$3" JobState)) before its step-$2 checkpoint" ;;
    esac
    (($(date +%s) - t0 < 300)) || fail "no step-$2 checkpoint in $1 after 300 s"
    sleep 0.05
  done
}
task_pid() {  # task_pid JOBID PROCID: the task's python process (the shim execs python)
  local p e
  for p in /proc/[0-9]*; do
    e="$(2>/dev/null tr '\0' '\n' <"$p/environ")" || continue
    grep -qxF "SLURM_JOB_ID=$1" <<<"$e" && grep -qxF "SLURM_PROCID=$2" <<<"$e" \
      && grep -q experiments.codegen "$p/cmdline" 2>/dev/null && { echo "${p#/proc/}"; return 0; }
  done
  return 1
}
sha() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["final_params_sha256"])' "$1/results.json"; }
check_sha() {  # check_sha WORKDIR JOBID: the run's final SHA equals the reference's
  [[ -f "$1/results.json" ]] || fail "job $2 wrote no $1/results.json"
  local got
  got="$(sha "$1")"
  [[ "$got" == "$REF" ]] || fail "job $2: final SHA ${got:0:12} != 1-process SHA ${REF:0:12}"
  "$PY" - "$1/results.json" <<'PY' || fail "job $2: results.json is not a 2-process, 3-step run"
import json, sys
r = json.load(open(sys.argv[1]))
sys.exit(0 if (r["processes"], r["steps"]) == (2, 3) else 1)
PY
}
newest() { find "$1/checkpoints" -mindepth 1 -maxdepth 1 -type d -regex '.*/[0-9]+' -printf '%f\n' 2>/dev/null | sort -n | tail -n 1 | grep . || echo 0; }
log0() { cat "$1/logs/$2-$3-0.out" 2>/dev/null || true; }  # log0 WORKDIR NAME JOBID: task 0's log

# --- reference: one process, the same mesh ------------------------------------------------------------------
stage reference "1 process x 2 CPU devices, no SLURM ($PY)"
"$PY" -m experiments.codegen "${FLAGS[@]}" --mesh_cpu_devices=2 --workdir="$RUNS/reference" \
  >"$RUNS/reference.log" 2>&1 || fail "the 1-process run failed (exit $?)"
REF="$(sha "$RUNS/reference")"
say "final SHA ${REF:0:16}"

# --- clean: the launcher, 2 tasks -----------------------------------------------------------------------------
stage clean "sbatch launch/slurm.sbatch, 2 tasks on $NODES node(s)"
WD="$RUNS/clean"
jid="$(submit "$WD" clean)" || fail "sbatch refused the job"
st="$(wait_end "$jid" 400)"
[[ "$st" == COMPLETED ]] || fail "job $jid ended $st"
nodelist="$(field "$jid" NodeList)"
grep -q "in 2 process(es)" <<<"$(log0 "$WD" clean "$jid")" || fail "task 0's log has no 2-process mesh line"
check_sha "$WD" "$jid"
say "job $jid on $nodelist COMPLETED; final SHA = 1-process SHA"

# --- kill: task 1's process SIGKILLed after the step-1 checkpoint ----------------------------------------------
stage kill "the same command; task 1 SIGKILLed after the step-1 checkpoint"
WD="$RUNS/faults"
submit_until_ckpt "$WD" faults 1
jid="$JID"
pid="$(task_pid "$jid" 1)" || fail "task 1 of job $jid not found"
kill -KILL "$pid"
t_kill=$(date +%s)
st="$(wait_end "$jid" 120)"
ended=$(($(date +%s) - t_kill))
[[ "$st" == FAILED ]] || fail "job $jid ended $st after the kill (expected FAILED)"
((ended <= HEARTBEAT + 20)) || fail "job $jid took $ended s to end after the kill"
[[ ! -f "$WD/results.json" ]] || fail "job $jid finished anyway (the kill came too late)"
line="$(grep -m1 "task 1: Killed" "$RUNS/faults-$jid.out")" || fail "no line naming task 1 in the batch log"
say "job $jid $st $ended s after the kill: $line"

# --- node loss: the resumed run loses task 1's node after the step-2 checkpoint --------------------------------
if ((NODES > 1)); then
  stage "node loss" "the same submission (it resumes); task 1's node lost after its first checkpoint"
  next=$(($(newest "$WD") + 1))
  ((next <= 2)) || fail "the killed run got as far as checkpoint $((next - 1)): too late for this stage"
  submit_until_ckpt "$WD" faults "$next"
  jid="$JID"
  pid="$(task_pid "$jid" 1)" || fail "task 1 of job $jid not found"
  node="$(2>/dev/null tr '\0' '\n' <"/proc/$pid/environ" | sed -n 's/^SLURMD_NODENAME=//p')"
  [[ -n "$node" ]] || fail "task 1's node unknown"
  slurmd_pid="$(cat "$SLURM_LOCAL_DIR/run/slurmd.$node.pid")"
  stepd_pid="$(ps -o ppid= -p "$pid" | tr -d ' ')"
  [[ "$(ps -o comm= -p "$stepd_pid")" == slurmstepd ]] || fail "task 1's parent is not its slurmstepd"
  kill -KILL "$slurmd_pid" "$stepd_pid" "$pid"
  t_kill=$(date +%s)
  say "node $node lost (slurmd $slurmd_pid, slurmstepd $stepd_pid, task $pid SIGKILLed)"
  until line="$(grep -m1 "error: lost process 1 of 2" "$WD/logs/faults-$jid-0.out")"; do
    (($(date +%s) - t_kill < HEARTBEAT + 30)) || fail "task 0 did not name the lost process"
    sleep 0.2
  done
  named=$(($(date +%s) - t_kill))
  ((named <= HEARTBEAT + 15)) || fail "task 0 named the lost process only after $named s"
  say "task 0 after $named s: ${line%%;*}"
  st="$(wait_end "$jid" 180)"
  ended=$(($(date +%s) - t_kill))
  [[ "$st" == NODE_FAIL || "$st" == FAILED ]] || fail "job $jid ended $st after the node loss"
  [[ ! -f "$WD/results.json" ]] || fail "job $jid finished anyway"
  say "job $jid $st $ended s after the node loss (SlurmdTimeout $(scontrol show config | sed -n 's/^SlurmdTimeout *= *//p'))"
  # the node comes back: its slurmd started again (it carries the cluster's marker: cluster.sh stops it)
  slurmd -D -N "$node" -f "$SLURM_CONF" >>"$SLURM_LOCAL_DIR/log/slurmd.$node.out" 2>&1 &
  for ((t = 0; t < 120; t++)); do
    [[ "$(sinfo -h -n "$node" -o %T)" == idle ]] && break
    sleep 0.5
  done
  [[ "$(sinfo -h -n "$node" -o %T)" == idle ]] || fail "node $node did not come back"
  say "node $node back (idle)"
fi

# --- resume: the same submission finishes ------------------------------------------------------------------
stage resume "the same submission again"
jid="$(submit "$WD" faults)" || fail "sbatch refused the job"
st="$(wait_end "$jid" 400)"
[[ "$st" == COMPLETED ]] || fail "job $jid ended $st"
resumed="$(grep -m1 -o "resumed from .*" <<<"$(log0 "$WD" faults "$jid")")" || fail "job $jid did not resume"
check_sha "$WD" "$jid"
say "job $jid COMPLETED, $resumed; final SHA = 1-process SHA"

# --- requeue -----------------------------------------------------------------------------------------------------
stage requeue "sbatch --requeue; scontrol requeue after the step-1 checkpoint"
WD="$RUNS/requeue"
submit_until_ckpt "$WD" requeue 1 --requeue
jid="$JID"
scontrol requeue "$jid" || fail "scontrol requeue $jid refused"
say "job $jid requeued"
st="$(wait_end "$jid" 500)"
[[ "$st" == COMPLETED ]] || fail "job $jid ended $st"
restarts="$(field "$jid" Restarts)"
((restarts >= 1)) || fail "job $jid was not restarted (Restarts=$restarts)"
log="$(log0 "$WD" requeue "$jid")"
saved="$(grep -m1 -o "signal received: checkpoint saved at step [0-9]*" <<<"$log")" \
  || fail "the first attempt did not save on SIGTERM (task 0's log)"
resumed="$(grep -m1 -o "resumed from .*" <<<"$log")" || fail "job $jid did not resume after the requeue"
grep -q "(attempt 2)" "$RUNS/requeue-$jid.out" || fail "the batch log does not show the second attempt"
check_sha "$WD" "$jid"
say "job $jid COMPLETED after $restarts requeue(s): $saved, then $resumed; final SHA = 1-process SHA"
stage done ""

if ((NODES > 1)); then
  loss="task kill and node loss survived, resumed bit-identical"
else
  loss="task kill survived (node loss skipped: one node), resumed bit-identical"
fi
echo "[selftest] times: $(IFS=';'; echo "${TIMES[*]}" | sed 's/;/, /g'); total $(($(date +%s) - SELFTEST_T0)) s"
echo "slurm: 2 tasks on $NODES node(s), final SHA = 1-process SHA; $loss; requeue resumed bit-identical"
