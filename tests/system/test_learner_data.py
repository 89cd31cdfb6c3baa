"""``DataIntake``: what the parallel learner counts of the polled results, whatever their samples files hold."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

from nervex.policy import CollectSpec, LearnSpec
from nervex.system.comm.storage import Storage
from nervex.system.learner_data import DataIntake

MISSING = "samples/" + "0" * 64 + ".safetensors"
REPO_ROOT = Path(__file__).resolve().parents[2]


def make_intake(tmp_path, learning_starts: int = 0, update_per_collect: int = 1) -> DataIntake:
    """An off-policy intake over a real (empty) storage path; its loop holds only the counters it reads and moves."""
    contract = SimpleNamespace(
        on_policy=False,
        learn=LearnSpec(batch_size=4, update_per_collect=update_per_collect, learning_starts=learning_starts),
        collect=CollectSpec("sample", 8),
    )
    loop = SimpleNamespace(contract=contract, train_iter=0, env_step=0)
    storage = Storage(str(tmp_path / "storage"), min_free_bytes=0)
    return DataIntake(loop, storage, None, logging.getLogger("test_learner_data"))  # type: ignore[arg-type]


def test_game_outcomes_are_counted_exactly_even_when_the_samples_are_gone(tmp_path):
    intake = make_intake(tmp_path)
    outcomes = [[1, 1, 0], [-1], [1, None]]  # None: an episode without an outcome (not a game) counts in no column
    items = [
        {
            "seq": seq + 1,
            "task_id": f"t{seq}",
            "result": {
                "data": MISSING,
                "env_steps": 8,
                "policy_iter": 0,
                "episodes": [{"return": float(o or 0), "length": 5, "outcome": o} for o in task],
            },
        }
        for seq, task in enumerate(outcomes)
    ]
    assert intake.ingest(items) == 0  # no samples file: nothing stored, each counted missing
    figures = intake.figures()
    assert (figures["rollout/wins"], figures["rollout/draws"], figures["rollout/losses"]) == (3.0, 1.0, 1.0)
    assert figures["rollout/win_rate"] == 3 / 5
    assert figures["data/missing"] == 3.0 and intake.loop.env_step == 24 and intake.seq == 3
    assert figures["rollout/ep_rew_mean"] == (1 + 1 + 0 - 1 + 1 + 0) / 6


@pytest.mark.parametrize(
    "env_step_after, env_steps, credited",
    [
        (504, 8, 8),  # one collection ending past learning_starts (500): all of it, as serial trains after it
        (512, 8, 8),  # a later one: all of it
        # a large first result: the 524 steps past 500 plus one collection (serial: 66 collections, 528)
        (1024, 1024, 532),
        (2048, 1024, 1024),  # every result after the crossing: all of it
    ],
    ids=["crossing collection", "next collection", "large crossing result", "large later result"],
)
def test_the_result_crossing_learning_starts_earns_what_serial_mode_would_train(
    tmp_path, env_step_after, env_steps, credited
):
    intake = make_intake(tmp_path, learning_starts=500, update_per_collect=4)
    intake.loop.env_step = env_step_after
    assert intake._credited_steps(env_steps) == credited
    assert intake.ratio == 4 / 8


@pytest.mark.parametrize(
    "config",
    [
        "classic_control/cartpole/config/cartpole_dqn.yaml",
        "classic_control/pendulum/config/pendulum_sac.yaml",
        "classic_control/pendulum/config/pendulum_ppo.yaml",
        "games/tictactoe/config/tictactoe_dqn.yaml",
        "multiagent/two_step/config/two_step_qmix.yaml",
        "multiagent/mpe/config/simple_spread5_ddpg.yaml",
    ],
)
def test_the_sample_check_passes_what_real_actors_collect(config):
    """No false alarm: samples the serial actor really collects (single agent, continuous and discrete, a game with
    masks, joint multi-agent sequences, independent learners over agents) fit the env's declared spaces. A check that
    refused these would stall a parallel run without an error."""
    from nervex.config import read_config
    from nervex.entry import compile_config
    from nervex.entry.builder import make_actor, make_env_managers, make_policy
    from nervex.system.learner_data import SampleCheck

    cfg = compile_config(read_config(str(REPO_ROOT / "app_zoo" / config)))
    cfg.env.collector_env_num = min(2, int(cfg.env.collector_env_num))
    collector, evaluator, info = make_env_managers(cfg, 0)
    try:
        policy = make_policy(cfg, info)
        actor = make_actor(cfg, collector, policy, 0)
        spec = type(policy).contract(policy.cfg).collect
        n = spec.n if spec.unit != "sample" else max(64, spec.n)
        samples = [s for _ in range(2) for s in actor.collect(CollectSpec(spec.unit, n, False))]
        assert samples
        assert SampleCheck(info.obs_space, info.act_space, info.agent_num).problem(samples) is None
        broken = [dict(sample) for sample in samples]
        broken[0]["action"] = np.full_like(np.asarray(broken[0]["action"]), 10**6)  # no env here has that action
        if not isinstance(info.act_space, gym.spaces.Box):
            assert "field 'action'" in SampleCheck(info.obs_space, info.act_space, info.agent_num).problem(broken)
    finally:
        collector.close()
        evaluator.close()
