"""Rainbow: the learn step against a hand-built C51 target, priorities, NoisyNet acting, config switches, state."""

import os

import numpy as np
import pytest
import torch

from nervex.config import ConfigError, read_config
from nervex.entry import SerialTrainer, compile_config
from nervex.model import DistributionalHead, NoisyLinear
from nervex.policy import RainbowPolicy, create_policy
from nervex.torch_utils import load_checkpoint, save_checkpoint

from .test_dqn import ConstantRewardEnv  # noqa: F401  (registers the env 'test_constant_reward')

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE_RAINBOW = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_rainbow.yaml")

NEG = -1e4  # an atom logit whose probability is exactly 0 in float32 (exp(-1e4) underflows)


def cartpole_policy_cfg(**model):
    """The shipped CartPole policy section, with the noisy head unless ``noisy=False`` is given."""
    cfg = compile_config(read_config(CARTPOLE_RAINBOW)).policy
    cfg.model.update(obs_dim=4, action_dim=2, **{"noisy": True, **model})
    cfg.command.eps.enabled = None  # rainbow's default: epsilon-greedy only without noisy layers
    return cfg


def one_hot_policy(double: bool):
    """A policy whose net is a lookup table: obs = one-hot state (6 states), atom logits = one weight column.

    Support z = [0, 1, 2, 3, 4] (5 atoms, delta 1), 2 actions, gamma 0.5, 2-step targets, no noise.
    """
    cfg = {
        "policy_type": "rainbow",
        "model": dict(obs_dim=6, action_dim=2, hidden_sizes=[], dueling=False, noisy=False),
        "discount_factor": 0.5,
        "nstep": 2,
        "priority": True,
        "learn": {"double": double, "target_update_freq": 1000},
    }
    cfg["model"].update(n_atom=5, v_min=0.0, v_max=4.0)
    return create_policy(cfg)


def table_state(policy, logits):
    """The model's state dict for ``logits[state]`` of shape (action_dim=2, n_atom=5) per one-hot state."""
    weight = torch.tensor(logits, dtype=torch.float32).reshape(6, 10).t().contiguous()
    return {"head.q_head.weight": weight, "head.q_head.bias": torch.zeros(10)}


def onehot(i):
    return torch.eye(6)[i]


# Online atom logits at the three observations (states 0-2): arbitrary, moderate (no probability near 0).
OBS_LOGITS = [
    [[0.1, 0.3, -0.2, 0.5, 0.0], [0.2, -0.1, 0.4, 0.0, 0.3]],
    [[0.0, 0.2, 0.6, -0.3, 0.1], [-0.2, 0.1, 0.0, 0.2, 0.5]],
    [[0.3, 0.0, 0.1, 0.2, -0.4], [0.1, 0.5, 0.2, -0.1, 0.0]],
]
# Online atom logits at the next observations (states 3-5): only their greedy action matters.
HIGH, LOW = [NEG, NEG, NEG, NEG, 0.0], [0.0, NEG, NEG, NEG, NEG]  # Q = 4 and Q = 0
ONLINE_NEXT = [[HIGH, LOW], [HIGH, LOW], [LOW, HIGH]]  # online greedy: a0 at s'_A, a1 at s'_C
# Target net's distributions at the next observations.
TARGET_NEXT = [
    [[NEG, NEG, NEG, 0.0, 0.0], [NEG, NEG, NEG, NEG, 0.0]],  # s'_A: a0 = {3: .5, 4: .5} (Q 3.5), a1 = {4: 1} (Q 4)
    [[NEG, NEG, NEG, NEG, 0.0], [NEG, NEG, NEG, NEG, 0.0]],  # s'_B: not used (terminated)
    [[NEG, NEG, NEG, NEG, 0.0], [NEG, 0.0, NEG, NEG, NEG]],  # s'_C: a0 = {4: 1} (Q 4), a1 = {1: 1} (Q 1)
]
# One batch, gamma 0.5, nstep 2:
#  A: rewards (1, 0.5), full window: G = 1.25, bootstrap 0.25 * Z(s'_A, a*)
#  B: reward 2, terminated after one step: G = 2, no bootstrap
#  C: reward 1, truncated (time limit) after one step: G = 1, bootstrap value_gamma = 0.5 (not 0.25, not 0)
BATCH = {
    "obs": torch.stack([onehot(0), onehot(1), onehot(2)]),
    "next_obs": torch.stack([onehot(3), onehot(4), onehot(5)]),
    "action": torch.tensor([1, 0, 1]),
    "reward": torch.tensor([[1.0, 0.5], [2.0, 0.0], [1.0, 0.0]]),
    "terminated": torch.tensor([False, True, False]),
    "truncated": torch.tensor([False, False, True]),
    "value_gamma": torch.tensor([0.25, 0.5, 0.5]),
    "weight": torch.tensor([1.0, 0.5, 2.0]),
}
EXPECTED_TARGET = {
    # double: a* = online greedy = a0 at s'_A, a1 at s'_C
    #  A: 1.25 + 0.25 * {3, 4} = {2.0: .5, 2.25: .5} -> atom 2: .5 + .5 * .75, atom 3: .5 * .25
    #  C: 1 + 0.5 * 1 = 1.5 -> atoms 1 and 2 half each
    True: [[0, 0, 0.875, 0.125, 0], [0, 0, 1, 0, 0], [0, 0.5, 0.5, 0, 0]],
    # not double: a* = target greedy = a1 at s'_A (z = 4), a0 at s'_C (z = 4)
    #  A: 1.25 + 0.25 * 4 = 2.25 -> atom 2: .75, atom 3: .25;  C: 1 + 0.5 * 4 = 3 -> atom 3
    False: [[0, 0, 0.75, 0.25, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0]],
}


@pytest.mark.parametrize("double", [True, False])
def test_learn_step_matches_hand_built_c51_target(double):
    policy = one_hot_policy(double)
    state = policy.state_dict()
    state["model"] = table_state(policy, OBS_LOGITS + ONLINE_NEXT)
    state["learn"]["agents"]["learn_agent"]["models"]["target"] = table_state(policy, OBS_LOGITS + TARGET_NEXT)
    policy.load_state_dict(state)
    log_p = torch.log_softmax(torch.tensor(OBS_LOGITS), dim=-1)[torch.arange(3), BATCH["action"]]
    expected_ce = -(torch.tensor(EXPECTED_TARGET[double]) * log_p).sum(-1)

    info = policy.learn_mode.forward(dict(BATCH))

    np.testing.assert_allclose(info["priority"], expected_ce.numpy(), rtol=1e-5)  # priority = per-sample CE
    expected_loss = (BATCH["weight"] * expected_ce).mean()  # importance-weighted
    assert info["total_loss"] == pytest.approx(expected_loss.item(), rel=1e-5)


def test_uniform_replay_has_no_priority_and_unweighted_loss():
    cfg = cartpole_policy_cfg()
    cfg.priority = False
    assert RainbowPolicy.contract(cfg).buffer_type == "uniform"
    assert RainbowPolicy.contract(cartpole_policy_cfg()).buffer_type == "prioritized"
    policy = create_policy(cfg)
    batch = {
        "obs": torch.randn(8, 4),
        "next_obs": torch.randn(8, 4),
        "action": torch.randint(0, 2, (8,)),
        "reward": torch.ones(8, 3),
        "terminated": torch.zeros(8, dtype=torch.bool),
        "weight": torch.zeros(8),  # ignored without priority: the loss would be 0 if it were used
    }
    info = policy.learn_mode.forward(batch)
    assert "priority" not in info
    assert info["total_loss"] > 0


def states(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return {i: rng.normal(0, 0.5, 4).astype(np.float32) for i in range(n)}


def actions(mode, obs):
    out = mode.forward(list(obs), obs)
    return np.array([int(out[i]["action"]) for i in obs])


def test_noisy_collect_explores_and_eval_is_greedy_without_noise():
    torch.manual_seed(0)
    policy = create_policy(cartpole_policy_cfg())
    assert policy.command_mode.get_setting_collect({"env_step": 0}) == {}  # noisy: no epsilon-greedy by default
    obs = states()
    greedy = actions(policy.eval_mode, obs)
    with torch.no_grad():
        batch = torch.as_tensor(np.stack(list(obs.values())))
        policy.model.eval()
        mean_net = policy.model(batch)["logit"].argmax(-1).numpy()
    np.testing.assert_array_equal(greedy, mean_net)  # eval acts on the mean weights
    collected = np.stack([actions(policy.collect_mode, obs) for _ in range(10)])
    changed = (collected != collected[0]).any(axis=0)
    assert changed.sum() >= 5, "collect actions should vary with the noise from call to call"
    for _ in range(3):  # collect (training mode) in between leaves eval noiseless
        actions(policy.collect_mode, obs)
        np.testing.assert_array_equal(actions(policy.eval_mode, obs), greedy)


def test_plain_head_collects_epsilon_greedy():
    policy = create_policy(cartpole_policy_cfg(noisy=False))
    setting = policy.command_mode.get_setting_collect({"env_step": 0})
    assert setting == {"eps": pytest.approx(1.0)}  # the shipped linear schedule starts at 1
    obs = states()
    first = actions(policy.collect_mode, obs)  # eps 0: greedy, nothing random left
    np.testing.assert_array_equal(actions(policy.collect_mode, obs), first)
    np.testing.assert_array_equal(actions(policy.eval_mode, obs), first)
    cfg = cartpole_policy_cfg()
    cfg.command.eps.enabled = True  # forced on over the noise
    assert "eps" in create_policy(cfg).command_mode.get_setting_collect({"env_step": 0})


def test_target_net_draws_its_own_noise_in_the_learn_step():
    torch.manual_seed(0)
    policy = create_policy(cartpole_policy_cfg())
    batch = {
        "obs": torch.randn(8, 4),
        "next_obs": torch.randn(8, 4),
        "action": torch.randint(0, 2, (8,)),
        "reward": torch.ones(8, 3),
        "terminated": torch.zeros(8, dtype=torch.bool),
        "weight": torch.ones(8),
    }
    actions(policy.eval_mode, states(4))  # leaves the shared model in eval mode: learn must switch it back
    policy.learn_mode.forward(batch)
    online = [m for m in policy.model.modules() if isinstance(m, NoisyLinear)]
    target = [m for m in policy._learn_agent.target_model.modules() if isinstance(m, NoisyLinear)]
    assert len(online) == len(target) == 2  # dueling: value and advantage streams
    for a, b in zip(online, target):
        assert a.training and b.training
        assert not torch.equal(a.eps_out, b.eps_out)


@pytest.mark.parametrize("dueling", [True, False])
@pytest.mark.parametrize("noisy", [True, False])
def test_model_switches_build_the_expected_head(dueling, noisy):
    policy = create_policy(cartpole_policy_cfg(dueling=dueling, noisy=noisy, n_atom=21, v_min=-5.0, v_max=15.0))
    head = policy.model.head
    assert isinstance(head, DistributionalHead)
    assert (head.n_atom, head.v_min, head.v_max) == (21, -5.0, 15.0)
    assert hasattr(head, "value_head") == dueling
    assert any(isinstance(m, NoisyLinear) for m in head.modules()) == noisy
    out = policy.model(torch.zeros(3, 4))
    assert out["distribution"].shape == (3, 2, 21)


def test_rainbow_defaults_are_the_full_rainbow_network():
    policy = create_policy({"policy_type": "rainbow", "model": {"obs_dim": 4, "action_dim": 2}})
    head = policy.model.head
    assert isinstance(head, DistributionalHead) and hasattr(head, "value_head")
    assert any(isinstance(m, NoisyLinear) for m in head.modules())
    adder = policy.collect_mode.adder
    assert (adder.kind, adder.nstep) == ("nstep", 3)


def test_non_distributional_model_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="policy.model.distributional.*policy_type: dqn"):
        create_policy({"policy_type": "rainbow", "model": {"obs_dim": 4, "action_dim": 2, "distributional": False}})
    path = tmp_path / "bad.yaml"
    path.write_text(
        "env:\n  env_type: cartpole\npolicy:\n  policy_type: rainbow\n  model:\n    distributional: false\n"
    )
    with pytest.raises(ConfigError, match="'policy.model.distributional' in bad.yaml"):
        compile_config(read_config(str(path)))


def test_state_round_trip_gives_identical_actions_and_learn_steps(tmp_path):
    torch.manual_seed(0)
    cfg = cartpole_policy_cfg()
    policy = create_policy(cfg)
    batch = {
        "obs": torch.randn(16, 4),
        "next_obs": torch.randn(16, 4),
        "action": torch.randint(0, 2, (16,)),
        "reward": torch.rand(16, 3),
        "terminated": torch.rand(16) < 0.2,
        "weight": torch.rand(16),
    }
    for _ in range(5):
        policy.learn_mode.forward(dict(batch))
    path = str(tmp_path / "rainbow.pt")
    save_checkpoint({"policy": policy.state_dict()}, path)
    state = load_checkpoint(path)["policy"]  # weights_only
    evaluator = create_policy(cfg, enable_field=["eval"])
    evaluator.eval_mode.load_state_dict(state)
    obs = states()
    np.testing.assert_array_equal(actions(evaluator.eval_mode, obs), actions(policy.eval_mode, obs))
    learner = create_policy(cfg, enable_field=["learn"])
    learner.learn_mode.load_state_dict(state)
    infos = []
    for p in (policy, learner):
        torch.manual_seed(1)  # the same noise draws
        infos.append(p.learn_mode.forward(dict(batch)))
    assert infos[0]["total_loss"] == infos[1]["total_loss"]
    np.testing.assert_array_equal(infos[0]["priority"], infos[1]["priority"])


@pytest.mark.parametrize("nstep", [1, 3])
def test_time_limit_truncation_bootstraps(tmp_path, nstep):
    """Constant reward 1 under a time limit of 10: Q = 1 / (1 - gamma) = 10, not the finite-horizon ~5.3."""
    gamma = 0.9
    cfg = {
        "max_env_step": 4000,
        "env": {
            "env_type": "test_constant_reward",  # registered by test_dqn
            "manager_type": "base",
            "collector_env_num": 2,
            "evaluator_env_num": 1,
            "time_limit": 10,
        },
        "policy": {
            "policy_type": "rainbow",
            "model": {"hidden_sizes": [16], "n_atom": 41, "v_min": 0.0, "v_max": 20.0},
            "discount_factor": gamma,
            "nstep": nstep,
            "learn": {"batch_size": 32, "learning_rate": 0.01, "learning_starts": 100, "target_update_freq": 20},
            "collect": {"n_sample": 8},
        },
        "replay_buffer": {"maxlen": 2000},
        "evaluator": {"n_episode": 1, "eval_freq": 100000, "stop_val": 1e9},
    }
    with SerialTrainer(cfg, seed=0, exp_name="trunc", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
        model = trainer.policy.model.eval()
        with torch.no_grad():
            q = model(torch.ones(1, 2))["logit"]
    assert q.max().item() == pytest.approx(1.0 / (1.0 - gamma), abs=1.0)
