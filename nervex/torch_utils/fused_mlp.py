"""An MLP's forward and backward as one autograd node, for the small networks of RL on a CPU.

For a [64, 64] actor-critic on a batch of 256, PyTorch spends more time around its kernels than in them: every
``Linear`` and activation is an autograd node, and ``torch.tanh`` on the CPU takes ~45 us for a 256 x 64 tensor
where NumPy's vectorized ``tanh`` takes ~6 us. ``mlp_forward`` runs every layer in one ``autograd.Function``
(``addmm`` per layer, the activation in place, NumPy's ``tanh`` for CPU float tensors) and writes the backward by
hand: per layer one activation-derivative kernel and two matmuls. The results equal PyTorch's to float rounding
(``tanh`` differs by at most one ulp); ``tests/torch_utils/test_fused_mlp.py`` checks the gradients with
``gradcheck``. Double backward (``create_graph=True``) is not supported through it.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

FUSED_ACTIVATIONS = ("tanh", "relu")


def tanh_(x: torch.Tensor) -> torch.Tensor:
    """``x.tanh_()``, through NumPy's vectorized ``tanh`` for contiguous CPU float tensors that need no gradient."""
    if (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and x.is_contiguous()
        and not x.requires_grad
    ):
        array = x.numpy()
        np.tanh(array, out=array)
        return x
    return x.tanh_()


def _activate_(h: torch.Tensor, act: Optional[str]) -> torch.Tensor:
    if act == "tanh":
        return tanh_(h)
    if act == "relu":
        return h.relu_()
    return h


def _layers_forward(
    x: torch.Tensor, acts: Sequence[Optional[str]], weights: Sequence[torch.Tensor]
) -> List[torch.Tensor]:
    """Every layer's output, ``[x, h_1, ..., h_n]`` (2-D ``x``)."""
    outputs = [x]
    h = x
    for i, act in enumerate(acts):
        h = _activate_(torch.addmm(weights[2 * i + 1], h, weights[2 * i].t()), act)
        outputs.append(h)
    return outputs


def _layers_backward(
    g: torch.Tensor,
    acts: Sequence[Optional[str]],
    outputs: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
    needs: Sequence[bool],
    input_grad: bool,
) -> Tuple[Optional[torch.Tensor], List[Optional[torch.Tensor]]]:
    """Gradients of one MLP from the gradient of its output: ``(grad of x or None, [gW1, gb1, ...])``."""
    weight_grads: List[Optional[torch.Tensor]] = [None] * len(weights)
    for i in reversed(range(len(acts))):
        h = outputs[i + 1]
        if acts[i] == "tanh":
            g = torch.ops.aten.tanh_backward(g, h)  # g * (1 - h^2)
        elif acts[i] == "relu":
            g = torch.ops.aten.threshold_backward(g, h, 0)
        if needs[2 * i]:
            weight_grads[2 * i] = g.t().mm(outputs[i])
        if needs[2 * i + 1]:
            weight_grads[2 * i + 1] = g.sum(0)
        if i > 0 or input_grad:
            g = g.mm(weights[2 * i])
    return (g if input_grad else None), weight_grads


class _MLPFunction(torch.autograd.Function):
    """Several MLPs on one input (an actor's and a critic's trunks), as one autograd node."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, structure: Tuple[Tuple[Optional[str], ...], ...], *weights: torch.Tensor):
        saved: List[torch.Tensor] = []
        results = []
        offset = 0
        for acts in structure:
            outputs = _layers_forward(x, acts, weights[offset : offset + 2 * len(acts)])
            offset += 2 * len(acts)
            saved += outputs[1:]
            results.append(outputs[-1])
        ctx.structure = structure
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None: its MLP is skipped
        ctx.save_for_backward(x, *saved, *weights)
        return tuple(results) if len(results) > 1 else results[0]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        structure = ctx.structure
        saved = ctx.saved_tensors
        x = saved[0]
        n_out = sum(len(acts) for acts in structure)
        layer_outputs, weights = saved[1 : 1 + n_out], saved[1 + n_out :]
        input_grad = ctx.needs_input_grad[0]
        x_grad: Optional[torch.Tensor] = None
        all_weight_grads: List[Optional[torch.Tensor]] = []
        out_offset = w_offset = 0
        for acts, grad in zip(structure, grads):
            n = len(acts)
            outputs = [x, *layer_outputs[out_offset : out_offset + n]]
            ws = weights[w_offset : w_offset + 2 * n]
            needs = ctx.needs_input_grad[2 + w_offset : 2 + w_offset + 2 * n]
            if grad is None:  # this output was not used in the loss
                all_weight_grads += [None] * (2 * n)
            else:
                g, weight_grads = _layers_backward(grad.contiguous(), acts, outputs, ws, needs, input_grad)
                all_weight_grads += weight_grads
                if g is not None:
                    x_grad = g if x_grad is None else x_grad + g
            out_offset += n
            w_offset += 2 * n
        return (x_grad, None, *all_weight_grads)


def _flat(x: torch.Tensor) -> torch.Tensor:
    h = x.reshape(-1, x.shape[-1])
    return h if h.is_contiguous() else h.contiguous()


def mlps_forward(x: torch.Tensor, plans: Sequence[Sequence[Tuple[Any, Optional[str]]]]) -> Tuple[torch.Tensor, ...]:
    """Run several MLPs on the same input, as one autograd node when a gradient is needed.

    Args:
        x: The input; leading dimensions are kept.
        plans: One list per MLP of ``(linear, activation)`` pairs: an ``nn.Linear`` (its ``weight`` and ``bias``
            are read at call time) and ``'tanh'``, ``'relu'`` or None.

    Returns:
        Each MLP's output.

    Shapes:
        - x: :math:`(*, D_{in})`
        - outputs: :math:`(*, D_{out,k})`
    """
    lead = x.shape[:-1]
    h = _flat(x)
    weights: List[torch.Tensor] = []
    for plan in plans:
        for linear, _ in plan:
            weights += [linear.weight, linear.bias]
    structure = tuple(tuple(act for _, act in plan) for plan in plans)
    if torch.is_grad_enabled() and (h.requires_grad or any(w.requires_grad for w in weights)):
        outs = _MLPFunction.apply(h, structure, *weights)
        outs = outs if isinstance(outs, tuple) else (outs,)
    elif _numpy_inference_ok(h, weights):
        outs = _numpy_forward(h.detach().numpy(), structure, weights)
    else:
        outs, offset = [], 0
        for acts in structure:
            outs.append(_layers_forward(h, acts, weights[offset : offset + 2 * len(acts)])[-1])
            offset += 2 * len(acts)
    return tuple(out.reshape(*lead, out.shape[-1]) for out in outs)


# An inference forward whose every matmul is at most this many multiply-adds (rows x in x out) runs in NumPy: an
# actor's batch of a few observations costs PyTorch ~10 us of dispatch per op while the matmul itself takes ~1 us.
# 2^18 is also OpenBLAS's bound for single-threaded gemm (65536 x GEMM_MULTITHREAD_THRESHOLD 4), so NumPy's BLAS
# never starts threads that would compete with torch's; larger products go to torch's kernels.
NUMPY_INFERENCE_MAX_MACS = 1 << 18


def _numpy_inference_ok(h: torch.Tensor, weights: Sequence[torch.Tensor]) -> bool:
    rows = h.shape[0]
    return (
        h.device.type == "cpu"
        and h.dtype == torch.float32
        and all(w.device.type == "cpu" and w.dtype == torch.float32 for w in weights)
        and all(rows * w.shape[0] * w.shape[1] <= NUMPY_INFERENCE_MAX_MACS for w in weights[::2])
    )


def _numpy_forward(
    x: np.ndarray, structure: Tuple[Tuple[Optional[str], ...], ...], weights: Sequence[torch.Tensor]
) -> List[torch.Tensor]:
    """``_layers_forward``'s outputs for every MLP, computed in NumPy (no gradient; CPU float32 only)."""
    arrays = [w.detach().numpy() for w in weights]  # views of the parameters: no copy
    outs, offset = [], 0
    for acts in structure:
        h = x
        for i, act in enumerate(acts):
            h = h @ arrays[offset + 2 * i].T
            h += arrays[offset + 2 * i + 1]
            if act == "tanh":
                np.tanh(h, out=h)
            elif act == "relu":
                np.maximum(h, 0, out=h)
        offset += 2 * len(acts)
        outs.append(torch.from_numpy(h))
    return outs


def mlp_forward(x: torch.Tensor, layers: Sequence[Tuple[Any, Optional[str]]]) -> torch.Tensor:
    """``mlps_forward`` for one MLP: its output.

    Shapes:
        - x: :math:`(*, D_{in})`
        - output: :math:`(*, D_{out})`
    """
    return mlps_forward(x, [layers])[0]
