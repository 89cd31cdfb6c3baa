"""torch's Adam with optional gradient clipping and skipping of steps whose gradients blew up."""

from __future__ import annotations

import difflib
import math
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

GRAD_CLIP_TYPES = ("clip_norm", "clip_value")
GRAD_IGNORE_TYPES = ("ignore_norm", "ignore_value")


def _check_choice(value: Optional[str], valid: Tuple[str, ...], arg: str) -> None:
    if value is None or value in valid:
        return
    close = difflib.get_close_matches(str(value), valid, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise ValueError(f"Adam: unknown {arg} '{value}'; valid: {', '.join(valid)} (or None to turn it off){hint}")


def _check_positive(value: float, arg: str, enabled_by: str) -> None:
    if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise ValueError(f"Adam: {arg} must be a positive finite number when {enabled_by} is set, got {value!r}")


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients of ``params`` together so their global L2 norm is at most ``max_norm``.

    The result of ``torch.nn.utils.clip_grad_norm_`` (coefficient ``max_norm / (norm + 1e-6)`` capped at 1) at about
    half its cost for the one-device, one-dtype parameter lists of RL models: on the CPU one norm of the concatenated
    gradients and a multiply only when something is clipped; on an accelerator three foreach kernels, no sync.

    Args:
        params: Parameters; those without a gradient are skipped.
        max_norm: The largest global norm left after clipping.

    Returns:
        The global norm before clipping (a 0-dim tensor).
    """
    params = [p for p in params if p.grad is not None]
    grads = [p.grad for p in params]
    if not grads:
        return torch.zeros(())
    if len({(g.device, g.dtype) for g in grads}) > 1:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    if grads[0].device.type == "cpu":
        # one norm over the concatenated gradients: on the CPU _foreach_norm is a loop of per-tensor norms
        total = torch.cat([g.reshape(-1) for g in grads]).norm()
        # on the CPU reading the norm costs nothing: skip the multiply when nothing is clipped, and multiply by a
        # Python float (a tensor scalar is copied once per gradient)
        coef = max_norm / (float(total) + 1e-6)
        if coef < 1.0:
            torch._foreach_mul_(grads, coef)
        return total
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp_(max=1.0))
    return total


def trained_tensors(*optimizers: torch.optim.Optimizer) -> List[torch.Tensor]:
    """Every tensor the optimizers train, in their order, each once."""
    tensors: Dict[int, torch.Tensor] = {}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for tensor in group["params"]:
                tensors.setdefault(id(tensor), tensor)
    return list(tensors.values())


def _fused_supported(params: List[Any]) -> bool:
    """True when every parameter is a floating-point tensor on the CPU or a CUDA device (what fused Adam takes)."""
    tensors: List[Any] = []
    for item in params:
        tensors.extend(item["params"] if isinstance(item, dict) else [item])
    return bool(tensors) and all(
        isinstance(t, torch.Tensor) and t.is_floating_point() and t.device.type in ("cpu", "cuda") for t in tensors
    )


def _torch_adam_step(optimizer: torch.optim.Adam) -> None:
    """``torch.optim.Adam.step`` without torch's hook wrapper, which it gains once any plain ``torch.optim.Adam`` is
    built (our ``step`` has already run the hooks)."""
    step = torch.optim.Adam.step
    if getattr(step, "hooked", False):
        step = step.__wrapped__
    step(optimizer)


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` that can clip gradients, or skip a step whose gradients are too large, before stepping.

    Args:
        params: Parameters or parameter groups, as for ``torch.optim.Adam``.
        lr, betas, eps, weight_decay, amsgrad: Passed to ``torch.optim.Adam``.
        grad_clip_type: ``'clip_norm'`` scales all gradients together so their global L2 norm is at most
            ``clip_value``; ``'clip_value'`` clamps every gradient element to ``[-clip_value, clip_value]``;
            ``None`` (default) leaves gradients alone.
        clip_value: The threshold of ``grad_clip_type``.
        grad_ignore_type: ``'ignore_norm'`` skips the step when the global L2 norm of the gradients exceeds
            ``ignore_value`` (or is not finite); ``'ignore_value'`` skips it when any element's absolute value does.
            Checked on the raw gradients, before clipping. ``None`` (default) never skips.
        ignore_value: The threshold of ``grad_ignore_type``.
        **kwargs: Other ``torch.optim.Adam`` options (``foreach``, ``maximize``, ``capturable``, ``fused``...).
            Without ``fused`` or ``foreach``, the fused implementation is used when every parameter can take it.

    Attributes:
        ignored_steps: How many ``step()`` calls were skipped by ``grad_ignore_type``.

    Example:
        >>> optimizer = Adam(model.parameters(), lr=1e-3, grad_clip_type='clip_norm', clip_value=10.0)
        >>> loss.backward(); optimizer.step()
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        grad_clip_type: Optional[str] = None,
        clip_value: float = 0.5,
        grad_ignore_type: Optional[str] = None,
        ignore_value: float = 1e3,
        **kwargs: Any,
    ) -> None:
        _check_choice(grad_clip_type, GRAD_CLIP_TYPES, "grad_clip_type")
        _check_choice(grad_ignore_type, GRAD_IGNORE_TYPES, "grad_ignore_type")
        if grad_clip_type is not None:
            _check_positive(clip_value, "clip_value", "grad_clip_type")
        if grad_ignore_type is not None:
            _check_positive(ignore_value, "ignore_value", "grad_ignore_type")
        params = list(params)
        self._lean = None
        self._all_params: List[torch.Tensor] = []  # set before torch's __init__, whose add_param_group refreshes it
        if "fused" not in kwargs and "foreach" not in kwargs and _fused_supported(params):
            # one fused kernel instead of a Python loop over parameters: ~30% off a small net's learner step
            kwargs["fused"] = True
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, **kwargs)
        self.grad_clip_type = grad_clip_type
        self.clip_value = float(clip_value)
        self.grad_ignore_type = grad_ignore_type
        self.ignore_value = float(ignore_value)
        self.ignored_steps = 0
        self._lean: Optional[List[Tuple[Dict[str, Any], List[List[torch.Tensor]]]]] = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients (to None by default) without torch's per-call profiler bookkeeping."""
        if not set_to_none:
            super().zero_grad(set_to_none=False)
            return
        for p in self._all_params:
            p.grad = None

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._lean = None  # the state tensors are replaced: the cached lists would point at the old ones
        super().load_state_dict(state_dict)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        self._lean = None
        super().add_param_group(param_group)
        self._all_params = [p for group in self.param_groups for p in group["params"]]

    def _lean_lists(self) -> Optional[List[Tuple[Dict[str, Any], List[List[torch.Tensor]]]]]:
        """Per group: ``(group, [params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps])`` for the fused kernel, or
        None when the lean step does not apply (see ``step``)."""
        if self._lean is not None:
            return self._lean
        lean = []
        for group in self.param_groups:
            if not group.get("fused") or group.get("capturable") or group.get("differentiable"):
                return None
            if group.get("decoupled_weight_decay"):
                return None
            params = group["params"]
            states = [self.state.get(p) for p in params]
            if not params or any(not st for st in states) or len({(p.device, p.dtype) for p in params}) != 1:
                return None
            if any(p.is_complex() for p in params):
                return None
            steps = [st["step"] for st in states]
            if len({float(step) for step in steps}) == 1:
                # every parameter of the group has taken every step: one counter serves them all, so the step
                # costs one add instead of one (scalar-copying) add per parameter
                shared = steps[0]
                for st in states:
                    st["step"] = shared
                steps = [shared] * len(states)
            lists = [
                list(params),
                [st["exp_avg"] for st in states],
                [st["exp_avg_sq"] for st in states],
                [st["max_exp_avg_sq"] for st in states] if group["amsgrad"] else [],
                steps,
            ]
            lean.append((group, lists))
        self._lean = lean
        return lean

    def _lean_step(self) -> bool:
        """The fused Adam kernel called straight on cached tensor lists (what ``torch.optim.Adam`` ends up doing,
        without re-collecting the state every step: ~130 us of a small net's ~150 us step). False when it does not
        apply: a parameter without a gradient, state not created yet, several devices or dtypes in a group."""
        lean = self._lean_lists()
        if lean is None:
            return False
        grads_per_group = []
        for _, (params, *_rest) in lean:
            grads = [p.grad for p in params]
            if any(g is None or g.is_sparse for g in grads):
                return False
            grads_per_group.append(grads)
        for (group, (params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps)), grads in zip(lean, grads_per_group):
            beta1, beta2 = group["betas"]
            if all(step is steps[0] for step in steps):
                steps[0].add_(1)
            else:
                torch._foreach_add_(steps, 1)
            torch._fused_adam_(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                max_exp_avg_sqs,
                steps,
                amsgrad=group["amsgrad"],
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=group["maximize"],
                grad_scale=None,
                found_inf=None,
            )
        return True

    def _params_with_grad(self) -> List[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"] if p.grad is not None]

    def _should_ignore(self, grads: List[torch.Tensor]) -> bool:
        if self.grad_ignore_type is None or not grads:
            return False
        if self.grad_ignore_type == "ignore_norm":
            size = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        else:
            size = torch.stack([g.detach().abs().max() for g in grads]).max()
        # one host sync per step, only when ignoring is switched on; NaN/inf never passes
        size = float(size)
        return not math.isfinite(size) or size > self.ignore_value

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[Union[float, torch.Tensor]]:
        """Evaluate ``closure`` (if given), skip or clip as configured, then take the Adam step.

        torch wraps an optimizer's ``step`` in a profiler range and runs the registered step hooks; this does the
        same, but skips the range and the hook loop when no hook is registered and no profiler is on (~60 us of a
        step that takes ~80 us on a small net's CPU learner).

        Args:
            closure: Re-evaluates the model and returns the loss, as for ``torch.optim.Adam.step``.

        Returns:
            The closure's loss, or None.
        """
        if (
            closure is not None
            or torch.autograd._profiler_enabled()
            or self._optimizer_step_pre_hooks
            or self._optimizer_step_post_hooks
            or _global_optimizer_pre_hooks
            or _global_optimizer_post_hooks
        ):
            return self._hooked_step(closure)
        return self._step(None)

    step.hooked = True  # type: ignore[attr-defined]  (torch's __init__ would wrap it again otherwise)

    @torch.no_grad()
    def _step(self, closure: Optional[Callable[[], float]] = None) -> Optional[Union[float, torch.Tensor]]:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.grad_ignore_type is not None or self.grad_clip_type is not None:
            params = self._params_with_grad()
            if self._should_ignore([p.grad for p in params]):
                self.ignored_steps += 1
                return loss
            if self.grad_clip_type == "clip_norm" and params:
                clip_grad_norm(params, self.clip_value)
            elif self.grad_clip_type == "clip_value" and params:
                torch.nn.utils.clip_grad_value_(params, self.clip_value)
        if not self._lean_step():
            _torch_adam_step(self)
        return loss

    # the step as torch runs it: in a profiler range, with the registered pre- and post-step hooks
    _hooked_step = torch.optim.Optimizer.profile_hook_step(_step)
