"""Seeding across managers and start methods, checked against plain Gymnasium envs; envs that are slow, not hung.

Not repeated here (see ``test_env_manager_contract.py``): CartPole rollouts equal across the base, forked subprocess
(1 and N workers, pipe) managers, ``seed + i`` for env ``i``'s first reset, the base manager's rebuild seeds; (see
``test_subprocess_env_manager.py``) spawn and forkserver against fork with a constant action (observations only).
What this file adds: a continuous-action env (Pendulum, whose 200-step time limit puts a truncation and an
auto-reset inside the window), every field of every timestep under ``spawn``, the whole rollout against plain
Gymnasium envs seeded by the documented rule, and the seed a restarted subprocess env gets.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List

import gymnasium as gym
import numpy as np
import pytest

from nervex.envs import GymEnv
from nervex.worker.actor.env_manager import BaseEnvManager, SubprocessEnvManager

from .fault_envs import CountingEnv

STEPS = 210  # Pendulum-v1 truncates at 200: the window holds one truncation and the auto-reset after it
ENV_NUM = 2
ENV_IDS = {"cartpole": "CartPole-v1", "pendulum": "Pendulum-v1"}
MANAGERS = {
    "base": lambda cfg, **kw: BaseEnvManager(GymEnv, cfg, ENV_NUM, **kw),
    "fork": lambda cfg, **kw: SubprocessEnvManager(GymEnv, cfg, ENV_NUM, context="fork", retry_delay=0.0, **kw),
    "spawn": lambda cfg, **kw: SubprocessEnvManager(GymEnv, cfg, ENV_NUM, context="spawn", retry_delay=0.0, **kw),
}


def action_sequence(env_id: str, steps: int = STEPS) -> np.ndarray:
    """A fixed random action per step and env: ``(steps, ENV_NUM)`` ints or ``(steps, ENV_NUM, 1)`` float32."""
    space = gym.make(env_id).action_space
    rng = np.random.default_rng(2024)
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.n, size=(steps, ENV_NUM))
    return rng.uniform(space.low, space.high, size=(steps, ENV_NUM, *space.shape)).astype(np.float32)


def manager_rollout(manager: Any, seed: int, actions: np.ndarray) -> List[Dict[int, tuple]]:
    """First observations, then per step ``{env_id: (obs, reward, done, terminated, truncated)}``."""
    with manager:
        manager.seed(seed)
        manager.launch()
        rows: List[Dict[int, tuple]] = [{i: (o.tolist(),) for i, o in sorted(manager.ready_obs.items())}]
        for step_actions in actions:
            timesteps = manager.step({i: step_actions[i] for i in sorted(manager.ready_obs)})
            rows.append(
                {
                    i: (ts.obs.tolist(), ts.reward, ts.done, ts.info["terminated"], ts.info["truncated"])
                    for i, ts in sorted(timesteps.items())
                }
            )
        assert manager.stats["dropped_episodes"] == 0
    return rows


def gymnasium_rollout(env_id: str, seed: int, actions: np.ndarray) -> List[Dict[int, tuple]]:
    """The documented rule with plain Gymnasium envs: env ``i`` resets with ``seed + i`` once, then unseeded."""
    envs = [gym.make(env_id) for _ in range(ENV_NUM)]
    rows: List[Dict[int, tuple]] = [{}]
    for i, env in enumerate(envs):
        rows[0][i] = (np.asarray(env.reset(seed=seed + i)[0], np.float32).tolist(),)
    for step_actions in actions:
        row = {}
        for i, env in enumerate(envs):
            action = int(step_actions[i]) if step_actions.ndim == 1 else step_actions[i]
            obs, reward, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
            row[i] = (np.asarray(obs, np.float32).tolist(), float(reward), done, terminated, truncated)
            if done:
                env.reset()  # the manager's auto-reset: no seed, the env's stream goes on
        rows.append(row)
    return rows


@pytest.mark.parametrize("env_name", list(ENV_IDS))
def test_same_seed_same_rollout_in_every_manager_and_start_method(env_name):
    env_id = ENV_IDS[env_name]
    actions = action_sequence(env_id)
    expected = gymnasium_rollout(env_id, seed=7, actions=actions)
    ends = [(i, ts[3], ts[4]) for row in expected[1:] for i, ts in row.items() if ts[2]]
    assert ends, "the window must contain episode ends, so auto-resets are covered"
    if env_name == "pendulum":
        assert {(i, False, True) for i in range(ENV_NUM)} <= set(ends)  # truncated at 200 steps, then reset
    for kind, make in MANAGERS.items():
        got = manager_rollout(make({"env_id": env_id}), seed=7, actions=actions)
        for step, (g, e) in enumerate(zip(got, expected)):
            assert g == e, f"{kind}: step {step} differs from plain Gymnasium envs seeded 7 + env_id"
    assert expected[0][0] != expected[0][1]  # env i uses seed + i: two envs, two different starts


@pytest.mark.parametrize("kind", ["base", "spawn"])
def test_different_seeds_give_different_rollouts(kind):
    env_id = ENV_IDS["pendulum"]
    actions = action_sequence(env_id, steps=20)
    first = manager_rollout(MANAGERS[kind]({"env_id": env_id}), seed=7, actions=actions)
    second = manager_rollout(MANAGERS[kind]({"env_id": env_id}), seed=8, actions=actions)
    assert first[0][0] != second[0][0] and first[0][1] != second[0][1]
    assert first[0][1] == second[0][0]  # seed 7's env 1 and seed 8's env 0 both reset with 8
    assert first[-1] != second[-1]


class ExitingCartPole(GymEnv):
    """CartPole whose process exits (``os._exit``) on the ``exit_at``-th step since the env was built."""

    config: Dict[str, Any] = dict(GymEnv.config, env_id="CartPole-v1", exit_at=0)

    def __init__(self, cfg: Dict[str, Any] = None) -> None:
        super().__init__(cfg)
        self._steps = 0

    def step(self, action: Any) -> Any:
        self._steps += 1
        if self._steps == self._cfg["exit_at"]:
            os._exit(3)
        return super().step(action)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_restarted_subprocess_env_gets_seed_plus_id_plus_env_num_per_restart(context):
    """Env 1's process dies on its 3rd step: the rebuilt env resets with ``seed + 1 + env_num * 1``."""
    cfgs = [dict(env_id="CartPole-v1"), dict(env_id="CartPole-v1", exit_at=3)]
    with SubprocessEnvManager(ExitingCartPole, cfgs, ENV_NUM, worker_num=2, context=context, retry_delay=0.0) as m:
        m.seed(50)
        m.launch()
        for _ in range(3):
            timesteps = m.step({i: 0 for i in m.ready_obs})  # action 0 for 3 steps never ends CartPole
        assert timesteps[1].info["reason"] == "crash" and not timesteps[0].done
        assert m.stats["crashes"] == 1 and m.stats["restarts"] == 1
        restarted_first_obs = m.ready_obs[1]
    expected = gym.make("CartPole-v1").reset(seed=50 + 1 + ENV_NUM * 1)[0]
    np.testing.assert_array_equal(restarted_first_obs, expected)


# ---- slow envs: slower than usual is not hung ------------------------------------------------------------------------
class SlowResetEnv(CountingEnv):
    """CountingEnv whose resets after the first take ``reset_delay_s`` (a slow simulator restart)."""

    def reset(self) -> np.ndarray:
        if self._resets >= 1:
            time.sleep(self._cfg.get("reset_delay_s", 0.0))
        return super().reset()


def test_slow_steps_within_step_timeout_are_not_timeouts():
    """Two 0.15 s envs share one worker: 0.3 s per step message, under a 1 s step_timeout."""
    cfgs = [dict(delay_s=0.15, episode_len=50)] * 2
    with SubprocessEnvManager(CountingEnv, cfgs, 2, worker_num=1, step_timeout=1.0, retry_delay=0.0) as m:
        m.launch()
        for _ in range(4):
            timesteps = m.step({i: 0 for i in m.ready_obs})
            assert not any(ts.info.get("abnormal") for ts in timesteps.values())
        assert m.stats["timeouts"] == 0 and m.stats["restarts"] == 0


def test_slow_auto_reset_is_bounded_by_reset_timeout_not_step_timeout():
    """Resets take 1 s, steps are instant; step_timeout 0.5 s, reset_timeout 5 s: the episode must end normally."""
    cfg = dict(episode_len=2, reset_delay_s=1.0)
    with SubprocessEnvManager(SlowResetEnv, cfg, 1, step_timeout=0.5, reset_timeout=5.0, retry_delay=0.0) as m:
        m.launch()
        seen = []
        for _ in range(3):
            seen.extend(m.step({i: 0 for i in m.ready_obs}).values())
        assert [ts.info.get("reason") for ts in seen] == [None] * 3
        assert [ts.done for ts in seen] == [False, True, False]
        assert m.stats["timeouts"] == 0
