"""VmasEnvManager (manager_type: vmas) and VmasEnv on VMAS simple_spread: the cooperative contract's shapes, per-env
auto-reset, seeding, returns, truncation, action checks, and the actor and evaluator collecting from it."""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import pytest
import torch

pytest.importorskip("vmas")

from vmas.scenarios.mpe.simple_spread import Scenario as SimpleSpread  # noqa: E402

from nervex.config import ConfigError  # noqa: E402
from nervex.entry.builder import compile_config, make_actor, make_env_managers, make_evaluator, make_policy  # noqa: E402
from nervex.envs import GymEnv, create_env, team_value  # noqa: E402
from nervex.envs.vmas_env import VmasEnv  # noqa: E402
from nervex.policy import CollectSpec  # noqa: E402
from nervex.worker.actor.env_manager import VmasEnvManager  # noqa: E402

SPREAD = dict(scenario="simple_spread", scenario_kwargs=dict(n_agents=3, obs_agents=True))
OBS_DIM = 14  # own pos (2), own vel (2), 3 landmarks (6), 2 other agents (4)


def manager(env_num: int = 4, seed: int = 0, **cfg: Any) -> VmasEnvManager:
    m = VmasEnvManager(VmasEnv, {**SPREAD, **cfg}, env_num=env_num)
    m.seed(seed)
    m.launch()
    return m


def actions(m: VmasEnvManager, rng: np.random.Generator) -> Dict[int, np.ndarray]:
    return {env_id: rng.integers(0, 9, 3) for env_id in m.ready_obs}


def test_reset_and_step_give_the_cooperative_layout():
    m = manager(env_num=4, max_steps=5)
    info = m.env_info()
    assert info.agent_num == 3 and info.agent_ids == ("agent_0", "agent_1", "agent_2")
    assert info.obs_space["obs"].shape == (3, OBS_DIM) and info.obs_space["global_state"].shape == (3 * OBS_DIM,)
    assert info.act_space.nvec.tolist() == [9, 9, 9] and info.rew_space.shape == (3,)
    assert info.team_reward == "mean" and info.max_episode_steps == 5 and info.state_space.shape == (42,)
    obs = m.ready_obs
    assert sorted(obs) == [0, 1, 2, 3]
    first = obs[0]
    assert set(first) == {"obs", "global_state"} and first["obs"].dtype == np.float32
    assert first["obs"].shape == (3, OBS_DIM)
    np.testing.assert_array_equal(first["global_state"], first["obs"].reshape(-1))  # VMAS has no state: the fallback
    np.testing.assert_array_equal(first["obs"][:, 2:4], 0.0)  # a fresh episode: every agent at rest
    timesteps = m.step(actions(m, np.random.default_rng(0)))
    step = timesteps[2]
    assert step.reward.shape == (3,) and step.reward.dtype == np.float32
    assert step.reward[0] == step.reward[1] == step.reward[2] < 0  # simple_spread gives every agent the team's reward
    assert step.done is False and step.info == {"terminated": False, "truncated": False}
    assert step.obs["obs"].shape == (3, OBS_DIM)
    m.close()
    m.close()  # twice is fine


def test_truncation_at_max_steps_with_returns_equal_to_the_summed_rewards():
    m = manager(env_num=3, max_steps=5)
    rng = np.random.default_rng(1)
    summed = np.zeros((3, 3))
    for t in range(1, 6):
        timesteps = m.step({env_id: np.full(3, 8) for env_id in m.ready_obs})  # 8: full force up and right
        for env_id, step in timesteps.items():
            summed[env_id] += step.reward
            assert step.done is (t == 5)
    for env_id, step in timesteps.items():
        assert step.info["truncated"] is True and step.info["terminated"] is False
        assert step.info["episode_len"] == 5
        np.testing.assert_allclose(step.info["episode_return"], summed[env_id], rtol=1e-6)
        assert np.abs(step.obs["obs"][:, 2:4]).min() > 0  # the real last observation: agents moving
        np.testing.assert_array_equal(m.ready_obs[env_id]["obs"][:, 2:4], 0.0)  # and a fresh episode after it
    m.step(actions(m, rng))  # the new episode runs
    m.close()


class StaggeredEnd(SimpleSpread):
    """simple_spread whose env ``i`` terminates after ``i + 2`` steps (to exercise per-env resets)."""

    def make_world(self, batch_dim: int, device: torch.device, **kwargs: Any) -> Any:
        world = super().make_world(batch_dim, device, **kwargs)
        self.t = torch.zeros(batch_dim, device=device)
        self.lengths = torch.arange(batch_dim, device=device) + 2
        return world

    def reset_world_at(self, env_index: Any = None) -> None:
        super().reset_world_at(env_index)
        if env_index is None:
            self.t[:] = 0
        else:
            self.t[env_index] = 0

    def post_step(self) -> None:
        self.t += 1

    def done(self) -> torch.Tensor:
        return self.t >= self.lengths


def test_each_finished_env_is_reset_alone_and_terminated_is_not_truncated():
    m = manager(env_num=3, max_steps=100, scenario=StaggeredEnd())
    lengths: Dict[int, List[int]] = {0: [], 1: [], 2: []}
    rng = np.random.default_rng(2)
    for _ in range(12):
        before = m.ready_obs
        for env_id, step in m.step(actions(m, rng)).items():
            if step.done:
                assert step.info["terminated"] is True and step.info["truncated"] is False
                lengths[env_id].append(step.info["episode_len"])
                np.testing.assert_array_equal(m.ready_obs[env_id]["obs"][:, 2:4], 0.0)  # reset at once
            else:
                assert not np.array_equal(m.ready_obs[env_id]["obs"], before[env_id]["obs"])
    assert lengths == {0: [2] * 6, 1: [3] * 4, 2: [4] * 3}
    assert sorted(m.ready_obs) == [0, 1, 2]


def first_obs(seed: int, env_num: int = 3) -> np.ndarray:
    m = manager(env_num=env_num, seed=seed)
    out = np.stack([o["obs"] for o in m.ready_obs.values()])
    m.close()
    return out


def test_seeding_same_seed_same_start_other_seed_other_start():
    a, b, c = first_obs(7), first_obs(7), first_obs(8)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    assert not np.allclose(a[0], a[1]) and not np.allclose(a[1], a[2])  # the envs of one batch differ


def test_a_batch_keeps_its_random_stream_when_another_batch_steps_in_between():
    """VMAS shares one random state per process; each batch swaps its own in, so an evaluator stepping between
    collector steps does not change the collector's episodes (here across two auto-resets)."""

    def run(interleave: bool) -> List[np.ndarray]:
        m = manager(env_num=2, seed=3, max_steps=3)
        other = manager(env_num=2, seed=100_003, max_steps=3) if interleave else None
        rng, seen = np.random.default_rng(4), []
        for _ in range(7):
            m.step(actions(m, rng))
            if other is not None:
                other.step(actions(other, np.random.default_rng(5)))
                torch.rand(3)  # the user's own torch draws do not matter either
            seen.append(np.stack([o["obs"] for o in m.ready_obs.values()]))
        return seen

    for alone, mixed in zip(run(False), run(True)):
        np.testing.assert_array_equal(alone, mixed)


def test_reset_reseeds_only_after_seed():
    m = manager(env_num=2, seed=11)
    start = m.ready_obs[0]["obs"].copy()
    m.reset()
    assert not np.array_equal(m.ready_obs[0]["obs"], start)  # the stream goes on
    m.seed(11)
    m.reset()
    np.testing.assert_array_equal(m.ready_obs[0]["obs"], start)


def test_wrong_actions_raise_naming_the_env_and_the_fix():
    m = manager(env_num=3)
    good = {env_id: np.zeros(3, np.int64) for env_id in range(3)}
    with pytest.raises(ValueError, match=r"env 1's action has shape \(3, 1\); .* takes \(3,\) int64"):
        m.step({**good, 1: np.zeros((3, 1), np.int64)})
    with pytest.raises(ValueError, match=r"env 2's action has shape \(2,\)"):
        m.step({**good, 2: np.zeros(2, np.int64)})
    with pytest.raises(ValueError, match=r"env 0's action for agent 1 \(agent_1\) is 9; its actions are 0..8"):
        m.step({**good, 0: np.array([0, 9, 0])})
    with pytest.raises(ValueError, match=r"must be integers per agent"):
        m.step({**good, 0: np.array([0.5, 1.0, 0.0])})
    with pytest.raises(KeyError, match=r"env\(s\) \[2\] are waiting but got no action"):
        m.step({0: good[0], 1: good[1]})
    with pytest.raises(KeyError, match=r"env\(s\) \[5\] are not waiting"):
        m.step({**good, 5: good[0]})
    assert m.step(good)[0].done is False  # nothing was stepped by the refused calls


def test_continuous_actions_box_shape_and_checks():
    m = manager(env_num=2, continuous_actions=True)
    space = m.env_info().act_space
    assert space.shape == (3, 2) and space.low.min() == -1.0 and space.high.max() == 1.0
    with pytest.raises(ValueError, match=r"env 0's action has shape \(3,\); .* \(3, 2\) float32"):
        m.step({0: np.zeros(3, np.float32), 1: np.zeros((3, 2), np.float32)})
    with pytest.raises(ValueError, match=r"env 1's continuous action is not finite"):
        m.step({0: np.zeros((3, 2), np.float32), 1: np.full((3, 2), np.nan, np.float32)})
    steps = m.step({0: np.ones((3, 2), np.float32), 1: -np.full((3, 2), 5.0, np.float32)})  # env 1's: clamped
    assert steps[0].reward.shape == (3,)
    # pushed up and right in env 0, down and left in env 1 (collisions may bend a single agent's velocity)
    assert steps[0].obs["obs"][:, 2:4].mean() > 0 > steps[1].obs["obs"][:, 2:4].mean()


def test_single_vmas_env_matches_the_contract_and_checks_its_action():
    env = create_env({"env_type": "vmas", **SPREAD, "max_steps": 2})
    assert isinstance(env, VmasEnv)
    env.seed(0)
    obs = env.reset()
    assert obs["obs"].shape == (3, OBS_DIM)
    with pytest.raises(ValueError, match=r"env 0's action has shape \(\); "):
        env.step(3)
    env.step(np.zeros(3, np.int64))
    last = env.step(np.zeros(3, np.int64))
    assert last.done and last.info["truncated"] and last.info["episode_len"] == 2
    with pytest.raises(RuntimeError, match="after the episode ended; call reset"):
        env.step(np.zeros(3, np.int64))
    env.close()
    with pytest.raises(KeyError, match=r"unknown VmasEnv config key 'scenario_kwarg'.*did you mean 'scenario_kwargs'"):
        VmasEnv({"scenario_kwarg": {}})


def test_the_vmas_manager_refuses_other_envs():
    with pytest.raises(TypeError, match=r"env_fn must be VmasEnv \(env_type 'vmas'\).*manager_type 'base'"):
        VmasEnvManager(GymEnv, {"env_id": "CartPole-v1"}, env_num=2)


def config(env_num: int = 4, max_steps: int = 5, **extra: Any) -> Any:
    env = dict(env_type="vmas", manager_type="vmas", max_steps=max_steps, collector_env_num=env_num, **SPREAD)
    policy = dict(policy_type="dqn", model=dict(hidden_sizes=[32]), nstep=1)
    return compile_config(dict(seed=0, env={**env, **extra}, policy=policy, evaluator=dict(n_episode=4)))


def test_the_builder_makes_vmas_managers_for_collector_and_evaluator():
    cfg = config(evaluator_env_num=4)
    assert cfg.env.manager == {}
    collector, evaluator, info = make_env_managers(cfg, seed=5)
    assert isinstance(collector, VmasEnvManager) and isinstance(evaluator, VmasEnvManager)
    assert evaluator.env_num == 4 and evaluator.episode_num == 1 and info.agent_num == 3
    collector.launch()
    evaluator.launch()
    assert not np.allclose(collector.ready_obs[0]["obs"], evaluator.ready_obs[0]["obs"])  # seed + 100000
    with pytest.raises(ConfigError, match="scenario_kwarg"):
        config(scenario_kwarg={})


def test_the_actor_collects_random_warmup_and_policy_steps_and_the_evaluator_plays():
    """DQN's collect mode (one learning slot acting for the 3 agents): random warm-up, then its own forward."""
    cfg = config(env_num=4, max_steps=5)
    collector, evaluator, info = make_env_managers(cfg, seed=0)
    policy = make_policy(cfg, info, enable_field=["collect", "eval"])
    actor = make_actor(cfg, collector, policy, seed=0)
    samples = actor.collect(CollectSpec("sample", 40), random_action=True)
    assert actor.env_step == 40 and actor.episode_count == 8  # 4 envs x 10 steps, 5-step episodes
    assert len(samples) == 40
    for sample in samples:
        assert sample["obs"]["obs"].shape == (3, OBS_DIM) and sample["next_obs"]["global_state"].shape == (42,)
        action = np.asarray(sample["action"])
        assert action.shape == (3,) and action.min() >= 0 and action.max() <= 8
        reward = np.asarray(sample["reward"]).reshape(-1)
        assert reward.shape == (3,) and reward[0] == reward[1] == reward[2]
        assert sample["truncated"] == sample["done"] and not sample["terminated"]
    assert sum(bool(s["done"]) for s in samples) == 8
    assert len({tuple(np.asarray(s["action"]).tolist()) for s in samples}) > 20  # random joint actions
    # the episode returns the actor logs are the team's ('mean' over agents) of what the env summed
    assert all(r < 0 for r in actor.episode_returns) and len(actor.episode_returns) == 8
    greedy = actor.collect(CollectSpec("sample", 8), setting={"eps": 0.0})
    assert all(np.asarray(s["action"]).shape == (3,) for s in greedy)
    result = make_evaluator(cfg, evaluator, policy).eval()
    assert result["eval/n_episode"] == 4 and result["eval/mean_ep_len"] == 5 and result["eval/mean_reward"] < 0
    actor.close()
    evaluator.close()


def test_team_return_is_the_mean_of_the_per_agent_returns():
    m = manager(env_num=1, max_steps=3)
    rewards = []
    for _ in range(3):
        step = m.step({0: np.array([1, 2, 3])})[0]
        rewards.append(float(step.reward.mean()))
    assert team_value(step.info["episode_return"], m.env_info().team_reward) == pytest.approx(sum(rewards), rel=1e-6)


@pytest.mark.parametrize(
    "cfg, match",
    [
        (dict(max_steps=0), r"'max_steps' must be an int >= 1"),
        (dict(team_reward="max"), r"'team_reward' must be 'sum' or 'mean'"),
        (dict(scenario_kwargs=[3]), r"'scenario_kwargs' must be a mapping"),
    ],
)
def test_bad_config_values_are_named(cfg, match):
    with pytest.raises((ValueError, TypeError), match=match):
        VmasEnv(cfg).info()


@pytest.mark.parametrize("policy", ["qmix", "mappo"])
def test_shipped_configs_run_benchmarls_default_simple_spread_task(policy):
    """The env sections of the shipped configs hold BenchMARL's task settings and build the vmas managers (the
    policy section belongs to the qmix/mappo policies; DQN stands in for it here)."""
    import importlib.util
    import os

    import yaml

    from nervex.config import read_config

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    cfg = read_config(
        os.path.join(root, "app_zoo", "multiagent", "vmas", "config", f"vmas_simple_spread_{policy}.yaml")
    )
    spec = importlib.util.find_spec("benchmarl")  # its location only: importing it (torchrl) takes seconds
    if spec is None:
        pytest.skip("benchmarl is not installed")
    task_yaml = os.path.join(spec.submodule_search_locations[0], "conf", "task", "vmas", "simple_spread.yaml")
    with open(task_yaml) as f:
        task = {k: v for k, v in yaml.safe_load(f).items() if k != "defaults"}
    env = cfg["env"]
    assert dict(max_steps=env["max_steps"], **env["scenario_kwargs"]) == task
    assert env["continuous_actions"] is (policy == "mappo")  # BenchMARL: QMIX discrete, MAPPO prefers continuous
    cfg["policy"] = dict(policy_type="dqn", model=dict(hidden_sizes=[8]))
    cfg.pop("replay_buffer", None)
    cfg["env"].update(collector_env_num=2, evaluator_env_num=2)
    collector, evaluator, info = make_env_managers(compile_config(cfg), seed=0)
    assert isinstance(collector, VmasEnvManager) and isinstance(evaluator, VmasEnvManager)
    assert info.agent_num == 3 and info.max_episode_steps == 100 and info.team_reward == "mean"


def test_episode_num_takes_envs_out_and_step_needs_a_launch():
    m = VmasEnvManager(VmasEnv, {**SPREAD, "max_steps": 2}, env_num=2, episode_num=1)
    with pytest.raises(RuntimeError, match=r"not launched; call launch\(\) or reset\(\)"):
        m.step({})
    m.launch()
    for _ in range(2):
        m.step({env_id: np.zeros(3, np.int64) for env_id in m.ready_obs})
    assert m.done and m.ready_obs == {} and m.step({}) == {}
    m.reset()
    assert not m.done and sorted(m.ready_obs) == [0, 1]
