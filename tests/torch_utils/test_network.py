import pytest
import torch
import torch.nn as nn

from nervex.torch_utils import MLP, conv2d_block, fc_block
from nervex.torch_utils.network import get_activation


@pytest.mark.parametrize(
    "hidden, out_dim, expected_out, linear_count",
    [((8, 16), 3, 3, 3), ((8,), None, 8, 1), ((), 5, 5, 1), ((), None, 4, 0)],
)
def test_mlp_shapes(hidden, out_dim, expected_out, linear_count):
    mlp = MLP(4, hidden, out_dim)
    assert mlp.out_dim == expected_out
    assert mlp(torch.zeros(2, 4)).shape == (2, expected_out)
    assert sum(isinstance(m, nn.Linear) for m in mlp.modules()) == linear_count


def test_mlp_ends_linear_when_out_dim_given():
    mlp = MLP(3, (4,), 2, activation="tanh", layer_norm=True)
    layers = list(mlp.modules())
    assert any(isinstance(m, nn.LayerNorm) for m in layers) and any(isinstance(m, nn.Tanh) for m in layers)
    assert isinstance(mlp.layers[-1], nn.Linear)
    with pytest.raises(TypeError, match=r"sequence of ints, e.g. \[64\]"):
        MLP(3, 64)


def test_fc_and_conv_blocks():
    block = fc_block(3, 5, activation=None, layer_norm=True)
    assert [type(m) for m in block] == [nn.Linear, nn.LayerNorm]
    conv = conv2d_block(4, 32, 8, stride=4)
    assert conv(torch.zeros(1, 4, 84, 84)).shape == (1, 32, 20, 20)  # (84 - 8) // 4 + 1
    assert (conv(torch.randn(1, 4, 84, 84)) >= 0).all()  # relu at the end


def test_unknown_activation_suggests_the_nearest():
    assert isinstance(get_activation("ReLU"), nn.ReLU)
    with pytest.raises(ValueError, match=r"unknown activation 'rleu'; valid: relu.*did you mean 'relu'\?"):
        MLP(2, (), activation="rleu")
