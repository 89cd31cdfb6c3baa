"""ATOC (Jiang & Lu 2018, "Learning Attentional Communication for Multi-Agent Cooperation"): a DDPG actor split
around an attentional communication channel, and a per-agent critic.

Every agent runs the same weights (parameter sharing). One step of the actor, for ``N`` agents:

1. **part I**: ``h_i = f_I(o_i)``, agent ``i``'s *thought* (an activated hidden layer of the actor);
2. **attention unit**: ``p_i = sigmoid(g(h_i))``, a classifier on the thought; agent ``i`` *initiates*
   communication when ``p_i > initiator_threshold``;
3. **groups**: an initiator's group is itself and its ``group_size - 1`` nearest agents, by position
   (``group_by: position``: the observation entries ``position_dims`` hold the agent's coordinates, the paper's
   proximity) or by the distance between thoughts (``group_by: thought``, DI-engine's choice);
4. **channel**: a bidirectional LSTM reads the group's thoughts as a sequence (the initiator first) and outputs an
   *integrated thought* per member, which replaces that member's thought. All groups go through the channel in one
   batched call; an agent in several groups takes the mean of its integrated thoughts (the paper runs overlapping
   groups one after another, DI-engine lets the last group win; one call is N times cheaper than a serial pass).
   Agents in no group keep their thought;
5. **part II**: ``a_i = loc + scale * tanh(f_II(h_i))`` inside the env's ``[action_low, action_high]``.

The critic is the paper's ``Q(o_i, a_i)``, one network for all agents. Steps 2 and 3 choose discrete structure from
detached thoughts (no gradient); the actor's gradient flows through the channel into every group member's part I.

``ATOC.delta_q`` gives the attention unit's training signal: for each agent ``i`` as the lone initiator of its group,
``dQ_i = mean_{j in G_i} [Q(o_j, a_j(integrated h_j)) - Q(o_j, a_j(h_j))]``, what communicating in ``i``'s group
changes the group's value by (the paper's delta Q, for every agent rather than only the current initiators, so the
classifier sees both classes).
"""

from __future__ import annotations

import difflib
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from nervex.torch_utils import MLP
from nervex.utils import MODEL_REGISTRY

from .qac import BatchedCritics, BoundArg, _bounds
from .value_ac import _check_action_dim

ATOC_MODES: Tuple[str, ...] = ("compute_actor", "compute_critic")
GROUP_BY: Tuple[str, ...] = ("thought", "position")
ObsArg = Union[torch.Tensor, Mapping[str, torch.Tensor]]


class ATOC(nn.Module):
    """ATOC's actor (part I, attention unit, BiLSTM channel, part II) and its per-agent critic ``Q(o_i, a_i)``.

    Args:
        obs_dim: One agent's observation size.
        action_dim: One agent's action size.
        agent_num: Agents N.
        thought_size: Width of a thought (even: the BiLSTM's two directions have ``thought_size / 2`` units each).
        actor_hidden_sizes: Hidden widths of part I (before the thought layer) and of part II (after it).
        attention_hidden_sizes: Hidden widths of the attention unit's MLP (the paper: two layers).
        critic_hidden_sizes: Hidden widths of the critic.
        group_size: Agents in a communication group, the initiator included (2 .. agent_num).
        group_by: ``'position'`` (needs ``position_dims``) or ``'thought'``.
        position_dims: Indices of the agent's own coordinates in its observation row (MPE: ``[2, 3]``).
        initiator_threshold: An agent initiates when its attention probability exceeds this.
        communication: False turns the attention unit and the channel off (independent DDPG, shared parameters).
        action_low, action_high: One agent's ``Box`` bounds (numbers or per dimension); the builder fills them.
        activation: Hidden activation of every MLP.

    Shapes:
        ``forward(obs, mode='compute_actor')``: ``obs`` ``(B, N, obs_dim)`` (or ``{'obs': ...}``) -> ``action``
        ``(B, N, action_dim)``, ``thought`` (detached, before communication), ``integrated`` ``(B, N,
        thought_size)``, ``initiator_prob`` ``(B, N)``, ``initiator`` ``(B, N)`` bool, ``group`` ``(B, N,
        group_size)`` int64 (row ``i``: agent ``i``'s group if it initiates, itself first).
        ``forward({'obs', 'action'}, mode='compute_critic')``: ``obs`` ``(*lead, obs_dim)``, ``action`` ``(*lead,
        action_dim)`` -> ``q`` ``(1, *lead)`` (one critic; the leading 1 is the critic axis of ``QAC``).
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        agent_num: int,
        thought_size: int = 32,
        actor_hidden_sizes: Sequence[int] = (64,),
        attention_hidden_sizes: Sequence[int] = (64, 64),
        critic_hidden_sizes: Sequence[int] = (64, 64),
        group_size: int = 2,
        group_by: str = "thought",
        position_dims: Optional[Sequence[int]] = None,
        initiator_threshold: float = 0.5,
        communication: bool = True,
        action_low: BoundArg = None,
        action_high: BoundArg = None,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        self.obs_dim = _positive(obs_dim, "obs_dim")
        self.action_dim = _check_action_dim(action_dim, "ATOC")
        self.agent_num = _positive(agent_num, "agent_num")
        self.thought_size = _positive(thought_size, "thought_size")
        if self.thought_size % 2:
            raise ValueError(
                f"ATOC thought_size must be even (two LSTM directions of half its width), got {thought_size}"
            )
        self.group_size = _check_group(group_size, self.agent_num)
        self.group_by, self.position_dims = _check_grouping(group_by, position_dims, self.obs_dim)
        if not 0.0 < float(initiator_threshold) < 1.0:
            raise ValueError(f"ATOC initiator_threshold must be in (0, 1), got {initiator_threshold!r}")
        self.initiator_threshold = float(initiator_threshold)
        self.communication = bool(communication)
        self.actor_encoder = MLP(self.obs_dim, [*actor_hidden_sizes, self.thought_size], activation=activation)
        self.attention = MLP(self.thought_size, attention_hidden_sizes, out_dim=1, activation=activation)
        self.channel = nn.LSTM(self.thought_size, self.thought_size // 2, batch_first=True, bidirectional=True)
        self.actor_decoder = MLP(self.thought_size, actor_hidden_sizes, out_dim=self.action_dim, activation=activation)
        self.critic = BatchedCritics(self.obs_dim + self.action_dim, critic_hidden_sizes, 1, activation)
        low, high = _bounds(action_low, action_high, self.action_dim)
        self.register_buffer("action_low", low, persistent=False)
        self.register_buffer("action_high", high, persistent=False)
        self.register_buffer("action_loc", (high + low) / 2, persistent=False)
        self.register_buffer("action_scale", (high - low) / 2, persistent=False)

    # ---- parameter groups (one optimizer each) ------------------------------------------------------------------
    def actor_parameters(self) -> list:
        """Part I, the channel and part II: what the actor's loss trains (the attention unit has its own loss)."""
        modules = (self.actor_encoder, self.channel, self.actor_decoder)
        return [p for m in modules for p in m.parameters()]

    # ---- the actor, step by step ------------------------------------------------------------------------------
    def forward(
        self, x: Union[ObsArg, Dict[str, torch.Tensor]], mode: str = "compute_actor", **kwargs
    ) -> Dict[str, torch.Tensor]:
        """``compute_actor(x)`` or ``compute_critic(x['obs'], x['action'], **kwargs)``.

        Raises:
            ValueError: an unknown ``mode``, or a critic input without ``obs`` and ``action``.
        """
        if mode == "compute_actor":
            return self.compute_actor(x)
        if mode == "compute_critic":
            if not isinstance(x, Mapping) or "obs" not in x or "action" not in x:
                raise ValueError("ATOC compute_critic needs {'obs': ..., 'action': ...}")
            return self.compute_critic(x["obs"], x["action"], **kwargs)
        close = difflib.get_close_matches(str(mode), ATOC_MODES, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"ATOC forward mode must be one of {', '.join(ATOC_MODES)}, got {mode!r}{hint}")

    def agent_obs(self, obs: ObsArg) -> torch.Tensor:
        """The float ``(B, N, obs_dim)`` per-agent rows of an observation (a tensor, or a dict's ``obs``).

        Raises:
            ValueError: the rows are not ``(B, agent_num, obs_dim)``.
        """
        if isinstance(obs, Mapping):
            obs = obs["obs"]
        if obs.dim() != 3 or obs.shape[1:] != (self.agent_num, self.obs_dim):
            raise ValueError(
                f"ATOC expects per-agent observations (B, {self.agent_num}, {self.obs_dim}), got {tuple(obs.shape)}; "
                "check model.agent_num / obs_dim against the env"
            )
        return obs if obs.is_floating_point() else obs.float()

    def compute_actor(self, obs: ObsArg) -> Dict[str, torch.Tensor]:
        """The team's actions with communication (see the module docstring); shapes in the class docstring."""
        obs = self.agent_obs(obs)
        thought = self.actor_encoder(obs)
        batch, agents = thought.shape[:2]
        if not self.communication:
            off = torch.zeros(batch, agents, dtype=torch.bool, device=obs.device)
            return dict(action=self.decode(thought), thought=thought.detach(), integrated=thought, initiator=off)
        prob = self.initiator_prob(thought.detach())
        initiator = prob > self.initiator_threshold
        group = self.groups(obs, thought.detach())
        integrated = self.communicate(thought, group, initiator)
        return dict(
            action=self.decode(integrated),
            thought=thought.detach(),
            integrated=integrated,
            initiator_prob=prob,
            initiator=initiator,
            group=group,
        )

    def initiator_prob(self, thought: torch.Tensor) -> torch.Tensor:
        """``sigmoid(attention(h))``: the probability that each agent initiates. ``(..., thought_size) -> (...)``."""
        return torch.sigmoid(self.attention_logit(thought))

    def attention_logit(self, thought: torch.Tensor) -> torch.Tensor:
        """The attention unit's logit. ``(..., thought_size) -> (...)``."""
        return self.attention(thought).squeeze(-1)

    def groups(self, obs: torch.Tensor, thought: torch.Tensor) -> torch.Tensor:
        """Each agent's would-be group: itself, then its ``group_size - 1`` nearest agents.

        Shapes:
            - obs: :math:`(B, N, obs\\_dim)`; thought: :math:`(B, N, H)`; output: :math:`(B, N, group\\_size)`
        """
        key = obs[..., self.position_dims] if self.group_by == "position" else thought
        distance = torch.cdist(key, key)  # (B, N, N)
        # itself first, whatever the distances (two agents may stand on the same spot)
        distance = distance - torch.eye(self.agent_num, device=distance.device, dtype=distance.dtype)
        return distance.topk(self.group_size, dim=-1, largest=False).indices

    def communicate(self, thought: torch.Tensor, group: torch.Tensor, initiator: torch.Tensor) -> torch.Tensor:
        """The thoughts after every initiator's group went through the channel: all groups in one batched LSTM call;
        an agent in several groups takes the mean of its integrated thoughts; an agent in none keeps its thought.

        Shapes:
            - thought: :math:`(B, N, H)`; group: :math:`(B, N, m)`; initiator: :math:`(B, N)`; output like thought
        """
        batch_rows, initiators = initiator.nonzero(as_tuple=True)
        if batch_rows.numel() == 0:
            return thought
        members = group[batch_rows, initiators]  # (R, m): the R groups' members, initiator first
        batch_index = batch_rows.unsqueeze(1).expand_as(members)
        integrated, _ = self.channel(thought[batch_index, members])  # (R, m, H)
        flat_thought = thought.reshape(-1, self.thought_size)
        slot = (batch_index * self.agent_num + members).reshape(-1)  # each member's row of flat_thought
        total = torch.zeros_like(flat_thought).index_add(0, slot, integrated.reshape(-1, self.thought_size))
        count = torch.zeros(flat_thought.shape[0], 1, dtype=thought.dtype, device=thought.device)
        count = count.index_add(0, slot, torch.ones(slot.shape[0], 1, dtype=thought.dtype, device=thought.device))
        mixed = torch.where(count > 0, total / count.clamp_min(1.0), flat_thought)
        return mixed.reshape(thought.shape)

    def decode(self, thought: torch.Tensor) -> torch.Tensor:
        """Part II: the bounded action. ``(..., thought_size) -> (..., action_dim)``."""
        return self.action_loc + self.action_scale * torch.tanh(self.actor_decoder(thought))

    # ---- the critic and the attention unit's signal ---------------------------------------------------------
    def compute_critic(
        self, obs: torch.Tensor, action: torch.Tensor, critics: Optional[int] = None, param_grad: bool = True
    ) -> Dict[str, torch.Tensor]:
        """``Q(o_i, a_i)`` for every row; ``param_grad=False`` keeps gradients from the critic's weights.

        Raises:
            ValueError: ``obs`` and ``action`` disagree on their leading shape or their widths are wrong.
        """
        if isinstance(obs, Mapping):
            obs = obs["obs"]
        lead = tuple(obs.shape[:-1])
        if obs.shape[-1] != self.obs_dim or tuple(action.shape) != lead + (self.action_dim,):
            raise ValueError(
                f"ATOC compute_critic: obs {tuple(obs.shape)} and action {tuple(action.shape)}; expected "
                f"(..., {self.obs_dim}) and (..., {self.action_dim}) with the same leading shape"
            )
        x = torch.cat([obs.float(), action.to(torch.float32)], dim=-1).reshape(-1, self.obs_dim + self.action_dim)
        return {"q": self.critic(x, critics, param_grad).reshape((1,) + lead)}

    def delta_q(self, obs: ObsArg, thought: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """What communicating in each agent's group changes the group's value by, ``mean_{j in G_i} [Q(o_j,
        a_j(integrated)) - Q(o_j, a_j(alone))]``, each agent as the lone initiator of its group (no gradient).

        Shapes:
            - obs: :math:`(B, N, obs\\_dim)`; thought: :math:`(B, N, H)`; group: :math:`(B, N, m)`
            - output: :math:`(B, N)`
        """
        obs = self.agent_obs(obs)
        batch, agents, size = group.shape
        batch_index = torch.arange(batch, device=group.device).view(batch, 1, 1).expand_as(group)
        with torch.no_grad():
            members = thought[batch_index, group]  # (B, N, m, H)
            integrated, _ = self.channel(members.reshape(batch * agents, size, self.thought_size))
            integrated = integrated.reshape(members.shape)
            member_obs = obs[batch_index, group]
            q_alone = self.compute_critic(member_obs, self.decode(members))["q"][0]
            q_together = self.compute_critic(member_obs, self.decode(integrated))["q"][0]
        return (q_together - q_alone).mean(-1)


def _positive(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"ATOC {name} must be a positive int, got {value!r}")
    return value


def _check_group(group_size: int, agent_num: int) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or not 2 <= group_size <= agent_num:
        raise ValueError(
            f"ATOC group_size must be an int in 2..agent_num ({agent_num}): the initiator and at least one "
            f"collaborator; got {group_size!r}"
        )
    return group_size


def _check_grouping(group_by: str, position_dims: Optional[Sequence[int]], obs_dim: int) -> Tuple[str, list]:
    if group_by not in GROUP_BY:
        raise ValueError(f"ATOC group_by must be one of {', '.join(GROUP_BY)}, got {group_by!r}")
    if group_by == "thought":
        if position_dims is not None:
            raise ValueError("ATOC position_dims is only read with group_by: position; remove it or set group_by")
        return group_by, []
    dims = list(position_dims or [])
    if not dims or any(isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < obs_dim for d in dims):
        raise ValueError(
            f"ATOC group_by: position needs position_dims, the indices (0..{obs_dim - 1}) of the agent's own "
            f"coordinates in its observation (MPE: [2, 3]); got {position_dims!r}"
        )
    return group_by, dims


MODEL_REGISTRY.register("atoc", ATOC)
