"""check_env: passes on correct envs, fails with a message naming the property on broken ones."""

from __future__ import annotations

from typing import Any, Optional

import gymnasium as gym
import numpy as np
import pytest

from nervex.envs.base_env import BaseEnv, BaseEnvInfo, BaseEnvTimestep
from nervex.envs.check_env import EnvCheckError, check_env


class RandomWalkEnv(BaseEnv):
    """A noisy 1-D walk: terminates at |x| >= 3, truncates after 20 steps. ``bug`` breaks one property."""

    def __init__(self, bug: Optional[str] = None) -> None:
        super().__init__({"bug": bug})
        self.bug = bug
        self._seed: Optional[int] = None
        self._rng = np.random.default_rng()
        self._closed = False
        self.obs_space = gym.spaces.Box(-10.0, 10.0, (1,), dtype=np.float32)
        self.act_space = gym.spaces.Discrete(2)

    def seed(self, seed: int) -> None:
        self._seed = seed

    def reset(self) -> np.ndarray:
        if self._seed is not None and self.bug != "unseeded":
            self._rng = np.random.default_rng(0 if self.bug == "seed_ignored" else self._seed)
            self._seed = None
        self.x, self.t, self.ret = float(self._rng.normal(0.0, 0.5)), 0, 0.0
        return np.array([self.x], dtype=np.float32)

    def step(self, action: Any) -> BaseEnvTimestep:
        self.x += (1.0 if action else -1.0) * 0.5 + float(self._rng.normal(0.0, 0.3))
        self.t += 1
        reward = float(self._rng.uniform(-1.0, 1.0))
        self.ret += reward
        terminated, truncated = abs(self.x) >= 3.0, self.t >= 20
        done = terminated or truncated
        obs = np.array([self.x], dtype=np.float32)
        info = {"terminated": terminated, "truncated": truncated}
        if done:
            info.update(episode_return=self.ret, episode_len=self.t)
        return self._break(BaseEnvTimestep(obs, reward, done, info))

    def _break(self, ts: BaseEnvTimestep) -> BaseEnvTimestep:
        obs, reward, done, info = ts
        if self.bug in ("lives", "lives_wrong_return") and done:
            return self._two_lives(ts)
        if self.bug == "reward_array":
            reward = np.array([reward])
        elif self.bug == "wrong_return" and done:
            info["episode_return"] += 1.0
        elif self.bug == "wrong_len" and done:
            info["episode_len"] += 1
        elif self.bug == "no_episode_return" and done:
            del info["episode_return"]
        elif self.bug == "obs_outside" and self.t == 5:
            obs = np.array([42.0], dtype=np.float32)
        elif self.bug == "obs_float64":
            obs = obs.astype(np.float64)
        elif self.bug == "numpy_done":
            done = np.bool_(done)
        elif self.bug == "done_mismatch":
            done = self.t % 7 == 0
        elif self.bug == "truncated_missing":
            del info["truncated"]
        return BaseEnvTimestep(obs, reward, done, info)

    def _two_lives(self, ts: BaseEnvTimestep) -> BaseEnvTimestep:
        # every other episode is the first "life" of a two-life game: it ends the learning episode only
        self.lives_lost = getattr(self, "lives_lost", 0) + 1
        info = dict(ts.info)
        if self.lives_lost % 2:
            info["game_over"] = False
            self.game_ret, self.game_len = info.pop("episode_return"), info.pop("episode_len")
        else:
            info["game_over"] = True
            if self.bug == "lives":  # the game's figures cover both lives
                info["episode_return"] += self.game_ret
                info["episode_len"] += self.game_len
        return BaseEnvTimestep(ts.obs, ts.reward, ts.done, info)

    def close(self) -> None:
        if self.bug == "close_twice" and self._closed:
            raise RuntimeError("already closed")
        self._closed = True

    def info(self) -> BaseEnvInfo:
        if self.bug == "info_not_spaces":
            return BaseEnvInfo(1, (1,), 2)
        return BaseEnvInfo(agent_num=1, obs_space=self.obs_space, act_space=self.act_space, max_episode_steps=20)


def test_passes_on_a_correct_env():
    check_env(RandomWalkEnv(), n_steps=100)


def test_passes_on_an_env_whose_games_span_several_learning_episodes():
    # episodic life: a done with info['game_over'] = False and no figures; the game's end reports both lives
    check_env(RandomWalkEnv("lives"), n_steps=100)


@pytest.mark.filterwarnings("ignore::UserWarning:gymnasium.utils.env_checker")  # infinite Box bounds: by design
@pytest.mark.parametrize("name", ["cartpole", "pendulum"])
def test_passes_on_classic_control(name: str):
    pytest.importorskip("app_zoo.classic_control")
    from nervex.utils import ENV_REGISTRY

    check_env(ENV_REGISTRY.get(name)({}), n_steps=300)  # CartPole terminates, Pendulum truncates at 200


BROKEN = [
    ("reward_array", r"step 0: reward must be a Python float, got ndarray"),
    ("wrong_return", r"info\['episode_return'\] = .* but the episode's rewards sum to"),
    ("wrong_len", r"info\['episode_len'\] = \d+ but the episode took \d+ steps"),
    ("no_episode_return", r"done but info has no 'episode_return'"),
    ("lives_wrong_return", r"info\['episode_return'\] = .* but the episode's rewards sum to"),
    ("obs_outside", r"step 4: observation ndarray\(shape=\(1,\), dtype=float32, min=42.0.* not inside"),
    ("obs_float64", r"observation ndarray\(shape=\(1,\), dtype=float64.*not inside info\(\).obs_space"),
    ("numpy_done", r"done must be a bool, got numpy.bool"),
    ("done_mismatch", r"done=.* but terminated=.*done must equal terminated or truncated"),
    ("truncated_missing", r"info\['truncated'\] must be a bool"),
    ("unseeded", r"seeding: two rollouts after env.seed\(0\) with the same actions differ at the first reset"),
    ("seed_ignored", r"seeding: rollouts with seeds 0 and \[1, 2, 3\] .* are identical"),
    ("close_twice", r"close: a second env.close\(\) raised RuntimeError"),
    ("info_not_spaces", r"info\(\).obs_space must be a gymnasium.Space, got tuple"),
]


@pytest.mark.parametrize("bug, message", BROKEN, ids=[b for b, _ in BROKEN])
def test_fails_naming_the_broken_property(bug: str, message: str):
    with pytest.raises(EnvCheckError, match=message):
        check_env(RandomWalkEnv(bug), n_steps=100)


def test_deterministic_env_may_opt_out_of_the_seed_check():
    check_env(RandomWalkEnv("seed_ignored"), n_steps=50, deterministic=True)


def test_is_an_assertion_error():
    # callers that only know the contract as assertions still catch it
    assert issubclass(EnvCheckError, AssertionError)
