import pytest
import torch
import torch.nn as nn

from nervex.model import ConvDiscreteNet, FCDiscreteNet, create_model
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
