"""The actor's collect units, checked transition by transition on ClockEnv with values computed by hand.

The model gives ``V(obs) = 10 + t`` (``t = obs[1]``), so every GAE advantage below follows from the env's schedule.
"""

from typing import Dict, List

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn

from nervex.policy import CollectSpec, DQNPolicy, PPOPolicy
from nervex.worker.actor import SerialActor
from nervex.worker.actor.env_manager import BaseEnvManager

from .envs import ClockEnv


class ClockValueModel(nn.Module):
    """A ValueAC-shaped model: ``value = 10 + t``; logits (or mu) fixed by parameters; counts calls per mode."""

    def __init__(self, continuous: bool = False, mu: float = 0.0) -> None:
        super().__init__()
        self.continuous = continuous
        self.bias = nn.Parameter(torch.tensor([0.0, 1.0]) if not continuous else torch.full((2,), float(mu)))
        self.log_std = nn.Parameter(torch.full((2,), -5.0))
        self.calls: Dict[str, List[int]] = {}

    def forward(self, x: torch.Tensor, mode: str = "compute_action_value") -> Dict[str, torch.Tensor]:
        self.calls.setdefault(mode, []).append(x.shape[0])
        out: Dict[str, torch.Tensor] = {}
        if mode != "compute_value":
            base = self.bias.expand(x.shape[0], 2)
            if self.continuous:
                out.update(mu=base, sigma=self.log_std.exp().expand_as(base))
            else:
                out["logit"] = base
        if mode != "compute_action":
            out["value"] = 10.0 + x[:, 1]
        return out


def ppo(model: nn.Module, **cfg) -> PPOPolicy:
    base = {
        "policy_type": "ppo",
        "discount_factor": 0.5,
        "gae_lambda": 1.0,
        "collect": {"rollout_len": 5},
        "model": {"action_space": "continuous" if getattr(model, "continuous", False) else "discrete"},
    }
    base.update(cfg)
    return PPOPolicy(base, model=model)


def actor_for(policy, env_cfgs, seed: int = 0) -> SerialActor:
    manager = BaseEnvManager(ClockEnv, env_cfgs, len(env_cfgs))
    return SerialActor({}, manager, policy.collect_mode, seed=seed)


def by_env(samples: List[dict]) -> Dict[float, List[dict]]:
    out: Dict[float, List[dict]] = {}
    for sample in samples:
        out.setdefault(float(sample["obs"][0]), []).append(sample)
    return out


def test_rollout_is_exactly_t_steps_per_env_with_batched_bootstraps():
    model = ClockValueModel()
    # env 0 (tag 0): time limit at 3 steps (truncated); env 1 (tag 1): terminates after 2 steps
    actor = actor_for(ppo(model), [dict(env_tag=0.0, episode_len=3, truncate=True), dict(env_tag=1.0, episode_len=2)])
    samples = actor.collect(CollectSpec("rollout", 5))
    assert actor.env_step == 10 and len(samples) == 10
    # a bootstrap forward at the step of env 0's truncation (its final obs, t=3), and one batched forward at the
    # rollout's end for both envs' last obs (env 0: t=2, env 1: t=1)
    assert model.calls["compute_value"] == [1, 2]
    env0, env1 = by_env(samples)[0.0], by_env(samples)[1.0]
    assert [float(s["obs"][1]) for s in env0] == [0, 1, 2, 0, 1]
    # gamma 0.5, lambda 1: returns are r + 0.5 * G_next, bootstrapped with V(final obs) = 13 at the truncation
    # and V(t=2) = 12 at the rollout's cut; advantages are returns - (10 + t)
    assert [float(s["return"]) for s in env0] == pytest.approx([3.375, 4.75, 7.5, 4.5, 7.0])
    assert [float(s["adv"]) for s in env0] == pytest.approx([-6.625, -6.25, -4.5, -5.5, -4.0])
    # env 1: terminations do not bootstrap (return 1 at each end); the cut bootstraps from V(t=1) = 11
    assert [float(s["return"]) for s in env1] == pytest.approx([1.5, 1.0, 1.5, 1.0, 6.5])
    assert [float(s["adv"]) for s in env1] == pytest.approx([-8.5, -10.0, -8.5, -10.0, -3.5])
    assert set(samples[0]) == {"obs", "action", "logp", "value", "adv", "return"}
    actor.close()


def test_next_rollout_starts_where_the_envs_are_and_carries_nothing_over():
    model = ClockValueModel()
    actor = actor_for(ppo(model), [dict(env_tag=0.0, episode_len=3, truncate=True)])
    actor.collect(CollectSpec("rollout", 5))
    second = actor.collect(CollectSpec("rollout", 5))
    # the env was at t=2 after the first rollout: the second begins with (2 -> 3, truncated), nothing repeated
    assert [float(s["obs"][1]) for s in second] == [2, 0, 1, 2, 0]
    assert actor.env_step == 10
    assert float(second[0]["return"]) == pytest.approx(1 + 0.5 * 13)
    actor.close()


def test_sample_unit_steps_n_times_and_carries_unfinished_trajectories():
    policy = DQNPolicy({"policy_type": "dqn", "nstep": 3, "model": {"obs_dim": 2, "action_dim": 2}})
    actor = actor_for(policy, [dict(env_tag=0.0, episode_len=4), dict(env_tag=1.0, episode_len=4)])
    first = actor.collect(CollectSpec("sample", 4), {"eps": 0.0})
    # 2 vector steps; 3-step windows need 2 more transitions: nothing is ready yet
    assert actor.env_step == 4 and first == []
    second = actor.collect(CollectSpec("sample", 4), {"eps": 0.0})
    # episodes end at t=4: every window of both envs is handed over, 4 per env
    assert actor.env_step == 8 and len(second) == 8
    assert sorted(float(s["obs"][1]) for s in second if s["obs"][0] == 0.0) == [0, 1, 2, 3]
    actor.close()


def test_episode_unit_collects_whole_episodes():
    policy = DQNPolicy({"policy_type": "dqn", "model": {"obs_dim": 2, "action_dim": 2}})
    actor = actor_for(policy, [dict(env_tag=0.0, episode_len=2), dict(env_tag=1.0, episode_len=5)])
    samples = actor.collect(CollectSpec("episode", 3), {"eps": 0.0})
    # env 0 ends episodes at 2, 4, 6 steps; env 1 at 5: the third episode ends at vector step 5
    assert actor.episode_count == 3 and actor.env_step == 10 and len(samples) == 10
    actor.close()


def test_on_policy_episode_unit_restarts_the_envs_at_each_call():
    model = ClockValueModel()
    actor = actor_for(ppo(model, collect={"n_episode": 2}), [dict(env_tag=0.0, episode_len=3)] * 2)
    first = actor.collect(CollectSpec("episode", 1, restart_envs=True))
    assert len(first) == 6 and actor.episode_count == 2  # both envs finish at step 3
    assert [float(s["return"]) for s in first[:3]] == pytest.approx([1.75, 1.5, 1.0])  # terminal: no bootstrap
    second = actor.collect(CollectSpec("episode", 1, restart_envs=True))
    assert [float(s["obs"][1]) for s in second][:3] == [0, 1, 2]  # each call starts fresh episodes
    assert "compute_value" not in model.calls  # whole terminated episodes need no bootstrap
    actor.close()


def test_random_warmup_draws_from_the_seeded_action_space():
    policy = DQNPolicy({"policy_type": "dqn", "model": {"obs_dim": 2, "action_dim": 2}})
    actor = actor_for(policy, [dict(env_tag=0.0, episode_len=50)], seed=7)
    samples = actor.collect(CollectSpec("sample", 20), random_action=True)
    space = gym.spaces.Discrete(2)
    space.seed(7)
    assert [int(s["action"]) for s in samples] == [int(space.sample()) for _ in range(20)]
    actor.close()


class RecordingClockEnv(ClockEnv):
    """Remembers every action it received (in-process manager: the test reads the class attribute)."""

    received: List[np.ndarray] = []

    def step(self, action):
        RecordingClockEnv.received.append(np.array(action))
        return super().step(action)


def test_continuous_actions_are_clipped_for_the_env_but_stored_as_sampled():
    model = ClockValueModel(continuous=True, mu=5.0)  # mu far above the Box's high of 1
    stored = []

    class Spy:
        def on_episode_step(self, env_id, transition):
            stored.append(transition["action"])

    manager = BaseEnvManager(RecordingClockEnv, {"continuous": True, "episode_len": 9}, 1)
    actor = SerialActor({}, manager, ppo(model).collect_mode, callbacks=Spy())
    RecordingClockEnv.received.clear()
    actor.collect(CollectSpec("rollout", 3))
    assert np.all(np.abs(np.stack(stored) - 5.0) < 0.1)  # the policy's own samples, whose log-probs PPO needs
    assert np.array_equal(np.stack(RecordingClockEnv.received), np.ones((3, 2), dtype=np.float32))  # what the env got
    actor.close()
