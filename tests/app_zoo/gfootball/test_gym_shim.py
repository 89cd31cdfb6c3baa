"""The gfootball app without the engine: the old-gym shim, the missing-engine error, config checks, the configs."""

from __future__ import annotations

import glob
import os
import sys
from typing import Any, Dict, Tuple

import gymnasium
import numpy as np
import pytest

from app_zoo.gfootball.envs import FootballEnv, gym_shim
from app_zoo.gfootball.envs.gym_shim import OLD_GYM_MODULES, old_gym_api
from nervex.config import read_config
from nervex.entry.builder import compile_config
from nervex.utils import ENV_REGISTRY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "app_zoo", "gfootball", "config", "*.yaml")))


def make_counter_env(gym: Any) -> Any:
    """An env of the old gym API, written as gfootball writes them: reset() -> obs, step -> 4-tuple."""

    class CounterEnv(gym.Env):
        def __init__(self) -> None:
            self.count = 0
            self.secret = "kept"
            self._private = "hidden"

        @property
        def action_space(self) -> gymnasium.Space:
            return gym.spaces.Discrete(3)

        @property
        def observation_space(self) -> gymnasium.Space:
            return gym.spaces.Box(0, 10, (1,), np.float32)

        def reset(self) -> np.ndarray:
            self.count = 0
            return np.array([0.0], np.float32)

        def step(self, action: int) -> Tuple[np.ndarray, float, bool, Dict[str, Any]]:
            self.count += action
            return np.array([self.count], np.float32), float(action), self.count >= 4, {"score_reward": action}

    return CounterEnv()


def test_import_gym_inside_the_block_is_the_shim_and_the_old_modules_come_back():
    before = {name: sys.modules.get(name) for name in OLD_GYM_MODULES}
    with old_gym_api() as shim:
        import gym
        from gym.envs.registration import register

        assert gym is shim
        assert gym.Env is gymnasium.Env and gym.spaces is gymnasium.spaces
        assert gym.Wrapper is gym_shim.Wrapper
        register(id="GFootball-test-v0", entry_point="somewhere:make", kwargs={"a": 1})
    assert {name: sys.modules.get(name) for name in OLD_GYM_MODULES} == before
    # the ids gfootball registers stay out of Gymnasium's registry (they name old-API envs it could not drive)
    assert gym_shim.OLD_GYM_REGISTRY["GFootball-test-v0"]["kwargs"] == {"a": 1}
    assert "GFootball-test-v0" not in gymnasium.registry


def test_shim_wrappers_keep_the_old_api():
    with old_gym_api() as gym:

        class Double(gym.ObservationWrapper):
            def __init__(self, env: Any) -> None:
                gym.ObservationWrapper.__init__(self, env)
                self.observation_space = gym.spaces.Box(0, 20, (1,), np.float32)

            def observation(self, obs: np.ndarray) -> np.ndarray:
                return obs * 2

        class Negate(gym.RewardWrapper):
            def reward(self, reward: float) -> float:
                return -reward

        env = Negate(Double(make_counter_env(gym)))
    np.testing.assert_array_equal(env.reset(), [0.0])
    obs, reward, done, info = env.step(3)
    np.testing.assert_array_equal(obs, [6.0])  # 3, doubled
    assert (reward, done, info) == (-3.0, False, {"score_reward": 3})
    obs, reward, done, _ = env.step(2)
    np.testing.assert_array_equal(obs, [10.0])
    assert reward == -2.0 and done is True
    # spaces: the wrapper's own where it set one, else the wrapped env's
    assert env.observation_space.high[0] == 20 and env.action_space.n == 3
    # public attributes are forwarded, private ones are not (old gym's rule), unwrapped reaches the base env
    assert env.secret == "kept" and env.unwrapped.count == 5
    with pytest.raises(AttributeError, match="private"):
        _ = env._private


def test_shim_make_names_the_way_to_build_a_football_env():
    with old_gym_api() as gym:
        with pytest.raises(NotImplementedError, match="create_environment"):
            gym.make("GFootball-academy_empty_goal_close-simple115v2-v0")


def test_missing_engine_error_names_the_install_script(monkeypatch):
    for name in [n for n in sys.modules if n == "gfootball" or n.startswith("gfootball.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(gym_shim, "gfootball_available", lambda: False)
    with pytest.raises(ImportError, match=r"app_zoo/gfootball/install\.sh"):
        gym_shim.import_gfootball_env()
    env = FootballEnv({})  # building the object is cheap and needs no engine
    with pytest.raises(ImportError, match=r"install\.sh"):
        env.info()
    with pytest.raises(ImportError, match=r"install\.sh"):
        env.reset()


def test_registered_as_gfootball():
    assert ENV_REGISTRY.get("gfootball") is FootballEnv


@pytest.mark.parametrize(
    "cfg, error, match",
    [
        ({"env_nmae": "x"}, KeyError, "did you mean 'env_name'"),
        ({"representation": "pixels"}, ValueError, "'representation' must be one of"),
        ({"stacked": True}, ValueError, "'stacked' is for representation 'extracted'"),
        ({"rewards": "checkpoints"}, ValueError, "'rewards' must be one of"),
        ({"controlled_players": 0}, ValueError, "'controlled_players' must be an int in 1..11"),
        ({"controlled_players": True}, ValueError, "'controlled_players'"),
        ({"channel_dimensions": [96]}, ValueError, "'channel_dimensions'"),
        ({"max_episode_steps": 0}, ValueError, "'max_episode_steps'"),
        ({"engine_options": {"level": "11_vs_11_stochastic"}}, ValueError, "may not set \\['level'\\]"),
    ],
    ids=[
        "typo",
        "pixels",
        "stacked-vector",
        "rewards",
        "no-players",
        "bool-players",
        "dims",
        "limit",
        "engine-level",
    ],
)
def test_config_errors_name_the_key(cfg, error, match):
    with pytest.raises(error, match=match):
        FootballEnv(cfg)


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_shipped_gfootball_configs_compile(path):
    cfg = compile_config(read_config(path))
    assert cfg.env.env_type == "gfootball"
    FootballEnv({k: cfg.env[k] for k in FootballEnv.config})  # the env section passes the env's own checks


def test_three_configs_ship():
    names = {os.path.basename(p) for p in CONFIGS}
    assert {
        "academy_empty_goal_close_ppo.yaml",
        "academy_empty_goal_close_smm_ppo.yaml",
        "academy_3_vs_1_with_keeper_mappo.yaml",
    } <= names
