"""The fused layers' CPU products: oneDNN and torch's BLAS give the product torch computes, and the choice between
them follows ``NERVEX_CPU_MATMUL``."""

import pytest
import torch

from nervex.torch_utils import cpu_matmul
from nervex.torch_utils.cpu_matmul import bmatmul, matmul, onednn_for

needs_onednn = pytest.mark.skipif(cpu_matmul._LINEAR is None, reason="this torch build has no oneDNN linear op")


@pytest.fixture
def backend(monkeypatch):
    """``backend('onednn')`` sends every CPU float32 product to oneDNN (no size floor); ``backend('blas')`` none."""

    def choose(name):
        monkeypatch.setattr(cpu_matmul, "ONEDNN_MIN_MACS", 0)
        monkeypatch.setattr(cpu_matmul, "_DECISIONS", {torch.get_num_threads(): name == "onednn"})

    return choose


@pytest.fixture
def spy(monkeypatch):
    """Counts the calls that reach oneDNN's op (each still runs it)."""
    calls = []
    op = cpu_matmul._LINEAR

    def counted(*args):
        calls.append(args[0].shape)
        return op(*args)

    monkeypatch.setattr(cpu_matmul, "_LINEAR", counted)
    return calls


def operand(shape, transposed, seed):
    """A random float32 tensor of ``shape``, stored transposed (a strided view) when asked."""
    g = torch.Generator().manual_seed(seed)
    if not transposed:
        return torch.randn(*shape, generator=g)
    return torch.randn(*reversed(shape), generator=g).t()


def close_to_float64(got, a, b, bias=None):
    want = a.double() @ b.double()
    if bias is not None:
        want = want + bias.double()
    scale = want.abs().max().item()
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5 * scale)


SHAPES = [(256, 256, 256), (64, 256, 256), (256, 3, 256), (256, 256, 1), (7, 5, 9)]


@needs_onednn
@pytest.mark.parametrize("name", ["onednn", "blas"])
@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, False), (False, True)])
def test_matmul_equals_the_product_in_every_layout_with_bias_and_into_a_given_tensor(
    backend, spy, name, m, k, n, a_t, b_t
):
    backend(name)
    a, b = operand((m, k), a_t, 1), operand((k, n), b_t, 2)
    bias = torch.randn(n)
    close_to_float64(matmul(a, b), a, b)
    close_to_float64(matmul(a, b, bias), a, b, bias)
    out = torch.full((m, n), float("nan"))
    assert matmul(a, b, bias, out=out) is out
    close_to_float64(out, a, b, bias)
    assert len(spy) == (3 if name == "onednn" else 0)


@needs_onednn
@pytest.mark.parametrize("name", ["onednn", "blas"])
@pytest.mark.parametrize("shared", [False, True])
def test_bmatmul_equals_each_product_with_a_shared_input_and_transposed_operands(backend, spy, name, shared):
    backend(name)
    x = torch.randn(64, 32)
    a = x.expand(3, 64, 32) if shared else torch.randn(3, 64, 32)
    b = torch.randn(3, 48, 32).transpose(1, 2)  # (3, 32, 48), each matrix a transposed view
    bias = torch.randn(3, 1, 48)
    out = torch.full((3, 64, 48), float("nan"))
    for got in (bmatmul(a, b, bias), bmatmul(a, b, bias, out=out)):
        for i in range(3):
            close_to_float64(got[i], a[i], b[i], bias[i])
    close_to_float64(bmatmul(a, b)[2], a[2], b[2])
    assert len(spy) == (9 if name == "onednn" else 0)


@needs_onednn
def test_operands_changed_in_place_are_read_again(backend):
    """oneDNN reorders the weight on every call: a parameter stepped in place (an optimizer) is never stale."""
    backend("onednn")
    a, w, bias = torch.randn(256, 256), torch.randn(256, 256), torch.randn(256)
    first = matmul(a, w.t(), bias)
    w.mul_(2.0)
    bias.add_(1.0)
    torch.testing.assert_close(matmul(a, w.t(), bias), 2.0 * (first - bias + 1.0) + bias, rtol=1e-5, atol=1e-3)


@needs_onednn
def test_tensors_that_need_a_gradient_stay_with_torch(backend, spy):
    backend("onednn")
    a = torch.randn(256, 256, requires_grad=True)
    b = torch.randn(256, 256)
    assert not onednn_for(a, b)
    matmul(a, b).sum().backward()
    torch.testing.assert_close(a.grad, b.sum(1).expand(256, 256))
    assert spy == []
    with torch.no_grad():
        assert onednn_for(a, b)
    assert not onednn_for(a.double(), b.double()) and not onednn_for(a[:1], b[:, :1])


@needs_onednn
def test_the_size_floor_keeps_small_products_with_torch(monkeypatch, spy):
    monkeypatch.setattr(cpu_matmul, "_DECISIONS", {torch.get_num_threads(): True})
    rows = cpu_matmul.ONEDNN_MIN_MACS // (256 * 256)  # 128: a batch of 128 through a 256-wide layer
    assert onednn_for(torch.randn(rows, 256), torch.randn(256, 256))
    for a, b in [(torch.randn(rows - 1, 256), torch.randn(256, 256)), (torch.randn(256, 4), torch.randn(4, 256))]:
        assert not onednn_for(a, b)
        close_to_float64(matmul(a, b), a, b)
    assert spy == []


@pytest.mark.parametrize("value", ["fast", "mkl", "1"])
def test_an_unknown_setting_is_an_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("NERVEX_CPU_MATMUL", value)
    monkeypatch.setattr(cpu_matmul, "_DECISIONS", {})
    with pytest.raises(ValueError, match=rf"NERVEX_CPU_MATMUL='{value}': expected one of auto, onednn, blas"):
        cpu_matmul.backend()


def test_the_setting_decides_and_auto_measures_once_per_thread_count_without_touching_the_global_rng(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "_DECISIONS", {})
    monkeypatch.setenv("NERVEX_CPU_MATMUL", "blas")
    assert cpu_matmul.backend() == "blas"
    monkeypatch.setattr(cpu_matmul, "_DECISIONS", {})
    monkeypatch.setenv("NERVEX_CPU_MATMUL", "onednn")
    assert cpu_matmul.backend() == ("onednn" if cpu_matmul._LINEAR is not None else "blas")
    monkeypatch.setattr(cpu_matmul, "_DECISIONS", {})
    monkeypatch.setenv("NERVEX_CPU_MATMUL", " Auto ")
    torch.manual_seed(3)
    expected_draw = torch.rand(3)
    torch.manual_seed(3)
    first = cpu_matmul.backend()
    torch.testing.assert_close(torch.rand(3), expected_draw)  # the timing's operands came from its own generator
    assert first in ("onednn", "blas")
    assert list(cpu_matmul._DECISIONS) == [torch.get_num_threads()]
    monkeypatch.setenv("NERVEX_CPU_MATMUL", "not read again")  # cached: no second measurement, no error
    assert cpu_matmul.backend() == first
