"""COMA's models (Foerster et al. 2018): the centralized counterfactual critic and the actor-critic pair."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from nervex.torch_utils import MLP
from nervex.utils import MODEL_REGISTRY

from .agent_net import AgentNet, State


def one_hot_actions(action: torch.Tensor, action_dim: int) -> torch.Tensor:
    """One-hot of integer actions; a negative action (none yet: before an episode's first step) is all zeros.

    Shapes:
        ``(*)`` int -> ``(*, action_dim)`` float32.
    """
    action = action.long()
    return F.one_hot(action.clamp(min=0), action_dim).float() * (action >= 0).unsqueeze(-1).float()


class COMACritic(nn.Module):
    """COMA's centralized critic: ``Q(s, (u_-a, .))`` for every action of agent ``a``, for all agents in one pass.

    Agent ``a``'s input is the global state, its own observation, the one-hot actions of all agents with its own
    zeroed (the others' actions are held fixed; its own is what the output ranges over), optionally every agent's
    previous action (PyMARL's critic input), and its agent-id one-hot. An MLP maps it to one value per action of ``a``
    (weights shared over agents; the id tells them apart).

    Args:
        obs_dim: One agent's observation size.
        action_dim: One agent's number of actions.
        agent_num: Agents N.
        state_dim: Size of the global state.
        hidden_sizes: Widths of the MLP (PyMARL: two layers of 128).
        last_action: Also feed every agent's previous action (``data['last_action']``).
        activation: The MLP's activation.

    Shapes:
        ``global_state`` ``(*, S)``, ``obs`` ``(*, N, O)``, ``action`` ``(*, N)`` int64, ``last_action`` ``(*, N)``
        int64 (-1: none) -> ``q`` ``(*, N, A)``.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        agent_num: int,
        state_dim: int,
        hidden_sizes: Sequence[int] = (128, 128),
        last_action: bool = True,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        sizes = [int(s) for s in hidden_sizes]
        if min(int(obs_dim), int(action_dim), int(agent_num), int(state_dim)) < 1 or not sizes:
            raise ValueError(
                f"COMACritic needs positive sizes and at least one hidden layer, got obs_dim={obs_dim}, "
                f"action_dim={action_dim}, agent_num={agent_num}, state_dim={state_dim}, hidden_sizes={hidden_sizes}"
            )
        self.obs_dim, self.action_dim = int(obs_dim), int(action_dim)
        self.agent_num, self.state_dim = int(agent_num), int(state_dim)
        self.last_action = bool(last_action)
        joint = self.agent_num * self.action_dim
        self.input_dim = self.state_dim + self.obs_dim + joint * (2 if self.last_action else 1) + self.agent_num
        self.body = MLP(self.input_dim, sizes, activation=activation)
        self.head = nn.Linear(sizes[-1], self.action_dim)

    def _inputs(self, data: Mapping[str, Any]) -> torch.Tensor:
        obs = torch.as_tensor(data["obs"]).float()
        lead, n, a = obs.shape[:-2], self.agent_num, self.action_dim
        if tuple(obs.shape[-2:]) != (n, self.obs_dim):
            raise ValueError(f"COMACritic: obs has shape {tuple(obs.shape)}, expected (..., {n}, {self.obs_dim})")
        state = torch.as_tensor(data["global_state"]).float()
        if tuple(state.shape) != (*lead, self.state_dim):
            raise ValueError(
                f"COMACritic: global_state has shape {tuple(state.shape)}, expected {(*lead, self.state_dim)}"
            )
        action = torch.as_tensor(data["action"])
        if tuple(action.shape) != (*lead, n):
            raise ValueError(
                f"COMACritic: action has shape {tuple(action.shape)}, expected {(*lead, n)} (one per agent)"
            )
        others = 1.0 - torch.eye(n, device=obs.device)  # row a: 0 for agent a's own action, 1 for the others'
        joint = one_hot_actions(action, a).reshape(*lead, 1, n * a)
        parts = [
            state.unsqueeze(-2).expand(*lead, n, self.state_dim),
            obs,
            joint * others.repeat_interleave(a, dim=1),
        ]
        if self.last_action:
            last = data.get("last_action")
            last = torch.full_like(action, -1) if last is None else torch.as_tensor(last)
            parts.append(one_hot_actions(last, a).reshape(*lead, 1, n * a).expand(*lead, n, n * a))
        parts.append(torch.eye(n, device=obs.device).expand(*lead, n, n))
        return torch.cat(parts, dim=-1)

    def forward(self, data: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        """``{'q': (*, N, A)}`` from ``{'global_state', 'obs', 'action'[, 'last_action']}`` (see the class)."""
        return {"q": self.head(self.body(self._inputs(data)))}


class COMA(nn.Module):
    """COMA's actor and critic: an ``AgentNet`` actor (GRU by default, as in the paper) and a ``COMACritic``.

    ``forward(data, mode='compute_actor')`` runs the actor (``AgentNet``'s inputs and outputs: ``{'obs', 'prev_state'}``
    -> ``{'logit', 'next_state'}``, ``sequence=True`` for time-major sequences); ``mode='compute_critic'`` runs the
    critic (``COMACritic``'s). ``initial_state`` is the actor's, for the ``hidden_state`` agent plugin.

    Args:
        obs_dim, action_dim, agent_num, state_dim: Sizes (the builder fills them from the env).
        hidden_sizes: The actor's encoder widths.
        rnn: The actor's ``'gru'`` or ``'none'``.
        hidden_size: The actor's GRU width.
        share_params: One actor for all agents (with the agent-id one-hot).
        critic_hidden_sizes: The critic's MLP widths.
        critic_last_action: Feed the critic every agent's previous action.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        agent_num: int,
        state_dim: int,
        hidden_sizes: Sequence[int] = (64,),
        rnn: str = "gru",
        hidden_size: int = 64,
        share_params: bool = True,
        critic_hidden_sizes: Sequence[int] = (128, 128),
        critic_last_action: bool = True,
    ) -> None:
        super().__init__()
        self.actor = AgentNet(
            obs_dim, action_dim, agent_num, hidden_sizes, rnn=rnn, hidden_size=hidden_size, share_params=share_params
        )
        self.critic = COMACritic(
            obs_dim, action_dim, agent_num, state_dim, critic_hidden_sizes, last_action=critic_last_action
        )

    @property
    def recurrent(self) -> bool:
        """Whether the actor has a recurrent state."""
        return self.actor.rnn_type != "none"

    def initial_state(self, batch_size: Optional[int] = None) -> State:
        """The actor's zero state (see ``AgentNet.initial_state``)."""
        return self.actor.initial_state(batch_size)

    def forward(self, data: Mapping[str, Any], mode: str = "compute_actor", sequence: bool = False) -> Dict[str, Any]:
        """Run the actor or the critic.

        Args:
            data: The actor's or the critic's inputs.
            mode: ``'compute_actor'`` or ``'compute_critic'``.
            sequence: Actor only: time-major ``(T, B, N, O)`` observations.

        Raises:
            ValueError: an unknown ``mode``.
        """
        if mode == "compute_actor":
            return self.actor(data, sequence=sequence)
        if mode == "compute_critic":
            return self.critic(data)
        raise ValueError(f"COMA.forward: unknown mode {mode!r}; valid: 'compute_actor', 'compute_critic'")


MODEL_REGISTRY.register("coma", COMA)
MODEL_REGISTRY.register("coma_critic", COMACritic)
