#!/usr/bin/env bash
# The parallel mode under Slurm, the nerveX tutorial's way: one srun step per role group.
#   app_zoo/classic_control/cartpole/dist/run_slurm.sh PARTITION [CONFIG]
# Environment: LEARNERS (learner ranks, default 1: >1 trains data-parallel with torch.distributed), NODES (nodes with
# a manager and its actors, default 1), LEARNER_NODES (nodes the learner ranks spread over; default: Slurm's choice),
# ACTORS (actors per manager, default: system.manager.actors), COORD_HOST (the
# coordinator's bind address; default "node": the address of the node Slurm places the coordinator on, whatever it
# is, so the address and the node always agree; 127.0.0.1 only when every role runs on one node), RUN_DIR (on a file system every node mounts; the SQLite
# files must be on node-local disk, see docs/parallel.md), LEARNER_RESTARTS (default 3: a learner step that fails, e.g.
# a rank killed, is started again and resumes from its newest checkpoint, at most this many times), LEAGUE_RESTARTS
# (default 3: the same for the league manager step; its league lives in the coordinator's SQLite, and while it is down
# the coordinator names the learner's newest snapshot in each task), MANAGER_RESTARTS (default 5: the managers' step,
# which Slurm cancels when a node of it is cut off, started again with growing waits), COORDINATOR_RESTARTS (default
# 5: the same for the coordinator's step).
set -euo pipefail
PARTITION="${1:?usage: run_slurm.sh PARTITION [CONFIG]}"
cd "$(dirname "$0")/../../../.."
CONFIG="${2:-app_zoo/classic_control/cartpole/dist/cartpole_dqn_dist.yaml}"
PY="${PYTHON:-$PWD/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
LEARNERS="${LEARNERS:-1}"
NODES="${NODES:-1}"
COORD_HOST="${COORD_HOST:-node}"
TAG="$$"  # this run's steps are named nervex-<role>-$TAG: the end of the run signals them, and nothing else
GRACE_S="${GRACE_S:-60}"
RUN_DIR="${RUN_DIR:-runs/$(basename "$CONFIG" .yaml)__$(date +%Y%m%d-%H%M%S)}"
ARGS=(--config "$CONFIG" --run-dir "$RUN_DIR")
ACTOR_ARGS=()
[ -n "${ACTORS:-}" ] && ACTOR_ARGS=(--actors "$ACTORS")
mkdir -p "$RUN_DIR/logs"
STOP_MARK="$RUN_DIR/logs/.run_slurm_stopping"
rm -f "$STOP_MARK"

pids=()
alive() { local pid; for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }
wait_steps() { # SECONDS: wait until every step has ended, at most that long; whether they all ended
  local deadline=$((SECONDS + $1))
  while alive; do [ "$SECONDS" -ge "$deadline" ] && return 1; sleep 1; done
  return 0
}
term_steps() { # SIGTERM the tasks of this run's steps still running (scancel --signal signals, it does not cancel)
  local ids
  ids=$(squeue -h -s -o "%i %j" 2>/dev/null | awk -v tag="-$TAG" 'index($2, "nervex-") == 1 && substr($2, length($2) - length(tag) + 1) == tag {print $1}')
  [ -n "$ids" ] && scancel --signal=TERM $ids 2>/dev/null || true
}
stop_all() {
  touch "$STOP_MARK"  # the steps that end from here on are not started again
  # the roles stop by themselves once the run finished (the coordinator drains its stop, then exits); whatever still
  # runs gets SIGTERM (each role logs its clean stop), and only after GRACE_S more does srun cancel (SIGKILL) it
  if [ -z "${INTERRUPTED:-}" ]; then
    wait_steps "$GRACE_S" && { wait 2>/dev/null || true; return; }
  fi
  echo "run_slurm.sh: sending SIGTERM to the steps still running" >&2
  term_steps
  wait_steps "$GRACE_S" || for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_all EXIT
trap 'INTERRUPTED=1; exit 130' INT TERM

# keep_running RESTARTS NAME LOG COMMAND...: run COMMAND (output appended to LOG), and again when it fails or ends
# before the run finished, at most RESTARTS more times, waiting 2, 4, 8, 16, then 30 s; SIGTERM stops the command and
# the loop
keep_running() {
  local restarts=$1 name=$2 log=$3 attempt=0 status child=""
  shift 3
  trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; exit 143' TERM
  while :; do
    "$@" >>"$log" 2>&1 &
    child=$!
    status=0
    wait "$child" || status=$?
    # over when the run is (the coordinator wrote run_finished.json before telling anyone to stop) or this script
    # stops; a step that ended with 0 before that was stopped from outside (Slurm cancels a step when one of its
    # nodes is cut off, and its roles stop cleanly on the SIGTERM) and is started again like a failed one
    [ "$status" -eq 0 ] && { [ -e "$RUN_DIR/run_finished.json" ] || [ -e "$STOP_MARK" ]; } && return 0
    echo "run_slurm.sh: the $name step exited with status $status before the run finished" >&2
    [ "$attempt" -ge "$restarts" ] && return "$status"
    attempt=$((attempt + 1))
    local wait_s=$((1 << attempt)); [ "$wait_s" -gt 30 ] && wait_s=30  # 2, 4, 8, 16, 30 s: outlasts a partition
    echo "run_slurm.sh: starting the $name step again ($attempt of $restarts) in $wait_s s" >&2
    sleep "$wait_s"
  done
}

# the coordinator resumes from its SQLite files when started again (on whichever node: the roles read its new
# address from $RUN_DIR/coordinator.url)
keep_running "${COORDINATOR_RESTARTS:-5}" "coordinator" "$RUN_DIR/logs/coordinator.stderr" \
  srun -p "$PARTITION" --job-name="nervex-coordinator-$TAG" -N1 -n1 \
  "$PY" -u -m nervex.system.coordinator_start "${ARGS[@]}" --host "$COORD_HOST" --exit-when-finished &
pids+=($!)
keep_running "${LEAGUE_RESTARTS:-3}" "league manager" "$RUN_DIR/logs/league_manager.stderr" \
  srun -p "$PARTITION" --job-name="nervex-league-$TAG" -N1 -n1 "$PY" -u -m nervex.system.league_manager_start "${ARGS[@]}" &
pids+=($!)
# a step over several nodes is cancelled by Slurm when one of them stops answering slurmctld (a partition: "NODE
# FAILURE"); it is started again once the nodes are back, and its actors register anew
keep_running "${MANAGER_RESTARTS:-5}" "manager" "$RUN_DIR/logs/manager.stderr" \
  srun -p "$PARTITION" --job-name="nervex-manager-$TAG" -N"$NODES" --ntasks-per-node=1 \
  "$PY" -u -m nervex.system.manager_start "${ARGS[@]}" "${ACTOR_ARGS[@]}" &
pids+=($!)
# the learner ranks as one step: a rank that fails ends the step (the others would wait on it until the
# process-group timeout); ranks come from SLURM_PROCID / SLURM_NTASKS, never SLURM_LOCALID. A failed step is started
# again: the new ranks resume from the newest valid checkpoint in $RUN_DIR/ckpt.
LEARNER_RESTARTS="${LEARNER_RESTARTS:-3}"
LEARNER_PLACEMENT=()  # LEARNER_NODES=N: the ranks spread over N nodes (Slurm packs them as it likes otherwise)
[ -n "${LEARNER_NODES:-}" ] && LEARNER_PLACEMENT=(-N"$LEARNER_NODES")
echo "run_slurm.sh: run directory $RUN_DIR (logs in $RUN_DIR/logs)" >&2
attempt=0
while :; do
  srun -p "$PARTITION" --job-name="nervex-learner-$TAG" -n"$LEARNERS" "${LEARNER_PLACEMENT[@]}" --kill-on-bad-exit=1 \
    "$PY" -u -m nervex.system.learner_start "${ARGS[@]}" >>"$RUN_DIR/logs/learner.stderr" 2>&1 &
  learner=$!
  pids+=($learner)
  status=0
  wait "$learner" || status=$?
  echo "run_slurm.sh: learner step exited with status $status" >&2
  if [ "$status" -eq 0 ] || [ "$attempt" -ge "$LEARNER_RESTARTS" ]; then
    break
  fi
  attempt=$((attempt + 1))
  echo "run_slurm.sh: starting the learner step again from its newest checkpoint ($attempt of $LEARNER_RESTARTS)" >&2
  wait_s=$((1 << attempt)); [ "$wait_s" -gt 30 ] && wait_s=30
  sleep "$wait_s"
done
[ -f "$RUN_DIR/eval.csv" ] && tail -n 1 "$RUN_DIR/eval.csv" >&2
exit "$status"
