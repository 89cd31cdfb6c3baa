"""FootballEnv on the real engine (skipped where app_zoo/gfootball/install.sh has not built it): shapes, the scoring
and checkpoint rewards, end flags, seeding, many agents, stacked minimaps, pickling, a subprocess manager."""

from __future__ import annotations

import pickle
from typing import Any, List

import numpy as np
import pytest

from app_zoo.gfootball.envs import FootballEnv, gfootball_available

pytestmark = pytest.mark.skipif(
    not gfootball_available(), reason="gfootball engine not built (app_zoo/gfootball/install.sh)"
)

RIGHT, SHOT = 5, 12  # gfootball's default action set: ... 5 right ... 12 shot


def score_in_empty_goal(env: FootballEnv, max_steps: int = 100) -> List[Any]:
    """Run right with the ball, then shoot: scores in academy_empty_goal_close."""
    steps = []
    for t in range(max_steps):
        ts = env.step(RIGHT if t < 6 else SHOT)
        steps.append(ts)
        if ts.done:
            break
    return steps


def rollout(env: FootballEnv, seed: int, n_steps: int) -> List[np.ndarray]:
    rng = np.random.default_rng(seed)
    env.seed(seed)
    trace = [env.reset()]
    for _ in range(n_steps):
        ts = env.step(rng.integers(env.info().act_space.n))
        trace.append(ts.obs)
        if ts.done:
            trace.append(env.reset())
    return trace


@pytest.fixture
def env():
    env = FootballEnv({"env_name": "academy_empty_goal_close"})
    yield env
    env.close()


def test_simple115v2_shapes_and_spaces(env):
    info = env.info()
    assert info.agent_num == 1 and info.act_space.n == 19
    assert info.max_episode_steps == 400  # the academy's game_duration
    assert info.obs_space.shape == (115,)
    env.seed(0)
    obs = env.reset()
    assert obs.shape == (115,) and obs.dtype == np.float32
    assert obs in info.obs_space
    ts = env.step(0)
    assert ts.obs.shape == (115,) and isinstance(ts.reward, float)
    assert ts.info["score_reward"] == 0.0


def test_a_goal_gives_reward_one_and_terminates(env):
    env.seed(1)
    env.reset()
    steps = score_in_empty_goal(env)
    last = steps[-1]
    assert last.done and last.reward == 1.0 and last.info["score_reward"] == 1.0
    assert last.info["terminated"] is True and last.info["truncated"] is False
    assert all(ts.reward == 0.0 for ts in steps[:-1])
    assert last.info["episode_return"] == 1.0 and last.info["episode_len"] == len(steps)
    assert last.info["episode_stats"] == {"goal": 1.0, "win": 1.0, "score_reward": 1.0}


def test_idle_until_the_time_limit_truncates():
    env = FootballEnv({"env_name": "academy_empty_goal_close", "max_episode_steps": 5})
    try:
        env.seed(0)
        env.reset()
        steps = [env.step(0) for _ in range(5)]
        assert env.info().max_episode_steps == 5
        assert [ts.done for ts in steps] == [False] * 4 + [True]
        info = steps[-1].info
        assert info["truncated"] is True and info["terminated"] is False
        assert info["episode_stats"]["goal"] == 0.0 and info["episode_return"] == 0.0
        with pytest.raises(RuntimeError, match="before reset"):
            env.step(0)
    finally:
        env.close()


def test_checkpoint_rewards_come_before_the_goal():
    env = FootballEnv({"env_name": "academy_empty_goal_close", "rewards": "scoring,checkpoints"})
    try:
        env.seed(1)
        env.reset()
        steps = score_in_empty_goal(env)
        rewards = [ts.reward for ts in steps]
        # 10 checkpoints of 0.1 at most, then the goal's 1.0; the scoring reward alone stays 0 until the goal
        assert sum(rewards) == pytest.approx(2.0)
        assert sum(rewards[:-1]) > 0 and all(ts.info["score_reward"] == 0.0 for ts in steps[:-1])
        assert steps[-1].info["episode_stats"]["goal"] == 1.0
    finally:
        env.close()


def test_same_seed_same_episodes_other_seed_differs():
    first, second = (FootballEnv({"env_name": "academy_3_vs_1_with_keeper"}) for _ in range(2))
    try:
        a, b = rollout(first, 3, 60), rollout(second, 3, 60)
        assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
        c = rollout(second, 4, 60)
        assert len(a) != len(c) or any(not np.array_equal(x, y) for x, y in zip(a, c))
    finally:
        first.close()
        second.close()


def test_unknown_scenario_is_named_not_an_exit():
    env = FootballEnv({"env_name": "academy_empty_goal_clos"})
    with pytest.raises(ValueError, match="did you mean 'academy_empty_goal_close'"):
        env.info()
    with pytest.raises(ValueError, match="unknown scenario"):
        env.reset()


def test_bad_actions_are_rejected(env):
    env.seed(0)
    env.reset()
    with pytest.raises(ValueError, match="not in 0..18"):
        env.step(19)


def test_many_agents_layout():
    env = FootballEnv(
        {"env_name": "academy_3_vs_1_with_keeper", "controlled_players": 3, "rewards": "scoring,checkpoints"}
    )
    try:
        info = env.info()
        assert info.agent_num == 3 and info.team_reward == "mean"
        assert info.act_space.nvec.tolist() == [19, 19, 19]
        assert info.agent_ids == ("player_0", "player_1", "player_2")
        env.seed(0)
        obs = env.reset()
        assert obs["obs"].shape == (3, 115) and obs["global_state"].shape == (115,)
        assert obs in info.obs_space
        # the agents' views differ only in the active-player one-hot (entries 97..107); the state marks all three
        active = obs["obs"][:, 97:108]
        assert active.sum(axis=1).tolist() == [1.0, 1.0, 1.0] and active.argmax(axis=1).tolist() != [0, 0, 0]
        shared = np.delete(obs["obs"], range(97, 108), axis=1)
        assert (shared == shared[0]).all()
        assert obs["global_state"][97:108].sum() == 3.0
        ts = env.step(np.zeros(3, np.int64))
        assert ts.reward.shape == (3,) and ts.reward.dtype == np.float64
        with pytest.raises(ValueError, match="per controlled player"):
            env.step([0, 0])
    finally:
        env.close()


@pytest.mark.parametrize("stacked, channels", [(False, 4), (True, 16)])
def test_extracted_minimap_is_channel_first_uint8(stacked, channels):
    env = FootballEnv({"env_name": "academy_empty_goal_close", "representation": "extracted", "stacked": stacked})
    try:
        assert env.info().obs_space.shape == (channels, 72, 96)
        env.seed(0)
        obs = env.reset()
        assert obs.shape == (channels, 72, 96) and obs.dtype == np.uint8 and obs.flags.c_contiguous
        assert obs in env.info().obs_space
        assert obs[2].max() == 255  # the ball's plane shows the ball
        ts = env.step(RIGHT)
        assert ts.obs.shape == (channels, 72, 96)
        if stacked:  # oldest frame first: the reset frame is repeated, the newest is the step's
            np.testing.assert_array_equal(ts.obs[:4], obs[:4])
            np.testing.assert_array_equal(ts.obs[12:], env.step(RIGHT).obs[8:12])
    finally:
        env.close()


def test_pickles_without_the_engine(env):
    env.seed(5)
    env.reset()
    clone = pickle.loads(pickle.dumps(env))
    try:
        assert clone._football is None
        assert clone.reset().shape == (115,)
    finally:
        clone.close()


def test_nervex_check_env_passes():
    from nervex.envs.check_env import check_env

    check_env(FootballEnv({"env_name": "academy_empty_goal_close"}), n_steps=100)


def test_subprocess_manager_steps_football_envs():
    from nervex.worker.actor.env_manager import SubprocessEnvManager

    manager = SubprocessEnvManager(FootballEnv, {"env_name": "academy_empty_goal_close"}, 2, episode_num=1)
    try:
        manager.seed(0)
        manager.launch()
        ends = 0
        for _ in range(500):
            obs = manager.ready_obs
            if not obs:
                break
            for timestep in manager.step({i: SHOT for i in obs}).values():
                assert timestep.obs.shape == (115,)
                ends += timestep.done
        assert ends == 2
    finally:
        manager.close()
