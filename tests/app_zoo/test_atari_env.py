"""AtariEnv: registration, the episode figures under episodic life and clipping, seeding, switches, pickling."""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import Any, Dict, List

import numpy as np
import pytest

pytest.importorskip("ale_py")

from app_zoo.atari import AtariEnv  # noqa: E402 - after the importorskip
from nervex.envs.check_env import check_env  # noqa: E402
from nervex.utils import ENV_REGISTRY  # noqa: E402


def frame_number(env: AtariEnv) -> int:
    return env.gym_env.unwrapped.ale.getEpisodeFrameNumber()


def rollout(env: AtariEnv, seed: int, n_steps: int) -> List[np.ndarray]:
    space = env.info().act_space
    space.seed(seed)
    env.seed(seed)
    trace = [env.reset()]
    for _ in range(n_steps):
        ts = env.step(space.sample())
        trace.append(ts.obs)
        if ts.done:
            trace.append(env.reset())
    return trace


def play_game(env: AtariEnv, seed: int, max_steps: int = 5000) -> Dict[str, Any]:
    """Random actions until the game is over; collects every done's info and the per-step figures."""
    space = env.info().act_space
    space.seed(seed)
    env.seed(seed)
    env.reset()
    dones, rewards, raw_rewards = [], [], []
    for _ in range(max_steps):
        ts = env.step(space.sample())
        rewards.append(ts.reward)
        raw_rewards.append(ts.info["raw_reward"])
        if ts.done:
            dones.append(dict(ts.info, lives=env.gym_env.unwrapped.ale.lives(), frame=frame_number(env)))
            if ts.info["game_over"]:
                return dict(dones=dones, rewards=rewards, raw_rewards=raw_rewards)
            env.reset()
    raise AssertionError(f"no game over within {max_steps} steps; dones so far: {dones}")


def test_registered_with_deepmind_shapes():
    assert ENV_REGISTRY.get("atari") is AtariEnv
    env = AtariEnv({"env_id": "PongNoFrameskip-v4"})
    info = env.info()
    assert info.obs_space.shape == (4, 84, 84) and info.obs_space.dtype == np.uint8
    assert info.act_space.n == 6
    env.seed(0)
    obs = env.reset()
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    ts = env.step(0)
    assert ts.obs.shape == (4, 84, 84) and ts.reward in (-1.0, 0.0, 1.0)
    env.close()


def test_check_env_passes_on_pong():
    check_env(AtariEnv({"env_id": "PongNoFrameskip-v4"}), n_steps=100)


def test_same_seed_same_observations_other_seed_differs():
    first = rollout(AtariEnv({}), seed=7, n_steps=50)
    second = rollout(AtariEnv({}), seed=7, n_steps=50)
    assert len(first) == len(second)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    other = rollout(AtariEnv({}), seed=8, n_steps=50)
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_episodic_life_breakout_terminates_per_life_and_reports_the_whole_game():
    env = AtariEnv({"env_id": "BreakoutNoFrameskip-v4"})
    game = play_game(env, seed=5)  # a seed whose random play scores in three different lives
    dones = game["dones"]
    life_losses, end = dones[:-1], dones[-1]
    assert [d["lives"] for d in life_losses] == [4, 3, 2, 1]
    for d in life_losses:
        assert d["terminated"] and not d["truncated"]  # no bootstrap past a lost life...
        assert d["life_loss"] and not d["game_over"]
        assert "episode_return" not in d and "episode_len" not in d  # ...but the game goes on
    # the emulator was never restarted between lives
    assert [d["frame"] for d in dones] == sorted(d["frame"] for d in dones)
    assert end["game_over"] and end["terminated"] and not end["truncated"]
    assert end["episode_len"] == len(game["rewards"])
    assert end["episode_return"] == sum(game["raw_rewards"]) == 3.0
    assert sum(1 for r in game["raw_rewards"] if r) == 3
    # a plain reset after the game's end starts a new game with every life
    env.reset()
    assert env.gym_env.unwrapped.ale.lives() == 5 and frame_number(env) < 100
    env.close()


def test_clipped_rewards_but_unclipped_episode_return():
    env = AtariEnv({"env_id": "SpaceInvadersNoFrameskip-v4"})  # pays 5..30 per alien
    game = play_game(env, seed=0)
    assert set(game["rewards"]) <= {0.0, 1.0}
    assert max(game["raw_rewards"]) >= 5.0
    end = game["dones"][-1]
    assert end["episode_return"] == sum(game["raw_rewards"]) > sum(game["rewards"])
    env.close()


def test_time_limit_counts_the_whole_game_and_ends_it():
    env = AtariEnv({"env_id": "BreakoutNoFrameskip-v4", "max_episode_steps": 60})
    env.seed(0)
    env.reset()
    dones = []
    for step in range(1, 200):
        ts = env.step(1)  # FIRE, never moving: the first life is lost after ~25 steps
        if ts.done:
            dones.append(dict(ts.info, step=step))
            if ts.info["game_over"]:
                break
            env.reset()
    assert dones[0]["life_loss"] and dones[0]["terminated"]
    end = dones[-1]
    assert end["step"] == 60 and end["truncated"] and not end["terminated"]
    assert end["episode_len"] == 60 and "episode_return" in end
    env.reset()  # the cut game must not go on
    assert env.gym_env.unwrapped.ale.lives() == 5
    env.close()


def test_seeded_reset_restarts_a_game_in_progress():
    env = AtariEnv({"env_id": "BreakoutNoFrameskip-v4"})
    env.seed(0)
    env.reset()
    for _ in range(200):  # lose a life: the next plain reset would go on with the game
        if env.step(1).done:
            break
    assert env.gym_env.unwrapped.ale.lives() == 4
    env.seed(0)
    env.reset()
    assert env.gym_env.unwrapped.ale.lives() == 5
    game_len = None
    for step in range(1, 1000):
        ts = env.step(1)
        if ts.done and ts.info["game_over"]:
            game_len = step
            break
        if ts.done:
            env.reset()
    assert game_len is not None and ts.info["episode_len"] == game_len  # the figures restarted with the game
    env.close()


def test_every_wrapper_can_be_switched_off():
    off = dict(noop_max=0, frame_skip=1, episodic_life=False, fire_reset=False, clip_reward=False)
    env = AtariEnv(dict(off, warp_frame=False, frame_stack=0))
    assert type(env.gym_env).__name__ == "AtariEnv"  # ale_py's env, nothing around it
    env.seed(0)
    assert env.reset().shape == (210, 160)
    env.step(0)
    assert frame_number(env) == 1
    env.close()
    rgb = AtariEnv({"grayscale": False})
    assert rgb.info().obs_space.shape == (12, 84, 84)
    rgb.seed(0)
    assert rgb.reset().shape == (12, 84, 84)
    rgb.close()


def test_v5_ids_need_their_frame_skip_off():
    env = AtariEnv({"env_id": "ALE/Pong-v5", "env_kwargs": {"frameskip": 1, "repeat_action_probability": 0.25}})
    env.seed(0)
    assert env.reset().shape == (4, 84, 84)
    env.close()
    with pytest.raises(ValueError, match="set env_kwargs.frameskip: 1"):
        AtariEnv({"env_id": "ALE/Pong-v5"}).reset()


def test_pickled_env_plays_like_a_fresh_one():
    used = AtariEnv({})
    rollout(used, seed=1, n_steps=5)
    clone = pickle.loads(pickle.dumps(used))  # what a subprocess env manager does
    used.close()
    a, b = rollout(clone, seed=3, n_steps=20), rollout(AtariEnv({}), seed=3, n_steps=20)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_without_ale_py_import_works_and_building_says_how_to_install():
    code = (
        "import sys; sys.modules['ale_py'] = None\n"
        "import app_zoo.atari\n"
        "from nervex.utils import ENV_REGISTRY\n"
        "assert 'atari' in ENV_REGISTRY\n"
        "try:\n"
        "    app_zoo.atari.AtariEnv({})\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install -e .[atari]" in out.stdout
