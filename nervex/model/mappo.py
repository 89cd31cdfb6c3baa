"""MAPPO's model (Yu et al. 2022): a shared actor over the agents and a centralized value on the global state.

The actor is ``AgentNet`` (one network for every agent, the agent-id one-hot in its input; MLP or GRU): per-agent
logits under the action mask (discrete) or a Gaussian mean with a state-independent log std (continuous). The critic
sees the global state, not the agent's observation: by default ``V(s, i)`` with agent ``i``'s one-hot appended (one
value per agent, the paper's agent-specific input without the local features), ``'state'`` gives the plain ``V(s)``
to every agent, ``'state_obs'`` appends the agent's own observation too (the paper's "agent-specific global state").
Sampling, log-probabilities and losses belong to the policy (``nervex.policy.mappo``).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from nervex.torch_utils import MLP
from nervex.torch_utils.network import init_orthogonal_
from nervex.utils import MODEL_REGISTRY

from .agent_net import AgentNet
from .value_ac import ACTION_SPACES, _check_mode

CRITIC_INPUTS: Tuple[str, ...] = ("state_id", "state", "state_obs")
MASKED_LOGIT = -1e8
"""The logit of an illegal action: probability exactly 0 in float32 after the softmax, yet finite (no ``nan`` in a
``0 * log 0`` entropy term), as the MAPPO code masks before its softmax."""


class MAPPO(nn.Module):
    """Shared actor + centralized critic for ``N`` cooperative agents.

    ``forward(data, mode)`` with ``data = {'obs': (B, N, obs_dim), 'global_state': (B, state_dim), 'action_mask':
    (B, N, A) (optional, 1 = legal), 'alive': (B, N) (optional), 'prev_state': {'h': (B, N, H)} (GRU actor; None or
    absent: zeros)}`` and ``mode`` one of ``compute_action`` (actor only), ``compute_value`` (critic only, needs no
    ``obs``) and ``compute_action_value``. A dead agent's mask row (``alive == 0``) may allow nothing: it is read as
    all-legal, since the env ignores that agent's action and the policy gives it no loss.

    Args:
        obs_dim: One agent's observation size.
        action_dim: One agent's actions (discrete) or action size (continuous).
        agent_num: Agents N.
        state_dim: The global state's size.
        action_space: ``'discrete'`` or ``'continuous'``.
        hidden_sizes: The actor's MLP widths (``AgentNet.hidden_sizes``).
        rnn: The actor's core: ``'none'`` (MLP) or ``'gru'``.
        hidden_size: The GRU's width.
        agent_id: Append the agent-id one-hot to the actor's input.
        critic_hidden_sizes: The critic's MLP widths.
        critic_input: ``'state_id'`` (``V(s, i)``), ``'state'`` (``V(s)``) or ``'state_obs'`` (``V(s, o_i, i)``).
        activation: Activation of both MLPs (``'relu'``, ``'tanh'``...).
        log_std_init: The initial log std of continuous actions.

    Shapes:
        - logit (discrete): :math:`(B, N, A)`, illegal actions at ``MASKED_LOGIT``; ``action_mask`` (bool) returned
          alongside when given
        - mu, sigma (continuous): :math:`(B, N, D)`
        - value: :math:`(B, N)`
        - next_state: ``{'h': (B, N, H)}`` for a GRU actor, else None

    Raises:
        ValueError: an unknown ``action_space``, ``critic_input`` or mode; inputs of the wrong shape.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        agent_num: int,
        state_dim: int,
        action_space: str = "discrete",
        hidden_sizes: Sequence[int] = (64, 64),
        rnn: str = "none",
        hidden_size: int = 64,
        agent_id: bool = True,
        critic_hidden_sizes: Sequence[int] = (64, 64),
        critic_input: str = "state_id",
        activation: str = "relu",
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        if action_space not in ACTION_SPACES:
            raise ValueError(f"MAPPO action_space must be one of {ACTION_SPACES}, got {action_space!r}")
        if critic_input not in CRITIC_INPUTS:
            raise ValueError(f"MAPPO critic_input must be one of {CRITIC_INPUTS}, got {critic_input!r}")
        if int(state_dim) < 1:
            raise ValueError(f"MAPPO needs a global state: state_dim must be >= 1, got {state_dim}")
        self.action_space, self.critic_input = action_space, critic_input
        self.agent_num, self.state_dim, self.obs_dim = int(agent_num), int(state_dim), int(obs_dim)
        self.actor = AgentNet(
            obs_dim, action_dim, agent_num, hidden_sizes, rnn, hidden_size, agent_id, activation=activation
        )
        extra = {"state_id": self.agent_num, "state": 0, "state_obs": self.agent_num + self.obs_dim}[critic_input]
        self.critic = MLP(self.state_dim + extra, [int(s) for s in critic_hidden_sizes], 1, activation=activation)
        # PPO's initialisation (Baselines, SB3, the MAPPO code): orthogonal, gain 0.01 on the action output
        init_orthogonal_(self.actor.encoders, math.sqrt(2))
        init_orthogonal_(self.actor.heads, 0.01)
        init_orthogonal_(self.critic, math.sqrt(2))
        init_orthogonal_(self.critic.layers[-1], 1.0)
        self.log_std = nn.Parameter(torch.full((int(action_dim),), float(log_std_init))) if self.continuous else None

    @property
    def continuous(self) -> bool:
        return self.action_space == "continuous"

    def actor_parameters(self) -> List[nn.Parameter]:
        """The actor's parameters (with the log std of continuous actions): the actor's optimizer's."""
        return list(self.actor.parameters()) + ([self.log_std] if self.log_std is not None else [])

    def critic_parameters(self) -> List[nn.Parameter]:
        """The centralized critic's parameters: the critic's optimizer's."""
        return list(self.critic.parameters())

    def initial_state(self, batch_size: Optional[int] = None) -> Optional[Dict[str, torch.Tensor]]:
        """The actor's zero state: ``{'h': (N, H)}`` (or ``(batch_size, N, H)``); None for an MLP actor."""
        return self.actor.initial_state(batch_size)

    def compute_value(self, data: Mapping[str, Any]) -> torch.Tensor:
        """The critic's value per agent, :math:`(B, N)`, from ``data['global_state']`` (and ``obs`` for
        ``critic_input='state_obs'``)."""
        state = torch.as_tensor(data["global_state"]).float()
        if state.dim() != 2 or state.shape[-1] != self.state_dim:
            raise ValueError(
                f"MAPPO expects global_state of shape (B, {self.state_dim}), got {tuple(state.shape)}; the env's "
                f"global state must match model.state_dim"
            )
        if self.critic_input == "state":
            return self.critic(state).expand(-1, self.agent_num)
        batch = state.shape[0]
        eye = torch.eye(self.agent_num, device=state.device, dtype=state.dtype).expand(batch, -1, -1)
        parts = [state.unsqueeze(1).expand(-1, self.agent_num, -1)]
        if self.critic_input == "state_obs":
            parts.append(torch.as_tensor(data["obs"]).float())
        return self.critic(torch.cat(parts + [eye], dim=-1)).squeeze(-1)

    def compute_action(self, data: Mapping[str, Any]) -> Dict[str, Any]:
        """The actor's output: ``logit`` (masked) and ``action_mask``, or ``mu`` and ``sigma``; ``next_state``."""
        out = self.actor({"obs": data["obs"], "prev_state": data.get("prev_state")})
        result: Dict[str, Any] = {"next_state": out["next_state"]}
        if self.continuous:
            mu = out["logit"]
            result.update(mu=mu, sigma=self.log_std.exp().expand_as(mu))
            return result
        logit = out["logit"]
        mask = legal_mask(data, tuple(logit.shape))
        if mask is not None:
            logit = logit.masked_fill(~mask, MASKED_LOGIT)
            result["action_mask"] = mask
        result["logit"] = logit
        return result

    def forward(self, data: Mapping[str, Any], mode: str = "compute_action_value") -> Dict[str, Any]:
        """Actor and/or critic outputs (see the class docstring)."""
        _check_mode(mode, "MAPPO")
        if mode == "compute_value":
            return {"value": self.compute_value(data)}
        out = self.compute_action(data)
        if mode == "compute_action_value":
            out["value"] = self.compute_value(data)
        return out


def legal_mask(data: Mapping[str, Any], shape: Tuple[int, ...]) -> Optional[torch.Tensor]:
    """The bool mask of legal actions in ``data`` (None without ``action_mask``); dead agents' rows all legal.

    Raises:
        ValueError: the mask is not shaped like the logits.
    """
    mask = data.get("action_mask")
    if mask is None:
        return None
    mask = torch.as_tensor(mask).bool()
    if tuple(mask.shape) != shape:
        raise ValueError(f"MAPPO: action_mask has shape {tuple(mask.shape)}, expected the logits' {shape} (B, N, A)")
    alive = data.get("alive")
    if alive is not None:
        mask = mask | ~torch.as_tensor(alive, device=mask.device).bool().unsqueeze(-1)
    return mask


MODEL_REGISTRY.register("mappo", MAPPO)
