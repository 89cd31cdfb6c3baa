"""Exploration schedules."""

from __future__ import annotations

import math
from typing import Callable

EPSILON_GREEDY_TYPES = ("exp", "linear")


def epsilon_greedy(start: float, end: float, decay: int, type: str = "exp") -> Callable[[int], float]:
    """Return the epsilon schedule ``eps(step)`` of epsilon-greedy exploration.

    - ``'exp'``: ``end + (start - end) * exp(-step / decay)``; ``decay`` is the time constant.
    - ``'linear'``: moves in a straight line from ``start`` at step 0 to ``end`` at ``step == decay``, then stays
      at ``end``.

    Args:
        start: Epsilon at step 0.
        end: Epsilon the schedule tends to (``'exp'``) or reaches (``'linear'``).
        decay: Time constant (``'exp'``) or number of steps to reach ``end`` (``'linear'``); must be positive.
        type: ``'exp'`` or ``'linear'``. (Named ``type`` to keep the public signature of DESIGN.md.)

    Returns:
        A function of the step (env steps or learner iterations, whichever the caller counts) returning a float.

    Shapes:
        - step: int scalar
        - output: float scalar

    Raises:
        ValueError: ``type`` is unknown or ``decay`` is not positive.

    Example:
        >>> eps_fn = epsilon_greedy(0.95, 0.05, 10000, 'linear')
        >>> eps_fn(5000)
        0.5
    """
    if type not in EPSILON_GREEDY_TYPES:
        raise ValueError(f"epsilon_greedy: unknown type {type!r}; valid types are {list(EPSILON_GREEDY_TYPES)}")
    if decay <= 0:
        raise ValueError(f"epsilon_greedy: decay must be positive, got {decay}")
    if type == "exp":

        def exp_eps(step: int) -> float:
            return end + (start - end) * math.exp(-step / decay)

        return exp_eps

    def linear_eps(step: int) -> float:
        # Interpolating (rather than max(end, ...)) also works for an increasing schedule (start < end).
        if step >= decay:
            return float(end)
        return start + (end - start) * step / decay

    return linear_eps
