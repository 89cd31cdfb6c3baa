#!/usr/bin/env bash
# Build and install Google Research Football (the `gfootball` engine) into a virtual environment.
#
#   app_zoo/gfootball/install.sh [VENV]      # VENV defaults to .venv (relative to the current directory)
#
# Installs the Debian packages the engine's README lists (compiler, CMake, SDL2, OpenGL/EGL, Boost), then builds
# the engine from gfootball's source package on PyPI (28 minutes on a busy 2-core machine). Idempotent: a second run
# skips what is already there. Needs root (or sudo) for apt-get. NICE="" disables the lowered compile priority.
#
# gfootball declares `gym>=0.11` as a dependency. nervex does not depend on `gym`: the package is installed with
# --no-deps and its other dependencies are installed explicitly; nervex's wrapper (app_zoo/gfootball/envs/gym_shim.py)
# makes gfootball's `import gym` resolve to Gymnasium while gfootball is imported.
set -euo pipefail

VENV="${1:-.venv}"
GFOOTBALL_VERSION="${GFOOTBALL_VERSION:-2.10.2}"
PY="$VENV/bin/python"
NICE="${NICE-nice -n 5}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

if [[ ! -x "$PY" ]]; then
    echo "install.sh: no Python interpreter at $PY; pass the virtual environment as the first argument" >&2
    exit 2
fi

# `import gfootball` would import `gym`; the engine's compiled module and the package version are enough to check.
if "$PY" - "$GFOOTBALL_VERSION" >/dev/null 2>&1 <<'EOF'
import importlib.metadata, importlib.util, sys
assert importlib.metadata.version("gfootball") == sys.argv[1]
assert importlib.util.find_spec("gfootball_engine._gameplayfootball") is not None
EOF
then
    echo "gfootball $GFOOTBALL_VERSION already installed in $VENV"
    exit 0
fi

SUDO=""
if [[ "$(id -u)" != "0" ]]; then
    SUDO="sudo"
fi

# The specific Boost libraries the engine links (thread, system, filesystem, python) instead of libboost-all-dev.
DEB_PACKAGES=(
    build-essential cmake pkg-config
    libgl1-mesa-dev libegl1-mesa-dev
    libsdl2-dev libsdl2-image-dev libsdl2-ttf-dev libsdl2-gfx-dev
    libboost-thread-dev libboost-system-dev libboost-filesystem-dev libboost-python-dev
    python3-dev
)
missing=()
for pkg in "${DEB_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if (( ${#missing[@]} )); then
    echo "installing Debian packages: ${missing[*]}"
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi

# gfootball's runtime dependencies, without `gym` (see above). pygame-ce also provides the `pygame` module.
"$PY" -m pip install setuptools wheel psutil absl-py scipy
"$PY" -c "import pygame" >/dev/null 2>&1 || "$PY" -m pip install "pygame>=1.9.6"
"$PY" -c "import cv2" >/dev/null 2>&1 || "$PY" -m pip install opencv-python-headless

# build_game_engine.sh calls `python3 -c 'import psutil'` and cmake looks for Python: put the venv first on PATH.
PATH="$(cd "$VENV/bin" && pwd):$PATH"
export PATH
$NICE "$PY" -m pip install --no-deps --no-build-isolation --no-binary gfootball -v "gfootball==$GFOOTBALL_VERSION"

"$PY" - "$REPO_ROOT" <<'EOF'
import sys

sys.path.insert(0, sys.argv[1])
from app_zoo.gfootball.envs.gym_shim import import_gfootball_env

football_env = import_gfootball_env()
env = football_env.create_environment(env_name="academy_empty_goal_close", representation="simple115v2")
obs = env.reset()
print("gfootball installed; simple115v2 observation shape", obs.shape)
env.close()
EOF
