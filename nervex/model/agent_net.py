"""AgentNet: one network acting for every agent of a cooperative team (shared parameters, agent-id one-hot)."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import torch
import torch.nn as nn

from nervex.torch_utils import MLP
from nervex.utils import MODEL_REGISTRY

State = Optional[Dict[str, torch.Tensor]]


class AgentNet(nn.Module):
    """The per-agent network of QMIX, VDN, COMA and MAPPO: ``obs_i [+ one_hot(i)]`` -> MLP -> (GRU) -> head.

    Every agent runs the same weights by default (parameter sharing, as in QMIX and MAPPO); the agent-id one-hot lets
    shared weights still act differently per agent. ``share_params=False`` gives each agent its own encoder, recurrent
    cell and head; ``per_agent_heads=True`` keeps the shared body and gives each agent its own output layer.

    Two calls, like ``DRQN``:

    - one step, for acting: ``forward({'obs': (B, N, obs_dim), 'prev_state': {'h': (B, N, hidden)} or None})``;
    - a sequence, for learning: ``forward({'obs': (T, B, N, obs_dim), 'prev_state': ...}, sequence=True)``,
      time-major; the GRU runs step by step from ``prev_state`` (zero when None).

    The recurrent state has the **batch axis first** (``{'h': (B, N, hidden_size)}``), which the ``hidden_state``
    agent plugin stacks and splits per env; an MLP net (``rnn: none``) has no state (``next_state`` is None).

    Args:
        obs_dim: One agent's input size (the policy may have appended its last action).
        action_dim: Outputs per agent (Q-values or logits, or the mean of a continuous action).
        agent_num: Agents N.
        hidden_sizes: Widths of the MLP encoder.
        rnn: ``'gru'`` or ``'none'``.
        hidden_size: Width of the GRU state.
        agent_id: Append the one-hot of the agent's index to its input.
        share_params: One set of weights for all agents.
        per_agent_heads: With shared weights, a separate output layer per agent.
        activation: The encoder's activation.

    Shapes:
        step: ``obs`` ``(B, N, obs_dim)`` -> ``logit`` ``(B, N, action_dim)``, ``next_state['h']`` ``(B, N, H)``.
        sequence: ``obs`` ``(T, B, N, obs_dim)`` -> ``logit`` ``(T, B, N, action_dim)``; ``next_state`` after the
        last step.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        agent_num: int,
        hidden_sizes: Sequence[int] = (64,),
        rnn: str = "gru",
        hidden_size: int = 64,
        agent_id: bool = True,
        share_params: bool = True,
        per_agent_heads: bool = False,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        if rnn not in ("gru", "none"):
            raise ValueError(f"AgentNet rnn must be 'gru' or 'none', got {rnn!r}")
        if int(agent_num) < 1 or int(obs_dim) < 1 or int(action_dim) < 1:
            raise ValueError(
                f"AgentNet needs positive sizes, got obs_dim={obs_dim}, action_dim={action_dim}, agent_num={agent_num}"
            )
        if per_agent_heads and not share_params:
            raise ValueError(
                "AgentNet: per_agent_heads applies to shared parameters; with share_params false every "
                "agent already has its own head"
            )
        self.obs_dim, self.action_dim, self.agent_num = int(obs_dim), int(action_dim), int(agent_num)
        self.agent_id, self.share_params, self.per_agent_heads = bool(agent_id), bool(share_params), per_agent_heads
        self.rnn_type, self.hidden_size = rnn, int(hidden_size)
        in_dim = self.obs_dim + (self.agent_num if self.agent_id else 0)
        sizes = [int(s) for s in hidden_sizes]
        copies = 1 if share_params else self.agent_num
        self.encoders = nn.ModuleList(MLP(in_dim, sizes, activation=activation) for _ in range(copies))
        body = sizes[-1]
        if rnn == "gru":
            self.cells = nn.ModuleList(nn.GRUCell(body, self.hidden_size) for _ in range(copies))
            body = self.hidden_size
        head_copies = self.agent_num if (per_agent_heads or not share_params) else 1
        self.heads = nn.ModuleList(nn.Linear(body, self.action_dim) for _ in range(head_copies))

    def initial_state(self, batch_size: Optional[int] = None) -> State:
        """The zero state: ``{'h': (N, H)}``, or ``(batch_size, N, H)``; None for an MLP net."""
        if self.rnn_type == "none":
            return None
        shape = (
            (self.agent_num, self.hidden_size) if batch_size is None else (batch_size, self.agent_num, self.hidden_size)
        )
        return {"h": torch.zeros(shape, device=next(self.parameters()).device)}

    def _inputs(self, obs: torch.Tensor) -> torch.Tensor:
        obs = obs if obs.is_floating_point() else obs.float()
        if not self.agent_id:
            return obs
        eye = torch.eye(self.agent_num, device=obs.device, dtype=obs.dtype)
        return torch.cat([obs, eye.expand(*obs.shape[:-2], self.agent_num, self.agent_num)], dim=-1)

    def _per_agent(self, modules: nn.ModuleList, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        """Apply ``modules`` over the agent axis (-2): the one shared module at once, or agent ``i``'s to agent i."""
        if len(modules) == 1:
            flat = [t.reshape(-1, t.shape[-1]) for t in (x, *rest)]
            out = modules[0](*flat)
            return out.reshape(*x.shape[:-1], out.shape[-1])
        outs = [modules[i](x[..., i, :], *(t[..., i, :] for t in rest)) for i in range(self.agent_num)]
        return torch.stack(outs, dim=-2)

    def _step(self, obs: torch.Tensor, h: Optional[torch.Tensor]) -> Any:
        features = self._per_agent(self.encoders, self._inputs(obs))
        if self.rnn_type == "gru":
            h = self._per_agent(self.cells, features, h)
            features = h
        return self._per_agent(self.heads, features), h

    def _check(self, obs: torch.Tensor, sequence: bool) -> None:
        lead = 2 if sequence else 1
        if obs.dim() != lead + 2 or tuple(obs.shape[-2:]) != (self.agent_num, self.obs_dim):
            layout = "(T, B, " if sequence else "(B, "
            raise ValueError(
                f"AgentNet expects obs of shape {layout}{self.agent_num}, {self.obs_dim}) (agents, obs_dim), got "
                f"{tuple(obs.shape)}"
            )

    def forward(self, data: Mapping[str, Any], sequence: bool = False) -> Dict[str, Any]:
        """Per-agent outputs and the next recurrent state.

        Args:
            data: ``{'obs': ..., 'prev_state': {'h': ...} or None}``.
            sequence: ``obs`` is time-major ``(T, B, N, obs_dim)``.

        Returns:
            ``{'logit': ..., 'next_state': {'h': (B, N, H)} or None}``.

        Raises:
            ValueError: ``obs`` or ``prev_state`` of the wrong shape.
        """
        obs = data["obs"]
        self._check(obs, sequence)
        batch = obs.shape[1] if sequence else obs.shape[0]
        h = None
        if self.rnn_type == "gru":
            state = data.get("prev_state")
            h = self.initial_state(batch)["h"] if state is None else torch.as_tensor(state["h"]).float()
            if tuple(h.shape) != (batch, self.agent_num, self.hidden_size):
                raise ValueError(
                    f"AgentNet prev_state['h'] has shape {tuple(h.shape)}, expected "
                    f"{(batch, self.agent_num, self.hidden_size)} (batch, agents, hidden_size)"
                )
            h = h.to(obs.device)
        if not sequence or self.rnn_type == "none":
            logit, h = self._step(obs, h)  # an MLP has no state: every step of a sequence at once
        else:
            # the encoder and the heads do not depend on the state: one call over all steps; the GRU steps in time
            features = self._per_agent(self.encoders, self._inputs(obs))
            hs = []
            for t in range(obs.shape[0]):
                h = self._per_agent(self.cells, features[t], h)
                hs.append(h)
            logit = self._per_agent(self.heads, torch.stack(hs))
        return {"logit": logit, "next_state": None if h is None else {"h": h}}


MODEL_REGISTRY.register("agent_net", AgentNet)
