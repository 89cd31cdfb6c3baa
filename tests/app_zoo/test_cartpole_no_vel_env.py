"""CartPoleNoVelEnv ('cartpole_no_vel'): CartPole-v1 with velocities zeroed, everything else CartPole's."""

from __future__ import annotations

import os
import pickle

import gymnasium as gym
import numpy as np
import pytest

from app_zoo.classic_control.cartpole.envs import CartPoleEnv, CartPoleNoVelEnv
from nervex.config import apply_overrides, read_config
from nervex.entry import compile_config
from nervex.envs import GymEnv, create_env, get_env_cls
from nervex.envs.check_env import check_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POSITIONS, VELOCITIES = [0, 2], [1, 3]


def balancing_action(obs: np.ndarray) -> int:
    """Keeps CartPole up for the whole 500 steps (it needs the velocities: use the unmasked twin's observation)."""
    return int(obs[2] + 0.5 * obs[3] > 0)


def test_registered_and_built_from_a_yaml_config():
    assert get_env_cls("cartpole_no_vel") is CartPoleNoVelEnv
    path = os.path.join(ROOT, "app_zoo", "classic_control", "cartpole", "config", "cartpole_dqn.yaml")
    cfg = compile_config(apply_overrides(read_config(path), ["env.env_type=cartpole_no_vel"]))
    env = create_env(cfg.env)
    assert isinstance(env, CartPoleNoVelEnv)
    info = env.info()
    assert info.obs_space == CartPoleEnv(cfg={}).info().obs_space  # shape, dtype and bounds unchanged
    assert info.act_space == gym.spaces.Discrete(2) and info.max_episode_steps == 500


def test_masked_velocities_and_cartpole_positions_over_episodes():
    """Same seed, same actions (random, across episode ends): positions, rewards and flags are CartPole's."""
    masked, plain = CartPoleNoVelEnv(cfg={}), CartPoleEnv(cfg={})
    masked.seed(3), plain.seed(3)
    obs, ref = masked.reset(), plain.reset()
    rng = np.random.default_rng(0)
    episodes = 0
    for _ in range(300):
        assert obs.dtype == np.float32 and obs.shape == (4,)
        assert (obs[VELOCITIES] == 0).all() and not np.signbit(obs[VELOCITIES]).any()  # +0.0 exactly
        assert np.array_equal(obs[POSITIONS], ref[POSITIONS])
        action = int(rng.integers(2))
        step, ref_step = masked.step(action), plain.step(action)
        assert (step.reward, step.done) == (ref_step.reward, ref_step.done)
        assert (step.info["terminated"], step.info["truncated"]) == (
            ref_step.info["terminated"],
            ref_step.info["truncated"],
        )
        obs, ref = step.obs, ref_step.obs
        if step.done:
            assert step.info["episode_return"] == ref_step.info["episode_return"]
            episodes += 1
            obs, ref = masked.reset(), plain.reset()
    assert episodes >= 5  # random actions topple the pole within tens of steps


def test_truncation_at_500_is_not_termination():
    masked, plain = CartPoleNoVelEnv(cfg={}), CartPoleEnv(cfg={})
    masked.seed(0), plain.seed(0)
    masked.reset()
    ref = plain.reset()
    steps = []
    while not steps or not steps[-1].done:
        action = balancing_action(ref)
        steps.append(masked.step(action))
        ref = plain.step(action).obs
    last = steps[-1]
    assert len(steps) == 500 and (last.info["terminated"], last.info["truncated"]) == (False, True)
    assert last.info["episode_return"] == 500.0 and last.info["episode_len"] == 500
    assert all(s.reward == 1.0 for s in steps) and (last.obs[VELOCITIES] == 0).all()


def test_termination_when_the_pole_falls():
    env = CartPoleNoVelEnv(cfg={})
    env.seed(1)
    env.reset()
    steps = []
    while not steps or not steps[-1].done:
        steps.append(env.step(1))  # always pushing right topples the pole
    assert steps[-1].info["terminated"] and not steps[-1].info["truncated"] and len(steps) < 50
    assert steps[-1].info["episode_return"] == float(len(steps))


def test_config_wrappers_see_the_masked_observation():
    scaled = CartPoleNoVelEnv(cfg={"wrappers": [{"type": "scale_obs", "scale": 2.0}]})
    plain = CartPoleEnv(cfg={})
    scaled.seed(5), plain.seed(5)
    obs, ref = scaled.reset(), plain.reset()
    assert (obs[VELOCITIES] == 0).all() and np.array_equal(obs[POSITIONS], 2.0 * ref[POSITIONS])


def test_same_env_as_gym_env_with_mask_velocity_wrapper():
    wrapped = GymEnv({"env_id": "CartPole-v1", "wrappers": ["mask_velocity"]})
    env = CartPoleNoVelEnv(cfg={})
    wrapped.seed(2), env.seed(2)
    assert np.array_equal(wrapped.reset(), env.reset())
    for action in [0, 1, 1, 0, 1]:
        assert np.array_equal(wrapped.step(action).obs, env.step(action).obs)


@pytest.mark.filterwarnings("ignore:.*infinity.*:UserWarning")
def test_check_env_and_pickle():
    check_env(CartPoleNoVelEnv(cfg={}), n_steps=200)
    env = CartPoleNoVelEnv(cfg={})
    env.seed(4)
    clone = pickle.loads(pickle.dumps(env))
    assert np.array_equal(clone.reset(), env.reset())


def test_env_id_without_known_velocities_is_an_error():
    with pytest.raises(ValueError, match="cartpole_no_vel config key 'env_id'.*no velocity indices.*'Blackjack-v1'"):
        CartPoleNoVelEnv(cfg={"env_id": "Blackjack-v1"})
    with pytest.raises(KeyError, match="did you mean 'wrappers'"):
        CartPoleNoVelEnv(cfg={"wrapper": []})
