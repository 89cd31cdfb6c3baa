"""Tic-tac-toe: a learning slot (DQN with action masks) against an act-only uniformly random slot, as first mover.

Only the learning seat's transitions become samples, outcomes are counted exactly, and the trained greedy policy wins
at least 90% of 200 fresh games against random, trained in serial mode and through the parallel mode.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from nervex.config import ConfigError, apply_overrides, read_config
from nervex.entry import DefaultCallbacks, SerialTrainer, compile_config, load_policy
from nervex.entry.builder import make_actor, make_env_managers, make_evaluator, make_policy
from nervex.policy import CollectSpec

pytest.importorskip("pettingzoo")

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = REPO_ROOT / "app_zoo" / "games" / "tictactoe" / "config" / "tictactoe_dqn.yaml"
DIST_CONFIG = REPO_ROOT / "app_zoo" / "games" / "tictactoe" / "dist" / "tictactoe_dqn_dist.yaml"
EVAL_GAMES = 200
EVAL_SEED = 12345  # games no training run saw (evaluator envs: seed + 100000 + i)


def evaluate_first_mover(cfg: Any, policy: Any, seed: int = EVAL_SEED) -> Dict[str, Any]:
    """``EVAL_GAMES`` greedy games of ``policy`` (seat 0) against the config's random slot (seat 1)."""
    cfg = compile_config(apply_overrides(cfg, [f"evaluator.n_episode={EVAL_GAMES}"]))
    _, evaluator_env, _ = make_env_managers(cfg, seed, collector=False)
    evaluator = make_evaluator(cfg, evaluator_env, policy, seed=seed)
    try:
        return evaluator.eval()
    finally:
        evaluator.close()


def assert_outcomes_exact(result: Dict[str, Any], games: int) -> None:
    assert result["eval/n_episode"] == games
    assert result["eval/wins"] + result["eval/draws"] + result["eval/losses"] == games
    assert result["eval/win_rate"] == result["eval/wins"] / games
    assert result["eval/mean_reward"] == pytest.approx((result["eval/wins"] - result["eval/losses"]) / games)


def test_only_the_learning_seats_decisions_become_samples_and_outcomes_add_up():
    """One env, whole games: every decision of seat 0 is one sample (its transition to its next move or the game's
    end), none of seat 1's; wins + draws + losses = games."""
    cfg = compile_config(apply_overrides(read_config(CONFIG), ["env.collector_env_num=1"]))
    collector_env, _, env_info = make_env_managers(cfg, seed=3, evaluator=False)
    policy = make_policy(cfg, env_info, enable_field=["collect"])
    actor = make_actor(cfg, collector_env, policy, seed=3)
    main = actor.seating.slots["main"]
    decisions: List[int] = []
    act = main.act
    main.act = lambda keys, obs, setting, random_action: (
        decisions.extend(keys) or act(keys, obs, setting, random_action)
    )
    try:
        samples = actor.collect(CollectSpec("episode", 10), {}, random_action=True)
        samples += actor.collect(CollectSpec("episode", 10), {"eps": 0.3})
        assert len(samples) == len(decisions) > 0
        assert all(int(s["obs"]["to_play"]) == 0 for s in samples)
        assert sum(bool(s["done"]) for s in samples) == actor.episode_count == 20
        stats = actor.stats()
        assert stats["rollout/wins"] + stats["rollout/draws"] + stats["rollout/losses"] == 20
        # the learner's reward is the game's end only: +1, 0 or -1 on the last transition of each game
        finals = [float(s["reward"][0]) for s in samples if s["done"]]
        assert sorted(set(finals)) <= [-1.0, 0.0, 1.0] and all(
            float(s["reward"][0]) == 0.0 for s in samples if not s["done"]
        )
        assert finals.count(1.0) == stats["rollout/wins"] and finals.count(-1.0) == stats["rollout/losses"]
    finally:
        actor.close()


class SampleCount(DefaultCallbacks):
    def __init__(self) -> None:
        self.samples = 0
        self.other_seat = 0

    def on_sample_end(self, trainer: Any, samples: List[Dict[str, Any]]) -> None:
        self.samples += len(samples)
        self.other_seat += sum(int(s["obs"]["to_play"]) != 0 for s in samples)


@pytest.mark.slow
def test_serial_dqn_wins_90_percent_of_games_as_first_mover(tmp_path):
    counter = SampleCount()
    cfg = read_config(CONFIG)
    with SerialTrainer(cfg, seed=0, run_root=str(tmp_path), callbacks=counter) as trainer:
        for _ in trainer:
            pass
        assert trainer.stopped
        assert counter.other_seat == 0 and len(trainer.buffer) == counter.samples  # seat 0's transitions only
        stats = trainer.actor.stats()
        assert stats["rollout/wins"] + stats["rollout/draws"] + stats["rollout/losses"] == stats["rollout/episodes"]
        result = evaluate_first_mover(cfg, trainer.policy)
    assert_outcomes_exact(result, EVAL_GAMES)
    assert result["eval/win_rate"] >= 0.9, result


@pytest.mark.slow
def test_parallel_dqn_wins_90_percent_of_games_as_first_mover(tmp_path):
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "nervex.system.launch", str(DIST_CONFIG), "--run-dir", str(run_dir)]
    command += ["--actors", "2", "--timeout", "400", "--set", "num_threads=1"]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=460)
    assert done.returncode == 0, done.stderr[-3000:]
    conn = sqlite3.connect(run_dir / "coordinator.sqlite")
    try:
        rows = conn.execute("SELECT result FROM tasks WHERE kind='collect' AND state='done'").fetchall()
    finally:
        conn.close()
    results = [json.loads(row[0]) for row in rows]
    episodes = [episode for result in results for episode in result["episodes"]]
    assert episodes and all(episode["outcome"] in (-1, 0, 1) for episode in episodes)
    assert all(
        episode["return"] == episode["outcome"] for episode in episodes
    )  # the first mover's reward is its outcome
    steps, samples = sum(r["env_steps"] for r in results), sum(r["n_samples"] for r in results)
    # seat 0 makes ceil(L/2) of a game's L moves (5 <= L <= 9); 2 actors x 8 envs may end with a game unfinished
    assert steps / 2 - 16 <= samples <= steps * 3 / 5 + 16
    cfg = read_config(CONFIG)  # the serial twin of the dist config: the same policy, model and slots
    policy = load_policy(str(run_dir / "ckpt" / "best.pt"), compile_config(cfg))
    result = evaluate_first_mover(cfg, policy)
    assert_outcomes_exact(result, EVAL_GAMES)
    assert result["eval/win_rate"] >= 0.9, result


def test_a_malformed_slot_is_refused_when_the_config_is_compiled():
    """``actor.slots`` is checked by the compile (``check_slots``), before any env or actor exists."""
    cfg = apply_overrides(read_config(CONFIG), ["actor.slots.opponent.kind=randm"])
    with pytest.raises(ConfigError, match=r"actor\.slots\.opponent\.kind.*did you mean 'random'"):
        compile_config(cfg)
