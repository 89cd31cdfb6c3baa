"""DDPG, TD3 and SAC: the learn step against hand-built targets, Polyak targets, TD3's delay, portable state."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from nervex.config import ConfigError
from nervex.entry.builder import fill_model_from_env
from nervex.envs import BaseEnvInfo
from nervex.model import QAC
from nervex.policy import DDPGPolicy, LearnSpec, SACPolicy, TD3Policy
from nervex.torch_utils import load_checkpoint, save_checkpoint

LOW, HIGH = [-1.0, 0.0], [3.0, 0.5]
MODEL = {"obs_dim": 3, "action_dim": 2, "action_low": LOW, "action_high": HIGH, "hidden_sizes": [32, 32]}
CLASSES = {"ddpg": DDPGPolicy, "td3": TD3Policy, "sac": SACPolicy}
OBS = torch.tensor(np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32))


def make(name, seed=0, **cfg):
    torch.manual_seed(seed)
    return CLASSES[name]({"policy_type": name, "model": dict(MODEL), **cfg})


def batch(seed=1, size=8):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(size, 3, generator=g),
        "next_obs": torch.randn(size, 3, generator=g),
        "action": torch.rand(size, 2, generator=g) * torch.tensor([4.0, 0.5]) + torch.tensor([-1.0, 0.0]),
        "reward": torch.randn(size, 1, generator=g),
        "terminated": torch.tensor([True, False] * (size // 2)),
        "value_gamma": torch.full((size,), 0.99),
    }


def actions(mode, obs=OBS):
    data = {i: o.numpy() for i, o in enumerate(obs)}
    out = mode.forward(list(data), data)
    return np.stack([out[i]["action"] for i in data])


def params(module):
    return [p.detach().clone() for p in module.parameters()]


# ---- declared defaults and errors ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CLASSES)
def test_contract_defaults_are_sb3s(name):
    cls = CLASSES[name]
    cfg = cls.compile_section({"policy_type": name})
    contract = cls.contract(cfg)
    assert contract.learn == LearnSpec(
        batch_size=256, update_per_collect=8, learning_starts=100, random_warmup=True
    ) and (contract.buffer_type, contract.collect.n) == ("uniform", 8)
    assert (cfg.learn.target_theta, cfg.discount_factor) == (0.005, 0.99)
    assert cfg.learn.learning_rate == {"sac": 3e-4}.get(name, 1e-3)


def test_td3_sac_specific_defaults():
    td3 = TD3Policy.compile_section({"policy_type": "td3"}).learn
    assert (td3.actor_update_freq, td3.target_policy_noise, td3.noise_clip) == (2, 0.2, 0.5)
    sac = SACPolicy.compile_section({"policy_type": "sac"}).learn
    assert (sac.auto_alpha, sac.alpha, sac.target_entropy) == (True, 1.0, None)


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="ddpg needs policy.model.critic_num 1, got 2"):
        DDPGPolicy({"policy_type": "ddpg", "model": dict(MODEL, critic_num=2)})
    with pytest.raises(ValueError, match="sac needs policy.model.actor_type 'squashed_gaussian'"):
        SACPolicy({"policy_type": "sac", "model": dict(MODEL, actor_type="deterministic")})
    with pytest.raises(ConfigError, match="key 'policy.learn.actor_update_freq' must be >= 1"):
        TD3Policy.compile_section({"policy_type": "td3", "learn": {"actor_update_freq": 0}})
    with pytest.raises(ConfigError, match=r"policy.collect.noise.type.*one of 'gaussian', 'ou'"):
        DDPGPolicy.compile_section({"policy_type": "ddpg", "collect": {"noise": {"type": "pink"}}})


def test_builder_fills_the_bounds_of_an_asymmetric_box():
    box = gym.spaces.Box(np.array(LOW, np.float32), np.array(HIGH, np.float32))
    info = BaseEnvInfo(1, gym.spaces.Box(-1, 1, (3,), np.float32), box, None, 200)
    cfg = {}
    fill_model_from_env(cfg, QAC, info)
    assert cfg == {"obs_dim": 3, "action_dim": 2, "action_low": LOW, "action_high": HIGH}
    cfg = {"action_low": [-0.5, 0.1], "action_high": [0.5, 0.2]}
    fill_model_from_env(cfg, QAC, info)
    assert cfg["action_low"] == [-0.5, 0.1]  # the config's own bounds win


# ---- the learn step ----------------------------------------------------------------------------------------------
def test_ddpg_critic_loss_uses_terminated_and_value_gamma():
    policy = make("ddpg", discount_factor=0.9, nstep=2)
    model, data = policy.model, batch()
    data["value_gamma"] = torch.tensor([0.9, 0.81] * 4)  # a truncated 1-step window among 2-step ones
    data["reward"] = torch.cat([data["reward"], torch.ones(8, 1)], dim=1)  # (B, nstep=2)
    with torch.no_grad():  # the target copy equals the online model before the first update
        next_q = model.compute_critic(data["next_obs"], model.compute_actor(data["next_obs"])["action"])["q"][0]
        q = model.compute_critic(data["obs"], data["action"])["q"][0]
        target = data["reward"][:, 0] + 0.9 * data["reward"][:, 1]
        target = target + data["value_gamma"] * (1 - data["terminated"].float()) * next_q
    info = policy.learn_mode.forward(dict(data))
    assert info["critic_loss"] == pytest.approx((0.5 * (target - q) ** 2).mean().item(), rel=1e-5)


@pytest.mark.parametrize("name", CLASSES)
def test_targets_move_by_exactly_tau(name):
    tau = 0.25
    policy = make(name, learn={"target_theta": tau, "actor_update_freq": 1} if name == "td3" else {"target_theta": tau})
    target = policy._learn_agent.get_model("target")
    before = params(target)
    policy.learn_mode.forward(batch())
    after_online = params(policy.model)
    for old, new, online in zip(before, params(target), after_online):
        torch.testing.assert_close(new, (1 - tau) * old + tau * online)
    assert any(not torch.equal(old, new) for old, new in zip(before, params(target)))


def test_td3_updates_actor_and_targets_every_d_critic_steps():
    policy = make("td3", learn={"actor_update_freq": 3})
    model, target = policy.model, policy._learn_agent.get_model("target")
    actor, critic, frozen = params(model.actor), params(model.critic), params(target)
    for step in range(1, 7):
        info = policy.learn_mode.forward(batch(seed=step))
        moved = any(not torch.equal(a, b) for a, b in zip(actor, params(model.actor)))
        target_moved = any(not torch.equal(a, b) for a, b in zip(frozen, params(target)))
        assert any(not torch.equal(a, b) for a, b in zip(critic, params(model.critic)))  # every step
        assert moved == target_moved == (step % 3 == 0) == ("actor_loss" in info), step
        actor, critic, frozen = params(model.actor), params(model.critic), params(target)


def test_sac_alpha_rises_when_entropy_is_below_target_and_a_fixed_alpha_stays():
    policy = make("sac", learn={"target_entropy": 10.0})  # far above what the policy has
    policy.learn_mode.forward(batch())
    assert policy._log_alpha.item() > 0
    fixed = make("sac", learn={"auto_alpha": False, "alpha": 0.2})
    info = fixed.learn_mode.forward(batch())
    assert info["alpha"] == pytest.approx(0.2) and fixed._log_alpha.item() == pytest.approx(math.log(0.2))
    assert "alpha_optimizer" not in fixed.learn_mode.optimizers()
    assert sorted(policy.learn_mode.optimizers()) == ["actor_optimizer", "alpha_optimizer", "critic_optimizer"]


@pytest.mark.parametrize("name", CLASSES)
def test_collect_actions_respect_the_bounds_and_eval_is_deterministic(name):
    policy = make(name, collect={"noise": {"sigma": 2.0}} if name != "sac" else {})
    collected = actions(policy.collect_mode, OBS * 10)
    assert (collected >= np.array(LOW)).all() and (collected <= np.array(HIGH)).all()
    assert np.array_equal(actions(policy.eval_mode), actions(policy.eval_mode))
    assert not np.array_equal(actions(policy.collect_mode), actions(policy.collect_mode))


# ---- portable state ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CLASSES)
def test_learner_snapshot_loads_into_collect_only_and_eval_only(name, tmp_path):
    learner = make(name)
    for seed in range(4):
        learner.learn_mode.forward(batch(seed))
    path = tmp_path / "snap.pt"
    save_checkpoint({"policy": learner.learn_mode.state_dict()}, path)
    state = load_checkpoint(path)["policy"]  # weights_only=True: plain tensors and numbers only
    collector = CLASSES[name](learner.cfg, enable_field=["collect"])
    evaluator = CLASSES[name](learner.cfg, enable_field=["eval"])
    collector.collect_mode.load_state_dict(state)
    evaluator.eval_mode.load_state_dict(state)
    greedy = actions(learner.eval_mode)
    np.testing.assert_array_equal(actions(evaluator.eval_mode), greedy)
    torch.manual_seed(5)
    explored = actions(learner.collect_mode)
    torch.manual_seed(5)
    np.testing.assert_array_equal(actions(collector.collect_mode), explored)
    assert not np.array_equal(actions(CLASSES[name](learner.cfg, enable_field=["eval"]).eval_mode), greedy)


@pytest.mark.parametrize("name", CLASSES)
def test_learn_state_roundtrip_continues_identically(name, tmp_path):
    a = make(name, seed=0, learn={"actor_update_freq": 3} if name == "td3" else {})
    for seed in range(4):
        a.learn_mode.forward(batch(seed))
    path = tmp_path / "learn.pt"
    save_checkpoint({"policy": a.learn_mode.state_dict()}, path)
    b = make(name, seed=1, learn={"actor_update_freq": 3} if name == "td3" else {})
    b.learn_mode.load_state_dict(load_checkpoint(path)["policy"])
    for policy in (a, b):
        torch.manual_seed(9)  # TD3's smoothing noise and SAC's samples
        for seed in range(4, 6):
            policy.learn_mode.forward(batch(seed))
    for pa, pb in zip(params(a._learn_agent.get_model("target")), params(b._learn_agent.get_model("target"))):
        assert torch.equal(pa, pb)
    for pa, pb in zip(params(a.model), params(b.model)):
        assert torch.equal(pa, pb)  # same optimizer moments, same TD3 step count, same SAC temperature
    if name == "sac":
        assert a._log_alpha.item() == b._log_alpha.item() != 0.0


@pytest.mark.parametrize("name", CLASSES)
def test_save_then_load_gives_identical_actions(name, tmp_path):
    policy = make(name, seed=0)
    policy.learn_mode.forward(batch())
    path = tmp_path / "policy.pt"
    save_checkpoint({"policy": policy.state_dict()}, path)
    loaded = make(name, seed=7)
    loaded.load_state_dict(load_checkpoint(path)["policy"])
    np.testing.assert_array_equal(actions(loaded.eval_mode), actions(policy.eval_mode))


def test_ou_noise_keeps_one_process_per_env_id_and_the_actor_resets_it():
    policy = make("ddpg", collect={"noise": {"type": "ou", "sigma": 0.5, "theta": 0.15, "dt": 0.01}})
    plugin = policy._acting.collect_agent.plugin("main", "ou_noise")
    data = {0: OBS[0].numpy(), 3: OBS[1].numpy()}
    policy.collect_mode.forward([0, 3], data)
    policy.collect_mode.forward([3], {3: OBS[1].numpy()})
    assert sorted(plugin.states) == [0, 3]
    policy.collect_mode.reset([3])  # what the actor calls at env 3's episode end
    assert sorted(plugin.states) == [0]


def _reference_critics(model, x, first=None):
    """The critics as plain autograd ops (one baddbmm and ReLU per layer), the reference of the fused node."""
    weights, biases = list(model.critic.weights), list(model.critic.biases)
    num = len(weights[0]) if first is None else first
    h = x.unsqueeze(0).expand(num, *x.shape)
    for k, (w, b) in enumerate(zip(weights, biases)):
        h = torch.baddbmm(b[:num], h, w[:num])
        h = torch.relu(h) if k < len(weights) - 1 else h
    return h.squeeze(-1)


def test_sac_learn_step_equals_a_plain_reference_update():
    """One SAC update against the textbook order written with plain ops (SB3's): temperature step, critic step on
    the soft target, actor step through the updated critics, Polyak move; the same noise draws on both sides."""
    import copy

    policy = make("sac", seed=3, learn={"target_theta": 0.5})  # a large tau, so a wrong one shows
    model = copy.deepcopy(policy.model)
    target = copy.deepcopy(policy._learn_agent.get_model("target"))
    log_alpha = torch.zeros((), requires_grad=True)
    opt_alpha = torch.optim.Adam([log_alpha], lr=3e-4)
    opt_actor = torch.optim.Adam(model.actor.parameters(), lr=3e-4)
    opt_critic = torch.optim.Adam(model.critic.parameters(), lr=3e-4)
    data = batch(seed=4)
    loc, scale = model.action_loc, model.action_scale

    def sample(net, obs):
        mu, log_std = net.actor.layers(obs).split(2, dim=-1)
        log_std = log_std.clamp(-20, 2)
        eps = torch.randn_like(mu)
        u = mu + log_std.exp() * eps
        log_prob = (-0.5 * eps**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob = log_prob - torch.log(scale * (1 - torch.tanh(u) ** 2)).sum(-1)
        return loc + scale * torch.tanh(u), log_prob

    torch.manual_seed(11)
    policy.learn_mode.forward(data)
    torch.manual_seed(11)
    obs, next_obs = data["obs"], data["next_obs"]
    action_pi, log_prob = sample(model, obs)
    alpha = log_alpha.detach().exp()
    opt_alpha.zero_grad()
    (-(log_alpha * (log_prob.detach() - 2.0)).mean()).backward()  # target entropy -|A| = -2
    opt_alpha.step()
    with torch.no_grad():
        next_action, next_log_prob = sample(model, next_obs)
        next_q = _reference_critics(target, torch.cat([next_obs, next_action], -1)).min(0).values
        not_done = 1.0 - data["terminated"].float()
        soft_target = data["reward"][:, 0] + data["value_gamma"] * not_done * (next_q - alpha * next_log_prob)
    q = _reference_critics(model, torch.cat([obs, data["action"]], -1))
    opt_critic.zero_grad()
    (0.5 * ((q - soft_target) ** 2).sum(0).mean()).backward()
    opt_critic.step()
    q_pi = _reference_critics(model, torch.cat([obs, action_pi], -1)).min(0).values
    opt_actor.zero_grad()
    (alpha * log_prob - q_pi).mean().backward()
    opt_actor.step()
    with torch.no_grad():
        for t_param, param in zip(target.parameters(), model.parameters()):
            t_param.lerp_(param, 0.5)

    for got, want in zip(policy.model.parameters(), model.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(policy._learn_agent.get_model("target").parameters(), target.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(policy._log_alpha.detach(), log_alpha.detach())
    assert not torch.equal(policy._log_alpha.detach(), torch.zeros(()))  # the temperature did move


def test_td3_learn_step_equals_a_plain_reference_update():
    """One TD3 update (actor every step here) against plain ops: smoothed target action from the target actor,
    clipped double-Q target, critic step, actor step through Q_1 of the updated critics, Polyak move."""
    import copy

    policy = make("td3", seed=5, learn={"actor_update_freq": 1, "target_theta": 0.5})
    model = copy.deepcopy(policy.model)
    target = copy.deepcopy(policy._learn_agent.get_model("target"))
    opt_actor = torch.optim.Adam(model.actor.parameters(), lr=1e-3)
    opt_critic = torch.optim.Adam(model.critic.parameters(), lr=1e-3)
    data = batch(seed=6)
    loc, scale = model.action_loc, model.action_scale
    low, high = model.action_low, model.action_high

    torch.manual_seed(12)
    policy.learn_mode.forward(data)
    torch.manual_seed(12)
    obs, next_obs = data["obs"], data["next_obs"]
    with torch.no_grad():
        next_action = loc + scale * torch.tanh(target.actor.layers(next_obs))
        noise = (torch.randn_like(next_action) * 0.2 * scale).clamp(-0.5 * scale, 0.5 * scale)
        next_action = torch.max(torch.min(next_action + noise, high), low)
        next_q = _reference_critics(target, torch.cat([next_obs, next_action], -1)).min(0).values
        td_target = data["reward"][:, 0] + data["value_gamma"] * (1.0 - data["terminated"].float()) * next_q
    q = _reference_critics(model, torch.cat([obs, data["action"]], -1))
    opt_critic.zero_grad()
    (0.5 * ((q - td_target) ** 2).sum(0).mean()).backward()
    opt_critic.step()
    action = loc + scale * torch.tanh(model.actor.layers(obs))
    opt_actor.zero_grad()
    (-_reference_critics(model, torch.cat([obs, action], -1), first=1)[0].mean()).backward()
    opt_actor.step()
    with torch.no_grad():
        for t_param, param in zip(target.parameters(), model.parameters()):
            t_param.lerp_(param, 0.5)

    for got, want in zip(policy.model.parameters(), model.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(policy._learn_agent.get_model("target").parameters(), target.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
