#!/usr/bin/env bash
# The parallel mode on this machine, the nerveX tutorial's way: every role in the background on 127.0.0.1, then wait
# for the learner (it stops the run at stop_val, max_env_step or max_train_iter) and stop the rest.
#   app_zoo/classic_control/cartpole/dist/run_local.sh [CONFIG]        (ACTORS=2 ... for two actors)
# ./run.sh dist CONFIG does the same from Python (nervex/system/launch.py) and also stops the run when a role dies.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
CONFIG="${1:-app_zoo/classic_control/cartpole/dist/cartpole_dqn_dist.yaml}"
ACTORS="${ACTORS:-1}"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
RUN_DIR="${RUN_DIR:-runs/$(basename "$CONFIG" .yaml)__$(date +%Y%m%d-%H%M%S)}"
ARGS=(--config "$CONFIG" --run-dir "$RUN_DIR")
mkdir -p "$RUN_DIR/logs"

pids=()
stop_all() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# every role finds the coordinator through $RUN_DIR/coordinator.url, so the order below does not matter
for role in coordinator league_manager; do
  "$PY" -u -m "nervex.system.${role}_start" "${ARGS[@]}" >>"$RUN_DIR/logs/$role.stderr" 2>&1 &
  pids+=($!)
done
"$PY" -u -m nervex.system.manager_start "${ARGS[@]}" --actors "$ACTORS" >>"$RUN_DIR/logs/manager.stderr" 2>&1 &
pids+=($!)
"$PY" -u -m nervex.system.learner_start "${ARGS[@]}" >>"$RUN_DIR/logs/learner.stderr" 2>&1 &
learner=$!
pids+=($learner)
echo "run_local.sh: run directory $RUN_DIR (logs in $RUN_DIR/logs)" >&2
status=0
wait "$learner" || status=$?
echo "run_local.sh: learner exited with status $status" >&2
[ -f "$RUN_DIR/eval.csv" ] && tail -n 1 "$RUN_DIR/eval.csv" >&2
exit "$status"
