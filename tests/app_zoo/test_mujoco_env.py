"""MujocoEnv on Hopper-v5: contract, seeding, termination vs truncation (skipped without pip install -e .[mujoco])."""

from __future__ import annotations

import subprocess
import sys
from typing import List

import numpy as np
import pytest

pytest.importorskip("mujoco")
pytest.importorskip("imageio")

from app_zoo.mujoco import MujocoEnv  # noqa: E402 - after the importorskip
from nervex.envs.check_env import check_env  # noqa: E402
from nervex.utils import ENV_REGISTRY  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:gymnasium.utils.env_checker")  # infinite Box bounds


def rollout(env: MujocoEnv, seed: int, n_steps: int) -> List[np.ndarray]:
    space = env.info().act_space
    space.seed(seed)
    env.seed(seed)
    trace = [env.reset()]
    for _ in range(n_steps):
        ts = env.step(space.sample())
        trace.append(ts.obs)
        if ts.done:
            trace.append(env.reset())
    return trace


def test_registered_float32_obs_box_actions():
    assert ENV_REGISTRY.get("mujoco") is MujocoEnv
    env = MujocoEnv({"env_id": "Hopper-v5"})
    info = env.info()
    assert info.obs_space.shape == (11,) and info.obs_space.dtype == np.float32
    assert info.act_space.shape == (3,) and info.act_space.dtype == np.float32
    assert info.max_episode_steps == 1000
    env.seed(0)
    obs = env.reset()
    assert obs.dtype == np.float32 and info.obs_space.contains(obs)
    ts = env.step(np.zeros(3, np.float32))
    assert ts.obs.dtype == np.float32 and type(ts.reward) is float
    env.close()


@pytest.mark.parametrize("env_id", ["Hopper-v5", "HalfCheetah-v5"])
def test_check_env_passes(env_id: str):
    check_env(MujocoEnv({"env_id": env_id}), n_steps=200)


def test_same_seed_same_observations_other_seed_differs():
    first = rollout(MujocoEnv({}), seed=3, n_steps=50)
    second = rollout(MujocoEnv({}), seed=3, n_steps=50)
    assert len(first) == len(second)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    other = rollout(MujocoEnv({}), seed=4, n_steps=50)
    assert not np.array_equal(first[0], other[0])  # the initial-state noise follows the seed


def test_falling_terminates_and_the_time_limit_truncates():
    env = MujocoEnv({"env_id": "Hopper-v5"})
    env.seed(0)
    env.reset()
    for _ in range(1000):  # full torque on every joint topples the hopper within ~100 steps
        ts = env.step(np.ones(3, np.float32))
        if ts.done:
            break
    assert ts.info["terminated"] and not ts.info["truncated"]
    assert ts.info["episode_len"] < 1000

    short = MujocoEnv({"env_id": "Hopper-v5", "max_episode_steps": 5})
    short.seed(0)
    short.reset()
    dones = [short.step(np.zeros(3, np.float32)).done for _ in range(5)]
    assert dones == [False] * 4 + [True]
    assert short.info().max_episode_steps == 5


def test_without_mujoco_import_works_and_building_says_how_to_install():
    code = (
        "import sys; sys.modules['mujoco'] = None\n"
        "import app_zoo.mujoco\n"
        "from nervex.utils import ENV_REGISTRY\n"
        "assert 'mujoco' in ENV_REGISTRY\n"
        "try:\n"
        "    app_zoo.mujoco.MujocoEnv({})\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install -e .[mujoco]" in out.stdout
