"""MAPPO: the two-step game through the real pipeline, action masks, the centralized value, dead agents, per-agent
GAE on the team reward under truncation, continuous and recurrent actors, portable state."""

import csv
import os

import gymnasium as gym
import numpy as np
import pytest
import torch

from nervex.config import apply_overrides, read_config
from nervex.entry import serial_pipeline
from nervex.envs import BaseEnv, BaseEnvInfo, BaseEnvTimestep
from nervex.model import MAPPO
from nervex.policy import MAPPOPolicy
from nervex.policy.mappo import alive_weight, masked_normalize
from nervex.utils.registry import ENV_REGISTRY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TWO_STEP = os.path.join(ROOT, "app_zoo", "multiagent", "two_step", "config", "two_step_mappo.yaml")
N, OBS_DIM, A, S = 3, 4, 5, 6


def make(seed=0, model=None, **cfg):
    torch.manual_seed(seed)
    model_cfg = {"obs_dim": OBS_DIM, "action_dim": A, "agent_num": N, "state_dim": S, **(model or {})}
    return MAPPOPolicy({"policy_type": "mappo", "team_reward": "sum", "model": model_cfg, **cfg})


def observation(rng, mask=None, alive=None):
    obs = {
        "obs": rng.normal(size=(N, OBS_DIM)).astype(np.float32),
        "global_state": rng.normal(size=(S,)).astype(np.float32),
        "action_mask": np.ones((N, A), np.int8) if mask is None else mask.astype(np.int8),
    }
    if alive is not None:
        obs["alive"] = np.asarray(alive, np.int8)
    return obs


def random_masks(rng, count):
    """Masks with 1 to A legal actions per agent, at random."""
    masks = (rng.random((count, N, A)) < 0.4).astype(np.int8)
    masks[np.arange(count)[:, None], np.arange(N)[None, :], rng.integers(0, A, (count, N))] = 1
    return masks


# ---- convergence -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_two_step_game_greedy_policy_earns_the_optimum_8(seed, tmp_path, one_thread):
    """The real serial pipeline on the shipped config: the greedy joint policy takes branch 2B then (1, 1) and earns
    8, where the safe branch pays 7 (about 1 s per seed: both reach 8 at 416 env steps)."""
    cfg = apply_overrides(read_config(TWO_STEP), ["max_env_step=3000"])
    serial_pipeline(cfg, seed=seed, exp_name="two_step", run_root=str(tmp_path), progress=False)
    with open(tmp_path / "two_step" / "eval.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["mean_reward"]) == 8.0
    assert int(rows[-1]["env_step"]) < 3000  # stopped at stop_val 8, not at the budget


# ---- action masks ----------------------------------------------------------------------------------------------
def test_masked_actions_are_never_taken_in_collect_and_eval():
    policy = make()
    rng = np.random.default_rng(0)
    masks = random_masks(rng, 64)
    data = {i: observation(rng, masks[i]) for i in range(64)}
    taken_collect = []
    for _ in range(20):
        out = policy.collect_mode.forward(list(data), data)
        taken_collect.append(np.stack([out[i]["action"] for i in data]))
        assert np.isfinite(np.stack([out[i]["logp"] for i in data])).all()
    taken_collect = np.stack(taken_collect)  # (20, 64, N)
    out = policy.eval_mode.forward(list(data), data)
    taken_eval = np.stack([out[i]["action"] for i in data])[None]
    for taken in (taken_collect, taken_eval):
        legal = np.take_along_axis(masks[None], taken[..., None], axis=-1)[..., 0]
        assert legal.all()
    # sampling is not degenerate: rows with several legal actions show several of them
    several = masks.sum(-1) > 1
    distinct = np.array([[len(set(taken_collect[:, b, i])) for i in range(N)] for b in range(64)])
    assert (distinct[several] > 1).mean() > 0.5


def test_eval_greedy_false_samples_legal_actions_and_greedy_takes_the_argmax():
    rng = np.random.default_rng(1)
    masks = random_masks(rng, 64)
    data = {i: observation(rng, masks[i]) for i in range(64)}
    greedy, sampled = make(), make(eval={"greedy": False})
    logits = greedy._model.compute_action(
        {k: torch.as_tensor(np.stack([d[k] for d in data.values()])) for k in data[0]}
    )
    best = np.where(masks > 0, logits["logit"].detach().numpy(), -np.inf).argmax(-1)  # (64, N)
    out = greedy.eval_mode.forward(list(data), data)
    assert (np.stack([out[i]["action"] for i in data]) == best).all()
    draws = np.stack(
        [np.stack([o["action"] for o in sampled.eval_mode.forward(list(data), data).values()]) for _ in range(20)]
    )
    assert np.take_along_axis(masks[None], draws[..., None], axis=-1).all()  # legal only
    several = masks.sum(-1) > 1
    distinct = np.array([[len(set(draws[:, b, i])) for i in range(N)] for b in range(64)])
    assert (distinct[several] > 1).mean() > 0.5  # it samples: rows with a choice vary


def test_masked_logits_give_probability_zero_and_a_dead_agents_empty_mask_is_ignored():
    model = MAPPO(OBS_DIM, A, N, S)
    rng = np.random.default_rng(1)
    mask = torch.ones(2, N, A, dtype=torch.int8)
    mask[:, 0, 1:] = 0  # agent 0 may only take action 0
    mask[:, 2] = 0  # agent 2 is dead: no legal action
    data = {
        "obs": torch.tensor(rng.normal(size=(2, N, OBS_DIM)), dtype=torch.float32),
        "global_state": torch.zeros(2, S),
        "action_mask": mask,
        "alive": torch.tensor([[1, 1, 0]] * 2),
    }
    out = model(data, mode="compute_action")
    probs = out["logit"].softmax(-1)
    assert torch.equal(probs[:, 0], torch.tensor([[1.0, 0, 0, 0, 0]] * 2))
    assert out["action_mask"][:, 2].all()  # the dead agent's row is read as all-legal
    with pytest.raises(ValueError, match="action_mask"):
        model({**data, "action_mask": mask[:, :, :2]}, mode="compute_action")


# ---- the centralized value -------------------------------------------------------------------------------------
def test_the_value_uses_the_global_state_and_the_agent_id():
    torch.manual_seed(0)
    obs = torch.randn(4, N, OBS_DIM)
    state = torch.randn(4, S)
    for critic_input in ("state_id", "state", "state_obs"):
        model = MAPPO(OBS_DIM, A, N, S, critic_input=critic_input)
        value = model({"obs": obs, "global_state": state}, mode="compute_value")["value"]
        assert value.shape == (4, N)
        other_state = model({"obs": obs, "global_state": state + 1.0}, mode="compute_value")["value"]
        assert (value - other_state).abs().min() > 1e-6  # every agent's value moves with the global state
        other_obs = model({"obs": obs + 1.0, "global_state": state}, mode="compute_value")["value"]
        assert torch.equal(value, other_obs) == (critic_input != "state_obs")
        spread = (value - value[:, :1]).abs().max()
        assert (spread > 1e-6) == (critic_input != "state")  # V(s, i) differs per agent; V(s) does not


# ---- losses over live agents -----------------------------------------------------------------------------------
def test_alive_weight_and_masked_normalize_by_hand():
    alive = torch.tensor([[1, 0], [1, 1]])
    weight = alive_weight(alive, torch.zeros(2, 2))
    assert torch.allclose(weight, torch.tensor([[4 / 3, 0.0], [4 / 3, 4 / 3]]))
    x = torch.tensor([[1.0, 100.0], [2.0, 3.0]])
    # live entries 1, 2, 3: mean 2, unbiased std 1
    assert torch.allclose(masked_normalize(x, weight, eps=0.0), torch.tensor([[-1.0, 98.0], [0.0, 1.0]]))
    assert alive_weight(None, x) is None
    assert torch.equal(alive_weight(torch.zeros(2, 2), x), torch.zeros(2, 2))


def learn_batch(seed=3, dead_fill=None):
    """A hand-built batch of 4 joint steps: agent 2 is dead in the first two."""
    g = torch.Generator().manual_seed(seed)
    alive = torch.ones(4, N, dtype=torch.int8)
    alive[:2, 2] = 0
    batch = {
        "obs": {
            "obs": torch.randn(4, N, OBS_DIM, generator=g),
            "global_state": torch.randn(4, S, generator=g),
            "action_mask": torch.ones(4, N, A, dtype=torch.int8),
            "alive": alive,
        },
        "action": torch.randint(0, A, (4, N), generator=g),
        "logp": -torch.rand(4, N, generator=g) - 1.0,
        "value": torch.randn(4, N, generator=g),
        "adv": torch.randn(4, N, generator=g),
        "return": torch.randn(4, N, generator=g),
        "weight": None,
    }
    if dead_fill is not None:  # anything at the dead entries
        dead = alive == 0
        for key in ("logp", "value", "adv", "return"):
            batch[key] = batch[key].masked_fill(dead, dead_fill)
        batch["action"] = batch["action"].masked_fill(dead, 0)
    return batch


def test_dead_agents_contribute_no_loss():
    updated = []
    for fill in (-7.0, 50.0):
        policy = make(seed=0)
        policy.learn_mode.forward(learn_batch(dead_fill=fill))
        updated.append([p.detach().clone() for p in policy.model.parameters()])
    for a, b in zip(*updated):
        assert torch.equal(a, b)  # the dead entries' values changed nothing, value norm included


def test_the_policy_loss_is_the_mean_clipped_surrogate_over_live_agents():
    policy = make(seed=0, value_norm=False, learn={"adv_norm": False, "entropy_weight": 0.0})
    batch = learn_batch(dead_fill=0.0)
    with torch.no_grad():
        logit = policy.model({**batch["obs"]}, mode="compute_action")["logit"]
    logp = logit.log_softmax(-1).gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
    ratio = (logp - batch["logp"]).exp()
    live = batch["obs"]["alive"] == 1
    adv = batch["adv"]
    surrogate = torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    expected = -surrogate[live].sum() / 10  # 10 live entries of 12
    figures = policy.learn_mode.forward(batch)
    assert figures["policy_gradient_loss"] == pytest.approx(float(expected), rel=1e-5)


# ---- GAE per agent on the team reward --------------------------------------------------------------------------
def test_gae_per_agent_on_the_team_reward_bootstraps_a_truncation_and_not_a_termination():
    policy = make(gae_lambda=0.5, discount_factor=0.9)
    collect = policy.collect_mode
    rng = np.random.default_rng(0)
    steps = [  # (per-agent reward, terminated, truncated, value per agent)
        (np.array([1.0, 0.0, 1.0]), False, False, np.array([1.0, 2.0, 3.0])),
        (np.array([0.0, 2.0, 0.0]), False, True, np.array([0.5, 0.5, 0.5])),  # time limit
        (np.array([1.0, 1.0, 1.0]), True, False, np.array([2.0, 0.0, 1.0])),  # next episode, terminated
    ]
    next_value_at_truncation = np.array([4.0, 6.0, 8.0], np.float32)
    samples = []
    collect.adder.add_first(0)
    for reward, terminated, truncated, value in steps:
        output = {"action": np.zeros(N, np.int64), "logp": np.zeros(N, np.float32), "value": value.astype(np.float32)}
        info = {"terminated": terminated, "truncated": truncated}
        timestep = BaseEnvTimestep(observation(rng), reward.astype(np.float32), terminated or truncated, info)
        transition = collect.process_transition(observation(rng), output, timestep)
        assert transition["reward"] == pytest.approx(reward.sum())  # team_reward: sum
        if truncated:
            transition["next_value"] = next_value_at_truncation  # what the actor's bootstrap stores
        samples += collect.adder.add(0, transition)
        if terminated or truncated:
            collect.adder.add_first(0)
    adv = np.stack([s["adv"] for s in samples])
    g, lam = 0.9, 0.5
    d1 = 2.0 + g * next_value_at_truncation - steps[1][3]  # truncated: bootstraps from V(final obs)
    d0 = 2.0 + g * steps[1][3] - steps[0][3]
    d2 = 3.0 - steps[2][3]  # terminated: no bootstrap
    expected = np.stack([d0 + g * lam * d1, d1, d2])
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    np.testing.assert_allclose(np.stack([s["return"] for s in samples]), expected + np.stack([s[3] for s in steps]))


# ---- continuous and recurrent actors ---------------------------------------------------------------------------
@ENV_REGISTRY.register("mappo_test_reach")
class ReachEnv(BaseEnv):
    """Two agents steer 2-D points toward the origin (Box actions (2, 2)); 6 steps, then a time limit."""

    config = {}

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self._rng = np.random.default_rng(0)
        self._pos = np.zeros((2, 2), np.float32)
        self._t = 0
        self._ret = np.zeros(2)

    def info(self):
        box = gym.spaces.Box(-np.inf, np.inf, (2, 2), np.float32)
        return BaseEnvInfo(
            agent_num=2,
            obs_space=gym.spaces.Dict(obs=box, global_state=gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)),
            act_space=gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32),
            rew_space=gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            max_episode_steps=6,
            agent_ids=("a", "b"),
            team_reward="mean",
        )

    def _obs(self):
        return {"obs": self._pos.copy(), "global_state": self._pos.reshape(-1).copy()}

    def reset(self):
        self._pos = self._rng.uniform(-1, 1, (2, 2)).astype(np.float32)
        self._t, self._ret = 0, np.zeros(2)
        return self._obs()

    def step(self, action):
        self._pos = self._pos + 0.3 * np.asarray(action, np.float32).reshape(2, 2)
        reward = -np.linalg.norm(self._pos, axis=-1).astype(np.float32)
        self._t += 1
        self._ret += reward
        done = self._t == 6
        info = {"terminated": False, "truncated": done}
        if done:
            info.update(episode_return=self._ret.copy(), episode_len=6)
        return BaseEnvTimestep(self._obs(), reward, done, info)

    def seed(self, seed):
        self._rng = np.random.default_rng(seed)

    def close(self):
        pass


def reach_config(**model):
    return {
        "seed": 0,
        "max_env_step": 480,
        "env": {"env_type": "mappo_test_reach", "manager_type": "base", "collector_env_num": 4, "evaluator_env_num": 1},
        "policy": {
            "policy_type": "mappo",
            "model": {"hidden_sizes": [16], "critic_hidden_sizes": [16], **model},
            "learn": {"epoch_per_collect": 2, "batch_size": 12},
            "collect": {"rollout_len": 12},
        },
        "evaluator": {"n_episode": 1, "eval_freq": 240, "stop_val": 100.0},
    }


def test_continuous_actions_train_through_the_pipeline(tmp_path, one_thread):
    """Box actions (2 agents x 2 dims), time-limit truncations bootstrapped; a few updates move the log std."""
    policy = serial_pipeline(reach_config(), seed=0, exp_name="reach", run_root=str(tmp_path), progress=False)
    assert policy.model.action_space == "continuous"  # filled by the builder from the Box action space
    assert policy.model.log_std.shape == (2,)  # one agent's action size, from the (agents, act_dim) Box
    assert (policy.model.log_std.detach() != 0).all()
    obs = {0: ReachEnv().reset()}
    action = policy.eval_mode.forward([0], obs)[0]["action"]
    assert action.shape == (2, 2)
    out = policy.collect_mode.forward([0], obs)[0]
    assert out["action"].shape == (2, 2) and out["logp"].shape == (2,) and out["value"].shape == (2,)


def test_a_gru_actor_stores_its_state_and_learns_from_it(tmp_path, one_thread):
    policy = make(model={"rnn": "gru", "hidden_size": 8})
    rng = np.random.default_rng(0)
    data = {0: observation(rng), 1: observation(rng)}
    first = policy.collect_mode.forward([0, 1], data)
    second = policy.collect_mode.forward([0, 1], data)
    assert first[0]["prev_state"]["h"].shape == (N, 8)
    assert np.abs(first[0]["prev_state"]["h"]).sum() == 0  # an episode starts from zeros
    assert np.abs(second[0]["prev_state"]["h"]).sum() > 0  # then carries the state it reached
    batch = learn_batch()
    batch["prev_state"] = {"h": torch.randn(4, N, 8)}
    figures = policy.learn_mode.forward(batch)
    assert np.isfinite(figures["total_loss"])
    serial_pipeline(reach_config(rnn="gru", hidden_size=8), seed=0, exp_name="gru", run_root=str(tmp_path))


# ---- state -----------------------------------------------------------------------------------------------------
def test_save_then_load_gives_identical_actions_and_values():
    policy = make(seed=0)
    policy.learn_mode.forward(learn_batch())  # moves the weights and the value normalizer off their start
    rng = np.random.default_rng(5)
    masks = random_masks(rng, 16)
    data = {i: observation(rng, masks[i]) for i in range(16)}
    state = policy.state_dict()
    loaded = make(seed=1)
    loaded.load_state_dict(state)
    for mode in ("eval_mode",):
        a = getattr(policy, mode).forward(list(data), data)
        b = getattr(loaded, mode).forward(list(data), data)
        assert all(np.array_equal(a[i]["action"], b[i]["action"]) for i in data)
    torch.manual_seed(9)
    a = policy.collect_mode.forward(list(data), data)
    torch.manual_seed(9)
    b = loaded.collect_mode.forward(list(data), data)
    for i in data:
        assert np.array_equal(a[i]["action"], b[i]["action"])
        assert np.array_equal(a[i]["value"], b[i]["value"])  # the value normalizer travelled with the weights
    assert state["extra"]["value_norm"]["count"] > 1


def test_team_reward_env_must_be_resolved():
    with pytest.raises(ValueError, match="team_reward"):
        MAPPOPolicy(
            {"policy_type": "mappo", "model": {"obs_dim": OBS_DIM, "action_dim": A, "agent_num": N, "state_dim": S}}
        )
