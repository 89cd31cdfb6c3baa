"""The many-agent contract helpers: agent_array, team_value, reward_shape, sample_action (hand values)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from nervex.envs import BaseEnvInfo, agent_array, reward_shape, sample_action, team_value

IDS = ("player_1", "player_2", "player_3")


def test_agent_array_orders_a_dict_as_agent_ids():
    out = agent_array({"player_3": 3.5, "player_1": -1.0, "player_2": 0.25}, IDS)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [-1.0, 0.25, 3.5])


def test_agent_array_stacks_per_agent_arrays_and_keeps_the_dtype():
    out = agent_array({"b": np.array([1, 2]), "a": np.array([3, 4])}, ("a", "b"), dtype=np.int8)
    assert out.dtype == np.int8
    np.testing.assert_array_equal(out, [[3, 4], [1, 2]])


def test_agent_array_accepts_an_array_already_in_agent_order():
    np.testing.assert_array_equal(agent_array([1, 2, 3], IDS), [1.0, 2.0, 3.0])


def test_agent_array_names_an_unknown_agent():
    with pytest.raises(KeyError, match=r"unknown agent id\(s\) \['player_9'\].*player_1"):
        agent_array({"player_1": 1, "player_2": 2, "player_3": 3, "player_9": 0}, IDS)


def test_agent_array_names_a_missing_agent():
    with pytest.raises(KeyError, match=r"no value for agent\(s\) \['player_2'\]"):
        agent_array({"player_1": 1, "player_3": 3}, IDS)


@pytest.mark.parametrize("value", [1.0, [1.0, 2.0]])
def test_agent_array_refuses_a_value_without_one_entry_per_agent(value):
    with pytest.raises(ValueError, match=r"one entry per agent \(3 agents"):
        agent_array(value, IDS)


def test_team_value_sum_and_mean():
    rewards = np.array([1.0, -2.0, 4.0])
    assert team_value(rewards, "sum") == 3.0
    assert team_value(rewards, "mean") == 1.0
    assert team_value(2.5, "mean") == 2.5  # a single agent's scalar is its own team value
    with pytest.raises(ValueError, match=r"unknown reduction 'max'.*\('sum', 'mean'\)"):
        team_value(rewards, "max")


def test_reward_shape_from_rew_space():
    box = gym.spaces.Box(-1, 1, (1,))
    assert reward_shape(BaseEnvInfo(1, box, gym.spaces.Discrete(2))) == ()
    assert reward_shape(BaseEnvInfo(1, box, gym.spaces.Discrete(2), gym.spaces.Box(-1, 1, ()))) == ()
    per_agent = BaseEnvInfo(3, box, gym.spaces.MultiDiscrete([2, 2, 2]), gym.spaces.Box(-1, 1, (3,)), agent_ids=IDS)
    assert reward_shape(per_agent) == (3,)


def _chi_square(counts: np.ndarray) -> float:
    expected = counts.sum() / len(counts)
    return float(((counts - expected) ** 2 / expected).sum())


def test_sample_action_discrete_is_uniform_over_legal_actions_only():
    rng = np.random.default_rng(0)
    mask = np.array([1, 0, 1, 1, 0, 0, 1, 0, 1], dtype=np.int8)
    draws = np.array([sample_action(gym.spaces.Discrete(9), mask, rng) for _ in range(5000)])
    counts = np.bincount(draws, minlength=9)
    assert counts[mask == 0].sum() == 0
    # 4 degrees of freedom: P(chi2 > 18.5) < 0.001, so a fair sampler passes and a skewed one (e.g. +10% on one
    # action: chi2 ~ 10 per 1000 draws of it) would not for long
    assert _chi_square(counts[mask == 1]) < 18.5
    assert isinstance(draws[0], np.int64)


def test_sample_action_discrete_with_start_and_no_mask():
    rng = np.random.default_rng(1)
    draws = [int(sample_action(gym.spaces.Discrete(3, start=-1), None, rng)) for _ in range(300)]
    assert set(draws) == {-1, 0, 1}


def test_sample_action_multidiscrete_follows_each_agents_mask():
    rng = np.random.default_rng(2)
    space = gym.spaces.MultiDiscrete([3, 3])
    mask = np.array([[0, 1, 1], [1, 0, 0]], dtype=bool)
    draws = np.array([sample_action(space, mask, rng) for _ in range(3000)])
    assert draws.dtype == np.int64 and draws.shape == (3000, 2)
    assert set(draws[:, 1]) == {0}  # agent 1 has a single legal action
    counts = np.bincount(draws[:, 0], minlength=3)
    assert counts[0] == 0
    assert _chi_square(counts[1:]) < 10.8  # 1 degree of freedom, P < 0.001


def test_sample_action_multidiscrete_of_unequal_sizes_ignores_columns_past_an_agents_size():
    rng = np.random.default_rng(3)
    mask = np.array([[1, 1, 1], [1, 1, 1]])  # agent 1 has 2 actions: its third column means nothing
    draws = np.array([sample_action(gym.spaces.MultiDiscrete([3, 2]), mask, rng) for _ in range(500)])
    assert draws[:, 1].max() == 1 and draws[:, 0].max() == 2


def test_sample_action_box_stays_in_bounds():
    rng = np.random.default_rng(4)
    space = gym.spaces.Box(np.array([-1, 0], np.float32), np.array([1, 5], np.float32), dtype=np.float32)
    draws = np.array([sample_action(space, None, rng) for _ in range(1000)])
    assert draws.dtype == np.float32
    assert (draws >= space.low).all() and (draws <= space.high).all()
    assert abs(draws[:, 1].mean() - 2.5) < 0.2  # uniform on [0, 5]


@pytest.mark.parametrize(
    "space, mask, match",
    [
        (gym.spaces.Discrete(3), [0, 0, 0], r"allows no action \(all 3 entries are 0\)"),
        (gym.spaces.Discrete(3), [1, 1], r"shape \(2,\); the action space needs \(3,\)"),
        (gym.spaces.MultiDiscrete([2, 2]), [[1, 1]], r"needs one row per agent, shaped \(2, 2\)"),
        (gym.spaces.MultiDiscrete([2, 2]), [[1, 1], [0, 0]], r"agent 1's action_mask allows no action"),
        (gym.spaces.Box(-1, 1, (2,)), [1, 1], r"has no discrete actions to mask"),
    ],
)
def test_sample_action_refuses_a_bad_mask(space, mask, match):
    with pytest.raises(ValueError, match=match):
        sample_action(space, np.asarray(mask), np.random.default_rng(0))


def test_sample_action_is_reproducible_from_the_generator():
    space, mask = gym.spaces.Discrete(9), np.ones(9)
    a = [sample_action(space, mask, np.random.default_rng(7)) for _ in range(3)]
    assert len(set(a)) == 1


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(agent_ids=("a", "b")), r"agent_num = 3 but agent_ids names 2"),
        (dict(agent_ids=("a", "a", "b")), r"agent_ids must be a tuple of distinct str"),
        (dict(team_reward="max"), r"team_reward must be one of \('sum', 'mean'\)"),
        (dict(rew_space=gym.spaces.Box(-1, 1, (2,))), r"rew_space has shape \(2,\); it must be \(\) .* or \(3,\)"),
        (dict(turn_based=True), r"turn_based is True but obs_space has no 'to_play' key"),
    ],
)
def test_check_env_refuses_inconsistent_agent_fields(change, match):
    from nervex.envs.check_env import EnvCheckError, _check_env_info

    info = BaseEnvInfo(3, gym.spaces.Box(-1, 1, (1,)), gym.spaces.MultiDiscrete([2, 2, 2]), agent_ids=("a", "b", "c"))
    _check_env_info(info)
    with pytest.raises(EnvCheckError, match=match):
        _check_env_info(info._replace(**change))
