#!/usr/bin/env bash
# nervex entry point.
#   ./run.sh train [CONFIG] [nervex CLI args]   train (default: CartPole DQN)
#   ./run.sh test  [pytest args]                run the default test suite (excludes @slow)
#   ./run.sh bench NAME [args]                  run bench/NAME.py (installs the [bench] peers)
#   ./run.sh dist CONFIG [--actors N]           parallel mode on this machine: coordinator, league manager, learner,
#                                               a manager and its actors on 127.0.0.1 (nervex/system/launch.py)
# Each command first creates or reuses the virtual environment .venv (override with NERVEX_VENV) and installs
# nervex into it, installing the CPU build torch==2.13.0 first when torch is absent.
set -euo pipefail
cd "$(dirname "$0")"

VENV="${NERVEX_VENV:-.venv}"
DEFAULT_CONFIG="app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml"
TORCH_PIN="torch==2.13.0"

pick_python() {
  for p in python3.11 python3.12 python3.10 python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
      echo "$p"; return 0
    fi
  done
  echo "run.sh: need Python >= 3.10" >&2; return 1
}

setup() {
  local extras="$1"
  if [ ! -x "$VENV/bin/python" ]; then
    echo "run.sh: creating virtual environment $VENV" >&2
    "$(pick_python)" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  fi
  PY="$VENV/bin/python"
  if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
    # pinned first: an unpinned torch (asked for by nervex or a peer library) would pull a multi-GB CUDA build
    echo "run.sh: installing $TORCH_PIN" >&2
    "$PY" -m pip install -q "$TORCH_PIN"
  fi
  local stamp="$VENV/.nervex-installed-$extras"
  if [ ! -f "$stamp" ] || [ setup.py -nt "$stamp" ]; then
    echo "run.sh: installing nervex[$extras]" >&2
    "$PY" -m pip install -q -e ".[$extras]"
    touch "$stamp"
  fi
}

cmd="${1:-train}"
[ $# -gt 0 ] && shift
case "$cmd" in
  train)
    setup test
    config="$DEFAULT_CONFIG"
    if [ $# -gt 0 ] && [[ "$1" != -* ]]; then config="$1"; shift; fi
    exec "$PY" -m nervex -m serial -c "$config" "$@"
    ;;
  test)
    setup test
    exec "$PY" -m pytest "$@"
    ;;
  bench)
    setup "test,bench"
    name="${1:?usage: ./run.sh bench NAME [args]   (NAME of bench/NAME.py)}"; shift
    exec "$PY" "bench/$name.py" "$@"
    ;;
  dist)
    setup test
    config="${1:?usage: ./run.sh dist CONFIG [--actors N] [--timeout S] [--run-dir DIR] [--set KEY=VALUE]}"; shift
    exec "$PY" -m nervex.system.launch "$config" "$@"
    ;;
  *)
    echo "usage: ./run.sh train [CONFIG] [args] | ./run.sh test [pytest args] | ./run.sh bench NAME [args] | ./run.sh dist CONFIG [args]" >&2
    exit 2
    ;;
esac
