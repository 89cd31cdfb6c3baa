"""app_zoo.classic_control: CartPoleEnv and PendulumEnv, registered on import."""

import gymnasium as gym
import numpy as np
import pytest

from nervex.envs import get_env_cls
from nervex.envs.check_env import check_env
from nervex.utils import ENV_REGISTRY


def test_import_registers_cartpole_and_pendulum():
    import app_zoo.classic_control  # noqa: F401
    from app_zoo.classic_control.cartpole.envs import CartPoleEnv
    from app_zoo.classic_control.pendulum.envs import PendulumEnv

    assert ENV_REGISTRY.get("cartpole") is CartPoleEnv and ENV_REGISTRY.get("pendulum") is PendulumEnv
    assert get_env_cls("cartpole") is CartPoleEnv


@pytest.mark.filterwarnings("ignore:.*infinity.*:UserWarning")
def test_cartpole_env_info():
    from app_zoo.classic_control.cartpole.envs import CartPoleEnv

    info = CartPoleEnv(cfg={}).info()
    assert (info.agent_num, info.obs_space.shape, info.obs_space.dtype) == (1, (4,), np.float32)
    assert info.act_space == gym.spaces.Discrete(2) and info.max_episode_steps == 500
    check_env(CartPoleEnv(cfg={}), n_steps=200)


def test_pendulum_env_info_and_truncation():
    from app_zoo.classic_control.pendulum.envs import PendulumEnv

    env = PendulumEnv(cfg={"max_episode_steps": 3})
    info = env.info()
    assert info.act_space == gym.spaces.Box(-2.0, 2.0, (1,), np.float32) and info.obs_space.shape == (3,)
    assert PendulumEnv(cfg={}).info().max_episode_steps == 200
    env.seed(0)
    env.reset()
    steps = [env.step(np.array([0.0], dtype=np.float32)) for _ in range(3)]
    assert [(s.done, s.info["terminated"], s.info["truncated"]) for s in steps] == [
        (False, False, False),
        (False, False, False),
        (True, False, True),
    ]
    assert steps[-1].info["episode_return"] == pytest.approx(sum(float(s.reward) for s in steps), rel=1e-6)
