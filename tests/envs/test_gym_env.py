"""GymEnv: termination vs truncation, episode figures, seeding, wrappers, lazy building, errors."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest

from nervex.envs import BaseEnvTimestep, GymEnv, UnknownEnvIdError, create_env, get_env_cls
from nervex.envs.check_env import check_env
from nervex.envs.wrappers import MaskObservation
from nervex.utils import ENV_REGISTRY

REWARDS = [3.0, -0.5, -2.0, 0.25]


class RewardSequenceEnv(gym.Env):
    """float64 observations [t, t], the rewards of REWARDS, terminates after the last one."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2), {}

    def step(self, action):
        reward = REWARDS[self.t]
        self.t += 1
        return np.full(2, float(self.t)), reward, self.t == len(REWARDS), False, {}


if "NervexTest/RewardSequence-v0" not in gym.registry:
    gym.register("NervexTest/RewardSequence-v0", entry_point=RewardSequenceEnv)


def balancing_action(obs: np.ndarray) -> int:
    """Push towards the side the pole leans to: keeps CartPole up for far more than 5 steps."""
    return int(obs[2] + 0.5 * obs[3] > 0)


def test_time_limit_is_truncation_not_termination():
    env = GymEnv({"env_id": "CartPole-v1", "max_episode_steps": 5})
    env.seed(0)
    obs = env.reset()
    flags = []
    for _ in range(5):
        timestep = env.step(balancing_action(obs))
        obs = timestep.obs
        flags.append((timestep.done, timestep.info["terminated"], timestep.info["truncated"]))
    assert flags == [(False, False, False)] * 4 + [(True, False, True)]
    assert timestep.info["episode_return"] == 5.0 and timestep.info["episode_len"] == 5
    assert env.info().max_episode_steps == 5
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)  # after done: reset first


def test_termination_matches_raw_gymnasium():
    """Always pushing right topples the pole: same step and flags as raw gymnasium, and not truncated."""
    raw = gym.make("CartPole-v1")
    raw.reset(seed=1)
    raw_len = 0
    while True:
        raw_len += 1
        _, _, terminated, truncated, _ = raw.step(1)
        if terminated or truncated:
            break
    env = GymEnv({"env_id": "CartPole-v1"})
    env.seed(1)
    env.reset()
    timesteps = []
    while not timesteps or not timesteps[-1].done:
        timesteps.append(env.step(1))
    timestep = timesteps[-1]
    assert (len(timesteps), timestep.info["terminated"], timestep.info["truncated"]) == (raw_len, True, False)
    assert timestep.info["episode_return"] == float(raw_len) and timestep.info["episode_len"] == raw_len


@pytest.mark.parametrize(
    "wrappers, expected_rewards",
    [
        pytest.param([], [3.0, -0.5, -2.0, 0.25], id="none"),
        pytest.param(["clip_reward"], [1.0, -0.5, -1.0, 0.25], id="clip"),
        pytest.param([{"type": "clip_reward", "low": 0.0, "high": 2.0}], [2.0, 0.0, 0.0, 0.25], id="clip_0_2"),
        pytest.param(["sign_reward"], [1.0, -1.0, -1.0, 1.0], id="sign"),
        pytest.param([{"type": "scale_reward", "scale": 0.1}], [0.3, -0.05, -0.2, 0.025], id="scale"),
        pytest.param(["clip_reward", {"type": "scale_reward", "scale": 2.0}], [2.0, -1.0, -2.0, 0.5], id="clip_scale"),
    ],
)
def test_reward_wrappers_keep_the_raw_return(wrappers, expected_rewards):
    env = GymEnv({"env_id": "NervexTest/RewardSequence-v0", "wrappers": wrappers})
    env.reset()
    timesteps = [env.step(0) for _ in REWARDS]
    assert [ts.reward for ts in timesteps] == pytest.approx(expected_rewards)
    assert all(type(ts.reward) is float for ts in timesteps)
    assert [ts.done for ts in timesteps] == [False, False, False, True]
    assert timesteps[-1].info["episode_return"] == pytest.approx(0.75)  # 3 - 0.5 - 2 + 0.25, unwrapped
    assert timesteps[-1].info["episode_len"] == 4


def test_float64_box_observations_come_as_float32():
    env = GymEnv({"env_id": "NervexTest/RewardSequence-v0"})
    assert env.reset().dtype == np.float32
    timestep = env.step(0)
    assert timestep.obs.dtype == np.float32 and timestep.obs.tolist() == [1.0, 1.0]
    assert env.info().obs_space.dtype == np.float32
    scaled = GymEnv({"env_id": "NervexTest/RewardSequence-v0", "wrappers": [{"type": "scale_obs", "scale": -0.5}]})
    scaled.reset()
    assert scaled.step(0).obs.tolist() == [-0.5, -0.5]
    space = scaled.info().obs_space
    assert (space.low.tolist(), space.high.tolist()) == ([-5.0, -5.0], [5.0, 5.0])


def test_first_reset_after_seed_is_gymnasium_reset_with_that_seed():
    raw = gym.make("CartPole-v1")
    expected_first = raw.reset(seed=42)[0]
    expected_second = raw.reset()[0]  # later resets continue the stream
    raw.action_space.seed(42)
    expected_actions = [raw.action_space.sample() for _ in range(10)]
    env = GymEnv({"env_id": "CartPole-v1"})
    env.seed(42)
    np.testing.assert_array_equal(env.reset(), expected_first)
    np.testing.assert_array_equal(env.reset(), expected_second)
    assert [env.info().act_space.sample() for _ in range(10)] == expected_actions


def _rollout(env: GymEnv, seed: int, n: int = 60) -> list:
    env.seed(seed)
    trace = [env.reset().tolist()]
    for t in range(n):
        timestep = env.step(t % 2)
        trace.append((timestep.obs.tolist(), timestep.reward, timestep.done))
        if timestep.done:
            trace.append(env.reset().tolist())
    return trace


def test_same_seed_same_rollout_other_seed_differs():
    env = GymEnv({"env_id": "CartPole-v1"})
    assert _rollout(env, 3) == _rollout(env, 3) == _rollout(GymEnv({"env_id": "CartPole-v1"}), 3)
    assert _rollout(env, 3) != _rollout(env, 4)


def test_lazy_build_and_pickle_keep_config_and_pending_seed():
    env = GymEnv({"env_id": "CartPole-v1", "max_episode_steps": 7})
    assert env._env is None  # nothing built yet: cheap to send to a subprocess
    env.seed(5)
    env.info()  # builds it
    clone = pickle.loads(pickle.dumps(env))
    assert clone._env is None and clone.info().max_episode_steps == 7
    np.testing.assert_array_equal(clone.reset(), gym.make("CartPole-v1").reset(seed=5)[0])
    env.close()
    env.close()  # twice is fine


@pytest.mark.parametrize(
    "cfg, error, fragments",
    [
        pytest.param(
            {"env_id": "CartPol-v1"}, UnknownEnvIdError, ["'CartPol-v1'", "did you mean 'CartPole-v1'"], id="typo"
        ),
        pytest.param({"env_id": "cartpole-v1"}, UnknownEnvIdError, ["did you mean 'CartPole-v1'"], id="case"),
        pytest.param({"env_id": "NoSuchThing-v3"}, UnknownEnvIdError, ["'NoSuchThing-v3'"], id="unknown"),
        pytest.param({"env_idd": "CartPole-v1"}, KeyError, ["env_idd", "did you mean 'env_id'"], id="bad_key"),
        pytest.param(
            {"wrappers": ["clip_rewards"]}, KeyError, ["clip_rewards", "clip_reward", "scale_obs"], id="wrapper"
        ),
        pytest.param({"wrappers": [{"type": "scale_reward", "factor": 2}]}, TypeError, ["factor"], id="wrapper_kwarg"),
        pytest.param({"max_episode_steps": 0}, ValueError, ["max_episode_steps", ">= 1"], id="limit"),
    ],
)
def test_config_errors_name_the_problem(cfg, error, fragments):
    with pytest.raises(error) as info:
        GymEnv(cfg)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_actions_are_converted_to_the_space():
    """Pendulum takes a (1,) float array; a float, a 0-d array or a float64 array give the same step."""
    results = []
    for action in (0.5, np.array(0.5), np.array([0.5]), np.float32(0.5)):
        env = GymEnv({"env_id": "Pendulum-v1"})
        env.seed(0)
        env.reset()
        results.append(env.step(action).obs.tolist())
    assert results[1:] == results[:1] * 3
    cartpole = GymEnv({"env_id": "CartPole-v1"})
    cartpole.seed(0)
    cartpole.reset()
    assert isinstance(cartpole.step(np.array([1])), BaseEnvTimestep)  # a 1-element array for Discrete(2)


def test_discrete_observations_are_arrays():
    env = GymEnv({"env_id": "FrozenLake-v1"})
    env.seed(0)
    obs = env.reset()
    assert isinstance(obs, np.ndarray) and obs.dtype == np.int64 and obs.shape == () and int(obs) == 0
    assert env.info().obs_space.contains(env.step(1).obs)


@pytest.mark.filterwarnings("ignore:.*(infinity|symmetric and normalized).*:UserWarning")
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_check_env_passes(env_id):
    check_env(GymEnv({"env_id": env_id}), n_steps=300)


def test_registry_lookup_and_create_env():
    assert get_env_cls("gym") is GymEnv
    env = create_env({"env_type": "gym", "env_id": "Pendulum-v1", "manager_type": "base", "collector_env_num": 3})
    assert isinstance(env, GymEnv) and env.env_id == "Pendulum-v1"
    with pytest.raises(KeyError, match="did you mean 'gym'"):
        get_env_cls("gymm")
    with pytest.raises(KeyError, match="use env_type 'gym' with env_id 'Acrobot-v1'"):
        get_env_cls("Acrobot-v1")
    assert "gym" in ENV_REGISTRY


class TwoLivesEnv(gym.Env):
    """Each life lasts 2 steps (reward 1 each); losing the first says game_over=False, the second ends the game."""

    observation_space = gym.spaces.Box(0.0, 10.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if getattr(self, "lives", 0) == 0:
            self.lives, self.t = 2, 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        life_lost = self.t % 2 == 0
        self.lives -= life_lost
        info = {"game_over": self.lives == 0} if life_lost else {}
        return np.full(1, self.t, np.float32), 1.0, life_lost, False, info


if "NervexTest/TwoLives-v0" not in gym.registry:
    gym.register("NervexTest/TwoLives-v0", entry_point=TwoLivesEnv)


def test_episodic_life_reports_the_whole_game_at_its_end():
    env = GymEnv({"env_id": "NervexTest/TwoLives-v0"})
    env.reset()
    first_life = [env.step(0), env.step(0)]
    assert first_life[-1].done and "episode_return" not in first_life[-1].info
    env.reset()  # a new life, the same game
    second_life = [env.step(0), env.step(0)]
    assert second_life[-1].done and second_life[-1].info["game_over"] is True
    assert (second_life[-1].info["episode_return"], second_life[-1].info["episode_len"]) == (4.0, 4)
    env.reset()  # a new game: the figures start again
    assert [env.step(0).done, env.step(0).info.get("episode_return")] == [False, None]


@pytest.mark.parametrize(
    "wrappers, action, raw_action",
    [
        pytest.param([], [1.5], [1.5], id="none"),
        pytest.param(["rescale_action"], [0.5], [1.0], id="rescale_to_minus1_1"),
        pytest.param(
            [{"type": "rescale_action", "min_action": 0.0, "max_action": 1.0}], [0.25], [-1.0], id="rescale_0_1"
        ),
        pytest.param(["clip_action"], [5.0], [2.0], id="clip"),
    ],
)
def test_action_wrappers_map_to_the_raw_action(wrappers, action, raw_action):
    """Pendulum's next angular velocity depends on the torque: equal obs <=> equal raw actions."""
    wrapped = GymEnv({"env_id": "Pendulum-v1", "wrappers": wrappers})
    raw = GymEnv({"env_id": "Pendulum-v1"})
    for env in (wrapped, raw):
        env.seed(0)
        env.reset()
    np.testing.assert_array_equal(wrapped.step(np.array(action)).obs, raw.step(np.array(raw_action)).obs)
    assert wrapped.info().act_space.shape == (1,)


class PositiveBoxEnv(gym.Env):
    """Observations [1, 2, 3, 4] in a Box of [1, 5]: masking must widen the bounds to hold the zero."""

    observation_space = gym.spaces.Box(1.0, 5.0, (2, 2), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.obs = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
        return self.obs, {}

    def step(self, action):
        return self.obs, 0.0, False, False, {}


def test_mask_observation_zeroes_flat_positions_and_keeps_the_space_shape():
    env = MaskObservation(PositiveBoxEnv(), indices=[3, 0])
    obs, _ = env.reset()
    assert obs.tolist() == [[0.0, 2.0], [3.0, 0.0]] and env.indices == (0, 3)
    assert env.unwrapped.obs.tolist() == [[1.0, 2.0], [3.0, 4.0]]  # the inner env's array is not written into
    space = env.observation_space
    assert (space.shape, space.dtype) == ((2, 2), np.float32)
    assert (space.low.tolist(), space.high.tolist()) == ([[0.0, 1.0], [1.0, 0.0]], [[5.0, 5.0], [5.0, 5.0]])
    assert space.contains(obs) and space.contains(env.step(0)[0])


def test_mask_observation_by_config_on_float64_observations():
    env = GymEnv({"env_id": "NervexTest/RewardSequence-v0", "wrappers": [{"type": "mask_observation", "indices": [1]}]})
    assert env.reset().tolist() == [0.0, 0.0]
    assert [env.step(0).obs.tolist() for _ in range(2)] == [[1.0, 0.0], [2.0, 0.0]]
    assert env.info().obs_space.shape == (2,)


@pytest.mark.parametrize(
    "indices, error, match",
    [
        pytest.param([], TypeError, "non-empty list of ints", id="empty"),
        pytest.param(1, TypeError, "non-empty list of ints", id="bare_int"),
        pytest.param([4], ValueError, r"index 4 is not a position .* shape \(2, 2\) \(0 <= index < 4\)", id="range"),
        pytest.param([-1], ValueError, "index -1 is not a position", id="negative"),
        pytest.param([1.0], ValueError, "index 1.0 is not a position", id="float"),
    ],
)
def test_mask_observation_rejects_bad_indices(indices, error, match):
    with pytest.raises(error, match=match):
        MaskObservation(PositiveBoxEnv(), indices=indices)


def test_mask_observation_needs_its_indices_in_the_config():
    with pytest.raises(TypeError, match="missing a required argument: 'indices'"):
        GymEnv({"env_id": "CartPole-v1", "wrappers": ["mask_observation"]})


@pytest.mark.parametrize("env_id, velocities", [("CartPole-v1", [1, 3]), ("Pendulum-v1", [2]), ("Acrobot-v1", [4, 5])])
def test_mask_velocity_zeroes_the_velocities_of_classic_tasks(env_id, velocities):
    masked, raw = GymEnv({"env_id": env_id, "wrappers": ["mask_velocity"]}), GymEnv({"env_id": env_id})
    masked.seed(0), raw.seed(0)
    obs, ref = masked.reset(), raw.reset()
    action = raw.info().act_space.sample()
    for _ in range(3):
        kept = [i for i in range(ref.size) if i not in velocities]
        assert (obs[velocities] == 0).all() and (ref[velocities] != 0).any()
        np.testing.assert_array_equal(obs[kept], ref[kept])
        obs, ref = masked.step(action).obs, raw.step(action).obs


def test_mask_velocity_unknown_task():
    env = GymEnv({"env_id": "NervexTest/RewardSequence-v0", "wrappers": ["mask_velocity"]})
    with pytest.raises(
        KeyError, match="no velocity indices are known for 'NervexTest/RewardSequence-v0'.*mask_observation"
    ):
        env.reset()


class _VectorRewardEnv(gym.Env):
    """Two agents (or objectives): reward [t, -t] per step; ``declare`` says whether it has a reward_space."""

    observation_space = gym.spaces.Box(0, 10, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, declare: bool = True) -> None:
        if declare:
            self.reward_space = gym.spaces.Box(-10, 10, (2,), np.float32)
        self.t = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(1, self.t, np.float32), np.array([self.t, -self.t], np.float32), self.t >= 3, False, {}


gym.register("NervexTestVectorReward-v0", entry_point=_VectorRewardEnv)


@pytest.mark.filterwarnings(
    "ignore:.*reward returned by `step\\(\\)` must be a float:UserWarning"
)  # Gymnasium's checker
def test_a_declared_vector_reward_stays_an_array_per_agent():
    env = GymEnv({"env_id": "NervexTestVectorReward-v0"})
    info = env.info()
    assert info.agent_num == 2 and info.agent_ids == ("agent_0", "agent_1")
    assert info.rew_space.shape == (2,) and info.rew_space.dtype == np.float64
    env.reset()
    rewards = [env.step(0) for _ in range(3)]
    assert [ts.reward.tolist() for ts in rewards] == [[1.0, -1.0], [2.0, -2.0], [3.0, -3.0]]
    assert rewards[0].reward.dtype == np.float64
    assert rewards[-1].done and rewards[-1].info["episode_return"].tolist() == [6.0, -6.0]
    check_env(GymEnv({"env_id": "NervexTestVectorReward-v0"}), n_steps=20, deterministic=True)


def test_an_undeclared_vector_reward_is_an_error_not_a_float():
    env = GymEnv({"env_id": "NervexTestVectorReward-v0", "env_kwargs": {"declare": False}})
    assert env.info().rew_space is None and env.info().agent_num == 1
    env.reset()
    with pytest.raises(ValueError, match=r"reward of shape \(2,\) but declares no reward_space"):
        env.step(0)
