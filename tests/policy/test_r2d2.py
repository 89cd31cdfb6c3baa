"""R2D2: burn-in gives no loss and no gradient, the stored state starts each sequence, targets, config errors."""

import copy

import numpy as np
import pytest
import torch

from nervex.config import ConfigError
from nervex.envs import BaseEnvTimestep
from nervex.model import DRQN
from nervex.policy import R2D2Policy, create_policy

BURNIN, UNROLL, NSTEP = 2, 3, 2
T = BURNIN + UNROLL + NSTEP


def make_policy(enable_field=("learn",), **overrides):
    cfg = {
        "policy_type": "r2d2",
        "model": dict(obs_shape=3, action_dim=2, encoder_hidden_sizes=[8], hidden_size=6, num_layers=2),
        "discount_factor": 0.9,
        "nstep": NSTEP,
        "burnin_step": BURNIN,
        "unroll_len": UNROLL,
        "learn": {"target_update_freq": 1000},
        **overrides,
    }
    torch.manual_seed(0)
    return create_policy(cfg, enable_field=list(enable_field))


def make_batch(burnin=(0, 1, 2), seed=0):
    """A replay batch of len(burnin) sequences (batch axis first), as the sequence adder and replay give it."""
    g = torch.Generator().manual_seed(seed)
    n = len(burnin)
    mask = torch.ones(n, T)
    mask[-1, T - 1 :] = 0.0  # the last sample's episode ended (truncated) one step before the sample's end
    return {
        "obs": torch.randn(n, T, 3, generator=g),
        "action": torch.randint(0, 2, (n, T), generator=g),
        "reward": torch.randn(n, T, generator=g),
        "terminated": torch.zeros(n, T, dtype=torch.bool),
        "truncated": torch.zeros(n, T, dtype=torch.bool),
        "done": torch.zeros(n, T, dtype=torch.bool),
        "mask": mask,
        "burnin": torch.tensor(burnin),
        "prev_state": {k: torch.randn(n, 2, 6, generator=g) for k in ("h", "c")},
        "weight": None,
    }


def test_burnin_steps_give_no_gradient_and_no_loss():
    policy = make_policy()
    batch = make_batch()
    batch["obs"].requires_grad_(True)
    out = policy._sequence_loss(batch)
    out["loss"].backward()
    grad = batch["obs"].grad.abs().sum(-1)  # (B, T)
    for i, b in enumerate(batch["burnin"].tolist()):
        assert not grad[i, :b].any(), f"sample {i}: gradient reached its burn-in steps {grad[i, :b]}"
        assert grad[i, b : b + UNROLL].all(), f"sample {i}: no gradient at a learn step"
    # rewards of burn-in steps do not enter any target
    changed = copy.deepcopy(make_batch())
    for i, b in enumerate(changed["burnin"].tolist()):
        changed["reward"][i, :b] += 100.0
    torch.testing.assert_close(policy._sequence_loss(changed)["loss"], policy._sequence_loss(make_batch())["loss"])
    # but burn-in observations do set the state the window starts from
    moved = make_batch()
    moved["obs"][2, :2] += 1.0
    assert not torch.allclose(policy._sequence_loss(moved)["q"][:, 2], policy._sequence_loss(make_batch())["q"][:, 2])


def test_window_q_values_equal_a_step_by_step_unroll_from_the_stored_state():
    policy = make_policy()
    batch = make_batch()
    q = policy._sequence_loss(batch)["q"]  # (UNROLL, B) at the actions taken
    model = policy.model
    for i, b in enumerate(batch["burnin"].tolist()):
        state = {k: v[i : i + 1] for k, v in batch["prev_state"].items()}
        for t in range(b + UNROLL):
            out = model({"obs": batch["obs"][i : i + 1, t], "prev_state": state})
            state = out["next_state"]
            if t >= b:
                expected = out["logit"][0, batch["action"][i, t]]
                torch.testing.assert_close(q[t - b, i], expected.detach(), rtol=1e-5, atol=1e-6)


def test_target_by_hand_for_one_step_without_rescale():
    # nstep 1, no rescale, target net = online net: target = r + gamma * Q(s', argmax Q(s'))
    policy = make_policy(nstep=1, value_rescale=False, burnin_step=0)
    batch = make_batch(burnin=(0,))
    batch = {k: v[:, : UNROLL + 1] if torch.is_tensor(v) and v.dim() >= 2 else v for k, v in batch.items()}
    batch["prev_state"] = policy.model.initial_state(1)
    batch["mask"] = torch.ones(1, UNROLL + 1)
    out = policy._sequence_loss(batch)
    logit = policy.model({"obs": batch["obs"].transpose(0, 1), "prev_state": batch["prev_state"]}, sequence=True)
    logit = logit["logit"][:, 0].detach()
    target = batch["reward"][0, :UNROLL] + 0.9 * logit[1:].max(-1).values
    taken = logit[:UNROLL].gather(1, batch["action"][0, :UNROLL].unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(out["td_error"][:, 0], (target - taken).abs(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["loss"], (target - taken).square().mean(), rtol=1e-5, atol=1e-6)


def test_learn_step_returns_sequence_priorities_and_moves_the_weights():
    policy = make_policy()
    before = [p.detach().clone() for p in policy.model.parameters()]
    info = policy.learn_mode.forward(make_batch())
    assert info["priority"].shape == (3,) and np.all(info["priority"] > 0)
    assert np.isfinite(info["total_loss"]) and "q_value" in info
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))


def test_stored_state_at_each_sequence_start_is_the_actors_state():
    # two envs acting together through the collect mode; env 1's episode ends (terminated) at step 6 and restarts
    policy = make_policy(enable_field=("collect",))
    collect = policy.collect_mode
    adder, hidden = collect.adder, policy._collect_agent.plugin("main", "hidden_state")
    zero = {k: v.numpy() for k, v in policy.model.initial_state().items()}
    rng = np.random.default_rng(0)
    states = {0: [], 1: []}  # the actor's state before each step of the env's current episode
    samples = {0: [], 1: []}  # (sample, index of the sample in its episode, that episode's states)
    count = {0: 0, 1: 0}
    for env_id in (0, 1):
        adder.add_first(env_id)
    for step in range(20):
        obs = {env_id: rng.standard_normal(3).astype(np.float32) for env_id in (0, 1)}
        for env_id in (0, 1):
            known = env_id < hidden.state_num
            states[env_id].append({k: v.numpy() for k, v in hidden.states[env_id].items()} if known else zero)
        output = collect.forward([0, 1], obs, eps=0.5)
        for env_id in (0, 1):
            done = env_id == 1 and step == 6
            info = {"terminated": done, "truncated": False}
            timestep = BaseEnvTimestep(rng.standard_normal(3).astype(np.float32), 1.0, done, info)
            transition = collect.process_transition(obs[env_id], output[env_id], timestep)
            assert set(transition["prev_state"]) == {"h", "c"} and transition["prev_state"]["h"].shape == (2, 6)
            for sample in adder.add(env_id, transition):
                samples[env_id].append((sample, count[env_id], states[env_id]))
                count[env_id] += 1
            if done:
                collect.reset([env_id])
                adder.add_first(env_id)
                states[env_id], count[env_id] = [], 0
    # env 0: windows at steps 0, 3, .. 15 (each needs 3 + 2 steps); env 1: 3 of its 7-step episode, 3 of the next
    assert [len(samples[0]), len(samples[1])] == [6, 6]
    for env_id in (0, 1):
        for sample, k, episode_states in samples[env_id]:
            burnin = min(BURNIN, k * UNROLL)
            start = k * UNROLL - burnin  # the episode step the sample starts at
            assert int(sample["burnin"]) == burnin and sample["obs"].shape == (T, 3)
            for key in ("h", "c"):
                np.testing.assert_array_equal(sample["prev_state"][key], episode_states[start][key])
    assert not samples[1][3][0]["prev_state"]["h"].any()  # a new episode's first sample starts from zeros
    assert samples[0][1][0]["prev_state"]["h"].any()  # a later one from the actor's state there


def test_a_sample_too_short_for_the_config_is_an_error():
    policy = make_policy()
    batch = make_batch()
    batch = {k: v[:, : T - 1] if torch.is_tensor(v) and v.dim() >= 2 and k != "burnin" else v for k, v in batch.items()}
    batch["prev_state"] = make_batch()["prev_state"]
    with pytest.raises(ValueError, match=r"a sample has 6 steps but burn-in 2 \+ unroll_len 3 \+ nstep 2 = 7"):
        policy._sequence_loss(batch)


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        ({"burnin_stpe": 2}, ConfigError, r"policy.burnin_stpe.*did you mean 'policy.burnin_step'"),
        ({"unroll_len": 0}, ConfigError, r"policy.unroll_len"),
        ({"priority_eta": 1.5}, ConfigError, r"policy.priority_eta"),
        (
            {"command": {"eps": {"per_env": True, "per_env_alpha": 0.0}}},
            ConfigError,
            r"per_env_alpha.*is 0 with per_env true",
        ),
        ({"model_type": "fc_discrete_net", "model": {"obs_dim": 3, "action_dim": 2}}, ValueError, "recurrent model"),
    ],
)
def test_config_errors(overrides, error, message):
    with pytest.raises(error, match=message):
        make_policy(**overrides)


def test_default_model_is_drqn():
    assert isinstance(make_policy().model, DRQN)
    assert R2D2Policy._buffer_type({"priority": True}) == "prioritized"


def test_pong_config_builds_and_takes_a_learn_step_on_random_frames():
    """The shipped Pong config's policy (no Atari ROMs needed): conv encoder, LSTM 512, one learn step, batch of 2."""
    import os

    from nervex.config import read_config
    from nervex.entry import compile_config

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cfg = compile_config(read_config(os.path.join(root, "app_zoo/atari/config/pong_r2d2.yaml"))).policy
    cfg.model.update(obs_shape=[4, 84, 84], action_dim=6)
    torch.manual_seed(0)
    policy = create_policy(cfg, enable_field=["learn"])
    steps = cfg.burnin_step + cfg.unroll_len + cfg.nstep
    assert steps == 125 and policy.model.hidden_size == 512
    g = torch.Generator().manual_seed(0)
    batch = {
        "obs": torch.randint(0, 256, (2, steps, 4, 84, 84), dtype=torch.uint8, generator=g),
        "action": torch.randint(0, 6, (2, steps), generator=g),
        "reward": torch.randint(-1, 2, (2, steps), generator=g).float(),
        "terminated": torch.zeros(2, steps, dtype=torch.bool),
        "mask": torch.ones(2, steps),
        "burnin": torch.tensor([0, 40]),
        "prev_state": policy.model.initial_state(2),
        "weight": torch.ones(2),
    }
    info = policy.learn_mode.forward(batch)
    assert np.isfinite(info["total_loss"]) and info["priority"].shape == (2,)


def test_checkpoint_reload_acts_the_same_over_an_episode(tmp_path):
    """Save -> load into a trainer of another seed -> identical greedy actions along a sequence of observations, the
    recurrent eval state carried from step to step (so the weights and the state handling both round-trip)."""
    import os

    from nervex.config import read_config
    from nervex.entry import SerialTrainer

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cfg = read_config(os.path.join(root, "app_zoo/classic_control/cartpole/config/cartpole_r2d2.yaml"))
    cfg.env.update(collector_env_num=2, evaluator_env_num=1)
    cfg.policy.learn.update(learning_starts=200, batch_size=8)
    cfg.evaluator.update(n_episode=1, eval_freq=10**9)
    observations = np.random.default_rng(0).normal(size=(40, 4)).astype(np.float32)
    observations[:, [1, 3]] = 0.0  # as cartpole_no_vel gives them

    def episode(trainer):
        trainer.policy.eval_mode.reset()
        return [int(trainer.compute_single_action(o)) for o in observations]

    with SerialTrainer(copy.deepcopy(cfg), seed=0, exp_name="a", run_root=str(tmp_path)) as trainer:
        while trainer.env_step < 600:
            trainer.train()
        assert trainer.train_iter > 0
        path = trainer.save_checkpoint()
        actions = episode(trainer)
    with SerialTrainer(copy.deepcopy(cfg), seed=1, exp_name="b", run_root=str(tmp_path)) as fresh:
        before = episode(fresh)
        fresh.load_checkpoint(path)
        after = episode(fresh)
    assert after == actions
    assert before != actions  # the check could fail: another seed's untrained net acts differently
