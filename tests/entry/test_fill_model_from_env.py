"""fill_model_from_env: sizes from the env's spaces (Dict 'obs', per-agent MultiDiscrete), or a ConfigError."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from nervex.config import ConfigError
from nervex.entry.builder import fill_model_from_env
from nervex.envs import BaseEnvInfo
from nervex.model import ConvDiscreteNet, FCDiscreteNet, ValueAC

BOARD = gym.spaces.Dict(
    {
        "obs": gym.spaces.Box(0, 1, (18,), np.float32),
        "action_mask": gym.spaces.Box(0, 1, (9,), np.int8),
        "to_play": gym.spaces.Discrete(2),
    }
)


def info(obs_space, act_space, agent_num=1, **kw) -> BaseEnvInfo:
    return BaseEnvInfo(agent_num, obs_space, act_space, **kw)


def test_a_dict_observation_is_sized_from_its_obs_key():
    cfg = {}
    fill_model_from_env(cfg, FCDiscreteNet, info(BOARD, gym.spaces.Discrete(9), 2, turn_based=True))
    assert cfg == {"obs_dim": 18, "action_dim": 9}


def test_a_dict_without_obs_names_the_key_to_set():
    space = gym.spaces.Dict({"image": gym.spaces.Box(0, 1, (4,)), "mask": gym.spaces.Box(0, 1, (2,))})
    with pytest.raises(ConfigError, match=r"without an 'obs' key \(keys: \['image', 'mask'\]\); set model.obs_dim"):
        fill_model_from_env({}, FCDiscreteNet, info(space, gym.spaces.Discrete(2)))
    cfg = {"obs_dim": 4}  # set by the user: nothing to size, nothing raised
    fill_model_from_env(cfg, FCDiscreteNet, info(space, gym.spaces.Discrete(2)))
    assert cfg == {"obs_dim": 4, "action_dim": 2}


def test_an_image_obs_key_fills_obs_shape():
    space = gym.spaces.Dict({"obs": gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), "action_mask": BOARD["action_mask"]})
    cfg = {}
    fill_model_from_env(cfg, ConvDiscreteNet, info(space, gym.spaces.Discrete(9)))
    assert cfg == {"obs_shape": [4, 84, 84], "action_dim": 9}


def test_a_per_agent_multidiscrete_gives_one_agents_action_count():
    obs = gym.spaces.Dict({"obs": gym.spaces.Box(-1, 1, (3, 5), np.float32)})  # 3 agents, 5 features each
    cfg = {}
    fill_model_from_env(cfg, ValueAC, info(obs, gym.spaces.MultiDiscrete([4, 4, 4]), 3))
    assert cfg == {"obs_dim": 5, "action_dim": 4, "action_space": "discrete"}


def test_a_per_agent_box_gives_one_agents_action_size_and_bounds():
    from nervex.model import QAC

    obs = gym.spaces.Dict({"obs": gym.spaces.Box(-1, 1, (3, 5), np.float32)})
    act = gym.spaces.Box(np.array([[-1.0, 0.0]] * 3), np.array([[1.0, 2.0]] * 3), dtype=np.float32)
    cfg = {}
    fill_model_from_env(cfg, QAC, info(obs, act, 3))
    assert cfg == {"obs_dim": 5, "action_dim": 2, "action_low": [-1.0, 0.0], "action_high": [1.0, 2.0]}
    uneven = gym.spaces.Box(np.array([[-1.0], [-2.0]]), np.array([[1.0], [2.0]]), dtype=np.float32)
    two = gym.spaces.Dict({"obs": gym.spaces.Box(-1, 1, (2, 5), np.float32)})
    with pytest.raises(ConfigError, match=r"different bounds; a shared agent net needs one: set model.action_low"):
        fill_model_from_env({}, QAC, info(two, uneven, 2))
    cfg = {"action_low": -2.0, "action_high": 2.0}  # set by the user: the action size is still one agent's
    fill_model_from_env(cfg, QAC, info(two, uneven, 2))
    assert cfg["action_dim"] == 1


def test_a_multidiscrete_of_unequal_sizes_names_model_action_dim():
    with pytest.raises(ConfigError, match=r"different action counts \[2, 4\]; .* set model.action_dim"):
        fill_model_from_env({}, FCDiscreteNet, info(gym.spaces.Box(-1, 1, (2, 3)), gym.spaces.MultiDiscrete([4, 2]), 2))


@pytest.mark.parametrize(
    "obs_space, act_space, match",
    [
        (gym.spaces.Tuple([gym.spaces.Discrete(2)]), gym.spaces.Discrete(2), r"observation space Tuple.*model.obs_dim"),
        (
            gym.spaces.Box(-1, 1, (3,)),
            gym.spaces.MultiBinary(4),
            r"action space MultiBinary\(4\); set model.action_dim",
        ),
    ],
)
def test_spaces_it_cannot_size_raise_naming_the_key(obs_space, act_space, match):
    with pytest.raises(ConfigError, match=match):
        fill_model_from_env({}, FCDiscreteNet, info(obs_space, act_space))


def test_single_agent_box_and_discrete_are_unchanged():
    cfg = {}
    fill_model_from_env(cfg, FCDiscreteNet, info(gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)))
    assert cfg == {"obs_dim": 4, "action_dim": 2}
    cfg = {}
    fill_model_from_env(cfg, ValueAC, info(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (1,))))
    assert cfg == {"obs_dim": 3, "action_dim": 1, "action_space": "continuous"}


def test_a_per_agent_box_action_sizes_one_agent():
    """A simultaneous-move env's Box((agent_num, act_dim)) sizes one agent's action and bounds (ATOC's actor)."""
    from nervex.model import ATOC

    box = gym.spaces.Box(np.zeros((5, 2)), np.ones((5, 2)) * [1.0, 2.0], dtype=np.float32)
    obs = gym.spaces.Dict(obs=gym.spaces.Box(-1, 1, (5, 6), np.float32))
    info = BaseEnvInfo(agent_num=5, obs_space=obs, act_space=box, agent_ids=tuple(f"a{i}" for i in range(5)))
    cfg = {}
    fill_model_from_env(cfg, ATOC, info)
    assert cfg["obs_dim"] == 6 and cfg["action_dim"] == 2 and cfg["agent_num"] == 5
    assert cfg["action_low"] == [0.0, 0.0] and cfg["action_high"] == [1.0, 2.0]
    uneven = gym.spaces.Box(np.zeros((5, 2)), np.arange(1, 11, dtype=np.float64).reshape(5, 2), dtype=np.float32)
    with pytest.raises(ConfigError, match="different bounds"):
        fill_model_from_env({}, ATOC, info._replace(act_space=uneven))
