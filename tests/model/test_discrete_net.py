import pytest
import torch
import torch.nn as nn

from nervex.model import ConvDiscreteNet, DiscreteHead, DistributionalHead, FCDiscreteNet, NoisyLinear, create_model
from nervex.utils import MODEL_REGISTRY


@pytest.mark.parametrize(
    "obs_dim, x_shape, logit_shape, dueling",
    [
        (4, (5, 4), (5, 3), False),
        (4, (5, 4), (5, 3), True),
        ((2, 3), (5, 2, 3), (5, 3), False),  # an observation shape is flattened
        ([6], (7, 5, 6), (7, 5, 3), True),  # extra leading dims (time, batch) are kept
    ],
)
def test_fc_discrete_net_shapes(obs_dim, x_shape, logit_shape, dueling):
    model = FCDiscreteNet(obs_dim, action_dim=3, hidden_sizes=[16, 8], dueling=dueling)
    out = model(torch.randn(x_shape))
    assert set(out) == {"logit"}
    assert out["logit"].shape == logit_shape


def test_fc_discrete_net_casts_integer_input_and_checks_shape():
    model = FCDiscreteNet(4, 2, hidden_sizes=())
    torch.testing.assert_close(model(torch.ones(1, 4, dtype=torch.int64))["logit"], model(torch.ones(1, 4))["logit"])
    with pytest.raises(ValueError, match=r"expects input of shape \(B, 4\), got \(2, 3\)"):
        model(torch.zeros(2, 3))


def test_dueling_head_by_hand():
    model = FCDiscreteNet(2, action_dim=3, hidden_sizes=(), dueling=True)
    with torch.no_grad():
        for layer in (model.head.value_head, model.head.advantage_head):
            layer.weight.zero_()
        model.head.value_head.bias.fill_(2.0)
        model.head.advantage_head.bias.copy_(torch.tensor([1.0, 2.0, 3.0]))
    # Q = V + A - mean(A) = 2 + [1, 2, 3] - 2
    torch.testing.assert_close(model(torch.randn(4, 2))["logit"], torch.tensor([[1.0, 2.0, 3.0]] * 4))


def test_dueling_q_minus_v_has_zero_mean_over_actions():
    torch.manual_seed(0)
    model = FCDiscreteNet(4, action_dim=5, hidden_sizes=(16,), dueling=True)
    x = torch.randn(8, 4)
    q = model(x)["logit"]
    value = model.head.value_head(model.encoder(x))  # (8, 1)
    torch.testing.assert_close((q - value).mean(dim=-1), torch.zeros(8), atol=1e-6, rtol=0)
    assert not torch.allclose(q, value.expand_as(q))  # the advantages do move Q away from V


@pytest.mark.parametrize("dueling", [False, True])
def test_conv_discrete_net_on_uint8_frames(dueling):
    torch.manual_seed(0)
    model = ConvDiscreteNet((4, 84, 84), action_dim=6, dueling=dueling)
    linear = [m for m in model.encoder.modules() if isinstance(m, nn.Linear)]
    assert linear[0].in_features == 64 * 7 * 7  # 84 -> 20 -> 9 -> 7
    frames = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    out = model(frames)
    assert out["logit"].shape == (2, 6) and out["logit"].dtype == torch.float32
    torch.testing.assert_close(out["logit"], model(frames.float() / 255.0)["logit"])


def test_conv_discrete_net_rejects_bad_shapes():
    with pytest.raises(ValueError, match="at least 36"):
        ConvDiscreteNet((4, 32, 84), action_dim=2)
    with pytest.raises(ValueError, match=r"must be \(C, H, W\)"):
        ConvDiscreteNet((84, 84), action_dim=2)
    model = ConvDiscreteNet((1, 36, 36), action_dim=2)
    assert model(torch.zeros(3, 1, 36, 36))["logit"].shape == (3, 2)
    with pytest.raises(ValueError, match=r"expects input of shape \(B, 1, 36, 36\)"):
        model(torch.zeros(3, 36, 36))


def test_registry_and_create_model():
    assert MODEL_REGISTRY.get("fc_discrete_net") is FCDiscreteNet
    assert MODEL_REGISTRY.get("conv_discrete_net") is ConvDiscreteNet
    model = create_model("fc_discrete_net", obs_dim=3, action_dim=2, hidden_sizes=[4])
    assert isinstance(model, FCDiscreteNet) and model(torch.zeros(1, 3))["logit"].shape == (1, 2)
    with pytest.raises(KeyError, match="did you mean 'fc_discrete_net'"):
        create_model("fc_discrete", obs_dim=3, action_dim=2)


@pytest.mark.parametrize("dueling", [False, True])
def test_fc_discrete_net_rainbow_switches(dueling):
    torch.manual_seed(0)
    model = FCDiscreteNet(4, 3, hidden_sizes=[16], dueling=dueling, distributional=True, noisy=True, n_atom=11)
    assert isinstance(model.head, DistributionalHead) and model.head.dueling == dueling
    assert all(isinstance(m, NoisyLinear) for m in model.head.children())
    x = torch.randn(7, 5, 4)  # leading (time, batch) dims are kept
    out = model(x)
    assert out["logit"].shape == (7, 5, 3) and out["distribution"].shape == (7, 5, 3, 11)
    torch.testing.assert_close(out["logit"], (out["distribution"] * model.head.support).sum(-1))
    assert not torch.allclose(out["logit"], model(x)["logit"])  # noisy in training mode
    model.eval()
    assert model(x)["logit"].equal(model(x)["logit"])


def test_fc_discrete_net_defaults_unchanged_and_atoms_need_distributional():
    model = FCDiscreteNet(4, 2, hidden_sizes=[8])
    assert type(model.head) is DiscreteHead and isinstance(model.head.q_head, nn.Linear)
    assert not any(isinstance(m, NoisyLinear) for m in model.modules())
    assert set(model(torch.zeros(1, 4))) == {"logit"}
    with pytest.raises(ValueError, match="only apply to the distributional head; set distributional=True"):
        FCDiscreteNet(4, 2, n_atom=21)
    noisy = FCDiscreteNet(4, 2, hidden_sizes=[8], noisy=True)  # NoisyNet-DQN: noisy head, Q-values only
    assert set(noisy(torch.zeros(1, 4))) == {"logit"} and isinstance(noisy.head.q_head, NoisyLinear)


def test_conv_discrete_net_distributional():
    torch.manual_seed(0)
    model = ConvDiscreteNet((1, 36, 36), 4, hidden_size=32, dueling=True, distributional=True, noisy=True, n_atom=5)
    out = model(torch.randint(0, 256, (3, 1, 36, 36), dtype=torch.uint8))
    assert out["logit"].shape == (3, 4) and out["distribution"].shape == (3, 4, 5)
    torch.testing.assert_close(out["distribution"].sum(-1), torch.ones(3, 4))


def test_create_model_with_rainbow_keys():
    model = create_model(
        "fc_discrete_net", obs_dim=4, action_dim=2, dueling=True, distributional=True, noisy=True,
        n_atom=21, v_min=-5.0, v_max=5.0,
    )  # fmt: skip
    assert (model.head.n_atom, model.head.v_min, model.head.v_max) == (21, -5.0, 5.0)
