"""IMPALA: V-trace targets on hand cases, the loss against rl_utils, the policy lag, config errors, state, acting."""

import math
import os

import numpy as np
import pytest
import torch

from nervex.config import ConfigError, read_config
from nervex.entry import compile_config
from nervex.policy import IMPALAPolicy, create_policy
from nervex.policy.actor_critic import dist_from_output
from nervex.rl_utils import vtrace_data, vtrace_error
from nervex.torch_utils import CategoricalDist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE_IMPALA = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_impala.yaml")
NO_VEL_IMPALA = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_no_vel_impala.yaml")

GAMMA = 0.9
B_VALUE = 0.5  # every state's value in the hand cases


def impala(lstm=False, gamma=GAMMA, enable_field=None, **learn):
    torch.manual_seed(0)
    model = dict(obs_dim=4, action_dim=2, hidden_sizes=[8])
    if lstm:
        model.update(lstm_hidden_size=6)
    cfg = {"policy_type": "impala", "model": model, "discount_factor": gamma, "learn": learn}
    return create_policy(cfg, enable_field=enable_field)


def constant_value(policy, value=B_VALUE):
    with torch.no_grad():
        policy.model.value_head.weight.zero_()
        policy.model.value_head.bias.fill_(value)


def model_logp(policy, obs, action, prev_state=None):
    """log pi(a_t | history) of a (B, T) batch under the policy's current weights (on-policy behaviour log-probs)."""
    x = obs.transpose(0, 1)
    with torch.no_grad():
        out = policy.model({"obs": x, "prev_state": prev_state} if policy.model.recurrent else x)
    return dist_from_output(out).log_prob(action.transpose(0, 1)).transpose(0, 1)


def hand_batch(policy):
    """Three sequences of U = 4 learn steps (T = 5) in the sequence Adder's layout:

    - 0: no episode end: rewards 1, 2, 3, 4, bootstrap from obs[4];
    - 1: terminated at step 2 (rewards 1, 1, 1), padding from step 3;
    - 2: truncated (time limit) at step 1 (rewards 1, 2), padding from step 2: obs[2] is the final observation.
    """
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(3, 5, 4, generator=g)
    if policy.model.action_space == "continuous":
        action = torch.randn(3, 5, policy.model.action_dim, generator=g)
    else:
        action = torch.randint(0, 2, (3, 5), generator=g)
    reward = torch.tensor([[1.0, 2, 3, 4, 5], [1, 1, 1, 0, 0], [1, 2, 0, 0, 0]])
    false = [False] * 5
    terminated = torch.tensor([false, [False, False, True, True, True], false])
    truncated = torch.tensor([false, false, [False, True, True, True, True]])
    mask = torch.tensor([[1.0] * 5, [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    batch = dict(obs=obs, action=action, reward=reward, terminated=terminated, truncated=truncated, mask=mask)
    batch["done"] = terminated | truncated
    batch["burnin"] = torch.zeros(3, dtype=torch.int64)
    if policy.model.recurrent:
        state = policy.model.initial_state(batch_size=3)
        batch["prev_state"] = {k: torch.randn(v.shape, generator=g) for k, v in state.items()}
    batch["logp"] = model_logp(policy, obs, action, batch.get("prev_state"))
    return batch


# V-trace with rho-bar = c-bar = 1 on on-policy data is the n-step return bootstrapped from the value, by hand
# (gamma 0.9, V = 0.5 everywhere):
# 0: v3 = 4 + .9 * .5 = 4.45, v2 = 3 + .9 * 4.45 = 7.005, v1 = 2 + .9 * 7.005 = 8.3045, v0 = 1 + .9 * 8.3045
# 1: terminated at 2: v2 = 1, v1 = 1 + .9 = 1.9, v0 = 1 + .9 * 1.9 = 2.71 (v3 is padding: its own value)
# 2: truncated at 1: v1 = 2 + .9 * V(final obs) = 2.45, v0 = 1 + .9 * 2.45 = 3.205
HAND_RETURNS = [[8.47405, 8.3045, 7.005, 4.45], [2.71, 1.9, 1.0, 0.5], [3.205, 2.45, 0.5, 0.5]]


@pytest.mark.parametrize("lstm", [False, True])
def test_on_policy_vtrace_targets_are_nstep_returns_by_hand(lstm):
    policy = impala(lstm=lstm, rho_clip=1.0, c_clip=1.0, enable_field=["learn"])
    constant_value(policy)
    batch = hand_batch(policy)
    inputs = policy._sequence_inputs(batch)
    targets = policy._targets(inputs)
    torch.testing.assert_close(targets.rho * inputs.mask, inputs.mask)  # on-policy: every ratio is 1
    returns = targets.returns.t() * batch["mask"][:, :4] + 0.5 * (1 - batch["mask"][:, :4])
    torch.testing.assert_close(returns, torch.tensor(HAND_RETURNS))
    # advantages r_s + gamma * v_{s+1} - V(x_s): the last learn step bootstraps from V(obs[4]); an end cuts
    adv = targets.adv.t()
    torch.testing.assert_close(adv[0], torch.tensor([8.47405, 8.3045, 7.005, 4.45]) - 0.5)
    torch.testing.assert_close(adv[1, :3], torch.tensor([2.71, 1.9, 1.0]) - 0.5)
    torch.testing.assert_close(adv[2, :2], torch.tensor([3.205, 2.45]) - 0.5)


def test_clipped_off_policy_targets_by_hand():
    # one sequence, U = 2, V = 0.5, rewards 1, 1; pi/mu = 2 at step 0 and 0.5 at step 1; rho-bar 1, c-bar 0.8
    policy = impala(rho_clip=1.0, c_clip=0.8, rho_pg_clip=1.0, enable_field=["learn"])
    constant_value(policy)
    batch = hand_batch(policy)
    batch = {k: v[:1, :3] if k not in ("burnin",) else v[:1] for k, v in batch.items()}
    batch["reward"] = torch.tensor([[1.0, 1.0, 0.0]])
    batch["logp"] = batch["logp"] - torch.tensor([[math.log(2.0), math.log(0.5), 0.0]])
    targets = policy._targets(policy._sequence_inputs(batch))
    # rho0 = c0 = min(1, 2) = 1 (rho-bar) / 0.8 (c-bar); rho1 = c1 = 0.5
    # delta1 = .5 * (1 + .9 * .5 - .5) = .475, v1 = .5 + .475 = .975
    # delta0 = 1 * (1 + .45 - .5) = .95, v0 = .5 + .95 + .9 * .8 * .475 = 1.792
    torch.testing.assert_close(targets.returns.t(), torch.tensor([[1.792, 0.975]]))
    # adv0 = 1 * (1 + .9 * v1 - .5) = 1.3775; adv1 = .5 * (1 + .9 * .5 - .5) = .475
    torch.testing.assert_close(targets.adv.t(), torch.tensor([[1.3775, 0.475]]))


def test_losses_are_rl_utils_vtrace_error():
    policy = impala(rho_clip=1.0, c_clip=0.9, rho_pg_clip=1.2, trace_lambda=0.95, enable_field=["learn"])
    batch = hand_batch(policy)
    g = torch.Generator().manual_seed(2)
    batch["logp"] = batch["logp"] + 0.5 * torch.randn(batch["logp"].shape, generator=g)  # off-policy
    inputs = policy._sequence_inputs(batch)
    losses = policy._losses(inputs, policy._targets(inputs))
    expected = vtrace_error(
        vtrace_data(
            inputs.target_logp,
            inputs.behaviour_logp,
            inputs.entropy,
            inputs.value,
            inputs.reward,
            inputs.done,
            inputs.mask,
        ),
        gamma=GAMMA,
        lambda_=0.95,
        rho_clip_ratio=1.0,
        c_clip_ratio=0.9,
        rho_pg_clip_ratio=1.2,
    )
    torch.testing.assert_close(losses["policy_loss"], expected.policy_loss)
    torch.testing.assert_close(losses["value_loss"], expected.value_loss)
    torch.testing.assert_close(losses["entropy_loss"], expected.entropy_loss)
    assert "upgo_loss" not in losses


def test_truncation_is_bootstrapped_and_cut():
    inputs = impala(enable_field=["learn"])
    constant_value(inputs)
    batch = hand_batch(inputs)
    seq = inputs._sequence_inputs(batch)
    # sequence 2: the truncated step's reward holds gamma * V(final obs); from it on every step is done
    torch.testing.assert_close(seq.reward[:, 2], torch.tensor([1.0, 2.0 + GAMMA * B_VALUE, 0.0, 0.0]))
    torch.testing.assert_close(seq.done[:, 2], torch.tensor([0.0, 1.0, 1.0, 1.0]))
    torch.testing.assert_close(seq.reward[:, 1], torch.tensor([1.0, 1.0, 1.0, 0.0]))  # a termination: unchanged


def test_upgo_term_switch_and_value():
    off = impala(enable_field=["learn"])
    on = impala(upgo_weight=1.0, enable_field=["learn"])
    constant_value(on)
    batch = hand_batch(on)
    inputs = on._sequence_inputs(batch)
    losses = on._losses(inputs, on._targets(inputs))
    # on-policy with V = 0.5: UPGO follows the rewards while r + gamma * V(next) >= V (always here), so its
    # returns are the n-step returns and the term equals the V-trace policy loss
    torch.testing.assert_close(losses["upgo_loss"], losses["policy_loss"])
    assert "upgo_loss" in on.learn_mode.forward(hand_batch(on))
    assert "upgo_loss" not in off.learn_mode.forward(hand_batch(off))


def test_learn_step_figures_and_improvement():
    policy = impala(learning_rate=1e-2, optimizer="adam", enable_field=["learn"])
    batch = hand_batch(policy)
    first = policy.learn_mode.forward(dict(batch))
    for key in ("total_loss", "policy_loss", "value_loss", "entropy_loss", "rho_mean", "rho_clip_fraction"):
        assert isinstance(first[key], float) and math.isfinite(first[key])
    assert first["rho_mean"] == pytest.approx(1.0)  # behaviour = target before the first step
    for _ in range(200):
        last = policy.learn_mode.forward(dict(batch))
    assert last["value_loss"] < 0.1 * first["value_loss"]
    assert last["rho_mean"] != pytest.approx(1.0)  # the same data are now off-policy


# ---- the policy lag --------------------------------------------------------------------------------------------
def collect_logp(policy, obs, seed=5):
    """(action, behaviour logp) the collect mode samples for three envs' observations, with a fixed torch seed."""
    torch.manual_seed(seed)
    out = policy.collect_mode.forward([0, 1, 2], {i: obs[i] for i in range(3)})
    return torch.tensor([int(out[i]["action"]) for i in range(3)]), torch.tensor(
        [float(out[i]["logp"]) for i in range(3)]
    )


def learner_logp(policy, obs, action):
    with torch.no_grad():
        return CategoricalDist(policy.model(obs)["logit"]).log_prob(action)


@pytest.mark.parametrize("lag", [0, 3])
def test_policy_lag_makes_behaviour_differ_from_target(lag):
    policy = impala(policy_lag=lag, learning_rate=0.05, optimizer="adam")
    obs = torch.randn(3, 4, generator=torch.Generator().manual_seed(3))
    batch = hand_batch(policy)
    action, before = collect_logp(policy, obs)
    torch.testing.assert_close(before, learner_logp(policy, obs, action))  # no step yet: one set of weights
    for step in range(1, 4):
        policy.learn_mode.forward(dict(batch))
        behaviour_action, behaviour = collect_logp(policy, obs)
        target = learner_logp(policy, obs, behaviour_action)
        if lag == 0 or step == lag:  # the actor acts with the learner's weights (refreshed every `lag` steps)
            torch.testing.assert_close(behaviour, target)
        else:  # it still acts with the initial weights: behaviour != target
            torch.testing.assert_close(behaviour, before)
            assert (behaviour - target).abs().max() > 1e-3
    # a learn step on data collected before the last refresh sees ratios != 1
    assert policy.learn_mode.forward(dict(batch))["rho_mean"] != pytest.approx(1.0, abs=1e-4)


def test_lag_needs_both_modes_and_the_state_keeps_the_actor_weights():
    collect_only = impala(policy_lag=3, enable_field=["collect"])
    assert collect_only._acting_model is collect_only.model  # an actor process acts with what it loads
    policy = impala(policy_lag=3, learning_rate=0.05, optimizer="adam")
    policy.learn_mode.forward(hand_batch(policy))
    state = policy.learn_mode.state_dict()
    assert state["extra"]["learn_iter"] == 1
    obs = torch.randn(3, 4)
    restored = impala(policy_lag=3)
    restored.learn_mode.load_state_dict(state)
    torch.testing.assert_close(collect_logp(restored, obs), collect_logp(policy, obs))
    # a snapshot without the lagged copy (an eval state) starts the actor from the loaded weights
    fresh = impala(policy_lag=3)
    fresh.learn_mode.load_state_dict({"model": policy.model.state_dict()})
    action, logp = collect_logp(fresh, obs)
    torch.testing.assert_close(logp, learner_logp(policy, obs, action))


# ---- acting: the collected sequences -----------------------------------------------------------------------------
def collect_samples(policy, n, env_num=2, seed=0):
    from app_zoo.classic_control.cartpole.envs import CartPoleEnv
    from nervex.policy import CollectSpec
    from nervex.worker.actor import SerialActor
    from nervex.worker.actor.env_manager import BaseEnvManager

    manager = BaseEnvManager(CartPoleEnv, {}, env_num)
    manager.seed(seed)
    actor = SerialActor({}, manager, policy.collect_mode, seed=seed)
    try:
        return actor.collect(CollectSpec("sample", n))
    finally:
        actor.close()


@pytest.mark.parametrize("lstm", [False, True])
def test_collected_sequences_are_on_policy_and_carry_the_lstm_state(lstm):
    policy = impala(lstm=lstm)
    samples = collect_samples(policy, 400)
    assert len(samples) >= 4
    first = samples[0]
    assert first["obs"].shape == (21, 4) and first["logp"].shape == (21,) and first["mask"].shape == (21,)
    assert ("prev_state" in first) == lstm
    batch = {k: torch.as_tensor(np.stack([s[k] for s in samples])) for k in first if k != "prev_state"}
    if lstm:
        assert first["prev_state"]["h"].shape == (2, 6)  # policy and value cores
        batch["prev_state"] = {k: torch.as_tensor(np.stack([s["prev_state"][k] for s in samples])) for k in ("h", "c")}
        # an episode's first window starts from zeros; its second starts from the state after the first 20 steps
        assert not np.any(first["prev_state"]["h"])
        long = [s for s in samples if s["mask"].all() and not np.any(s["prev_state"]["h"])]
        window, second = next((a, b) for a in long for b in samples if np.array_equal(b["obs"][0], a["obs"][20]))
        with torch.no_grad():
            after = policy.model({"obs": torch.as_tensor(window["obs"][:20, None])})["next_state"]
        torch.testing.assert_close(torch.as_tensor(second["prev_state"]["h"]), after["h"][0])
        torch.testing.assert_close(torch.as_tensor(second["prev_state"]["c"]), after["c"][0])
    # no learning happened: the stored behaviour log-probs are the learner's own, so every ratio of a real step is 1
    inputs = policy._sequence_inputs(batch)
    targets = policy._targets(inputs)
    torch.testing.assert_close(targets.rho * inputs.mask, inputs.mask, atol=1e-5, rtol=0)


def test_eval_is_greedy_and_recurrent_eval_keeps_a_state_per_env():
    policy = impala(lstm=True)
    obs = {i: torch.randn(4) for i in range(3)}
    first = policy.eval_mode.forward([0, 1, 2], obs)
    with torch.no_grad():
        expected = policy.model({"obs": torch.stack([obs[i] for i in range(3)])})["logit"].argmax(-1)
    assert [int(first[i]["action"]) for i in range(3)] == expected.tolist()
    # the second call continues each env's state: the same obs may now give other logits; a reset forgets it
    policy.eval_mode.forward([0, 1, 2], obs)
    policy.eval_mode.reset([1])
    state = policy._eval_agent.plugin("main", "hidden_state").states
    assert not state[1]["h"].any() and state[0]["h"].any()


# ---- config ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "policy_cfg, error, match",
    [
        (
            {"learn": {"rho_clp": 1.0}},
            ConfigError,
            r"unknown key 'policy.learn.rho_clp'.*did you mean 'policy.learn.rho_clip'",
        ),
        ({"learn": {"rho_clip": 0.0}}, ConfigError, r"policy.learn.rho_clip.*> 0"),
        ({"learn": {"c_clip": -1}}, ConfigError, r"policy.learn.c_clip"),
        ({"learn": {"trace_lambda": 1.5}}, ConfigError, r"policy.learn.trace_lambda"),
        ({"learn": {"policy_lag": -1}}, ConfigError, r"policy.learn.policy_lag"),
        ({"learn": {"optimizer": "sgd"}}, ConfigError, r"policy.learn.optimizer.*rmsprop"),
        ({"collect": {"unroll_len": 0}}, ConfigError, r"policy.collect.unroll_len"),
        ({"model": {"lstm_hidden_size": 0}}, ValueError, "lstm_hidden_size must be a positive int, got 0"),
    ],
)
def test_config_errors_name_the_key(policy_cfg, error, match):
    cfg = {"policy_type": "impala", "model": {"obs_dim": 4, "action_dim": 2}}
    for key, value in policy_cfg.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    with pytest.raises(error, match=match):
        create_policy(cfg)


def test_shipped_configs_compile_with_the_replay_defaults():
    cfg = compile_config(read_config(CARTPOLE_IMPALA))
    assert cfg.policy.on_policy is False and cfg.policy.policy_type == "impala"
    assert IMPALAPolicy.contract(cfg.policy).buffer_type == "uniform"
    no_vel = compile_config(read_config(NO_VEL_IMPALA))
    assert no_vel.env.env_type == "cartpole_no_vel" and no_vel.policy.model.lstm_hidden_size > 0
    # the policy's replay defaults (a FIFO of recent sequences used a bounded number of times) apply when unset
    bare = compile_config({"env": {"env_type": "cartpole"}, "policy": {"policy_type": "impala"}})
    assert bare.replay_buffer.maxlen == IMPALAPolicy.buffer_defaults["maxlen"]
    assert bare.replay_buffer.max_use == IMPALAPolicy.buffer_defaults["max_use"]


# ---- state -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lstm", [False, True])
def test_save_load_gives_identical_actions(tmp_path, lstm):
    from nervex.torch_utils import load_checkpoint, save_checkpoint

    policy = impala(lstm=lstm, learning_rate=0.05, optimizer="adam", policy_lag=2)
    for _ in range(3):
        policy.learn_mode.forward(hand_batch(policy))
    save_checkpoint({"policy": policy.learn_mode.state_dict()}, tmp_path / "impala.pt")
    torch.manual_seed(123)  # other initial weights
    loaded = impala(lstm=lstm, policy_lag=2)
    loaded.learn_mode.load_state_dict(load_checkpoint(tmp_path / "impala.pt")["policy"])
    eval_only = impala(lstm=lstm, enable_field=["eval"])
    eval_only.eval_mode.load_state_dict(load_checkpoint(tmp_path / "impala.pt")["policy"])
    g = torch.Generator().manual_seed(4)
    for _ in range(5):  # several steps: a recurrent policy's actions depend on its state too
        obs = {i: torch.randn(4, generator=g) * 2 for i in range(3)}
        want = policy.eval_mode.forward([0, 1, 2], obs)
        for other in (loaded, eval_only):
            got = other.eval_mode.forward([0, 1, 2], obs)
            assert [int(got[i]["action"]) for i in range(3)] == [int(want[i]["action"]) for i in range(3)]
        x = torch.stack(list(obs.values()))
        torch.testing.assert_close(collect_logp(loaded, x), collect_logp(policy, x))


def test_continuous_actions_collect_and_learn():
    torch.manual_seed(0)
    cfg = {
        "policy_type": "impala",
        "model": dict(obs_dim=4, action_dim=2, action_space="continuous", hidden_sizes=[8], lstm_hidden_size=4),
        "discount_factor": GAMMA,
    }
    policy = create_policy(cfg)
    out = policy.collect_mode.forward([0, 1], {0: torch.randn(4), 1: torch.randn(4)})
    assert out[0]["action"].shape == (2,) and out[0]["logp"].shape == () and out[0]["prev_state"]["h"].shape == (2, 4)
    batch = hand_batch(policy)  # Gaussian actions (3, 5, 2) and their log-densities under the model
    assert batch["action"].shape == (3, 5, 2) and batch["logp"].shape == (3, 5)
    inputs = policy._sequence_inputs(batch)
    torch.testing.assert_close(policy._targets(inputs).rho * inputs.mask, inputs.mask)  # on-policy
    figures = policy.learn_mode.forward(batch)
    assert all(math.isfinite(figures[k]) for k in ("total_loss", "policy_loss", "value_loss", "entropy_loss"))
    greedy = policy.eval_mode.forward([0], {0: torch.zeros(4)})[0]["action"]
    assert greedy.shape == (2,)
