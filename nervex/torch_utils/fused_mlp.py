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

from .cpu_matmul import bmatmul, matmul, onednn_for

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


def _activation_backward(g: torch.Tensor, h: torch.Tensor, act: Optional[str], inplace: bool = False) -> torch.Tensor:
    """The gradient before an activation from the one after it and the activation's output ``h``; ``inplace``
    writes it over ``g`` (a temporary of the backward's own: no new tensor, and its memory is already in cache)."""
    if act == "tanh":  # g * (1 - h^2)
        if inplace:
            return torch.ops.aten.tanh_backward.grad_input(g, h, grad_input=g)
        return torch.ops.aten.tanh_backward(g, h)
    if act == "relu":
        if inplace:
            return torch.ops.aten.threshold_backward.grad_input(g, h, 0, grad_input=g)
        return torch.ops.aten.threshold_backward(g, h, 0)
    return g


def layers_forward(
    x: torch.Tensor, acts: Sequence[Optional[str]], weights: Sequence[torch.Tensor]
) -> List[torch.Tensor]:
    """Every layer's output, ``[x, h_1, ..., h_n]`` (2-D ``x``)."""
    outputs = [x]
    h = x
    for i, act in enumerate(acts):
        h = _activate_(matmul(h, weights[2 * i].t(), weights[2 * i + 1]), act)
        outputs.append(h)
    return outputs


def layers_backward(
    g: torch.Tensor,
    acts: Sequence[Optional[str]],
    outputs: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
    needs: Sequence[bool],
    input_grad: bool,
    out: Optional[Sequence[Optional[torch.Tensor]]] = None,
    consume: bool = False,
) -> Tuple[Optional[torch.Tensor], List[Optional[torch.Tensor]]]:
    """Gradients of one MLP from the gradient of its output: ``(grad of x or None, [gW1, gb1, ...])``.

    ``out``: per tensor of ``weights`` (weights and biases), a contiguous tensor of its shape to write its gradient
    into (``None``: a new tensor), so a caller that keeps them (``.grad``) saves an allocation per tensor and step.

    ``consume``: the hidden activations ``outputs[1:-1]`` are not needed after this call, so each one, once its
    activation's backward has read it, takes the gradient of the layer's input where the shapes match (a
    ``[256, 256]`` trunk: one new ``(B, 256)`` tensor less, written into memory that is still in cache). The
    activations' values are lost; never set it on tensors an autograd graph saved.
    """
    weight_grads: List[Optional[torch.Tensor]] = [None] * len(weights)
    dst = out if out is not None else [None] * len(weights)
    last = len(acts) - 1
    untracked = _untracked(g, outputs, weights)
    consume = consume and untracked
    for i in reversed(range(len(acts))):
        # the output layer's gradient is the caller's tensor; every one below is this loop's own matmul result
        g = _activation_backward(g, outputs[i + 1], acts[i], inplace=untracked and i < last)
        if needs[2 * i]:
            h = outputs[i]
            # a narrow input (an observation) makes a short last dimension, which MKL runs ~2x slower: computed as
            # (in, out) and copied over. Not out=target.t(): torch runs a transposed out= as the slow product again
            if h.shape[1] * 16 <= g.shape[1]:
                target = dst[2 * i]
                product = h.t().mm(g).t()
                weight_grads[2 * i] = product.contiguous() if target is None else target.copy_(product)
            else:
                weight_grads[2 * i] = matmul(g.t(), h, out=dst[2 * i])
        if needs[2 * i + 1]:
            weight_grads[2 * i + 1] = g.sum(0) if dst[2 * i + 1] is None else torch.sum(g, 0, out=dst[2 * i + 1])
        if i > 0 or input_grad:
            weight = weights[2 * i]
            # one output (a 1-D action): the product is an outer product, ~4x faster broadcast than as a matmul
            if weight.shape[0] == 1:
                g = g * weight
            else:
                # (oneDNN returns a new tensor: writing it over the spent activation would only add a copy)
                spent = outputs[i + 1] if consume and i < last and not onednn_for(g, weight) else None
                fits = writable(spent, (g.shape[0], weight.shape[1]), g)
                g = matmul(g, weight, out=spent if fits else None)
    return (g if input_grad else None), weight_grads


def _untracked(g: torch.Tensor, outputs: Sequence[torch.Tensor], weights: Sequence[torch.Tensor]) -> bool:
    """Whether autograd records none of the backward's ops (in-place and ``out=`` writes need that): grad mode off,
    as in ``autograd.Function.backward`` and the hand-written steps, or no tensor requiring a gradient."""
    if not torch.is_grad_enabled():
        return True
    return not any(t.requires_grad for t in (g, *outputs, *weights))


def writable(t: Optional[torch.Tensor], shape: Sequence[int], like: torch.Tensor) -> bool:
    """Whether ``t`` can take a result of ``shape`` and ``like``'s dtype and device whole, through ``out=``: a dense,
    contiguous tensor of that shape, dtype and device (a spent activation, a ``.grad`` from the last step)."""
    return (
        t is not None
        and t.layout == torch.strided
        and tuple(t.shape) == tuple(shape)
        and t.dtype == like.dtype
        and t.device == like.device
        and t.is_contiguous()
    )


def _into(op: Any, dst: Optional[torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
    """``op(*args)``, written into ``dst`` when one is given."""
    return op(*args) if dst is None else op(*args, out=dst)


class _MLPFunction(torch.autograd.Function):
    """Several MLPs on one input (an actor's and a critic's trunks), as one autograd node."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, structure: Tuple[Tuple[Optional[str], ...], ...], *weights: torch.Tensor):
        saved: List[torch.Tensor] = []
        results = []
        offset = 0
        for acts in structure:
            outputs = layers_forward(x, acts, weights[offset : offset + 2 * len(acts)])
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
                g, weight_grads = layers_backward(grad.contiguous(), acts, outputs, ws, needs, input_grad)
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
    weights: List[torch.Tensor] = []
    for plan in plans:
        for linear, _ in plan:
            weights += [linear.weight, linear.bias]
    return mlps_forward_params(x, tuple(tuple(act for _, act in plan) for plan in plans), weights)


def mlps_forward_params(
    x: torch.Tensor, structure: Tuple[Tuple[Optional[str], ...], ...], weights: Sequence[torch.Tensor]
) -> Tuple[torch.Tensor, ...]:
    """``mlps_forward`` given each MLP's activations and the flat ``[weight, bias, ...]`` list (a caller that holds
    them saves rebuilding them per call)."""
    lead = x.shape[:-1]
    h = _flat(x)
    if torch.is_grad_enabled() and (h.requires_grad or any(w.requires_grad for w in weights)):
        outs = _MLPFunction.apply(h, structure, *weights)
        outs = outs if isinstance(outs, tuple) else (outs,)
    elif _numpy_inference_ok(h, weights):
        outs = _numpy_forward(h.detach().numpy(), structure, weights)
    else:
        outs, offset = [], 0
        for acts in structure:
            outs.append(layers_forward(h, acts, weights[offset : offset + 2 * len(acts)])[-1])
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
    """``layers_forward``'s outputs for every MLP, computed in NumPy (no gradient; CPU float32 only)."""
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


# ---- N MLPs of the same shape, evaluated together (QAC's critics) -------------------------------------------------
def batched_layers_forward(
    h: torch.Tensor, act: Optional[str], weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor]
) -> Tuple[List[torch.Tensor], torch.Tensor]:
    """``([input, h_1, ..., h_{n-1}], output)`` of N MLPs over ``(N, B, in)``; a width-1 output layer is computed as
    ``w^T h^T`` (``(N, 1, B)``: a batched matmul with one output column runs ~4x slower on the CPU)."""
    outputs = [h]
    for weight, bias in zip(weights[:-1], biases[:-1]):
        h = _activate_(bmatmul(h, weight, bias), act)
        outputs.append(h)
    weight, bias = weights[-1], biases[-1]
    if weight.shape[-1] != 1:
        return outputs, bmatmul(h, weight, bias)
    return outputs, torch.baddbmm(bias, weight.transpose(1, 2), h.transpose(1, 2)).transpose(1, 2)


def batched_layers_backward(
    grad: torch.Tensor,
    outputs: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
    act: Optional[str],
    needs_w: Sequence[bool],
    needs_b: Sequence[bool],
    input_grad: bool,
    weights_out: Optional[Sequence[Optional[torch.Tensor]]] = None,
    biases_out: Optional[Sequence[Optional[torch.Tensor]]] = None,
    consume: bool = False,
) -> Tuple[Optional[torch.Tensor], List[Optional[torch.Tensor]], List[Optional[torch.Tensor]]]:
    """Gradients of N MLPs (``batched_layers_forward``) from the gradient of their output, without autograd.

    Args:
        grad: The gradient of the MLPs' output.
        outputs: ``batched_layers_forward``'s saved activations ``[input, h_1, ..., h_{n-1}]``.
        weights: Per layer the stacked weights ``(N, in_k, out_k)``.
        act: The hidden activation (``'relu'``, ``'tanh'`` or None).
        needs_w, needs_b: Per layer, whether the weight's and the bias's gradient is wanted.
        input_grad: Whether the input's gradient is wanted.
        weights_out, biases_out: Per layer, a contiguous tensor of the weight's (bias's) shape to write its gradient
            into, or None for a new tensor (as ``layers_backward``'s ``out``).
        consume: The hidden activations ``outputs[1:]`` may be overwritten (as ``layers_backward``'s ``consume``).

    Returns:
        ``(input's gradient per MLP or None, [weight gradient or None per layer], [bias gradient or None per layer])``.

    Shapes:
        - grad: :math:`(N, B, D_{out})`
        - input's gradient: :math:`(N, B, D_{in})`
    """
    n = len(weights)
    weight_grads: List[Optional[torch.Tensor]] = [None] * n
    bias_grads: List[Optional[torch.Tensor]] = [None] * n
    w_dst = weights_out if weights_out is not None else [None] * n
    b_dst = biases_out if biases_out is not None else [None] * n
    g = grad.contiguous()
    untracked = _untracked(g, outputs, weights)
    consume = consume and untracked
    for k in reversed(range(n)):
        h_in, weight = outputs[k], weights[k]
        if k < n - 1:  # g is this loop's own matmul result here: overwritten in place
            g = _activation_backward(g, outputs[k + 1], act, inplace=untracked)
        if needs_b[k]:
            bias_grads[k] = g.sum(1, keepdim=True) if b_dst[k] is None else torch.sum(g, 1, keepdim=True, out=b_dst[k])
        width_one = weight.shape[-1] == 1
        if needs_w[k]:
            weight_grads[k] = _batched_weight_grad(g, h_in, width_one, w_dst[k])
        if k > 0 or input_grad:
            if width_one:
                g = g * weight.transpose(1, 2)
            else:
                spent = outputs[k + 1] if consume and k < n - 1 else None
                fits = writable(spent, (g.shape[0], g.shape[1], weight.shape[1]), g)
                g = bmatmul(g, weight.transpose(1, 2), out=spent if fits else None)
    return (g if input_grad else None), weight_grads, bias_grads


def _batched_weight_grad(
    g: torch.Tensor, h_in: torch.Tensor, width_one: bool, dst: Optional[torch.Tensor]
) -> torch.Tensor:
    """``h_in^T g`` per MLP, the ``(N, in, out)`` weight gradient, written into ``dst`` when given."""
    if width_one:  # as (N, 1, in): one output column is slow as the matmul's last dimension
        gw = _into(torch.bmm, None if dst is None else dst.transpose(1, 2), g.transpose(1, 2), h_in)
        return gw.transpose(1, 2)
    return bmatmul(h_in.transpose(1, 2), g, out=dst)


class _BatchedMLPFunction(torch.autograd.Function):
    """N MLPs of the same shape (stacked ``(N, in, out)`` weights) as one autograd node; gradients are computed only
    for the inputs that need them (the action's, without the critics' weights, for an actor's loss)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, act: Optional[str], n_layers: int, param_grad: bool, *params: torch.Tensor
    ) -> torch.Tensor:
        weights, biases = params[:n_layers], params[n_layers:]
        shared = x.dim() == 2
        h = x.unsqueeze(0).expand(weights[0].shape[0], *x.shape) if shared else x
        outputs, out = batched_layers_forward(h, act, weights, biases)
        ctx.act, ctx.n_layers, ctx.shared, ctx.param_grad = act, n_layers, shared, param_grad
        ctx.save_for_backward(*outputs, *weights)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        n = ctx.n_layers
        saved = ctx.saved_tensors
        outputs, weights = saved[:n], saved[n:]
        needs_w = [ctx.param_grad and need for need in ctx.needs_input_grad[4 : 4 + n]]
        needs_b = [ctx.param_grad and need for need in ctx.needs_input_grad[4 + n :]]
        x_grad, weight_grads, bias_grads = batched_layers_backward(
            grad, outputs, weights, ctx.act, needs_w, needs_b, ctx.needs_input_grad[0]
        )
        if x_grad is not None and ctx.shared:
            x_grad = x_grad.sum(0)
        return (x_grad, None, None, None, *weight_grads, *bias_grads)


def batched_mlps_forward(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor],
    activation: Optional[str],
    param_grad: bool = True,
) -> torch.Tensor:
    """N MLPs of the same layer sizes on one input (or one input each), as one autograd node.

    Args:
        x: The input every MLP reads, or one per MLP.
        weights: Per layer the stacked weights ``(N, in_k, out_k)``.
        biases: Per layer the stacked biases ``(N, 1, out_k)``.
        activation: ``'relu'``, ``'tanh'`` or None, after every layer but the last.
        param_grad: False: no gradient reaches the weights (an actor's loss through the critics needs the action's
            gradient only, and skips the weights' matmuls).

    Returns:
        The MLPs' outputs.

    Shapes:
        - x: :math:`(B, D_{in})` or :math:`(N, B, D_{in})`
        - output: :math:`(N, B, D_{out})`
    """
    if activation not in (None, *FUSED_ACTIVATIONS):
        raise ValueError(f"batched_mlps_forward: activation must be one of {FUSED_ACTIVATIONS} or None")
    params = [*weights, *biases]
    if torch.is_grad_enabled() and (x.requires_grad or (param_grad and any(p.requires_grad for p in params))):
        # with param_grad False the weights' gradients are None: they get no gradient and no matmul is spent on it
        return _BatchedMLPFunction.apply(x, activation, len(weights), param_grad, *params)
    h = x.unsqueeze(0).expand(weights[0].shape[0], *x.shape) if x.dim() == 2 else x
    with torch.no_grad():  # nothing needs a gradient here
        return batched_layers_forward(h, activation, params[: len(weights)], params[len(weights) :])[1]
