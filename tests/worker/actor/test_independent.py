"""Independent learners (``actor.slots.main.independent: true``): every agent of a simultaneous-move env is a
trajectory of its own for a single-agent policy, with one set of weights for all (parameter sharing).

The unit tests follow ``AgentsEnv``'s schedule (only action ``(t + i) % 3`` is legal for agent ``i`` at move
``t + 1``, move ``t`` rewards agent ``i`` ``(i + 1) * t``, agent ``c`` leaves after its first move); the pipeline
tests run ``dqn`` (independent Q-learning), ``ppo`` and ``ddpg`` unchanged through ``SerialTrainer``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest
import torch

from nervex.config import ConfigError
from nervex.entry import DefaultCallbacks, SerialTrainer
from nervex.policy import CollectSpec
from nervex.policy.common_policy import standard_transition
from nervex.policy.modes import CollectMode
from nervex.rl_utils import Adder
from nervex.utils.registry import ENV_REGISTRY
from nervex.worker.actor import SerialActor
from nervex.worker.actor.env_manager import BaseEnvManager
from nervex.worker.actor.slots import check_slots, parse_slots

from .envs import AgentsEnv, ClockEnv, ReachEnv, TurnEnv

ENV_REGISTRY.register("test_reach_agents", ReachEnv, force=True)
INDEPENDENT = {"main": {"kind": "learn", "seats": "all", "independent": True}}


class RecordingAdder(Adder):
    """A real 1-step Adder that also records every ``(key, transition)`` it is given."""

    def __init__(self) -> None:
        super().__init__(kind="nstep", nstep=1, gamma=0.9)
        self.added: List[Tuple[int, Dict[str, Any]]] = []

    def add(self, env_id: int, transition: Dict[str, Any]) -> List[Dict[str, Any]]:
        self.added.append((env_id, transition))
        return super().add(env_id, transition)


class AgentPolicy:
    """A collect mode that plays each agent's first legal action (``fixed``: that action whatever the mask), and
    records the keys and observations of every forward."""

    def __init__(self, fixed: Optional[int] = None) -> None:
        self.calls: List[Dict[int, Any]] = []
        self.fixed = fixed
        self.adder = RecordingAdder()

    def forward(self, data_id: List[int], obs: Dict[int, Any], **setting: Any) -> Dict[int, Dict[str, Any]]:
        self.calls.append({k: obs[k] for k in data_id})
        if self.fixed is not None:
            return {k: {"action": np.int64(self.fixed)} for k in data_id}
        return {k: {"action": np.int64(np.flatnonzero(obs[k]["action_mask"])[0])} for k in data_id}

    @property
    def collect_mode(self) -> CollectMode:
        return CollectMode(self.forward, standard_transition, self.adder, None, lambda ids: None, lambda s: None)


def agents_actor(slots: Dict[str, Any], policy: AgentPolicy, envs: int = 2, **env_cfg: Any) -> SerialActor:
    cfgs = [{"env_tag": float(i), **env_cfg} for i in range(envs)]
    return SerialActor({"slots": slots}, BaseEnvManager(AgentsEnv, cfgs, envs), policy.collect_mode, seed=0)


# ---- config -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "slots, message",
    [
        ({"main": {"kind": "learn", "independent": "yes"}}, "key 'actor.slots.main.independent' expects true or false, got 'yes'"),
        ({"main": {"kind": "learn", "independnt": True}}, "unknown key 'actor.slots.main.independnt' for a slot of kind 'learn'; did you mean 'independent'?"),
        ({"main": {"kind": "learn", "agent_reward": "team"}}, "key 'actor.slots.main.agent_reward' applies to independent learners only; add 'actor.slots.main.independent: true'"),
        ({"main": {"kind": "learn", "independent": True, "agent_reward": "tem"}}, "key 'actor.slots.main.agent_reward' is 'tem'; did you mean 'team'?"),
        ({"main": {"kind": "learn", "independent": True, "agent_obs": "rows"}}, "key 'actor.slots.main.agent_obs' is 'rows'; did you mean 'row'?"),
        ({"main": {"kind": "learn"}, "op": {"kind": "random", "independent": True}}, "unknown key 'actor.slots.op.independent' for a slot of kind 'random'"),
    ],
)  # fmt: skip
def test_a_malformed_independent_slot_is_an_error_that_names_the_key(slots, message):
    with pytest.raises(ConfigError) as error:
        parse_slots(slots)
    assert message in str(error.value)
    with pytest.raises(ConfigError, match="in run.yaml"):  # the compile-time check says where
        check_slots({"actor": {"slots": slots}}, " in run.yaml")


@pytest.mark.parametrize(
    "env_cls, message",
    [(TurnEnv, "this env is turn-based (its seats already are trajectories of their own): drop the key"), (ClockEnv, "this env is one agent")],
)  # fmt: skip
def test_independent_learners_need_a_simultaneous_env_of_several_agents(env_cls, message):
    with pytest.raises(ConfigError) as error:
        SerialActor({"slots": INDEPENDENT}, BaseEnvManager(env_cls, [{}], 1), AgentPolicy().collect_mode)
    assert "key 'actor.slots.main.independent': independent learners need a simultaneous-move env" in str(error.value)
    assert message in str(error.value)


# ---- transitions --------------------------------------------------------------------------------------------------
def test_each_agent_is_a_trajectory_with_its_own_row_reward_and_end():
    policy = AgentPolicy()
    actor = agents_actor(INDEPENDENT, policy)
    try:
        samples = actor.collect(CollectSpec("sample", 6), {})  # n_sample counts env steps: 3 moves of 2 envs
        assert actor.env_step == 6 and actor.episode_count == 2
        # one forward per step over every alive agent, keyed env_id * 3 + agent; c (keys 2, 5) left after move 1
        assert [sorted(call) for call in policy.calls] == [[0, 1, 2, 3, 4, 5], [0, 1, 3, 4], [0, 1, 3, 4]]
        seen = policy.calls[1][4]  # env 1's agent b before move 2: its own row and mask
        np.testing.assert_array_equal(seen["obs"], [11.0, 1.0])
        np.testing.assert_array_equal(seen["action_mask"], [0, 0, 1])
        assert set(seen) == {"obs", "action_mask"}
        by_key: Dict[int, List[Dict[str, Any]]] = {}
        for key, transition in policy.adder.added:
            by_key.setdefault(key, []).append(transition)
        assert len(samples) == 14 and sorted(by_key) == [0, 1, 2, 3, 4, 5]
        # agent b of env 1: legal actions 1, 2, 0; rewards 2 * t; the episode's end is a truncation
        b = by_key[4]
        assert [int(t["action"]) for t in b] == [1, 2, 0] and [t["reward"] for t in b] == [2.0, 4.0, 6.0]
        assert [(t["terminated"], t["truncated"], t["done"]) for t in b] == [(False, False, False)] * 2 + [
            (False, True, True)
        ]
        np.testing.assert_array_equal(b[-1]["next_obs"]["obs"], [11.0, 3.0])
        # agent c of env 0 leaves after its first move: one transition, its own termination
        (c,) = by_key[2]
        assert (c["reward"], c["terminated"], c["truncated"], c["done"]) == (3.0, True, False, True)
        np.testing.assert_array_equal(c["next_obs"]["action_mask"], [1, 0, 0])
    finally:
        actor.close()


def test_agent_reward_team_gives_every_agent_the_team_reward():
    policy = AgentPolicy()
    actor = agents_actor({"main": {**INDEPENDENT["main"], "agent_reward": "team"}}, policy, envs=1)
    try:
        actor.collect(CollectSpec("sample", 3), {})
        rewards = [(key, t["reward"]) for key, t in policy.adder.added]
        # the sum of (i + 1) * t over the agents alive before move t: 6 * 1, then (1 + 2) * 2 and (1 + 2) * 3
        assert rewards == [(0, 6.0), (1, 6.0), (2, 6.0), (0, 6.0), (1, 6.0), (0, 9.0), (1, 9.0)]
    finally:
        actor.close()


def test_the_warm_up_draws_each_agents_legal_action():
    """AgentsEnv raises on any illegal action, so three episodes of random warm-up pass only with per-agent masks
    (and the idle action 0 for the agent that left)."""
    policy = AgentPolicy()
    actor = agents_actor(INDEPENDENT, policy)
    try:
        actor.collect(CollectSpec("sample", 18), {}, random_action=True)
        assert actor.episode_count == 6 and policy.calls == []  # the policy never acted
        assert len(policy.adder.added) == 6 * 7
    finally:
        actor.close()


def test_an_action_the_agents_mask_forbids_is_an_error_that_names_the_agent():
    """``agent_obs: row`` hides the mask from the policy; a masked action is caught before it reaches the env."""
    policy = AgentPolicy(fixed=0)
    actor = agents_actor({"main": {**INDEPENDENT["main"], "agent_obs": "row"}}, policy, envs=1)
    try:
        with pytest.raises(ValueError, match=r"agent 'b' took action 0, which its action_mask \[0, 1, 0\] forbids"):
            actor.collect(CollectSpec("sample", 1), {})
        np.testing.assert_array_equal(policy.calls[0][1], [1.0, 0.0])  # the plain row
    finally:
        actor.close()


# ---- real policies through the pipeline ---------------------------------------------------------------------------
def two_step_cfg(policy: Dict[str, Any], slot: Dict[str, Any], max_env_step: int) -> Dict[str, Any]:
    return {
        "seed": 0,
        "max_env_step": max_env_step,
        "env": {"env_type": "two_step_game", "manager_type": "base", "collector_env_num": 2, "evaluator_env_num": 1},
        "policy": policy,
        "actor": {"slots": {"main": {"kind": "learn", "seats": "all", "independent": True, **slot}}},
        "evaluator": {"n_episode": 1, "eval_freq": 100000, "stop_val": 100},
    }


class KeepSamples(DefaultCallbacks):
    def __init__(self) -> None:
        self.samples: List[Dict[str, Any]] = []

    def on_sample_end(self, trainer: Any, samples: List[Dict[str, Any]]) -> None:
        self.samples.extend(samples)


def test_independent_q_learning_reaches_7_on_the_two_step_game(tmp_path):
    """IQL as the QMIX paper trains it (uniform exploration, eps = 1): each agent's Q of state 2B averages the other's
    uniform action, ``[(0 + 1) / 2, (1 + 8) / 2] = [0.5, 4.5]`` < 7, so the greedy team takes branch 2A: 7 (QMIX: 8).
    With shared weights both agents' samples of state 1 train one Q: agent 1's action does not pick the branch, so
    its samples pull both actions toward ``gamma * (7 + 4.5) / 2``; action 0 stays ahead. About 8 s."""
    policy = {
        "policy_type": "dqn",
        "model": {"hidden_sizes": [32]},
        "priority": False,
        "learn": {
            "batch_size": 64,
            "learning_starts": 64,
            "target_update_freq": 10,
            "update_per_collect": 2,
            "learning_rate": 0.01,
        },
        "command": {"eps": {"type": "linear", "start": 1.0, "end": 1.0, "decay": 1}},
    }
    cfg = two_step_cfg(policy, {}, max_env_step=1000)
    cfg["replay_buffer"] = {"maxlen": 1000}
    with SerialTrainer(cfg, seed=0, exp_name="iql", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
        figures = trainer.loop.evaluate()
        q = trainer.policy.model(torch.eye(3))["logit"].detach().numpy()  # rows: states 1, 2A, 2B
    assert figures["eval/mean_reward"] == 7.0 and figures["eval/team_return_sum"] == 14.0
    assert q[0, 0] > q[0, 1] + 0.5  # branch 2A (analytically 0.99 * 6.375 against 0.99 * 5.125)
    assert abs(q[2, 0] - 0.5) < 0.6 and abs(q[2, 1] - 4.5) < 1.0 and abs(q[1] - 7.0).max() < 0.8


def test_ppo_learns_per_agent_rollouts_on_the_two_step_game(tmp_path):
    """PPO takes no action mask: ``agent_obs: row``. Each rollout of 4 steps of 2 envs holds 2 x 4 x 2 agent
    samples, each with its own advantage; training runs unchanged."""
    policy = {
        "policy_type": "ppo",
        "model": {"hidden_sizes": [16]},
        "learn": {"epoch_per_collect": 2, "batch_size": 8},
        "collect": {"rollout_len": 4},
    }
    keep = KeepSamples()
    with SerialTrainer(
        two_step_cfg(policy, {"agent_obs": "row"}, 10**6), seed=0, run_root=str(tmp_path), callbacks=keep
    ) as trainer:
        for _ in range(3):
            trainer.train()
        assert trainer.env_step == 24 and trainer.train_iter == 3 * 2 * 2
        assert len(keep.samples) == 3 * 16
        assert all(s["obs"].shape == (3,) and s["obs"].sum() == 1.0 for s in keep.samples)
        assert {int(s["action"]) for s in keep.samples} <= {0, 1}
        returns = {round(float(s["return"]), 3) for s in keep.samples if s["obs"][1] == 1.0}
        assert returns == {7.0}  # state 2A: every agent's last reward is the team's 7, whatever it did
    figures = trainer.last_eval or {}
    assert figures == {} or "eval/team_return_sum" in figures


def test_ddpg_learns_a_shared_actor_on_a_continuous_env_of_two_agents(tmp_path):
    """DDPG's model is sized for one agent (``Box((2, 1))`` -> ``action_dim`` 1 in ``[-1, 1]``); both agents' transitions
    train one actor, which must reach each agent's own target from its own row. About 7 s."""
    cfg = {
        "seed": 0,
        "max_env_step": 1000,
        "env": {
            "env_type": "test_reach_agents",
            "manager_type": "base",
            "collector_env_num": 2,
            "evaluator_env_num": 1,
        },
        "policy": {
            "policy_type": "ddpg",
            "model": {"hidden_sizes": [32]},
            "learn": {"batch_size": 32, "learning_starts": 100, "update_per_collect": 4},
            "collect": {"n_sample": 8},
        },
        "replay_buffer": {"maxlen": 5000},
        "actor": {"slots": INDEPENDENT},
        "evaluator": {"n_episode": 1, "eval_freq": 100000, "stop_val": 100},
    }
    with SerialTrainer(cfg, seed=0, exp_name="ddpg", run_root=str(tmp_path)) as trainer:
        model = trainer.policy.model
        assert model.action_dim == 1 and model.action_low.tolist() == [-1.0] and model.action_high.tolist() == [1.0]
        trainer.run(progress=False)
        figures = trainer.loop.evaluate()
    # a random actor earns -2.9 per agent, the untrained one (actions near 0) about -1.25; reaching a target: 0
    assert figures["eval/return/left"] > -0.5 and figures["eval/return/right"] > -0.5
    assert figures["eval/team_return_sum"] == pytest.approx(figures["eval/mean_reward"])  # team_reward: sum
