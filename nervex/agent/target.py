"""Keeping a target network in step with the main one: hard copies every N calls, or Polyak averaging."""

from __future__ import annotations

import difflib
import math
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from nervex.torch_utils.module_watch import ModuleWatch

UPDATE_KWARGS = {"assign": ("freq",), "momentum": ("theta",)}


def _check_update_kwargs(update_type: str, update_kwargs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    if update_type not in UPDATE_KWARGS:
        close = difflib.get_close_matches(str(update_type), list(UPDATE_KWARGS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"unknown target update_type '{update_type}'; valid: {', '.join(UPDATE_KWARGS)}{hint}")
    (key,) = UPDATE_KWARGS[update_type]
    example = "{'freq': 100}" if update_type == "assign" else "{'theta': 0.005}"
    kwargs = dict(update_kwargs or {})
    unknown = [k for k in kwargs if k != key]
    if unknown or key not in kwargs:
        raise ValueError(
            f"target update_type '{update_type}' takes update_kwargs={example}, got {update_kwargs!r}"
            + (f"; unknown key(s) {unknown}" if unknown else "")
        )
    value = kwargs[key]
    if update_type == "assign" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"target update_kwargs['freq'] must be an int >= 1 (copy every freq-th call), got {value!r}")
    if update_type == "momentum" and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1 or math.isnan(value)
    ):
        raise ValueError(f"target update_kwargs['theta'] must be a number in (0, 1], got {value!r}")
    return kwargs


class TargetUpdater:
    """Moves ``target`` towards ``main`` on each ``update()`` call.

    ``'assign'`` with ``{'freq': N}`` copies every parameter and buffer on the N-th, 2N-th, ... call and leaves the
    target untouched on the others. ``'momentum'`` with ``{'theta': t}`` sets ``target = (1 - t) * target + t * main``
    for every floating-point parameter and buffer on every call; integer buffers (e.g. BatchNorm's batch counter)
    are copied, since they cannot be averaged.

    Args:
        main: The model being trained.
        target: Its copy, same architecture.
        update_type: ``'assign'`` or ``'momentum'``.
        update_kwargs: ``{'freq': N}`` or ``{'theta': t}``.

    Raises:
        ValueError: unknown ``update_type`` or missing / unknown / out-of-range ``update_kwargs``.
    """

    def __init__(
        self, main: nn.Module, target: nn.Module, update_type: str, update_kwargs: Optional[Dict[str, Any]]
    ) -> None:
        self.update_kwargs = _check_update_kwargs(update_type, update_kwargs)
        self.update_type = update_type
        self.main = main
        self.target = target
        self.update_count = 0
        self._pairs: Optional[Tuple[List[torch.Tensor], List[torch.Tensor], List[Tuple[torch.Tensor, torch.Tensor]]]]
        self._pairs = None
        self._pairs_watch = ModuleWatch([target, main])

    def update(self, source_state: Optional[Dict[str, Any]] = None) -> bool:
        """Apply one update step.

        Args:
            source_state: Weights to move towards instead of ``main``'s current ones (a ``main.state_dict()``).

        Returns:
            Whether the target's weights were changed by this call.
        """
        self.update_count += 1
        if self.update_type == "assign":
            if self.update_count % self.update_kwargs["freq"] != 0:
                return False
            self.target.load_state_dict(self.main.state_dict() if source_state is None else source_state)
            return True
        self._momentum_step(float(self.update_kwargs["theta"]), source_state)
        return True

    @torch.no_grad()
    def _momentum_step(self, theta: float, source_state: Optional[Dict[str, Any]]) -> None:
        if source_state is not None:
            target_state = self.target.state_dict()
            for key, target_value in target_state.items():
                if target_value.is_floating_point():
                    target_value.lerp_(source_state[key].to(target_value.device), theta)
                else:
                    target_value.copy_(source_state[key])
            return
        float_targets, float_mains, other_pairs = self._paired_values()
        if float_targets:
            # one fused kernel over every tensor instead of a Python loop of lerp_ calls
            torch._foreach_lerp_(float_targets, float_mains, theta)
        for target_value, main_value in other_pairs:
            target_value.copy_(main_value)

    def _paired_values(self) -> Tuple[List[torch.Tensor], List[torch.Tensor], List[Tuple[torch.Tensor, torch.Tensor]]]:
        """``(float targets, their mains, other (target, main) pairs)``, collected once and reused while the models
        keep the same tensors: walking two module trees on every Polyak step costs more than the averaging itself
        for small nets. ``load_state_dict`` and ``.to()`` keep the tensor objects; replacing a parameter, buffer or
        submodule of either model makes the next update walk the trees again (``ModuleWatch``)."""
        if self._pairs_watch.replaced() or self._pairs is None:
            # parameters() / buffers() skip duplicates, so a tied weight is averaged once, not twice
            target_values = [*self.target.parameters(), *self.target.buffers()]
            main_values = [*self.main.parameters(), *self.main.buffers()]
            if len(target_values) != len(main_values):
                raise RuntimeError(
                    "target and main models have different parameters/buffers; was the main model changed?"
                )
            floats = [(t, m) for t, m in zip(target_values, main_values) if t.is_floating_point()]
            others = [(t, m) for t, m in zip(target_values, main_values) if not t.is_floating_point()]
            self._pairs = ([t for t, _ in floats], [m for _, m in floats], others)
        return self._pairs
