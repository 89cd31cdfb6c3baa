"""Value factorisation for cooperative teams: the QMIX mixer (Rashid et al. 2018), VDN's sum (Sunehag et al. 2018),
and ``QMix``, the agent network plus a mixer that QMIX and VDN learn with (registered as ``'qmix'`` and ``'vdn'``).

The mixers take the per-agent Q-values of the chosen actions and return the team's ``Q_tot``; QMIX conditions the
mixing on the global state through hypernetworks whose weights are made non-negative (``abs``), so ``Q_tot`` is
monotonic in every agent's Q and each agent's greedy action is the team's greedy action.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from nervex.utils import MODEL_REGISTRY

from .agent_net import AgentNet, State

MIXERS = ("qmix", "vdn")
FORWARD_MODES = ("agent", "mix")


def _check_mixer_input(name: str, agent_q: torch.Tensor, agent_num: int) -> None:
    if agent_q.dim() < 1 or agent_q.shape[-1] != agent_num:
        raise ValueError(
            f"{name}: agent_q has shape {tuple(agent_q.shape)}; expected (..., {agent_num}) (one Q per agent, the "
            "agent axis last)"
        )


def _hypernet(state_dim: int, out_dim: int, layers: int, hidden: int) -> nn.Module:
    """A state-conditioned generator of ``out_dim`` weights: one linear layer, or two with a ReLU between."""
    if layers == 1:
        return nn.Linear(state_dim, out_dim)
    return nn.Sequential(nn.Linear(state_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))


class QMixer(nn.Module):
    """The QMIX mixing network: ``Q_tot = w2(s)^T elu(W1(s)^T q + b1(s)) + V(s)``.

    ``W1(s)`` ``(N, E)`` and ``w2(s)`` ``(E,)`` come from hypernetworks of the global state ``s`` and pass through
    ``abs``, so ``dQ_tot / dq_a >= 0`` for every agent ``a`` (monotonic mixing); the biases ``b1(s)`` (one linear
    layer) and ``V(s)`` (two layers, ``Linear-ReLU-Linear``, as in the paper) are unconstrained. The state enters only
    through the hypernetworks, never as an input of the mixing itself.

    Args:
        agent_num: Agents N.
        state_dim: Size of the global state.
        embed_dim: Width E of the mixing layer (PyMARL: 32).
        hypernet_layers: Layers of the weight hypernetworks, 1 or 2 (PyMARL's ``qmix.yaml``: 2).
        hypernet_embed: Hidden width of a 2-layer weight hypernetwork (PyMARL: 64).

    Shapes:
        ``forward(agent_q, state)``: ``agent_q`` ``(*L, N)``, ``state`` ``(*L, state_dim)`` -> ``(*L,)``.
    """

    def __init__(
        self, agent_num: int, state_dim: int, embed_dim: int = 32, hypernet_layers: int = 2, hypernet_embed: int = 64
    ) -> None:
        super().__init__()
        if hypernet_layers not in (1, 2):
            raise ValueError(f"QMixer hypernet_layers must be 1 or 2, got {hypernet_layers!r}")
        if min(int(agent_num), int(state_dim), int(embed_dim), int(hypernet_embed)) < 1:
            raise ValueError(
                f"QMixer needs positive sizes, got agent_num={agent_num}, state_dim={state_dim}, "
                f"embed_dim={embed_dim}, hypernet_embed={hypernet_embed}"
            )
        self.agent_num, self.state_dim, self.embed_dim = int(agent_num), int(state_dim), int(embed_dim)
        self.hyper_w1 = _hypernet(self.state_dim, self.agent_num * self.embed_dim, hypernet_layers, hypernet_embed)
        self.hyper_b1 = nn.Linear(self.state_dim, self.embed_dim)
        self.hyper_w2 = _hypernet(self.state_dim, self.embed_dim, hypernet_layers, hypernet_embed)
        self.hyper_v = nn.Sequential(nn.Linear(self.state_dim, self.embed_dim), nn.ReLU(), nn.Linear(self.embed_dim, 1))

    def forward(self, agent_q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """``Q_tot`` for the per-agent Q-values ``agent_q`` in the global state ``state`` (shapes: class docstring).

        Raises:
            ValueError: ``agent_q`` has no agent axis of ``agent_num`` last, or ``state`` is missing or does not match
                it.
        """
        _check_mixer_input("QMixer", agent_q, self.agent_num)
        if state is None:
            raise ValueError(
                "QMixer needs the global state (data['global_state']); the env gives none: use the vdn mixer, or an "
                "env adapter with a 'global_state' observation key"
            )
        lead = agent_q.shape[:-1]
        if tuple(state.shape) != (*lead, self.state_dim):
            raise ValueError(
                f"QMixer: state has shape {tuple(state.shape)}; expected {(*lead, self.state_dim)} (the leading "
                f"axes of agent_q {tuple(agent_q.shape)}, then state_dim)"
            )
        q = agent_q.reshape(-1, 1, self.agent_num)
        s = state.reshape(-1, self.state_dim).to(q.dtype)
        w1 = self.hyper_w1(s).abs().view(-1, self.agent_num, self.embed_dim)
        hidden = F.elu(torch.bmm(q, w1) + self.hyper_b1(s).unsqueeze(1))  # (M, 1, E)
        w2 = self.hyper_w2(s).abs().view(-1, self.embed_dim, 1)
        q_tot = torch.bmm(hidden, w2).view(-1) + self.hyper_v(s).view(-1)
        return q_tot.view(lead)


class VDNMixer(nn.Module):
    """VDN's mixing: ``Q_tot = sum_a q_a`` (no parameters; the state is accepted and ignored).

    Shapes:
        ``forward(agent_q, state=None)``: ``agent_q`` ``(*L, N)`` -> ``(*L,)``.
    """

    def forward(self, agent_q: torch.Tensor, state: Optional[torch.Tensor] = None) -> torch.Tensor:
        if agent_q.dim() < 1:
            raise ValueError(f"VDNMixer: agent_q must have an agent axis last, got a scalar of shape {agent_q.shape}")
        return agent_q.sum(dim=-1)


class QMix(nn.Module):
    """The model of the ``qmix`` and ``vdn`` policies: a shared ``AgentNet`` for per-agent Q-values and a mixer.

    Two forward modes (the policy's ``Agent`` passes ``mode=`` through to the model):

    - ``mode='agent'`` (acting and learning): ``{'obs': (B, N, obs_dim), 'prev_state': {'h': (B, N, H)} or None,
      'last_action': (B, N, action_dim) one-hot}`` -> ``{'logit': (B, N, action_dim), 'next_state'}``;
      ``sequence=True`` takes time-major ``(T, B, N, ...)`` inputs (``AgentNet``'s sequence call). With
      ``last_action`` the agent net's input is ``obs`` followed by the one-hot of the agent's previous action (zeros
      at an episode's start), as EPyMARL does by default.
    - ``mode='mix'``: ``{'agent_q': (*L, N), 'global_state': (*L, state_dim)}`` -> ``{'q_tot': (*L,)}``.

    Args:
        obs_dim: One agent's observation size (the builder fills it from the env's ``obs`` rows).
        action_dim: Actions per agent (filled from the env).
        agent_num: Agents N (filled from the env).
        state_dim: Global state size (filled from the env); required by the ``qmix`` mixer, unused by ``vdn``.
        agent: ``AgentNet`` keyword arguments (``hidden_sizes``, ``rnn``, ``hidden_size``, ``agent_id``,
            ``share_params``, ``per_agent_heads``, ``activation``); PyMARL's RNN agent by default.
        mixer: ``'qmix'`` (``QMixer``) or ``'vdn'`` (``VDNMixer``).
        mixer_cfg: ``QMixer`` keyword arguments (``embed_dim``, ``hypernet_layers``, ``hypernet_embed``).
        last_action: Append the one-hot of each agent's last action to its observation.

    Raises:
        ValueError: an unknown mixer, ``mixer_cfg`` given to ``vdn``, or ``qmix`` without ``state_dim``.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        agent_num: int,
        state_dim: Optional[int] = None,
        agent: Optional[Mapping[str, Any]] = None,
        mixer: str = "qmix",
        mixer_cfg: Optional[Mapping[str, Any]] = None,
        last_action: bool = True,
    ) -> None:
        super().__init__()
        if mixer not in MIXERS:
            raise ValueError(f"QMix mixer must be one of {MIXERS}, got {mixer!r}")
        self.obs_dim, self.action_dim, self.agent_num = int(obs_dim), int(action_dim), int(agent_num)
        self.last_action = bool(last_action)
        agent_kwargs = {**dict(hidden_sizes=(64,), rnn="gru", hidden_size=64), **dict(agent or {})}
        in_dim = self.obs_dim + (self.action_dim if self.last_action else 0)
        self.agent = AgentNet(in_dim, self.action_dim, self.agent_num, **agent_kwargs)
        self.mixer_type = mixer
        if mixer == "qmix":
            if state_dim is None:
                raise ValueError(
                    "QMix with mixer 'qmix' needs state_dim (the global state's size); set model.state_dim"
                )
            self.mixer: nn.Module = QMixer(self.agent_num, int(state_dim), **dict(mixer_cfg or {}))
        else:
            if mixer_cfg:
                raise ValueError(f"QMix mixer 'vdn' has no parameters; drop mixer_cfg {dict(mixer_cfg)}")
            self.mixer = VDNMixer()

    def initial_state(self, batch_size: Optional[int] = None) -> State:
        """The agent net's zero state ``{'h': (N, H)}`` (``(batch_size, N, H)``); None for an MLP agent."""
        return self.agent.initial_state(batch_size)

    def _agent_input(self, data: Mapping[str, Any]) -> torch.Tensor:
        obs = data["obs"]
        obs = obs if obs.is_floating_point() else obs.float()
        if not self.last_action:
            return obs
        last = data.get("last_action")
        expected = (*obs.shape[:-1], self.action_dim)
        if last is None or tuple(last.shape) != expected:
            got = None if last is None else tuple(last.shape)
            raise ValueError(
                f"QMix with last_action needs data['last_action'] of shape {expected} (one-hot of each agent's "
                f"previous action, zeros at an episode's start), got {got}"
            )
        return torch.cat([obs, last.to(obs.dtype)], dim=-1)

    def forward(self, data: Mapping[str, Any], sequence: bool = False, mode: str = "agent") -> Dict[str, Any]:
        """Per-agent Q-values (``mode='agent'``) or the mixed team value (``mode='mix'``); see the class docstring.

        Raises:
            ValueError: an unknown mode, or inputs of the wrong shape (named with the expected one).
        """
        if mode == "mix":
            return {"q_tot": self.mixer(data["agent_q"], data.get("global_state"))}
        if mode != "agent":
            raise ValueError(f"QMix forward mode must be one of {FORWARD_MODES}, got {mode!r}")
        obs = data["obs"]
        lead = 2 if sequence else 1
        if obs.dim() != lead + 2 or tuple(obs.shape[-2:]) != (self.agent_num, self.obs_dim):
            layout = "(T, B, " if sequence else "(B, "
            raise ValueError(
                f"QMix expects obs of shape {layout}{self.agent_num}, {self.obs_dim}) (agents, obs_dim), got "
                f"{tuple(obs.shape)}"
            )
        return self.agent({"obs": self._agent_input(data), "prev_state": data.get("prev_state")}, sequence=sequence)


class VDN(QMix):
    """``QMix`` with the ``vdn`` mixer: the default model of the ``vdn`` policy (it needs no global state).

    Args: as ``QMix`` less ``state_dim``, ``mixer`` and ``mixer_cfg``.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        agent_num: int,
        agent: Optional[Mapping[str, Any]] = None,
        last_action: bool = True,
    ) -> None:
        super().__init__(obs_dim, action_dim, agent_num, None, agent, "vdn", None, last_action)


MODEL_REGISTRY.register("qmix", QMix)
MODEL_REGISTRY.register("vdn", VDN)
