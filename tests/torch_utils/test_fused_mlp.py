"""The fused MLP and the lean optimizer paths equal their PyTorch references."""

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn

from nervex.torch_utils import MLP, Adam, clip_grad_norm
from nervex.torch_utils.fused_mlp import (
    _MLPFunction,
    batched_layers_backward,
    batched_layers_forward,
    batched_mlps_forward,
    layers_backward,
    layers_forward,
    mlp_forward,
    tanh_,
)


def reference(mlp: MLP, x: torch.Tensor) -> torch.Tensor:
    return mlp.layers(x)  # the plain nn.Sequential the fused path replaces


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("out_dim", [None, 3])
def test_forward_and_gradients_equal_autograd(activation, out_dim):
    torch.manual_seed(0)
    mlp = MLP(5, [16, 8], out_dim=out_dim, activation=activation)
    assert mlp._fused is not None
    twin = copy.deepcopy(mlp)
    x = torch.randn(2, 7, 5, requires_grad=True)  # leading (T, B) dims
    x_ref = x.detach().clone().requires_grad_(True)
    out, ref = mlp(x), reference(twin, x_ref)
    assert out.shape == ref.shape == (2, 7, out_dim or 8)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    weight = torch.randn_like(out)
    (out * weight).sum().backward()
    (ref * weight).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-6)
    for p, q in zip(mlp.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("in_dim,out_dim", [(3, 1), (40, 5)])
def test_layers_backward_into_given_tensors_equals_new_ones_and_autograd(in_dim, out_dim):
    """``layers_backward`` writing into given gradient tensors gives what it returns without them and what autograd
    gives, on a narrow input (3 against 64: the transposed weight gradient) with a 1-D output (outer products)."""
    torch.manual_seed(3)
    mlp = MLP(in_dim, [64, 64], out_dim=out_dim, activation="relu")
    acts, params = mlp.fused_params()
    x = torch.randn(32, in_dim)
    g = torch.randn(32, out_dim)
    with torch.no_grad():
        outputs = layers_forward(x, acts, params)
        every = [True] * len(params)
        x_new, new = layers_backward(g, acts, outputs, params, every, True)
        slots = [torch.full_like(p, float("nan")) for p in params]
        x_into, into = layers_backward(g, acts, outputs, params, every, True, slots)
    x_ref = x.clone().requires_grad_(True)
    (reference(mlp, x_ref) * g).sum().backward()
    torch.testing.assert_close(x_into, x_ref.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x_new, x_into)
    for slot, got, fresh, p in zip(slots, into, new, params):
        assert got.data_ptr() == slot.data_ptr()
        torch.testing.assert_close(slot, fresh)
        torch.testing.assert_close(slot, p.grad, rtol=1e-5, atol=1e-6)


def test_batched_layers_backward_into_given_tensors_equals_new_ones():
    torch.manual_seed(4)
    weights = [torch.randn(2, 4, 16), torch.randn(2, 16, 1)]
    biases = [torch.randn(2, 1, 16), torch.randn(2, 1, 1)]
    h = torch.randn(2, 8, 4)
    outputs, out = batched_layers_forward(h, "relu", weights, biases)
    grad = torch.randn_like(out)
    every = [True, True]
    _, w_new, b_new = batched_layers_backward(grad, outputs, weights, "relu", every, every, False)
    w_slots, b_slots = [torch.empty_like(w) for w in weights], [torch.empty_like(b) for b in biases]
    batched_layers_backward(grad, outputs, weights, "relu", every, every, False, w_slots, b_slots)
    for slot, fresh in zip(w_slots + b_slots, w_new + b_new):
        torch.testing.assert_close(slot, fresh)


@pytest.mark.parametrize("act", ["tanh", "relu"])
def test_backwards_write_over_their_own_temporaries_only(act):
    """The activation backward runs in place on the loop's own matmul results: the caller's output gradient (with
    an activation on the output layer too) and the saved activations come back unchanged, and the result still
    equals autograd's."""
    torch.manual_seed(5)
    weights = [torch.randn(16, 3), torch.randn(16, 16), torch.randn(2, 16)]
    biases = [torch.randn(16), torch.randn(16), torch.randn(2)]
    params = [t for pair in zip(weights, biases) for t in pair]
    acts = (act, act, act)
    x, g = torch.randn(8, 3), torch.randn(8, 2)
    outputs = layers_forward(x, acts, params)
    kept_g, kept_outputs = g.clone(), [h.clone() for h in outputs]
    x_grad, _ = layers_backward(g, acts, outputs, params, [True] * 6, True)
    assert torch.equal(g, kept_g)
    assert all(torch.equal(h, k) for h, k in zip(outputs, kept_outputs))
    x_ref = x.clone().requires_grad_(True)
    h = x_ref
    for i in range(3):
        h = torch.nn.functional.linear(h, weights[i], biases[i])
        h = torch.tanh(h) if act == "tanh" else torch.relu(h)
    (h * g).sum().backward()
    torch.testing.assert_close(x_grad, x_ref.grad, rtol=1e-5, atol=1e-6)

    stacked = [torch.randn(2, 4, 16), torch.randn(2, 16, 16), torch.randn(2, 16, 1)]
    stacked_b = [torch.randn(2, 1, 16), torch.randn(2, 1, 16), torch.randn(2, 1, 1)]
    outputs, out = batched_layers_forward(torch.randn(2, 8, 4), act, stacked, stacked_b)
    grad = torch.randn_like(out)
    kept_grad, kept_outputs = grad.clone(), [h.clone() for h in outputs]
    every = [True] * 3
    batched_layers_backward(grad, outputs, stacked, act, every, every, True)
    assert torch.equal(grad, kept_grad)
    assert all(torch.equal(h, k) for h, k in zip(outputs, kept_outputs))


@pytest.mark.parametrize("act", ["tanh", "relu"])
def test_consumed_activations_give_the_same_gradients(act):
    """``consume=True`` writes input gradients over spent hidden activations of matching shape (the [64, 64] trunk's
    second layer) and returns what the non-consuming backward returns; a layer of another width gets a new tensor."""
    torch.manual_seed(6)
    mlp = MLP(5, [64, 64, 32], out_dim=2, activation=act)
    acts, params = mlp.fused_params()
    x, g = torch.randn(16, 5), torch.randn(16, 2)
    every = [True] * len(params)
    # where autograd would record the ops (grad mode on, parameters requiring grad) nothing is overwritten
    tracked = layers_forward(x, acts, params)
    before = [h.detach().clone() for h in tracked]
    x_tracked, _ = layers_backward(g, acts, tracked, params, every, True, consume=True)
    assert all(torch.equal(h, b) for h, b in zip(tracked, before))
    with torch.no_grad():
        outputs = layers_forward(x, acts, params)
        x_plain, plain = layers_backward(g, acts, outputs, params, every, True)
        x_eaten, eaten = layers_backward(g, acts, [h.clone() for h in outputs], params, every, True, consume=True)
        kept = layers_forward(x, acts, params)
        x_kept, _ = layers_backward(g, acts, kept, params, every, True, consume=True)
        assert not torch.equal(kept[2], layers_forward(x, acts, params)[2])  # h_2 (64 wide, fed to a 64 x 64 layer)
        assert torch.equal(kept[3], layers_forward(x, acts, params)[3])  # h_3 is 32 wide: no (B, 64) result fits it
        torch.testing.assert_close(x_eaten, x_plain)
        torch.testing.assert_close(x_kept, x_plain)
        torch.testing.assert_close(x_tracked, x_plain)
        for a, b in zip(eaten, plain):
            torch.testing.assert_close(a, b)

        weights = [torch.randn(2, 4, 16), torch.randn(2, 16, 16), torch.randn(2, 16, 1)]
        biases = [torch.randn(2, 1, 16), torch.randn(2, 1, 16), torch.randn(2, 1, 1)]
        h = torch.randn(2, 8, 4)
        outputs, out = batched_layers_forward(h, act, weights, biases)
        grad = torch.randn_like(out)
        every = [True] * 3
        x_plain, w_plain, b_plain = batched_layers_backward(grad, outputs, weights, act, every, every, True)
        kept = [o.clone() for o in outputs]
        x_eaten, w_eaten, b_eaten = batched_layers_backward(grad, kept, weights, act, every, every, True, consume=True)
        assert not torch.equal(kept[2], outputs[2]) and torch.equal(kept[0], outputs[0])
        torch.testing.assert_close(x_eaten, x_plain)
        for a, b in zip(w_eaten + b_eaten, w_plain + b_plain):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("acts", [("tanh", "tanh", None), ("relu", None)])
def test_gradcheck_in_float64(acts):
    torch.manual_seed(1)
    dims = [3, 4, 5, 2][: len(acts) + 1]
    weights = []
    for d_in, d_out in zip(dims[:-1], dims[1:]):
        weights += [torch.randn(d_out, d_in, dtype=torch.float64, requires_grad=True)]
        weights += [torch.randn(d_out, dtype=torch.float64, requires_grad=True)]
    x = torch.randn(6, dims[0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *w: _MLPFunction.apply(x, (acts,), *w), (x, *weights))


def test_two_mlps_on_one_input_gradcheck_and_an_unused_output():
    torch.manual_seed(2)

    def params(dims):
        out = []
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            out += [torch.randn(d_out, d_in, dtype=torch.float64, requires_grad=True)]
            out += [torch.randn(d_out, dtype=torch.float64, requires_grad=True)]
        return out

    structure = (("tanh", None), ("relu", "tanh", None))
    weights = params([3, 4, 2]) + params([3, 5, 4, 1])
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)

    def both(x, *w):
        a, b = _MLPFunction.apply(x, structure, *w)
        return a.sum(-1) * 0.5 + b.squeeze(-1)

    assert torch.autograd.gradcheck(both, (x, *weights))
    a, b = _MLPFunction.apply(x, structure, *weights)
    b.sum().backward()  # the first MLP's output is unused: its weights get no gradient
    assert weights[0].grad is None and weights[4].grad is not None and x.grad is not None


def test_no_grad_forward_equals_and_builds_no_graph():
    mlp = MLP(4, [32], activation="tanh")
    x = torch.randn(9, 4)
    with torch.no_grad():
        out = mlp(x)
    assert out.grad_fn is None
    torch.testing.assert_close(out, reference(mlp, x).detach(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_small_batch_inference_runs_in_numpy_and_equals_the_torch_path(activation):
    from nervex.torch_utils import fused_mlp

    mlp = MLP(4, [32, 16], activation=activation)
    layers = mlp._fused
    weights = [w for lin, _ in layers for w in (lin.weight, lin.bias)]
    rows_limit = fused_mlp.NUMPY_INFERENCE_MAX_MACS // (32 * 16)  # the widest product, 32 x 16, sets the limit
    small, large = torch.randn(8, 4), torch.randn(rows_limit + 1, 4)
    assert fused_mlp._numpy_inference_ok(torch.randn(rows_limit, 4), weights)
    assert not fused_mlp._numpy_inference_ok(large, weights)
    with torch.no_grad():
        assert fused_mlp._numpy_inference_ok(small, weights)
        out_small, out_large = mlp_forward(small, layers), mlp_forward(large, layers)
        # the torch path on the same rows (a batch over the NumPy limit takes it)
        both = mlp_forward(torch.cat([small, large]), layers)
    torch.testing.assert_close(out_small, both[:8], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_small, reference(mlp, small).detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_large, both[8:], rtol=1e-6, atol=1e-6)
    # views of the live parameters: an in-place optimizer step is seen by the next NumPy forward
    with torch.no_grad():
        layers[0][0].weight.add_(1.0)
        torch.testing.assert_close(mlp_forward(small, layers), reference(mlp, small).detach(), rtol=1e-5, atol=1e-5)
    assert not fused_mlp._numpy_inference_ok(small.double(), [layers[0][0].weight])


def test_numpy_tanh_matches_torch_within_an_ulp():
    x = torch.linspace(-20, 20, 100_001)
    np.testing.assert_allclose(tanh_(x.clone()).numpy(), torch.tanh(x).numpy(), rtol=0, atol=1.2e-7)
    strided = torch.randn(6, 4).t()  # not contiguous: torch's own tanh, in place
    expected = torch.tanh(strided)
    assert torch.equal(tanh_(strided), expected)


def test_layer_norm_and_other_activations_use_the_module_path():
    assert MLP(4, [8], activation="tanh", layer_norm=True)._fused is None
    assert MLP(4, [8], activation="sigmoid")._fused is None
    head = nn.Linear(8, 2)
    out = mlp_forward(torch.randn(3, 8), [(head, None)])
    assert out.shape == (3, 2)


def test_lean_adam_step_is_bitwise_torch_fused_adam_also_after_reload_and_lr_change():
    torch.manual_seed(0)
    ours_model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    ref_model = copy.deepcopy(ours_model)
    ours = Adam(ours_model.parameters(), lr=1e-3, weight_decay=0.01, amsgrad=True)
    ref = torch.optim.Adam(ref_model.parameters(), lr=1e-3, weight_decay=0.01, amsgrad=True, fused=True)
    x = torch.randn(32, 4)
    for i in range(12):
        for model, opt in ((ours_model, ours), (ref_model, ref)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
            if i == 5:
                opt.param_groups[0]["lr"] = 3e-4
        if i == 8:
            ours.load_state_dict(copy.deepcopy(ours.state_dict()))  # the cached lists must follow the new state
    assert ours._lean is not None
    for p, q in zip(ours_model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)
    assert all(float(st["step"]) == 12 for st in ours.state.values())


def test_clip_grad_norm_equals_torch():
    torch.manual_seed(0)
    for scale in (0.01, 100.0):  # nothing to clip, then clipped
        a = [torch.randn(5, 3, requires_grad=True), torch.randn(7, requires_grad=True)]
        b = [t.detach().clone().requires_grad_(True) for t in a]
        for t, u in zip(a, b):
            t.grad = torch.randn_like(t) * scale
            u.grad = t.grad.clone()
        norm = clip_grad_norm(a, 1.0)
        ref = torch.nn.utils.clip_grad_norm_(b, 1.0)
        torch.testing.assert_close(norm, ref)
        for t, u in zip(a, b):
            torch.testing.assert_close(t.grad, u.grad)


# ---- N MLPs of one shape (QAC's critics) --------------------------------------------------------------------------
def _stacked(num, sizes, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(num, a, b, generator=g, dtype=dtype, requires_grad=True) for a, b in zip(sizes, sizes[1:])]
    biases = [torch.randn(num, 1, b, generator=g, dtype=dtype, requires_grad=True) for b in sizes[1:]]
    return weights, biases


def _plain_batched(x, weights, biases, act):
    h = x.unsqueeze(0).expand(weights[0].shape[0], *x.shape) if x.dim() == 2 else x
    for k, (w, b) in enumerate(zip(weights, biases)):
        h = torch.baddbmm(b, h, w)
        if k < len(weights) - 1:
            h = torch.relu(h) if act == "relu" else torch.tanh(h) if act == "tanh" else h
    return h


@pytest.mark.parametrize("act", ["relu", "tanh", None])
@pytest.mark.parametrize("shared", [True, False], ids=["shared input", "one input per MLP"])
@pytest.mark.parametrize("out", [1, 3], ids=["width-1 output (mv path)", "width-3 output"])
def test_batched_mlps_equal_plain_ops_and_pass_gradcheck(act, shared, out):
    weights, biases = _stacked(2, [5, 7, 6, out])
    x = torch.randn(4, 5, dtype=torch.float64) if shared else torch.randn(2, 4, 5, dtype=torch.float64)
    x.requires_grad_(True)
    got = batched_mlps_forward(x, weights, biases, act)
    want = _plain_batched(x, weights, biases, act)
    torch.testing.assert_close(got, want)
    grad = torch.randn_like(got)
    inputs = [x, *weights, *biases]
    for g_got, g_want in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(want, inputs, grad)):
        torch.testing.assert_close(g_got, g_want)
    assert torch.autograd.gradcheck(lambda x, *p: batched_mlps_forward(x, p[:3], p[3:], act), (x, *weights, *biases))


def test_batched_mlps_without_param_grad_give_the_input_gradient_only():
    weights, biases = _stacked(2, [5, 8, 1])
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    out = batched_mlps_forward(x, weights, biases, "relu", param_grad=False)
    out.sum().backward()
    assert all(p.grad is None for p in [*weights, *biases])
    expected = torch.autograd.grad(_plain_batched(x, weights, biases, "relu").sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)
    # nothing needs a gradient: no graph at all
    assert not batched_mlps_forward(x.detach(), weights, biases, "relu", param_grad=False).requires_grad
    with torch.no_grad():
        torch.testing.assert_close(batched_mlps_forward(x, weights, biases, "relu"), out)
    with pytest.raises(ValueError, match="activation must be one of"):
        batched_mlps_forward(x, weights, biases, "gelu")
