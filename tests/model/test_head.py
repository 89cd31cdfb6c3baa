"""DistributionalHead (C51, dueling, noisy) and DiscreteHead's noisy option, with values computed by hand."""

import math

import pytest
import torch
import torch.nn as nn

from nervex.model import C51_N_ATOM, C51_V_MAX, C51_V_MIN, DiscreteHead, DistributionalHead, NoisyLinear
from nervex.rl_utils.dist_td import dist_nstep_td_data, dist_nstep_td_error


def _set_constant(layer: nn.Module, bias) -> None:
    """Zero weights and the given bias: the layer's output no longer depends on its input."""
    with torch.no_grad():
        weight, bias_param = (
            (layer.weight_mu, layer.bias_mu) if isinstance(layer, NoisyLinear) else (layer.weight, layer.bias)
        )
        weight.zero_()
        bias_param.copy_(torch.as_tensor(bias, dtype=bias_param.dtype))


@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("x_shape", [(5, 8), (3, 5, 8)])  # extra leading dims (time, batch) are kept
def test_shapes_and_probabilities(dueling, x_shape):
    torch.manual_seed(0)
    head = DistributionalHead(8, action_dim=4, n_atom=11, v_min=-2.0, v_max=3.0, dueling=dueling)
    out = head(torch.randn(x_shape))
    lead = x_shape[:-1]
    assert set(out) == {"logit", "distribution", "log_distribution"}
    assert out["logit"].shape == (*lead, 4)
    assert out["distribution"].shape == out["log_distribution"].shape == (*lead, 4, 11)
    p = out["distribution"]
    assert (p > 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(*lead, 4))
    torch.testing.assert_close(out["log_distribution"].exp(), p)
    torch.testing.assert_close(out["logit"], (p * head.support).sum(-1))
    assert (out["logit"] >= -2.0).all() and (out["logit"] <= 3.0).all()


def test_support_and_defaults():
    head = DistributionalHead(4, 2, n_atom=5, v_min=-2.0, v_max=2.0)
    torch.testing.assert_close(head.support, torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0]))
    assert "support" not in head.state_dict()  # derived from the arguments, so checkpoints stay loadable
    assert head.double().support.dtype == torch.float64
    default = DistributionalHead(4, 2)
    assert (default.n_atom, default.v_min, default.v_max) == (C51_N_ATOM, C51_V_MIN, C51_V_MAX) == (51, -10.0, 10.0)


def test_dueling_by_hand():
    head = DistributionalHead(2, action_dim=2, n_atom=3, v_min=-1.0, v_max=1.0, dueling=True)
    _set_constant(head.value_head, [0.0, 1.0, 2.0])
    _set_constant(head.advantage_head, [1.0, 0.0, 0.0, 3.0, 0.0, 2.0])  # A[0] = [1, 0, 0], A[1] = [3, 0, 2]
    # mean_a A = [2, 0, 1]; atom logits V + A - mean_a A: [[-1, 1, 1], [1, 1, 3]]
    out = head(torch.randn(1, 2))
    torch.testing.assert_close(head.atom_logits(torch.randn(1, 2)), torch.tensor([[[-1.0, 1.0, 1.0], [1.0, 1.0, 3.0]]]))
    e = math.e
    p0 = [math.exp(-1) / (math.exp(-1) + 2 * e), e / (math.exp(-1) + 2 * e), e / (math.exp(-1) + 2 * e)]
    p1 = [e / (2 * e + e**3), e / (2 * e + e**3), e**3 / (2 * e + e**3)]
    torch.testing.assert_close(out["distribution"], torch.tensor([[p0, p1]]))
    q = [p0[2] - p0[0], p1[2] - p1[0]]  # support [-1, 0, 1]
    torch.testing.assert_close(out["logit"], torch.tensor([q]))


def test_dueling_advantage_is_mean_zero_over_actions_per_atom():
    torch.manual_seed(1)
    head = DistributionalHead(6, action_dim=5, n_atom=7, dueling=True)
    x = torch.randn(8, 6)
    value = head.value_head(x).unsqueeze(-2)  # (8, 1, 7)
    advantage_part = head.atom_logits(x) - value  # (8, 5, 7)
    torch.testing.assert_close(advantage_part.mean(dim=-2), torch.zeros(8, 7), atol=1e-6, rtol=0)
    assert advantage_part.abs().max() > 0.01  # the advantages do separate the actions


def test_noisy_changes_training_outputs_not_eval_outputs():
    torch.manual_seed(2)
    head = DistributionalHead(6, action_dim=3, n_atom=5, dueling=True, noisy=True)
    assert isinstance(head.value_head, NoisyLinear) and isinstance(head.advantage_head, NoisyLinear)
    x = torch.randn(4, 6)
    assert not torch.allclose(head(x)["distribution"], head(x)["distribution"])
    head.eval()
    first, second = head(x), head(x)
    for key in first:
        assert first[key].equal(second[key])
    # eval is the same head with the mu weights as plain linear layers
    plain = DistributionalHead(6, action_dim=3, n_atom=5, dueling=True)
    for name in ("value_head", "advantage_head"):
        noisy_layer, layer = getattr(head, name), getattr(plain, name)
        with torch.no_grad():
            layer.weight.copy_(noisy_layer.weight_mu)
            layer.bias.copy_(noisy_layer.bias_mu)
    torch.testing.assert_close(first["distribution"], plain(x)["distribution"])


def test_discrete_head_noisy_option():
    torch.manual_seed(3)
    head = DiscreteHead(6, action_dim=3, dueling=True, noisy=True)
    assert isinstance(head.value_head, NoisyLinear) and isinstance(head.advantage_head, NoisyLinear)
    x = torch.randn(4, 6)
    assert not torch.allclose(head(x), head(x))
    head.eval()
    assert head(x).equal(head(x))
    assert isinstance(DiscreteHead(6, 3).q_head, nn.Linear) and not isinstance(DiscreteHead(6, 3).q_head, NoisyLinear)


def test_outputs_feed_dist_nstep_td_error():
    """The head's ``distribution`` is dist_nstep_td_error's input as it is; the loss is the cross-entropy by hand."""
    torch.manual_seed(4)
    head = DistributionalHead(4, action_dim=2, n_atom=3, v_min=-1.0, v_max=1.0, dueling=True)
    out, next_out = head(torch.randn(2, 4)), head(torch.randn(2, 4))
    act, next_act = torch.tensor([0, 1]), torch.tensor([1, 0])
    reward = torch.tensor([[0.5, -1.0]])  # (nstep=1, B=2)
    done = torch.ones(2)  # terminated: the target is the reward alone
    data = dist_nstep_td_data(out["distribution"], next_out["distribution"], act, next_act, reward, done, None)
    loss, cross_entropy = dist_nstep_td_error(data, 0.99, -1.0, 1.0, 3)
    log_p = out["log_distribution"].detach()
    # r = 0.5 sits halfway between atoms 0 and 1; r = -1 is atom -1
    expected = torch.stack([-(0.5 * log_p[0, 0, 1] + 0.5 * log_p[0, 0, 2]), -log_p[1, 1, 0]])
    torch.testing.assert_close(cross_entropy, expected)
    loss.backward()
    assert head.value_head.weight.grad.abs().sum() > 0 and head.advantage_head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_atom=1), "n_atom must be an int >= 2"),
        (dict(n_atom=5.0), "n_atom must be an int >= 2"),
        (dict(v_min=1.0, v_max=1.0), "finite v_min < v_max"),
        (dict(v_max=float("inf")), "finite v_min < v_max"),
        (dict(action_dim=0), "action_dim must be a positive int"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = dict(in_dim=4, action_dim=2, **kwargs) if "action_dim" not in kwargs else dict(in_dim=4, **kwargs)
    with pytest.raises(ValueError, match=match):
        DistributionalHead(**args)
