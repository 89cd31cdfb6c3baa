"""Logs of a many-agent env: the team return with its reduction named (``team_return_sum``, ``team_return_mean``),
each agent's return and the env's ``info['episode_stats']``, as ``rollout/*`` (means over the actor's window),
``eval/*`` (means over an evaluation), columns of ``eval.csv`` and TensorBoard scalars.

Expected numbers: the two-step game pays every agent the team's payoff (``team_reward: mean``): branch 2A pays 7,
branch 2B with the joint action (1, 0) pays 1. ``AgentsEnv`` (three moves, agent ``c`` leaves after the first)
returns a 6, b 12, c 3 (``team_reward: sum``: 21), with stats ``coverage`` 0.5 and ``win`` 1 on even episodes.
"""

from __future__ import annotations

import csv
import math
import os
from typing import Any, Dict, List

import numpy as np
import pytest

from nervex.entry import SerialTrainer
from nervex.envs import TwoStepGameEnv
from nervex.policy import CollectSpec
from nervex.policy.common_policy import standard_transition
from nervex.policy.modes import CollectMode
from nervex.rl_utils import Adder
from nervex.utils.registry import ENV_REGISTRY
from nervex.worker.actor import EpisodeResult, SerialActor, SerialEvaluator
from nervex.worker.actor.env_manager import BaseEnvManager
from nervex.worker.actor.figures import episode_stats
from nervex.worker.learner import EVAL_CSV_FIELDS

from .envs import AgentsEnv, ClockEnv

ENV_REGISTRY.register("test_agents_env", AgentsEnv, force=True)
AGENT_COLUMNS = ["team_return_sum", "team_return_mean", "return/a", "return/b", "return/c"]


class JointPolicy:
    """A collect and eval mode acting for all agents of an env at once (the default slot): on the two-step game env
    0 takes branch 2A and env 1 branch 2B then (1, 0); on AgentsEnv every agent's legal action."""

    def __init__(self) -> None:
        self.adder = Adder(kind="nstep", nstep=1, gamma=0.9)

    def forward(self, data_id: List[int], obs: Dict[int, Any], **setting: Any) -> Dict[int, Dict[str, Any]]:
        out = {}
        for k in data_id:
            mask = np.asarray(obs[k]["action_mask"])
            if obs[k]["obs"].shape == (2, 3):  # the two-step game: (branch by env, agent 1's action) = (k, 0)
                out[k] = {"action": np.array([k % 2 if obs[k]["obs"][0, 0] == 1 else 1, 0], dtype=np.int64)}
            else:
                out[k] = {"action": mask.argmax(axis=1).astype(np.int64)}
        return out

    def reset(self, data_id: Any) -> None:
        pass

    @property
    def collect_mode(self) -> CollectMode:
        return CollectMode(self.forward, standard_transition, self.adder, None, self.reset, lambda s: None)


class Results:
    def __init__(self) -> None:
        self.results: List[EpisodeResult] = []

    def on_episode_result(self, result: EpisodeResult) -> None:
        self.results.append(result)


def test_team_and_agent_returns_are_the_hand_sums_on_the_two_step_game():
    policy, results = JointPolicy(), Results()
    manager = BaseEnvManager(TwoStepGameEnv, [{}, {}], 2)
    actor = SerialActor({"ep_info_window": 4}, manager, policy.collect_mode, callbacks=results)
    try:
        actor.collect(CollectSpec("sample", 8), {})  # two episodes of each env
        assert [(r.env_id, r.returns, r.agent_returns) for r in results.results[:2]] == [
            (0, {"main": 7.0}, {"agent_0": 7.0, "agent_1": 7.0}),
            (1, {"main": 1.0}, {"agent_0": 1.0, "agent_1": 1.0}),
        ]
        stats = actor.stats()
        # ep_rew_mean is the slot's return, the env's 'mean' over agents; team_return_sum names its reduction
        assert stats["rollout/ep_rew_mean"] == 4.0
        assert stats["rollout/team_return_sum"] == 8.0 and stats["rollout/team_return_mean"] == 4.0
        assert stats["rollout/return/agent_0"] == 4.0 and stats["rollout/return/agent_1"] == 4.0
    finally:
        actor.close()


def test_rollout_figures_average_agent_returns_and_episode_stats_over_the_window():
    policy = JointPolicy()
    manager = BaseEnvManager(AgentsEnv, [{"env_tag": 0.0}, {"env_tag": 1.0}], 2)
    actor = SerialActor({"ep_info_window": 4}, manager, policy.collect_mode)
    try:
        actor.collect(CollectSpec("sample", 6), {})  # each env's episode 0: a win
        first = actor.stats()
        assert first["rollout/win"] == 1.0 and first["rollout/coverage"] == 0.5
        actor.collect(CollectSpec("sample", 6), {})  # each env's episode 1: no win
        stats = actor.stats()
        assert {k: v for k, v in stats.items() if k.startswith("rollout/") and k != "rollout/episodes"} == {
            "rollout/ep_rew_mean": 21.0,  # team_reward: sum
            "rollout/ep_len_mean": 3.0,
            "rollout/team_return_sum": 21.0,
            "rollout/team_return_mean": 7.0,
            "rollout/return/a": 6.0,
            "rollout/return/b": 12.0,
            "rollout/return/c": 3.0,
            "rollout/coverage": 0.5,
            "rollout/win": 0.5,
        }
    finally:
        actor.close()


def test_a_single_agent_actor_logs_no_agent_figures():
    policy = JointPolicy()
    actor = SerialActor({}, BaseEnvManager(ClockEnv, [{}], 1), CollectMode(
        lambda ids, obs, **s: {k: {"action": 0} for k in ids}, standard_transition, policy.adder, None,
        lambda ids: None, lambda s: None,
    ))  # fmt: skip
    try:
        actor.collect(CollectSpec("sample", 3), {})
        rollout = sorted(k for k in actor.stats() if k.startswith("rollout/"))
        assert rollout == ["rollout/ep_len_mean", "rollout/ep_rew_mean", "rollout/episodes"]
    finally:
        actor.close()


def test_the_evaluator_reports_team_agent_and_stat_means():
    manager = BaseEnvManager(AgentsEnv, [{}], 1, episode_num=2)
    evaluator = SerialEvaluator({"n_episode": 2}, manager, JointPolicy())  # forward and reset: an eval mode
    try:
        assert evaluator.figure_names == AGENT_COLUMNS  # known from the env before any episode
        figures = evaluator.eval()
        assert figures["eval/mean_reward"] == 21.0 and figures["eval/n_episode"] == 2
        assert {k: figures[f"eval/{k}"] for k in AGENT_COLUMNS} == dict(zip(AGENT_COLUMNS, [21.0, 7.0, 6.0, 12.0, 3.0]))
        assert figures["eval/coverage"] == 0.5 and figures["eval/win"] == 0.5  # one win in two episodes
        assert evaluator.figure_names == AGENT_COLUMNS + ["coverage", "win"]
    finally:
        evaluator.close()


@pytest.mark.parametrize(
    "stats, message",
    [
        ([0.5], "info['episode_stats'] must be a dict of floats, got list"),
        ({"ep_rew_mean": 1.0}, "names a stat 'ep_rew_mean'; a stat is an identifier other than env_* and"),
        ({"env_steps": 1.0}, "names a stat 'env_steps'"),
        ({"cover age": 1.0}, "names a stat 'cover age'"),
        ({"coverage": "high"}, "info['episode_stats']['coverage'] must be a number, got 'high'"),
        ({"coverage": float("nan")}, "info['episode_stats']['coverage'] must be finite, got nan"),
    ],
)  # fmt: skip
def test_a_malformed_episode_stat_is_an_error_that_names_the_env_and_stat(stats, message):
    with pytest.raises(ValueError) as error:
        episode_stats({"episode_stats": stats}, env_id=3)
    assert str(error.value).startswith("env 3: ") and message in str(error.value)
    assert episode_stats({"episode_stats": {"win": True, "b": np.float32(2)}}, 0) == {"b": 2.0, "win": 1.0}


def test_eval_csv_and_tensorboard_get_the_agent_columns(tmp_path):
    """Independent DQN on AgentsEnv (one legal action per agent, so every return is known) through the trainer."""
    cfg = {
        "seed": 0,
        "max_env_step": 48,
        "env": {"env_type": "test_agents_env", "manager_type": "base", "collector_env_num": 2, "evaluator_env_num": 1},
        "policy": {"policy_type": "dqn", "model": {"hidden_sizes": [8]}, "learn": {"learning_starts": 16}},
        "actor": {"slots": {"main": {"kind": "learn", "independent": True}}},
        "evaluator": {"n_episode": 2, "eval_freq": 24, "stop_val": 1000},
    }
    with SerialTrainer(cfg, seed=0, exp_name="logs", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
        latest = dict(trainer.loop.scalar_writer.latest)
        run_dir = trainer.run_dir
    with open(os.path.join(run_dir, "eval.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == EVAL_CSV_FIELDS + AGENT_COLUMNS + ["coverage", "win"]
    assert len(rows) == 2
    for row in rows:
        assert [float(row[k]) for k in ["mean_reward", *AGENT_COLUMNS]] == [21.0, 21.0, 7.0, 6.0, 12.0, 3.0]
        assert float(row["coverage"]) == 0.5 and float(row["win"]) == 0.5
    for name, value in {"team_return_sum": 21.0, "return/c": 3.0, "coverage": 0.5}.items():
        assert latest[f"eval/{name}"] == value and latest[f"rollout/{name}"] == value
    assert math.isclose(latest["rollout/win"], 0.5, abs_tol=0.26)  # the window may end on a win or a loss
