"""The env manager contract (docs/internals.md "Env managers"), for both managers."""

from __future__ import annotations

import inspect

import gymnasium as gym
import numpy as np
import pytest

from nervex.envs import GymEnv
from nervex.utils import ENV_MANAGER_REGISTRY
from nervex.worker.actor.env_manager import BaseEnvManager, EnvError, SubprocessEnvManager

from .fault_envs import CountingEnv

MANAGERS = {
    "base": lambda *a, **kw: BaseEnvManager(*a, **kw),
    "subprocess": lambda *a, **kw: SubprocessEnvManager(*a, retry_delay=0.0, **kw),
    "subprocess_1_worker": lambda *a, **kw: SubprocessEnvManager(*a, worker_num=1, retry_delay=0.0, **kw),
    "subprocess_pipe": lambda *a, **kw: SubprocessEnvManager(*a, shared_memory=False, retry_delay=0.0, **kw),
}


@pytest.fixture(params=list(MANAGERS))
def make_manager(request):
    managers = []

    def make(*args, **kwargs):
        managers.append(MANAGERS[request.param](*args, **kwargs))
        return managers[-1]

    yield make
    for manager in managers:
        manager.close()


def obs_table(obs: dict) -> dict:
    return {i: o.tolist() for i, o in obs.items()}


def test_registered():
    assert ENV_MANAGER_REGISTRY.get("base") is BaseEnvManager
    assert ENV_MANAGER_REGISTRY.get("subprocess") is SubprocessEnvManager
    for cls in (BaseEnvManager, SubprocessEnvManager):  # config keys are exactly constructor keywords
        params = inspect.signature(cls.__init__).parameters
        assert set(cls.config) <= set(params) and set(params) - set(cls.config) == {
            "self",
            "env_fn",
            "env_cfg",
            "env_num",
            "episode_num",
        }


def test_step_auto_reset_and_episode_num(make_manager):
    """Env 0 plays 2-step episodes, env 1 3-step ones; 2 episodes each. Every value below is counted by hand."""
    cfgs = [dict(env_tag=10.0, episode_len=2), dict(env_tag=20.0, episode_len=3)]
    manager = make_manager(CountingEnv, cfgs, 2, episode_num=2)
    manager.launch()
    assert obs_table(manager.ready_obs) == {0: [10.0, 0.0], 1: [20.0, 0.0]}
    expected = [
        # ready envs before the step, {env: (obs after step, done)}, ready obs after the step
        ({0: ([10, 1], False), 1: ([20, 1], False)}, {0: [10, 1], 1: [20, 1]}),
        ({0: ([10, 2], True), 1: ([20, 2], False)}, {0: [10, 0], 1: [20, 2]}),  # env 0 auto-reset
        ({0: ([10, 1], False), 1: ([20, 3], True)}, {0: [10, 1], 1: [20, 0]}),
        ({0: ([10, 2], True), 1: ([20, 1], False)}, {1: [20, 1]}),  # env 0 played its 2 episodes
        ({1: ([20, 2], False)}, {1: [20, 2]}),
        ({1: ([20, 3], True)}, {}),
    ]
    for step, (want, want_ready) in enumerate(expected):
        assert not manager.done
        timesteps = manager.step({i: 1 for i in manager.ready_obs})
        got = {i: (ts.obs.tolist(), ts.done) for i, ts in timesteps.items()}
        assert got == want, f"step {step}"
        assert obs_table(manager.ready_obs) == want_ready, f"step {step}"
        for ts in timesteps.values():
            assert ts.reward == 1.0 and type(ts.reward) is float
            if ts.done:
                assert ts.info["episode_len"] == ts.obs[1] and ts.info["episode_return"] == float(ts.obs[1])
    assert manager.done and manager.ready_obs == {}
    manager.reset()  # counting starts again
    assert not manager.done and sorted(manager.ready_obs) == [0, 1]
    assert manager.stats["dropped_episodes"] == 0


def test_ready_obs_is_a_snapshot(make_manager):
    manager = make_manager(CountingEnv, {}, 2)
    manager.launch()
    before = manager.ready_obs
    manager.step({0: 0})
    assert obs_table(before) == {0: [0.0, 0.0], 1: [0.0, 0.0]}
    assert obs_table(manager.ready_obs) == {0: [0.0, 1.0], 1: [0.0, 0.0]}  # env 1 was not stepped


def test_misuse_errors(make_manager):
    manager = make_manager(CountingEnv, {}, 2, episode_num=1)
    with pytest.raises(RuntimeError, match="launch"):
        _ = manager.ready_obs
    with pytest.raises(RuntimeError, match="launch"):
        manager.step({0: 0})
    manager.reset()  # launches
    with pytest.raises(KeyError, match="envs 0..1"):
        manager.step({5: 0})
    for _ in range(3):
        manager.step({0: 0})
    with pytest.raises(KeyError, match="episode_num=1"):
        manager.step({0: 0})
    with pytest.raises(ValueError, match="env_num=3"):
        make_manager(CountingEnv, [{}, {}], 3)


def cartpole_trace(manager, seed: int, steps: int = 150) -> list:
    manager.seed(seed)
    manager.launch()
    rng = np.random.default_rng(0)
    trace = [obs_table(manager.ready_obs)]
    for _ in range(steps):
        if manager.done:
            break
        timesteps = manager.step({i: int(rng.integers(2)) for i in sorted(manager.ready_obs)})
        trace.append(
            {i: (ts.obs.tolist(), ts.reward, ts.done, ts.info.get("episode_len")) for i, ts in timesteps.items()}
        )
    return trace


def test_same_seed_same_rollout_in_every_manager(make_manager):
    reference = cartpole_trace(BaseEnvManager(GymEnv, {"env_id": "CartPole-v1"}, 3, episode_num=4), seed=11)
    assert any(ts[2] for step in reference[1:] for ts in step.values())  # episodes ended (and auto-reset) inside
    assert cartpole_trace(make_manager(GymEnv, {"env_id": "CartPole-v1"}, 3, episode_num=4), seed=11) == reference
    assert cartpole_trace(make_manager(GymEnv, {"env_id": "CartPole-v1"}, 3, episode_num=4), seed=12) != reference


def test_env_i_first_reset_uses_seed_plus_i(make_manager):
    manager = make_manager(GymEnv, {"env_id": "CartPole-v1"}, 3)
    manager.seed(100)
    manager.launch()
    raw = gym.make("CartPole-v1")
    for env_id, obs in manager.ready_obs.items():
        np.testing.assert_array_equal(obs, raw.reset(seed=100 + env_id)[0])
    info = manager.env_info()
    assert info.act_space == gym.spaces.Discrete(2) and info.obs_space.shape == (4,)


def test_env_exception_surfaces_with_env_id_and_traceback(make_manager):
    cfgs = [{}, dict(fault="raise", fault_step=2)]
    manager = make_manager(CountingEnv, cfgs, 2, max_retry=0)
    manager.launch()
    manager.step({0: 0, 1: 0})
    with pytest.raises(EnvError) as info:
        manager.step({0: 0, 1: 0})
    message = str(info.value)
    assert "env 1" in message and "ValueError: boom at t=2" in message
    assert "fault_envs.py" in message and "_misbehave" in message  # the env's own traceback text
    assert info.value.env_id == 1 and "_misbehave" in info.value.child_traceback


def test_env_reset_request_drops_the_episode(make_manager):
    cfgs = [{}, dict(fault="reset_request", fault_step=2, episode_len=5)]
    manager = make_manager(CountingEnv, cfgs, 2)
    manager.launch()
    manager.step({0: 0, 1: 0})
    timesteps = manager.step({0: 0, 1: 0})
    abnormal = timesteps[1]
    assert abnormal.done and abnormal.reward == 0.0 and abnormal.info["abnormal"]
    assert abnormal.info["reason"] == "reset_request" and "please reset at t=2" in abnormal.info["error"]
    assert abnormal.obs.tolist() == [0.0, 1.0]  # the observation the action was chosen on
    assert "episode_return" not in abnormal.info and not timesteps[0].info.get("abnormal", False)
    assert manager.ready_obs[1].tolist() == [0.0, 0.0]  # a fresh episode
    assert manager.stats["reset_requests"] == 1 and manager.stats["dropped_episodes"] == 1
    assert manager.stats["restarts"] == 0


def test_close_twice_and_relaunch(make_manager):
    manager = make_manager(CountingEnv, {}, 2)
    manager.launch()
    manager.close()
    manager.close()
    manager.launch()
    assert sorted(manager.ready_obs) == [0, 1]


def test_failing_env_is_rebuilt_within_max_retry(make_manager):
    """Env 1 raises at t=2 of every episode; a good step comes between failures, so max_retry=1 is never hit."""
    cfgs = [dict(episode_len=9), dict(fault="raise", fault_step=2, episode_len=9)]
    manager = make_manager(CountingEnv, cfgs, 2, max_retry=1)
    manager.seed(10)
    manager.launch()
    rows = []
    for _ in range(4):
        timesteps = manager.step({i: 0 for i in manager.ready_obs})
        rows.append([(ts.obs[1], ts.info.get("reason")) for _, ts in sorted(timesteps.items())])
    assert rows == [
        [(1.0, None), (1.0, None)],
        [(2.0, None), (1.0, "exception")],  # the abnormal timestep shows the obs the action was chosen on
        [(3.0, None), (1.0, None)],  # a fresh episode
        [(4.0, None), (1.0, "exception")],
    ]
    assert {k: manager.stats[k] for k in ("exceptions", "restarts", "dropped_episodes")} == {
        "exceptions": 2,
        "restarts": 2,
        "dropped_episodes": 2,
    }


def test_rebuilt_env_gets_a_deterministic_new_seed():
    manager = BaseEnvManager(CountingEnv, [{}, dict(fault="raise", fault_step=1)], 2, max_retry=1)
    manager.seed(10)
    manager.launch()
    assert manager._envs[1].seeds == [11]
    manager.step({0: 0, 1: 0})
    assert manager._envs[1].seeds == [10 + 1 + 2 * 1]  # seed + env_id + env_num * (rebuilds so far)
    with pytest.raises(EnvError, match="env 1 failed 2 time"):  # no good step since the last failure
        manager.step({0: 0, 1: 0})
    manager.close()
