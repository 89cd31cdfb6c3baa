"""Per-agent rewards (shape (3,)) through both managers: shared-memory slots sized from rew_space, same timesteps."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import gymnasium as gym
import numpy as np
import pytest

from nervex.envs import BaseEnv, BaseEnvInfo, BaseEnvTimestep
from nervex.worker.actor.env_manager import BaseEnvManager, EnvError, SubprocessEnvManager

IDS = ("a", "b", "c")


class ThreeAgentEnv(BaseEnv):
    """Three agents; obs (3, 2) = [agent index, t]; agent i's reward at step t is ``tag + (i + 1) * t * action_i``.

    ``reward_dtype`` is the declared rew_space dtype (and what ``step`` returns); ``bad_reward_at`` makes step t
    return a reward of shape (2,) instead of (3,).
    """

    config: Dict[str, Any] = dict(tag=0.0, episode_len=3, reward_dtype="float64", bad_reward_at=None)

    def __init__(self, cfg: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(dict(self.config, **(cfg or {})))
        self._dtype = np.dtype(self._cfg["reward_dtype"])
        self._t, self._ret = 0, np.zeros(3)

    def seed(self, seed: int) -> None:
        pass

    def reset(self) -> np.ndarray:
        self._t, self._ret = 0, np.zeros(3)
        return self._obs()

    def _obs(self) -> np.ndarray:
        return np.stack([np.arange(3), np.full(3, self._t)], axis=1).astype(np.float32)

    def step(self, action: Any) -> BaseEnvTimestep:
        self._t += 1
        reward = (self._cfg["tag"] + np.arange(1, 4) * self._t * np.asarray(action)).astype(self._dtype)
        self._ret += reward
        if self._cfg["bad_reward_at"] == self._t:
            reward = reward[:2]
        done = self._t >= self._cfg["episode_len"]
        info: Dict[str, Any] = {"terminated": done, "truncated": False}
        if done:
            info.update(episode_return=self._ret.copy(), episode_len=self._t)
        return BaseEnvTimestep(self._obs(), reward, done, info)

    def info(self) -> BaseEnvInfo:
        return BaseEnvInfo(
            3,
            gym.spaces.Box(0, 100, (3, 2), np.float32),
            gym.spaces.MultiDiscrete([2, 2, 2]),
            gym.spaces.Box(-np.inf, np.inf, (3,), self._dtype),
            agent_ids=IDS,
        )

    def close(self) -> None:
        pass


MANAGERS = {
    "base": lambda *a, **kw: BaseEnvManager(*a, **kw),
    "subprocess_shm": lambda *a, **kw: SubprocessEnvManager(*a, worker_num=2, retry_delay=0.0, **kw),
    "subprocess_pipe": lambda *a, **kw: SubprocessEnvManager(
        *a, worker_num=2, shared_memory=False, retry_delay=0.0, **kw
    ),
}
ACTIONS = [np.array([1, 0, 1]), np.array([1, 1, 1]), np.array([0, 1, 0]), np.array([1, 1, 0])]


def _run(manager: BaseEnvManager, steps: int) -> List[Dict[int, BaseEnvTimestep]]:
    manager.launch()
    return [manager.step({i: ACTIONS[(t + i) % 4] for i in manager.ready_obs}) for t in range(steps)]


@pytest.mark.parametrize("name", list(MANAGERS))
def test_per_agent_rewards_by_hand(name):
    cfgs = [dict(tag=10.0), dict(tag=20.0, episode_len=2)]
    with MANAGERS[name](ThreeAgentEnv, cfgs, 2) as manager:
        trace = _run(manager, 3)
    env0 = [trace[t][0] for t in range(3)]
    # env 0, tag 10: step t with ACTIONS[t]: 10 + [1, 2, 3] * t * action
    want0 = [[11.0, 10.0, 13.0], [12.0, 14.0, 16.0], [10.0, 16.0, 10.0]]
    for ts, want in zip(env0, want0):
        assert isinstance(ts.reward, np.ndarray) and ts.reward.dtype == np.float64 and ts.reward.shape == (3,)
        assert ts.reward.tolist() == want
    assert env0[2].done and env0[2].info["episode_return"].tolist() == [33.0, 40.0, 39.0]
    # env 1, tag 20, 2-step episodes: ACTIONS[1], ACTIONS[2], then a new episode with ACTIONS[3] at t = 1
    assert [trace[t][1].reward.tolist() for t in range(3)] == [[21, 22, 23], [20, 24, 20], [21, 22, 20]]
    assert trace[1][1].done and trace[1][1].info["episode_return"].tolist() == [41.0, 46.0, 43.0]


def _same(a: BaseEnvTimestep, b: BaseEnvTimestep) -> bool:
    if not (np.array_equal(a.obs, b.obs) and a.obs.dtype == b.obs.dtype and a.done == b.done):
        return False
    if not (type(a.reward) is type(b.reward) and a.reward.dtype == b.reward.dtype):
        return False
    return np.array_equal(a.reward, b.reward) and a.info.keys() == b.info.keys()


@pytest.mark.parametrize("reward_dtype", ["float64", "float32"])
def test_every_manager_returns_the_same_timesteps(reward_dtype):
    cfg = dict(tag=1.5, episode_len=4, reward_dtype=reward_dtype)
    traces = {}
    for name, make in MANAGERS.items():
        with make(ThreeAgentEnv, cfg, 3) as manager:
            traces[name] = _run(manager, 9)
    assert traces["base"][0][0].reward.dtype == np.dtype(reward_dtype)  # the declared dtype survives shared memory
    for name in ("subprocess_shm", "subprocess_pipe"):
        for t, (want, got) in enumerate(zip(traces["base"], traces[name])):
            assert want.keys() == got.keys(), (name, t)
            assert all(_same(want[i], got[i]) for i in want), (name, t)


def test_a_reward_that_does_not_fit_its_shared_slot_is_an_env_failure():
    cfg = dict(bad_reward_at=2)
    with SubprocessEnvManager(ThreeAgentEnv, cfg, 1, max_retry=2, retry_delay=0.0) as manager:
        trace = _run(manager, 3)
        assert manager.stats["exceptions"] == 1 and manager.stats["restarts"] == 1
    cut = trace[1][0]
    assert cut.done and cut.info["abnormal"] and cut.info["reason"] == "exception"
    assert "reward of shape (2,) does not fit the shared-memory slot (3,)" in cut.info["error"]
    assert trace[2][0].reward.tolist() == [0.0, 2.0, 0.0]  # the rebuilt env's first step, with ACTIONS[2]


def test_a_bad_reward_beyond_max_retry_raises_naming_it():
    with SubprocessEnvManager(ThreeAgentEnv, dict(bad_reward_at=1), 1, max_retry=0) as manager:
        manager.launch()
        with pytest.raises(EnvError, match=r"reward of shape \(2,\) does not fit the shared-memory slot \(3,\)"):
            manager.step({0: ACTIONS[0]})
