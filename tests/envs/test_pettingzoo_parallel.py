"""The PettingZoo ParallelEnv adapter: mpe2 simple_spread against the raw env, hand-written toy envs for the two mask
conventions, agents that finish early and the terminated/truncated rule; PettingZoo's parallel_api_test on the view."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")

from pettingzoo.test import parallel_api_test  # noqa: E402
from pettingzoo.utils.env import ParallelEnv  # noqa: E402

from nervex.envs import PettingZooParallelEnv, TwoStepGameEnv, check_env, create_env, to_parallel_env  # noqa: E402
from nervex.envs.pettingzoo_parallel import callable_env_id  # noqa: E402
from nervex.worker.actor.env_manager import BaseEnvManager, SubprocessEnvManager  # noqa: E402


class ToyParallelEnv(ParallelEnv):
    """Two agents: ``a`` (Discrete(3), obs of 2) and ``b`` (Discrete(2), obs of 4); no ``state()``.

    Step ``t`` (from 1): each acting agent's reward is ``10 * t + its action``; ``obs`` of agent ``i`` is
    ``[i, t, ...]``. Legal actions (both conventions): ``a`` may not take ``t % 3``; ``b`` may take only ``t % 2``.
    ``b`` terminates after ``b_steps`` steps (early); ``a`` ends after ``a_steps``, truncated if ``a_truncates``.
    ``mask_in``: ``'infos'`` (``infos[agent]['action_mask']``), ``'obs'`` (a dict observation) or ``None``.
    """

    metadata = {"name": "toy_parallel"}

    def __init__(self, mask_in: Optional[str] = "infos", b_steps: int = 2, a_steps: int = 4, a_truncates=True):
        self.possible_agents = ["a", "b"]
        self.mask_in, self.b_steps, self.a_steps, self.a_truncates = mask_in, b_steps, a_steps, a_truncates
        self.sizes, self.nums = {"a": 2, "b": 4}, {"a": 3, "b": 2}
        self.agents: List[str] = []
        self.t = 0
        self.obs_spaces = {a: self._obs_space(a) for a in self.possible_agents}
        self.act_spaces = {a: gym.spaces.Discrete(self.nums[a]) for a in self.possible_agents}

    def _obs_space(self, agent: str) -> gym.Space:
        box = gym.spaces.Box(-100, 100, (self.sizes[agent],), np.float32)
        if self.mask_in != "obs":
            return box
        return gym.spaces.Dict(observation=box, action_mask=gym.spaces.Box(0, 1, (self.nums[agent],), np.int8))

    def observation_space(self, agent: str) -> gym.Space:
        return self.obs_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self.act_spaces[agent]

    def _mask(self, agent: str) -> np.ndarray:
        if agent == "a":
            mask = np.ones(3, np.int8)
            mask[self.t % 3] = 0
        else:
            mask = np.zeros(2, np.int8)
            mask[self.t % 2] = 1
        return mask

    def _obs(self) -> Dict[str, Any]:
        out = {}
        for i, agent in enumerate(self.agents):
            row = np.zeros(self.sizes[agent], np.float32)
            row[:2] = [i if agent == "a" else 1, self.t]
            out[agent] = {"observation": row, "action_mask": self._mask(agent)} if self.mask_in == "obs" else row
        return out

    def _infos(self) -> Dict[str, Any]:
        return {a: ({"action_mask": self._mask(a)} if self.mask_in == "infos" else {}) for a in self.agents}

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return self._obs(), self._infos()

    def step(self, actions):
        for agent in self.agents:
            if not self._mask(agent)[actions[agent]]:
                raise AssertionError(f"toy env: {agent} took masked action {actions[agent]} at t={self.t}")
        assert set(actions) == set(self.agents), f"actions for {sorted(actions)}, live {self.agents}"
        self.t += 1
        rewards = {a: 10.0 * self.t + actions[a] for a in self.agents}
        terms = {a: False for a in self.agents}
        truncs = {a: False for a in self.agents}
        if "b" in self.agents and self.t >= self.b_steps:
            terms["b"] = True
        if self.t >= self.a_steps:
            (truncs if self.a_truncates else terms)["a"] = True
        obs, infos = self._obs(), self._infos()
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos


def make_toy(**kwargs) -> ToyParallelEnv:
    return ToyParallelEnv(**kwargs)


def toy(**kwargs) -> PettingZooParallelEnv:
    return PettingZooParallelEnv({"env_id": callable_env_id(make_toy), "env_kwargs": kwargs})


def legal(obs: Dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray([int(np.flatnonzero(row)[0]) for row in obs["action_mask"]], np.int64)


# ---- simple_spread ------------------------------------------------------------------------------------------------
def test_simple_spread_layout_and_state():
    env = create_env({"env_type": "pettingzoo_parallel", "env_id": "mpe2.simple_spread_v3"})
    info = env.info()
    assert info.agent_ids == ("agent_0", "agent_1", "agent_2") and info.agent_num == 3
    assert info.act_space == gym.spaces.MultiDiscrete([5, 5, 5]) and info.max_episode_steps == 25
    assert info.team_reward == "sum" and info.rew_space.shape == (3,)
    spaces = info.obs_space.spaces
    assert spaces["obs"].shape == (3, 18) and spaces["global_state"].shape == (54,) and info.state_space.shape == (54,)
    assert env.global_state_source == "state()"
    env.seed(1)
    obs = env.reset()
    # mpe2's state() is the agents' observations concatenated, so the two must agree
    np.testing.assert_array_equal(obs["global_state"], obs["obs"].reshape(-1))
    assert obs["action_mask"].tolist() == [[1] * 5] * 3 and obs["alive"].tolist() == [1, 1, 1]


def test_simple_spread_matches_the_raw_env_step_for_step():
    from mpe2 import simple_spread_v3

    raw = simple_spread_v3.parallel_env()
    raw_obs, _ = raw.reset(seed=7)
    env = PettingZooParallelEnv({})
    env.seed(7)
    obs = env.reset()
    rng = np.random.default_rng(0)
    total = np.zeros(3)
    for t in range(25):
        np.testing.assert_array_equal(obs["obs"], np.stack([raw_obs[a] for a in raw.possible_agents]))
        action = rng.integers(0, 5, 3)
        raw_obs, raw_rew, _, raw_trunc, _ = raw.step({a: int(action[i]) for i, a in enumerate(raw.possible_agents)})
        ts = env.step(action)
        obs = ts.obs
        assert ts.reward.tolist() == [raw_rew[a] for a in raw.possible_agents]
        total += ts.reward
        assert ts.done == (t == 24)
    assert all(raw_trunc.values())
    assert ts.info["truncated"] and not ts.info["terminated"]
    np.testing.assert_allclose(ts.info["episode_return"], total)
    assert ts.info["episode_len"] == 25 and ts.obs["alive"].tolist() == [1, 1, 1]  # truncated: values bootstrap
    np.testing.assert_array_equal(ts.obs["obs"], np.stack([raw_obs[a] for a in raw.possible_agents]))


def test_check_env_passes_discrete_and_continuous():
    check_env(PettingZooParallelEnv({}), n_steps=60)
    check_env(PettingZooParallelEnv({"env_kwargs": {"continuous_actions": True, "N": 5}}), n_steps=30)


def test_continuous_actions_are_a_box_per_agent_and_checked():
    env = PettingZooParallelEnv({"env_kwargs": {"continuous_actions": True, "N": 5}})
    assert env.info().act_space.shape == (5, 5) and "action_mask" not in env.info().obs_space.spaces
    env.reset()
    action = np.full((5, 5), 0.5, np.float32)
    action[3, 2] = 1.0 + 1e-7  # float rounding past the bound is clipped
    env.step(action)
    action[3, 2] = 1.5
    with pytest.raises(ValueError, match="agent_3's action .* is outside its space"):
        env.step(action)
    with pytest.raises(ValueError, match=r"shaped \(5, 5\)"):
        env.step(np.zeros((5, 4)))


@pytest.mark.parametrize(
    "make",
    [
        lambda: PettingZooParallelEnv({}),
        lambda: PettingZooParallelEnv({"env_kwargs": {"continuous_actions": True}}),
        TwoStepGameEnv,
        lambda: toy(mask_in="infos"),
        lambda: toy(mask_in="obs", a_truncates=False),
    ],
    ids=["simple_spread", "simple_spread_continuous", "two_step", "toy_infos_mask", "toy_obs_mask"],
)
def test_parallel_api_test_passes_on_the_view(make):
    parallel_api_test(to_parallel_env(make()), num_cycles=60)


def test_the_view_round_trips_two_step_payoffs():
    view = to_parallel_env(TwoStepGameEnv())
    obs, _ = view.reset(seed=0)
    assert view.agents == ["agent_0", "agent_1"] and obs["agent_0"]["action_mask"].tolist() == [1, 1]
    view.step({"agent_0": 1, "agent_1": 0})  # branch 2B
    _, rewards, terms, truncs, _ = view.step({"agent_0": 1, "agent_1": 1})
    assert rewards == {"agent_0": 8.0, "agent_1": 8.0} and all(terms.values()) and not any(truncs.values())
    assert view.agents == [] and view.state().tolist() == [0.0, 0.0, 1.0]


# ---- the toy env: masks, padding, early finishers -----------------------------------------------------------------
@pytest.mark.parametrize("mask_in", ["infos", "obs"])
def test_masks_from_either_convention_padded_for_smaller_action_counts(mask_in):
    env = toy(mask_in=mask_in)
    info = env.info()
    assert info.act_space == gym.spaces.MultiDiscrete([3, 2]) and info.obs_space["obs"].shape == (2, 4)
    assert env.global_state_source == "concat_obs" and info.state_space.shape == (8,)
    obs = env.reset()
    # t = 0: a may not take 0; b may take only 0; b's third column does not exist
    assert obs["action_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]
    assert obs["obs"].tolist() == [[0, 0, 0, 0], [1, 0, 0, 0]]  # a's 2 values padded to 4
    np.testing.assert_array_equal(obs["global_state"], obs["obs"].reshape(-1))
    ts = env.step(np.array([2, 0]))
    assert ts.reward.tolist() == [12.0, 10.0] and ts.obs["action_mask"].tolist() == [[1, 0, 1], [0, 1, 0]]


def test_no_mask_means_all_legal_within_each_agents_actions():
    obs = toy(mask_in=None).reset()
    assert obs["action_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]


def test_masked_or_out_of_space_actions_raise_naming_the_agent():
    env = toy()
    env.reset()
    with pytest.raises(ValueError, match=r"agent a's action 0 is masked; legal: \[1, 2\]"):
        env.step(np.array([0, 0]))
    with pytest.raises(ValueError, match=r"agent b's action 2 is outside Discrete\(2\)"):
        env.step(np.array([1, 2]))
    with pytest.raises(ValueError, match=r"int array shaped \(2,\)"):
        env.step(np.array([1.0, 0.0]))


def test_an_agent_that_finishes_early_is_dead_not_a_crash():
    env = toy(b_steps=2, a_steps=4, a_truncates=True)
    obs = env.reset()
    rewards, alive, rows = [], [], []
    for _ in range(4):
        action = legal(obs)
        if not obs["alive"][1]:
            action[1] = 99  # a dead agent's action is ignored, even one outside its space
        ts = env.step(action)
        obs = ts.obs
        rewards.append(ts.reward.tolist())
        alive.append(obs["alive"].tolist())
        rows.append(obs["obs"][1].tolist())
    # b terminates at t = 2: reward 0 after, zero row, alive 0; a is truncated at t = 4 and keeps its last obs
    assert rewards == [[11.0, 10.0], [20.0, 21.0], [30.0, 0.0], [41.0, 0.0]]
    assert alive == [[1, 1], [1, 0], [1, 0], [1, 0]]
    assert rows[1:] == [[0.0] * 4] * 3 and obs["obs"][0].tolist() == [0.0, 4.0, 0.0, 0.0]
    assert obs["action_mask"][1].tolist() == [1, 1, 0]  # a dead agent's row: all of its actions (ignored)
    assert ts.done and ts.info["truncated"] and not ts.info["terminated"]  # only a ended at the last step
    assert ts.info["episode_return"].tolist() == [102.0, 31.0] and ts.info["episode_len"] == 4
    assert ts.info["agent_done"].tolist() == [True, True]


def test_an_episode_whose_last_agent_terminates_is_terminated():
    env = toy(b_steps=2, a_steps=3, a_truncates=False)
    obs = env.reset()
    for _ in range(3):
        ts = env.step(legal(obs) if obs["alive"][1] else np.array([legal(obs)[0], 0]))
        obs = ts.obs
    assert ts.done and ts.info["terminated"] and not ts.info["truncated"] and obs["alive"].tolist() == [0, 0]
    with pytest.raises(RuntimeError, match="step\\(\\) before reset"):
        env.step(legal(obs))


def test_the_adapters_own_step_limit_truncates():
    env = PettingZooParallelEnv({"max_episode_steps": 3})
    env.reset()
    dones = [env.step(np.zeros(3, np.int64)).done for _ in range(3)]
    assert dones == [False, False, True] and env.info().max_episode_steps == 3


# ---- config errors and managers -----------------------------------------------------------------------------------
def test_config_errors_name_the_key_and_the_fix():
    with pytest.raises(KeyError, match="did you mean 'env_kwargs'"):
        PettingZooParallelEnv({"env_kwarg": {}})
    with pytest.raises(ValueError, match="'team_reward' must be one of"):
        PettingZooParallelEnv({"team_reward": "max"})
    with pytest.raises(ImportError, match="cannot import 'mpe2.no_such_env'"):
        PettingZooParallelEnv({"env_id": "mpe2.no_such_env"}).info()
    with pytest.raises(AttributeError, match="has no callable 'nope'"):
        PettingZooParallelEnv({"env_id": "mpe2.simple_spread_v3:nope"}).info()


@pytest.mark.parametrize("manager", ["base", "subprocess"])
def test_managers_step_the_adapter(manager):
    cfg = {"env_id": "mpe2.simple_spread_v3"}
    if manager == "base":
        made = BaseEnvManager(PettingZooParallelEnv, cfg, 2)
    else:
        made = SubprocessEnvManager(PettingZooParallelEnv, cfg, 2, worker_num=2)
    with made as envs:
        envs.launch()
        returns: List[np.ndarray] = []
        for _ in range(25):
            for ts in envs.step({i: np.zeros(3, np.int64) for i in envs.ready_obs}).values():
                assert ts.reward.shape == (3,) and ts.obs["obs"].shape == (3, 18)
                if ts.done:
                    returns.append(ts.info["episode_return"])
    assert len(returns) == 2 and all(r.shape == (3,) for r in returns)
