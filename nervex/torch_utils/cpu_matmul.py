"""Float32 matmuls on the CPU through oneDNN where it runs them faster than torch's BLAS (the fused layers' products).

torch runs a float32 ``mm``, ``addmm`` or ``bmm`` on the CPU through its BLAS, MKL in the x86-64 wheels. MKL 2024.2
takes its AVX2 code on AMD CPUs, so on an AMD EPYC with AVX-512 (Zen 5) a 256 x 256 x 256 product runs at ~195
GFLOPS on 2 threads, half of what the cores can do. oneDNN, in the same wheel (``torch.ops.mkldnn._linear_pointwise``,
the op torch.compile's CPU backend emits for ``Linear``), picks its kernels from the CPU's features and runs that
product in ~86 us instead of ~170 us, in float32 (no reduced precision; results differ from MKL's by rounding
only). A call costs ~12 us more than torch's, and in a learner step, where the operands arrive from other ops
rather than hot in cache, the gain is smaller than in a loop of one product: oneDNN takes only products of at least
``ONEDNN_MIN_MACS`` multiply-adds (128 x 256 x 256 and up); smaller ones stay with torch.

Which runs is decided once per process and intra-op thread count, by the ``NERVEX_CPU_MATMUL`` environment variable:
``auto`` (the default) times both on a 256 x 256 x 256 product and takes oneDNN where it is at least
``AUTO_MIN_SPEEDUP`` faster (where MKL runs its best code, as on Intel CPUs, the two should be close, and BLAS is
kept; not measured here); ``onednn`` takes it wherever the op exists; ``blas`` never takes it. oneDNN is never taken
where the build lacks it or where its product differs from torch's on a check made before the first use.

Only tensors outside autograd are passed to oneDNN (the op has no derivative): the fused layers call these from
their hand-written forward and backward, where no graph is recorded.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, Optional

import torch

ENV_VAR = "NERVEX_CPU_MATMUL"
BACKENDS = ("auto", "onednn", "blas")
# From here oneDNN pays inside a learner step, not only in a loop of one product: on 2 threads of an AMD EPYC
# (Zen 5) a DQN update with [256, 256] layers ran 0.94x as fast at batch 64 (64 x 256 x 256, 1.4x in isolation),
# 1.05x at batch 128 and 1.13x at batch 256; TD3's [256, 256] update at batch 256 1.29x (1.61x on 1 thread)
ONEDNN_MIN_MACS = 1 << 23
AUTO_MIN_SPEEDUP = 1.25

_DECISIONS: Dict[int, bool] = {}  # intra-op threads -> whether oneDNN runs the large products


def _linear_op() -> Optional[Callable[..., torch.Tensor]]:
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return None


_LINEAR = _linear_op()


def _setting() -> str:
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: expected one of {', '.join(BACKENDS)}")
    return value


def _onednn_product(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``a @ b (+ bias)`` through oneDNN: ``a`` (M, K), made contiguous if it is not (its rows are what the kernel
    reads); ``b`` (K, N) in any layout."""
    assert _LINEAR is not None
    return _LINEAR(a if a.is_contiguous() else a.contiguous(), b.t(), bias, "none", [], "")


def _best_of(fn: Callable[[], object], rounds: int, calls: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - start)
    return best


def _decide() -> bool:
    setting = _setting()
    if setting == "blas" or _LINEAR is None:
        return False
    # a product of known operands, from a private generator (the global RNG stream is the user's)
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(256, 256, generator=gen) - 0.5
    b = torch.rand(256, 256, generator=gen) - 0.5
    bias = torch.rand(256, generator=gen)
    with torch.no_grad():
        try:
            got = _onednn_product(a, b, bias)
        except Exception:  # the op exists but this build or CPU does not run it: BLAS, never a failed step
            return False
        want = torch.addmm(bias.double(), a.double(), b.double()).float()
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            return False
        if setting == "onednn":
            return True
        # interleaved rounds, the best of each: load from other processes falls on both alike
        blas_s = dnn_s = float("inf")
        for _ in range(3):
            blas_s = min(blas_s, _best_of(lambda: torch.mm(a, b), 2, 4))
            dnn_s = min(dnn_s, _best_of(lambda: _onednn_product(a, b), 2, 4))
    return blas_s >= AUTO_MIN_SPEEDUP * dnn_s


def backend() -> str:
    """``'onednn'`` or ``'blas'``: what runs this process's large float32 CPU products at the current intra-op
    thread count (decided on the first call for that count, see the module's docstring)."""
    return "onednn" if _onednn_enabled() else "blas"


def _onednn_enabled() -> bool:
    threads = torch.get_num_threads()
    decision = _DECISIONS.get(threads)
    if decision is None:
        decision = _DECISIONS[threads] = _decide()
    return decision


def onednn_for(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether :func:`matmul` runs ``a @ b`` (2-D, or the per-matrix product of 3-D ``a`` and ``b``) through oneDNN:
    CPU float32 tensors outside autograd, at least ``ONEDNN_MIN_MACS`` multiply-adds per matrix, and oneDNN chosen
    for this process."""
    return (
        a.dtype == torch.float32
        and b.dtype == torch.float32
        and a.device.type == "cpu"
        and b.device.type == "cpu"
        and a.shape[-2] * a.shape[-1] * b.shape[-1] >= ONEDNN_MIN_MACS
        and not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad))
        and _onednn_enabled()
    )


def matmul(
    a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``a @ b``, plus ``bias`` (broadcast over rows) when given, written into ``out`` when given.

    Shapes:
        - a: :math:`(M, K)`; b: :math:`(K, N)`; bias: :math:`(N,)`; out and result: :math:`(M, N)`
    """
    if onednn_for(a, b):
        result = _onednn_product(a, b, bias)
        return result if out is None else out.copy_(result)
    if bias is None:
        return torch.mm(a, b) if out is None else torch.mm(a, b, out=out)
    return torch.addmm(bias, a, b) if out is None else torch.addmm(bias, a, b, out=out)


def bmatmul(
    a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``a[i] @ b[i]`` for every ``i``, plus ``bias[i]`` when given, written into ``out`` when given.

    Shapes:
        - a: :math:`(N, M, K)`; b: :math:`(N, K, P)`; bias: :math:`(N, 1, P)`; out and result: :math:`(N, M, P)`
    """
    if onednn_for(a, b):
        if out is None:
            out = torch.empty(a.shape[0], a.shape[1], b.shape[2], dtype=a.dtype, device=a.device)
        for i in range(a.shape[0]):
            out[i].copy_(_onednn_product(a[i], b[i], None if bias is None else bias[i].reshape(-1)))
        return out
    if bias is None:
        return torch.bmm(a, b) if out is None else torch.bmm(a, b, out=out)
    return torch.baddbmm(bias, a, b) if out is None else torch.baddbmm(bias, a, b, out=out)
