"""Output heads shared by the discrete-action value networks."""

from __future__ import annotations

import math
from typing import Callable, Dict

import torch
import torch.nn as nn

from .noisy import NoisyLinear

# The C51 support of Bellemare et al. (2017) and Rainbow on Atari: 51 atoms on [-10, 10].
C51_V_MIN, C51_V_MAX, C51_N_ATOM = -10.0, 10.0, 51


def _linear_layer(noisy: bool) -> Callable[[int, int], nn.Module]:
    """The layer class of a head: :class:`NoisyLinear` (with its default ``sigma_init``) or ``nn.Linear``."""
    return NoisyLinear if noisy else nn.Linear


class DiscreteHead(nn.Module):
    """Q-values for every action from a feature vector, optionally with the dueling split.

    Args:
        in_dim: Feature width.
        action_dim: Number of actions.
        dueling: Use separate value and advantage layers combined as ``Q = V + A - mean_a(A)``
            (Wang et al. 2016); the mean subtraction makes V and A identifiable.
        noisy: Build the layers as :class:`NoisyLinear` (NoisyNet exploration; noise only in training mode).

    Shapes:
        ``forward``: ``(B, in_dim) -> (B, action_dim)``.
    """

    def __init__(self, in_dim: int, action_dim: int, dueling: bool = False, noisy: bool = False) -> None:
        super().__init__()
        if int(action_dim) < 1:
            raise ValueError(f"action_dim must be a positive int, got {action_dim!r}")
        self.dueling = bool(dueling)
        linear = _linear_layer(noisy)
        if self.dueling:
            self.value_head = linear(in_dim, 1)
            self.advantage_head = linear(in_dim, int(action_dim))
        else:
            self.q_head = linear(in_dim, int(action_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.dueling:
            return self.q_head(x)
        value = self.value_head(x)
        advantage = self.advantage_head(x)
        return value + advantage - advantage.mean(dim=-1, keepdim=True)


class DistributionalHead(nn.Module):
    """C51 return distributions for every action (Bellemare et al. 2017), optionally dueling and noisy (Rainbow).

    Each action's return is a categorical distribution over the fixed support ``z_j = v_min + j * delta``,
    ``delta = (v_max - v_min) / (n_atom - 1)`` (the support of ``nervex.rl_utils.categorical_projection``). The
    layers give atom logits ``(..., action_dim, n_atom)``; with ``dueling``, as in Rainbow, a value stream
    ``(..., 1, n_atom)`` and an advantage stream ``(..., action_dim, n_atom)`` combine per atom as
    ``V + A - mean_a(A)`` before the softmax over atoms.

    ``forward`` returns three fields:

    - ``logit``: the expected return ``Q(s, a) = sum_j p_j(s, a) z_j``, so the greedy and epsilon-greedy plugins
      (which read ``logit``) act on Q as they do for :class:`DiscreteHead`.
    - ``distribution``: the probabilities, the ``dist`` / ``next_n_dist`` inputs of
      ``nervex.rl_utils.dist_nstep_td_error`` as they are.
    - ``log_distribution``: ``log_softmax`` of the atom logits, for a cross-entropy that needs no clamp: taking the
      log of the probabilities underflows to ``-inf`` where an atom's mass is tiny, and a clamp there has zero
      gradient. The probabilities are ``exp`` of it, so both cost one softmax.

    Args:
        in_dim: Feature width.
        action_dim: Number of actions.
        n_atom: Number of atoms of the support (at least 2).
        v_min: Lowest atom.
        v_max: Highest atom; must exceed ``v_min``.
        dueling: Split into value and advantage streams (Wang et al. 2016), combined on the atom logits.
        noisy: Build the layers as :class:`NoisyLinear`.

    Attributes:
        support: The atoms ``z``, a non-persistent buffer ``(n_atom,)`` (it follows the head's device and dtype and
            is not in the state dict).

    Shapes:
        ``forward``: ``(..., in_dim)`` -> ``logit`` ``(..., action_dim)``; ``distribution`` and
        ``log_distribution`` ``(..., action_dim, n_atom)``.
    """

    def __init__(
        self,
        in_dim: int,
        action_dim: int,
        n_atom: int = C51_N_ATOM,
        v_min: float = C51_V_MIN,
        v_max: float = C51_V_MAX,
        dueling: bool = False,
        noisy: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(action_dim, bool) or int(action_dim) < 1:
            raise ValueError(f"action_dim must be a positive int, got {action_dim!r}")
        if isinstance(n_atom, bool) or not isinstance(n_atom, int) or n_atom < 2:
            raise ValueError(f"n_atom must be an int >= 2, got {n_atom!r}")
        if not (math.isfinite(v_min) and math.isfinite(v_max) and v_min < v_max):
            raise ValueError(f"the support needs finite v_min < v_max, got v_min={v_min!r}, v_max={v_max!r}")
        self.action_dim = int(action_dim)
        self.n_atom = n_atom
        self.v_min, self.v_max = float(v_min), float(v_max)
        self.dueling = bool(dueling)
        self.register_buffer("support", torch.linspace(self.v_min, self.v_max, n_atom), persistent=False)
        linear = _linear_layer(noisy)
        if self.dueling:
            self.value_head = linear(in_dim, n_atom)
            self.advantage_head = linear(in_dim, self.action_dim * n_atom)
        else:
            self.q_head = linear(in_dim, self.action_dim * n_atom)

    def atom_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The pre-softmax atom logits; with ``dueling``, ``V + A - mean_a(A)`` per atom.

        Shapes:
            ``(..., in_dim) -> (..., action_dim, n_atom)``.
        """
        shape = (*x.shape[:-1], self.action_dim, self.n_atom)
        if not self.dueling:
            return self.q_head(x).view(shape)
        value = self.value_head(x).unsqueeze(-2)
        advantage = self.advantage_head(x).view(shape)
        return value + advantage - advantage.mean(dim=-2, keepdim=True)

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        log_distribution = torch.log_softmax(self.atom_logits(x), dim=-1)
        distribution = log_distribution.exp()
        return {
            "logit": distribution @ self.support,
            "distribution": distribution,
            "log_distribution": log_distribution,
        }

    def extra_repr(self) -> str:
        return f"n_atom={self.n_atom}, v_min={self.v_min}, v_max={self.v_max}, dueling={self.dueling}"


def discrete_q_head(
    in_dim: int,
    action_dim: int,
    dueling: bool,
    noisy: bool,
    distributional: bool,
    n_atom: int,
    v_min: float,
    v_max: float,
    owner: str,
) -> nn.Module:
    """The head a discrete Q-network's switches select: :class:`DistributionalHead` or :class:`DiscreteHead`.

    Raises:
        ValueError: ``n_atom``/``v_min``/``v_max`` differ from the C51 defaults while ``distributional`` is off
            (they would be ignored), or the distributional head rejects them.
    """
    if distributional:
        return DistributionalHead(in_dim, action_dim, n_atom, v_min, v_max, dueling=dueling, noisy=noisy)
    if (n_atom, v_min, v_max) != (C51_N_ATOM, C51_V_MIN, C51_V_MAX):
        raise ValueError(
            f"{owner}: n_atom={n_atom}, v_min={v_min}, v_max={v_max} only apply to the distributional head; "
            "set distributional=True (policy.model.distributional: true) or leave them at their defaults"
        )
    return DiscreteHead(in_dim, action_dim, dueling=dueling, noisy=noisy)
