"""ATOC's policy: its batch terms and attention labels by hand, one learn step, bounds, save/load, real learning."""

import numpy as np
import pytest
import torch

from nervex.entry import SerialTrainer
from nervex.policy import create_policy
from nervex.policy.atoc import agent_terms, attention_labels
from nervex.torch_utils import collate

from .line_targets import LineTargetsEnv

AGENTS, OBS, ACT, THOUGHT = 3, 2, 2, 8
MODEL = dict(obs_dim=OBS, action_dim=ACT, agent_num=AGENTS, thought_size=THOUGHT, actor_hidden_sizes=[16])


def make_policy(**overrides):
    torch.manual_seed(0)
    cfg = {"policy_type": "atoc", "model": dict(MODEL), "team_reward": "agent", **overrides}
    return create_policy(cfg)


def transition(rng, communicated=True):
    obs = {"obs": rng.standard_normal((AGENTS, OBS)).astype(np.float32)}
    next_obs = {"obs": rng.standard_normal((AGENTS, OBS)).astype(np.float32)}
    delta_q = rng.standard_normal(AGENTS) if communicated else np.full(AGENTS, np.nan)
    return {
        "obs": obs,
        "next_obs": next_obs,
        "action": rng.uniform(-1, 1, (AGENTS, ACT)).astype(np.float32),
        "reward": rng.standard_normal((1, AGENTS)).astype(np.float32),
        "terminated": False,
        "truncated": False,
        "done": False,
        "thought": rng.uniform(0, 1, (AGENTS, THOUGHT)).astype(np.float32),
        "delta_q": delta_q.astype(np.float32),
    }


def test_agent_terms_per_agent_and_team():
    data = {
        # 2 samples, nstep 2, 3 agents
        "reward": torch.tensor([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [[7.0, 8.0, 9.0], [0.0, 0.0, 0.0]]]),
        "terminated": torch.tensor([False, True]),
        "value_gamma": torch.tensor([0.81, 0.9]),
    }
    reward, terminated, value_gamma = agent_terms(data, "agent", 3)
    # rows b * N + i: sample 0's agents, then sample 1's; time first
    assert reward.tolist() == [[1.0, 2.0, 3.0, 7.0, 8.0, 9.0], [4.0, 5.0, 6.0, 0.0, 0.0, 0.0]]
    assert terminated.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    torch.testing.assert_close(value_gamma, torch.tensor([0.81, 0.81, 0.81, 0.9, 0.9, 0.9]))
    reward, _, _ = agent_terms(data, "sum", 3)
    assert reward.tolist() == [[6.0, 6.0, 6.0, 24.0, 24.0, 24.0], [15.0, 15.0, 15.0, 0.0, 0.0, 0.0]]
    reward, _, _ = agent_terms(data, "mean", 3)
    assert reward.tolist() == [[2.0, 2.0, 2.0, 8.0, 8.0, 8.0], [5.0, 5.0, 5.0, 0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="one reward per agent"):
        agent_terms({**data, "reward": torch.zeros(2, 1)}, "agent", 3)


def test_attention_labels_min_max_normalized():
    labels = attention_labels(torch.tensor([-1.0, 3.0, 1.0, 0.0]))
    assert labels.tolist() == [0.0, 1.0, 0.5, 0.25]
    assert attention_labels(torch.tensor([2.0, 2.0])).tolist() == [0.5, 0.5]


def test_one_learn_step_changes_actor_critic_and_attention():
    policy = make_policy()
    model = policy.model
    parts = {"actor": model.actor_encoder, "channel": model.channel, "decoder": model.actor_decoder}
    parts.update(critic=model.critic, attention=model.attention)
    before = {name: [p.detach().clone() for p in part.parameters()] for name, part in parts.items()}
    rng = np.random.default_rng(0)
    batch = collate([transition(rng, communicated=i % 4 != 0) for i in range(16)])
    # everybody initiates, so the channel is in the actor's graph
    with torch.no_grad():
        model.attention.layers[-1].bias.fill_(10.0)
    info = policy.learn_mode.forward(batch)
    for name, part in parts.items():
        changed = [not torch.equal(b, p) for b, p in zip(before[name], part.parameters())]
        assert any(changed), f"{name} did not change"
    for key in ("critic_loss", "actor_loss", "attention_loss", "initiator_rate", "q_value", "total_loss"):
        assert np.isfinite(info[key]), key
    assert info["initiator_rate"] == 1.0


def test_priority_is_the_agents_mean_td_and_warmup_only_batches_skip_the_attention_step():
    policy = make_policy(priority=True)
    rng = np.random.default_rng(1)
    batch = collate([transition(rng, communicated=False) for _ in range(8)])
    batch["weight"] = torch.ones(8)
    before = [p.detach().clone() for p in policy.model.attention.parameters()]
    info = policy.learn_mode.forward(batch)
    assert info["priority"].shape == (8,)
    assert "attention_loss" not in info and np.isfinite(info["total_loss"])
    assert all(torch.equal(b, p) for b, p in zip(before, policy.model.attention.parameters()))


def test_collect_actions_stay_in_bounds_and_carry_the_attention_samples():
    model = dict(MODEL, action_low=0.0, action_high=1.0)
    policy = make_policy(model=model, collect={"noise": {"type": "gaussian", "sigma": 5.0}})
    rng = np.random.default_rng(2)
    obs = {i: {"obs": rng.standard_normal((AGENTS, OBS)).astype(np.float32)} for i in range(4)}
    out = policy.collect_mode.forward(list(obs), obs)
    actions = np.stack([out[i]["action"] for i in obs])
    assert actions.shape == (4, AGENTS, ACT)
    assert actions.min() == 0.0 and actions.max() == 1.0  # sigma 5 pushes some past both bounds: clipped
    assert out[0]["thought"].shape == (AGENTS, THOUGHT) and out[0]["delta_q"].shape == (AGENTS,)
    evaluated = policy.eval_mode.forward(list(obs), obs)
    assert all(((0 <= evaluated[i]["action"]) & (evaluated[i]["action"] <= 1)).all() for i in obs)


def test_save_then_load_gives_identical_actions():
    policy = make_policy()
    rng = np.random.default_rng(3)
    policy.learn_mode.forward(collate([transition(rng) for _ in range(8)]))
    other = make_policy()
    other.load_state_dict(policy.state_dict())
    obs = {i: {"obs": rng.standard_normal((AGENTS, OBS)).astype(np.float32)} for i in range(3)}
    mine, theirs = policy.eval_mode.forward([0, 1, 2], obs), other.eval_mode.forward([0, 1, 2], obs)
    for i in obs:
        np.testing.assert_array_equal(mine[i]["action"], theirs[i]["action"])
    assert set(policy.state_dict()["learn"]["optimizers"]) == {
        "actor_optimizer",
        "critic_optimizer",
        "attention_optimizer",
    }


def random_team_return(episodes: int = 50) -> float:
    env, rng, returns = LineTargetsEnv(), np.random.default_rng(0), []
    env.seed(100000)
    for _ in range(episodes):
        env.reset()
        while True:
            timestep = env.step(rng.uniform(-1, 1, (3, 1)))
            if timestep.done:
                returns.append(timestep.info["episode_return"].sum())
                break
    return float(np.mean(returns))


def test_learns_the_line_targets_env_better_than_random(tmp_path, one_thread):
    """3 agents on a line, each steering to its target: random earns about -21 (team sum), steering straight -3.
    ATOC reaches better than -10 within 400 env steps, ~100 gradient steps (seed 0: about -5; ~10 s)."""
    cfg = {
        "max_env_step": 400,
        "env": {"env_type": "test_line_targets", "manager_type": "base", "collector_env_num": 2},
        "policy": {
            "policy_type": "atoc",
            "model": {"thought_size": 16, "actor_hidden_sizes": [32], "attention_hidden_sizes": [32]},
            "discount_factor": 0.9,
            "learn": {"learning_starts": 200, "learning_rate": 3e-3, "target_theta": 0.02},
            "collect": {"noise": {"sigma": 0.3}},
        },
        "evaluator": {"n_episode": 10, "eval_freq": 400},
    }
    cfg["policy"]["model"].update(group_by="position", position_dims=[0])
    cfg["env"]["evaluator_env_num"] = 2
    with SerialTrainer(cfg, seed=0, exp_name="atoc_line", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
        assert trainer.policy.model.action_dim == 1  # one agent's action, sized by the builder from Box((3, 1))
        assert trainer.policy.cfg.team_reward == "agent"
    random_return = random_team_return()
    assert random_return < -15
    assert trainer.evaluator.best_reward > -10, f"best evaluation {trainer.evaluator.best_reward}"
