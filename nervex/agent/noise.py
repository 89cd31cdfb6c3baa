"""Exploration noise for deterministic continuous actors (DDPG, TD3): Gaussian and Ornstein-Uhlenbeck.

Both plugins add noise to ``output['action']`` and clip the result into the action bounds. ``sigma`` is given in the
``[-1, 1]`` action space, as Stable-Baselines3's action noise (its policies act there): the noise added to dimension
``d`` is ``sigma * scale_d * n`` with ``scale = (high - low) / 2``, so one ``sigma`` fits every env. Noise is drawn
from torch's global RNG, so a seeded run repeats itself.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from .plugins import AgentPlugin, ForwardFn, register_plugin


def _bound(value: Any, name: str, plugin: str) -> torch.Tensor:
    if value is None:
        raise ValueError(f"{plugin}: {name} is required (the env's Box bound; a QAC model holds it as {name})")
    bound = torch.as_tensor(value)
    if not bound.is_floating_point():
        bound = bound.float()
    if bound.dim() > 1:
        raise ValueError(
            f"{plugin}: {name} must be a number or one value per action dimension, got {tuple(bound.shape)}"
        )
    return bound


def _check_nonneg(value: float, name: str, plugin: str, positive: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        raise ValueError(
            f"{plugin}: {name} must be a {'positive' if positive else 'non-negative'} number, got {value!r}"
        )
    return float(value)


class _ActionNoisePlugin(AgentPlugin):
    """Shared by the noise plugins: the bounds, and adding scaled noise then clipping."""

    def __init__(self, low: Any, high: Any) -> None:
        self.low = _bound(low, "low", self.name)
        self.high = _bound(high, "high", self.name)
        if self.low.shape != self.high.shape and self.low.dim() and self.high.dim():
            raise ValueError(f"{self.name}: low {tuple(self.low.shape)} and high {tuple(self.high.shape)} differ")
        if not bool((self.low < self.high).all()):
            raise ValueError(f"{self.name}: need low < high in every dimension, got {self.low} and {self.high}")
        self.scale = (self.high - self.low) / 2

    def _apply(self, output: Dict[str, Any], unit_noise: torch.Tensor) -> Dict[str, Any]:
        action = output["action"]
        low, high = self.low.to(action), self.high.to(action)
        noisy = action + self.scale.to(action) * unit_noise
        output["action"] = torch.maximum(torch.minimum(noisy, high), low)
        return output

    @staticmethod
    def _action(output: Any, plugin: str) -> torch.Tensor:
        if not isinstance(output, dict) or not isinstance(output.get("action"), torch.Tensor):
            got = sorted(output) if isinstance(output, dict) else type(output).__name__
            raise TypeError(f"{plugin} needs the model output to hold an 'action' tensor, got {got}")
        return output["action"]


class GaussianNoisePlugin(_ActionNoisePlugin):
    """Adds ``sigma * scale * N(0, 1)`` to ``output['action']`` and clips it into ``[low, high]``.

    Args:
        sigma: Standard deviation in the ``[-1, 1]`` action space (SB3's ``NormalActionNoise`` sigma); 0 adds none.
        low, high: Action bounds (numbers or per dimension; a QAC model's ``action_low`` / ``action_high``).

    Shapes:
        ``action`` ``(B, A)`` -> ``action`` ``(B, A)``.
    """

    name = "gaussian_noise"

    def __init__(self, sigma: float, low: Any, high: Any) -> None:
        self.sigma = _check_nonneg(sigma, "sigma", self.name)
        super().__init__(low, high)

    def __call__(self, forward: ForwardFn, data: Any, **kwargs: Any) -> Dict[str, Any]:
        output = forward(data)
        action = self._action(output, self.name)
        return self._apply(output, self.sigma * torch.randn_like(action))

    def __repr__(self) -> str:
        return f"GaussianNoisePlugin(sigma={self.sigma})"


class OUNoisePlugin(_ActionNoisePlugin):
    """Ornstein-Uhlenbeck noise, one process per env: ``x <- x + theta * (mu - x) * dt + sigma * sqrt(dt) * N(0, 1)``
    (SB3's ``OrnsteinUhlenbeckActionNoise``), then ``action + scale * x`` clipped into ``[low, high]``.

    ``forward(data, state_id=[...])`` advances the processes of the listed ids (row ``k`` of the batch is env
    ``state_id[k]``; ids ``0 .. B-1`` when None). A process starts at 0; ``reset(state_id)`` sets the listed ids'
    processes (all when None) back to 0, e.g. at an episode's end.

    Args:
        sigma: Volatility in the ``[-1, 1]`` action space.
        low, high: Action bounds.
        theta: Rate of reversion to ``mu``.
        dt: Time step.
        mu: The mean the process reverts to.

    Shapes:
        ``action`` ``(B, A)`` -> ``action`` ``(B, A)``; each state ``(A,)``.
    """

    name = "ou_noise"
    forward_kwargs = ("state_id",)

    def __init__(
        self, sigma: float, low: Any, high: Any, theta: float = 0.15, dt: float = 1e-2, mu: float = 0.0
    ) -> None:
        self.sigma = _check_nonneg(sigma, "sigma", self.name)
        self.theta = _check_nonneg(theta, "theta", self.name)
        self.dt = _check_nonneg(dt, "dt", self.name, positive=True)
        self.mu = float(mu)
        super().__init__(low, high)
        self._states: Dict[int, torch.Tensor] = {}

    @property
    def states(self) -> Dict[int, torch.Tensor]:
        """The current process value of every id that has one (a copy of the dict)."""
        return dict(self._states)

    def _ids(self, state_id: Optional[Iterable[int]], batch: int) -> List[int]:
        ids = list(range(batch)) if state_id is None else [int(i) for i in state_id]
        if len(ids) != batch:
            raise ValueError(f"{self.name}: got {len(ids)} state ids for a batch of {batch} actions")
        return ids

    def __call__(
        self, forward: ForwardFn, data: Any, state_id: Optional[Iterable[int]] = None, **kwargs: Any
    ) -> Dict[str, Any]:
        output = forward(data)
        action = self._action(output, self.name)
        ids = self._ids(state_id, action.shape[0])
        zeros = torch.zeros_like(action[0])
        x = torch.stack([self._states.get(i, zeros) for i in ids]).to(action)
        x = x + self.theta * (self.mu - x) * self.dt + self.sigma * math.sqrt(self.dt) * torch.randn_like(x)
        for k, i in enumerate(ids):
            self._states[i] = x[k]
        return self._apply(output, x)

    def reset(self, state_id: Optional[Iterable[int]] = None) -> None:
        if state_id is None:
            self._states.clear()
            return
        for i in state_id:
            self._states.pop(int(i), None)

    def __repr__(self) -> str:
        return f"OUNoisePlugin(sigma={self.sigma}, theta={self.theta}, dt={self.dt}, mu={self.mu})"


NOISE_PLUGINS: Tuple[type, ...] = (GaussianNoisePlugin, OUNoisePlugin)
for _cls in NOISE_PLUGINS:
    register_plugin(_cls.name, _cls)
