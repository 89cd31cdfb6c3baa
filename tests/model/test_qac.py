"""QAC: shapes, bounded actors on an asymmetric Box, batched critics equal to separate MLPs, gradients."""

import math

import pytest
import torch
import torch.nn as nn

from nervex.model import QAC, create_model

LOW, HIGH = [-1.0, 0.0], [3.0, 0.5]


def qac(**kw):
    torch.manual_seed(0)
    return QAC(**{"obs_dim": 5, "action_dim": 2, "action_low": LOW, "action_high": HIGH, **kw})


def test_registered_and_shapes():
    model = create_model("qac", obs_dim=5, action_dim=2, critic_num=3, hidden_sizes=[32, 16])
    obs, action = torch.randn(7, 5), torch.randn(7, 2)
    assert model(obs)["action"].shape == (7, 2)
    assert model({"obs": obs, "action": action}, mode="compute_critic")["q"].shape == (3, 7)
    gaussian = qac(actor_type="squashed_gaussian")
    out = gaussian(obs, mode="compute_actor")
    assert out["mu"].shape == out["sigma"].shape == (7, 2)
    with pytest.raises(ValueError, match="did you mean 'compute_critic'"):
        model(obs, mode="compute_critc")
    with pytest.raises(ValueError, match="actor_type must be one of deterministic, squashed_gaussian"):
        QAC(5, 2, actor_type="gaussian")
    with pytest.raises(ValueError, match="need action_low < action_high"):
        QAC(5, 2, action_low=[0.0, 1.0], action_high=[1.0, 1.0])


def test_deterministic_actor_maps_tanh_onto_an_asymmetric_box():
    model = qac(hidden_sizes=[8])
    last = model.actor.layers[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor([math.atanh(0.5), math.atanh(-1.0 + 1e-7)]))
    # loc = [1, 0.25], scale = [2, 0.25]: tanh 0.5 -> 1 + 2 * 0.5 = 2; tanh -1 -> 0.25 - 0.25 = 0
    action = model(torch.randn(3, 5))["action"]
    torch.testing.assert_close(action, torch.tensor([[2.0, 0.0]] * 3), atol=1e-5, rtol=0)
    with torch.no_grad():
        last.bias.copy_(torch.tensor([50.0, 50.0]))
    torch.testing.assert_close(model(torch.randn(3, 5))["action"], torch.tensor([HIGH] * 3))


def test_actor_actions_stay_in_the_bounds_for_large_inputs():
    model = qac()
    action = model(torch.randn(1000, 5) * 100)["action"]
    for d in range(2):
        assert LOW[d] <= action[:, d].min() and action[:, d].max() <= HIGH[d]
    assert action[:, 0].max() > 2.5 and action[:, 0].min() < -0.5  # the whole range is reachable, not [-1, 1]


def test_squashed_gaussian_log_std_is_clamped():
    model = qac(actor_type="squashed_gaussian", hidden_sizes=[4])
    with torch.no_grad():
        model.actor.layers[-1].weight.zero_()
        model.actor.layers[-1].bias.copy_(torch.tensor([0.0, 0.0, 10.0, -30.0]))  # mu, mu, log_std, log_std
    sigma = model(torch.randn(2, 5))["sigma"]
    torch.testing.assert_close(sigma, torch.tensor([[math.exp(2.0), math.exp(-20.0)]] * 2))


def test_batched_critics_equal_separate_mlps_with_the_same_weights():
    model = qac(critic_num=3, hidden_sizes=[16, 8])
    obs, action = torch.randn(6, 5), torch.randn(6, 2)
    q = model({"obs": obs, "action": action}, mode="compute_critic")["q"]
    x = torch.cat([obs, action], dim=-1)
    for i in range(3):
        layers = []
        for k, (w, b) in enumerate(zip(model.critic.weights, model.critic.biases)):
            linear = nn.Linear(w.shape[1], w.shape[2])
            with torch.no_grad():
                linear.weight.copy_(w[i].t())
                linear.bias.copy_(b[i, 0])
            layers += [linear] + ([nn.ReLU()] if k < len(model.critic.weights) - 1 else [])
        torch.testing.assert_close(q[i], nn.Sequential(*layers)(x).squeeze(-1))
    assert not torch.allclose(q[0], q[1])  # independently initialised critics


def test_first_critics_only_equal_the_full_run_and_leave_the_rest_without_gradient():
    model = qac(critic_num=3, hidden_sizes=[16, 8])
    obs, action = torch.randn(6, 5), torch.randn(6, 2, requires_grad=True)
    full = model({"obs": obs, "action": action}, mode="compute_critic")["q"]
    first = model({"obs": obs, "action": action}, mode="compute_critic", critics=1)["q"]
    assert first.shape == (1, 6)
    torch.testing.assert_close(first[0], full[0])
    first.sum().backward()
    assert action.grad is not None and action.grad.abs().sum() > 0
    # the skipped critics' slices get zero gradient (their weights were not used)
    assert model.critic.weights[0].grad[1:].abs().sum() == 0 and model.critic.weights[0].grad[0].abs().sum() > 0
    with pytest.raises(ValueError, match="first must be in 1..3"):
        model({"obs": obs, "action": action}, mode="compute_critic", critics=4)


def test_gradients_flow_to_actor_and_every_critic():
    model = qac()
    obs = torch.randn(4, 5)
    action = model(obs)["action"]
    q = model({"obs": obs, "action": action}, mode="compute_critic")["q"]
    q.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.actor.parameters())
    for w in model.critic.weights:
        assert all(w.grad[i].abs().sum() > 0 for i in range(model.critic_num))


def test_bounds_are_constructor_arguments_not_state():
    model = qac()
    assert not any("action" in k for k in model.state_dict())
    other = QAC(5, 2, action_low=[-2.0, -2.0], action_high=[2.0, 2.0])
    other.load_state_dict(model.state_dict())
    assert other.action_high.tolist() == [2.0, 2.0]


def test_critics_without_param_grad_pass_the_action_gradient_and_leave_the_weights_alone():
    model = qac(critic_num=2, hidden_sizes=[16, 8])
    obs, action = torch.randn(6, 5), torch.randn(6, 2, requires_grad=True)
    full = model({"obs": obs, "action": action}, mode="compute_critic")["q"]
    expected = torch.autograd.grad(full.sum(), action)[0]
    q = model({"obs": obs, "action": action}, mode="compute_critic", param_grad=False)["q"]
    torch.testing.assert_close(q, full)
    q.sum().backward()
    torch.testing.assert_close(action.grad, expected)
    assert all(p.grad is None for p in model.critic.parameters())


def test_squashed_gaussian_actor_returns_its_clamped_log_sigma():
    model = qac(actor_type="squashed_gaussian")
    out = model(torch.randn(3, 5))
    torch.testing.assert_close(out["log_sigma"].exp(), out["sigma"])
    assert (out["log_sigma"] >= -20).all() and (out["log_sigma"] <= 2).all()
