"""Replay priorities of whole sequences, for recurrent policies that store and sample sequences (R2D2)."""

from __future__ import annotations

from typing import Optional

import torch


def sequence_priority(td_error: torch.Tensor, eta: float = 0.9, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """R2D2's priority of each sequence: ``eta * max_t |td_t| + (1 - eta) * mean_t |td_t|`` (Kapturowski et al., 2019).

    The mean alone would let one large error drown in a long sequence; the max alone makes priorities spiky.

    Args:
        td_error: TD error of each step of each sequence (any sign; not differentiated through).
        eta: Weight of the maximum, in ``[0, 1]`` (R2D2: 0.9; 0 gives the mean, 1 the maximum).
        mask: Steps that count (False for burn-in steps and padding after an episode's end); None: every step.

    Returns:
        One priority per sequence, ``>= 0``; 0 for a sequence with no step counted.

    Raises:
        ValueError: ``eta`` outside ``[0, 1]``, or a mask of another shape than ``td_error``.

    Shapes:
        td_error, mask: ``(T, B)``; returns ``(B,)``.
    """
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"sequence_priority eta must be in [0, 1] (R2D2 uses 0.9), got {eta}")
    error = td_error.detach().abs()
    if mask is None:
        return eta * error.amax(dim=0) + (1.0 - eta) * error.mean(dim=0)
    if mask.shape != td_error.shape:
        raise ValueError(f"sequence_priority mask has shape {tuple(mask.shape)}, td_error {tuple(td_error.shape)}")
    error = error * mask  # masked steps count as 0: never above the maximum of |td|, and left out of the mean's sum
    count = mask.sum(dim=0).clamp(min=1)
    return eta * error.amax(dim=0) + (1.0 - eta) * error.sum(dim=0) / count
