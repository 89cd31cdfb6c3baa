"""Output heads shared by the discrete-action value networks."""

from __future__ import annotations

import torch
import torch.nn as nn


class DiscreteHead(nn.Module):
    """Q-values for every action from a feature vector, optionally with the dueling split.

    Args:
        in_dim: Feature width.
        action_dim: Number of actions.
        dueling: Use separate value and advantage layers combined as ``Q = V + A - mean_a(A)``
            (Wang et al. 2016); the mean subtraction makes V and A identifiable.

    Shapes:
        ``forward``: ``(B, in_dim) -> (B, action_dim)``.
    """

    def __init__(self, in_dim: int, action_dim: int, dueling: bool = False) -> None:
        super().__init__()
        if int(action_dim) < 1:
            raise ValueError(f"action_dim must be a positive int, got {action_dim!r}")
        self.dueling = bool(dueling)
        if self.dueling:
            self.value_head = nn.Linear(in_dim, 1)
            self.advantage_head = nn.Linear(in_dim, int(action_dim))
        else:
            self.q_head = nn.Linear(in_dim, int(action_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.dueling:
            return self.q_head(x)
        value = self.value_head(x)
        advantage = self.advantage_head(x)
        return value + advantage - advantage.mean(dim=-1, keepdim=True)
