"""NoisyLinear: noise in training mode only, the paper's initialisation, gradients, state dicts, noise statistics."""

import io
import math

import pytest
import torch
import torch.nn.functional as F

from nervex.model import NoisyLinear, factorized_noise


def test_training_forwards_differ_and_eval_is_the_mu_linear():
    torch.manual_seed(0)
    layer = NoisyLinear(6, 4)
    x = torch.randn(3, 6)
    first, second = layer(x), layer(x)
    assert not torch.allclose(first, second)
    layer.eval()
    expected = x @ layer.weight_mu.T + layer.bias_mu
    torch.testing.assert_close(layer(x), expected)
    assert layer(x).equal(layer(x))
    layer.train()
    assert not torch.allclose(layer(x), expected)


def test_training_forward_uses_the_noise_it_leaves_in_the_buffers():
    torch.manual_seed(1)
    layer = NoisyLinear(5, 3)
    x = torch.randn(2, 5)
    y = layer(x)
    eps_in, eps_out = layer.eps_in, layer.eps_out
    weight = layer.weight_mu + layer.weight_sigma * eps_out[:, None] * eps_in[None, :]
    bias = layer.bias_mu + layer.bias_sigma * eps_out
    torch.testing.assert_close(y, x @ weight.T + bias)
    # f(x) = sign(x) sqrt(|x|) of a normal draw is never exactly 0, so every weight got noise
    assert (eps_in != 0).all() and (eps_out != 0).all()


def test_reset_noise_draws_new_noise_and_is_reproducible_with_a_generator():
    layer = NoisyLinear(4, 3)
    layer.reset_noise(torch.Generator().manual_seed(7))
    eps_in, eps_out = layer.eps_in.clone(), layer.eps_out.clone()
    layer.reset_noise()
    assert not eps_in.equal(layer.eps_in)
    layer.reset_noise(torch.Generator().manual_seed(7))
    assert eps_in.equal(layer.eps_in) and eps_out.equal(layer.eps_out)


def test_gradients_reach_mu_and_sigma_by_hand():
    torch.manual_seed(2)
    layer = NoisyLinear(3, 2)
    x = torch.randn(4, 3)
    layer(x).sum().backward()
    eps_in, eps_out = layer.eps_in, layer.eps_out
    column_sum = x.sum(0)  # d(sum y)/dW[i, j] = sum_b x[b, j]
    torch.testing.assert_close(layer.weight_mu.grad, column_sum.expand(2, 3))
    torch.testing.assert_close(layer.weight_sigma.grad, column_sum * eps_out[:, None] * eps_in[None, :])
    torch.testing.assert_close(layer.bias_mu.grad, torch.full((2,), 4.0))
    torch.testing.assert_close(layer.bias_sigma.grad, 4.0 * eps_out)


def test_two_forwards_before_one_backward():
    """An online net run on obs and on next_obs before the loss: the first graph keeps its own noise."""
    torch.manual_seed(3)
    layer = NoisyLinear(3, 2)
    x = torch.randn(4, 3)
    y1 = layer(x)
    eps_out_first = layer.eps_out
    y2 = layer(x)
    (y1.sum() + y2.sum()).backward()  # raises if the noise of y1 was overwritten in place
    expected = 4.0 * (eps_out_first + layer.eps_out)
    torch.testing.assert_close(layer.bias_sigma.grad, expected)


def test_eval_forward_gives_sigma_no_gradient():
    layer = NoisyLinear(3, 2).eval()
    layer(torch.randn(4, 3)).sum().backward()
    assert layer.weight_sigma.grad is None and layer.bias_sigma.grad is None
    assert layer.weight_mu.grad is not None


def test_initialisation_ranges():
    torch.manual_seed(4)
    in_features = 64
    layer = NoisyLinear(in_features, 128, sigma_init=0.4)
    bound = 1.0 / math.sqrt(in_features)
    for mu in (layer.weight_mu, layer.bias_mu):
        assert mu.abs().max() <= bound
        # uniform over the whole range, not a narrower one: the extremes come near the bound
        assert mu.max() > 0.9 * bound and mu.min() < -0.9 * bound
    assert layer.weight_mu.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    for sigma in (layer.weight_sigma, layer.bias_sigma):
        torch.testing.assert_close(sigma, torch.full_like(sigma, 0.4 / 8.0))


def test_zero_sigma_layer_is_deterministic_in_training():
    torch.manual_seed(5)
    layer = NoisyLinear(4, 2, sigma_init=0.0)
    x = torch.randn(3, 4)
    assert layer(x).equal(layer(x))
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight_mu, layer.bias_mu))


def test_factorized_noise_statistics():
    generator = torch.Generator().manual_seed(0)
    noise = factorized_noise(200_000, generator=generator)
    # E f(x) = 0, Var f(x) = E|x| = sqrt(2/pi) = 0.798; the standard error of the variance is about 0.0014
    assert noise.mean().item() == pytest.approx(0.0, abs=0.01)
    assert noise.var().item() == pytest.approx(math.sqrt(2 / math.pi), abs=0.01)
    # the weight noise eps_out[i] * eps_in[j] of independent factors has variance (sqrt(2/pi))^2 = 2/pi
    layer = NoisyLinear(50, 40)
    products = []
    for _ in range(200):
        layer.reset_noise(generator)
        products.append(torch.outer(layer.eps_out, layer.eps_in))
    products = torch.stack(products)
    assert products.mean().item() == pytest.approx(0.0, abs=0.01)
    assert products.var().item() == pytest.approx(2 / math.pi, abs=0.02)


def test_state_dict_round_trip_holds_no_noise():
    torch.manual_seed(6)
    layer = NoisyLinear(5, 3)
    state = layer.state_dict()
    assert set(state) == {"weight_mu", "weight_sigma", "bias_mu", "bias_sigma"}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    other = NoisyLinear(5, 3)
    other.load_state_dict(torch.load(buffer, weights_only=True))
    for name, tensor in layer.state_dict().items():
        assert other.state_dict()[name].equal(tensor)
    x = torch.randn(2, 5)
    assert other.eval()(x).equal(layer.eval()(x))
    # the same noise gives the same training output: the learned tensors are all there is
    layer.train(), other.train()
    torch.manual_seed(9)
    y = layer(x)
    torch.manual_seed(9)
    assert other(x).equal(y)


def test_noise_follows_dtype_and_device():
    layer = NoisyLinear(4, 3).double()
    y = layer(torch.randn(2, 4, dtype=torch.float64))
    assert y.dtype == torch.float64 and layer.eps_in.dtype == torch.float64 and layer.eps_out.dtype == torch.float64
    built = NoisyLinear(4, 3, dtype=torch.float64)
    assert built.weight_mu.dtype == torch.float64 and built.eps_out.dtype == torch.float64


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_noise_on_cuda():
    layer = NoisyLinear(4, 3).cuda()
    x = torch.randn(2, 4, device="cuda")
    assert layer(x).device.type == "cuda" and layer.eps_in.device.type == "cuda"
    assert not torch.allclose(layer(x), layer(x))
    layer.reset_noise(torch.Generator(device="cuda").manual_seed(0))
    torch.testing.assert_close(layer.eval()(x), x @ layer.weight_mu.T + layer.bias_mu)


@pytest.mark.parametrize(
    "args, match",
    [
        ((0, 3), "in_features must be a positive int"),
        ((3, 2.0), "out_features must be a positive int"),
        ((3, 2, -0.1), "sigma_init must be >= 0"),
    ],
)
def test_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        NoisyLinear(*args)
