"""QAC: an actor for bounded continuous actions and N Q-critics, the model of DDPG, TD3 and SAC.

The critics are evaluated together: their weights are stacked as ``(N, in, out)`` parameters and each layer is one
batched matmul (``torch.baddbmm``) over an ``(N, B, in)`` input, so twin critics cost one kernel per layer, not a
Python loop over critics.
"""

from __future__ import annotations

import difflib
import math
from typing import Dict, List, Literal, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from nervex.torch_utils import MLP, get_activation
from nervex.torch_utils.fused_mlp import FUSED_ACTIVATIONS, batched_mlps_forward
from nervex.torch_utils.module_watch import ModuleWatch
from nervex.utils import MODEL_REGISTRY

from .discrete_net import _as_shape, _check_trailing_shape
from .value_ac import _check_action_dim

ActorType = Literal["deterministic", "squashed_gaussian"]
ACTOR_TYPES: Tuple[str, ...] = ("deterministic", "squashed_gaussian")
QAC_MODES: Tuple[str, ...] = ("compute_actor", "compute_critic")
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # SAC's clamp of the actor's log standard deviation (SB3, Haarnoja et al.)
BoundArg = Optional[Union[float, Sequence[float]]]


class BatchedCritics(nn.Module):
    """``num`` MLPs with the same layer sizes, evaluated as one batched computation.

    Layer ``k`` holds ``weight_k`` ``(num, in_k, out_k)`` and ``bias_k`` ``(num, 1, out_k)``; critic ``i`` is the MLP
    with weights ``weight_k[i]`` (an ``nn.Linear`` whose ``weight`` is ``weight_k[i].T``). Each slice is initialised
    as ``nn.Linear`` is by default (uniform in ``+-1/sqrt(in_k)``).

    Args:
        in_dim: Input features.
        hidden_sizes: Hidden widths (activated); the output layer has width 1.
        num: How many critics.
        activation: Hidden activation name (see ``nervex.torch_utils.get_activation``).

    Shapes:
        ``forward``: ``x`` ``(B, in_dim)`` (shared by every critic) or ``(num, B, in_dim)`` -> ``(num, B)``.
    """

    def __init__(self, in_dim: int, hidden_sizes: Sequence[int], num: int, activation: str = "relu") -> None:
        super().__init__()
        if isinstance(num, bool) or not isinstance(num, int) or num < 1:
            raise ValueError(f"QAC critic_num must be a positive int, got {num!r}")
        self.num = num
        self.in_dim = int(in_dim)
        self.activation = get_activation(activation)
        self.activation_name = str(activation).lower()
        sizes = [self.in_dim, *(int(s) for s in hidden_sizes), 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = 1.0 / math.sqrt(fan_in)
            self.weights.append(nn.Parameter(torch.empty(num, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(num, 1, fan_out).uniform_(-bound, bound)))
        # see layer_params: it reads the two ParameterLists and their parameters
        self._params_watch = ModuleWatch([self], slots=("_parameters", "_modules"))
        self._params: Tuple[List[nn.Parameter], List[nn.Parameter]] = ([], [])

    def layer_params(self) -> Tuple[List[nn.Parameter], List[nn.Parameter]]:
        """``(weights, biases)``, one stacked tensor per layer, as lists (cached: iterating an ``nn.ParameterList``
        costs ~10 us per call; re-read when a tensor of this module was replaced)."""
        if self._params_watch.replaced():
            self._params = (list(self.weights), list(self.biases))
        return self._params

    def forward(self, x: torch.Tensor, first: Optional[int] = None, param_grad: bool = True) -> torch.Tensor:
        """The critics' values; with ``first = k`` only the first ``k`` critics run (TD3's actor reads Q_1 alone:
        half the arithmetic of that pass); with ``param_grad=False`` no gradient reaches the critics' weights (an
        actor's loss needs only the action's gradient, and skips the weights' matmuls)."""
        num = self.num if first is None else int(first)
        if not 1 <= num <= self.num:
            raise ValueError(f"BatchedCritics: first must be in 1..{self.num}, got {first!r}")
        if x.dim() not in (2, 3) or (x.dim() == 3 and x.shape[0] != num) or x.shape[-1] != self.in_dim:
            raise ValueError(
                f"BatchedCritics: input has shape {tuple(x.shape)}; expected (B, {self.in_dim}) or "
                f"({num}, B, {self.in_dim})"
            )
        weights, biases = self.layer_params()
        if num < self.num:
            weights, biases = [w[:num] for w in weights], [b[:num] for b in biases]
        if self.activation_name in FUSED_ACTIVATIONS:
            return batched_mlps_forward(x, weights, biases, self.activation_name, param_grad).squeeze(-1)
        if not param_grad:
            weights, biases = [w.detach() for w in weights], [b.detach() for b in biases]
        h = x.unsqueeze(0).expand(num, *x.shape) if x.dim() == 2 else x
        for k, (weight, bias) in enumerate(zip(weights, biases)):
            h = torch.baddbmm(bias, h, weight)
            if k < len(weights) - 1:
                h = self.activation(h)
        return h.squeeze(-1)


def _bounds(low: BoundArg, high: BoundArg, action_dim: int) -> Tuple[torch.Tensor, torch.Tensor]:
    if (low is None) != (high is None):
        raise ValueError("QAC: give both action_low and action_high (the env's Box bounds), or neither")
    if low is None:
        # without bounds the actor acts in tanh's range; the builder fills them from the env's Box
        return -torch.ones(action_dim), torch.ones(action_dim)
    out = []
    for name, value in (("action_low", low), ("action_high", high)):
        bound = torch.as_tensor(value, dtype=torch.float32)
        if bound.dim() > 1 or (bound.dim() == 1 and bound.shape[0] != action_dim):
            raise ValueError(f"QAC: {name} has shape {tuple(bound.shape)}; expected a number or ({action_dim},)")
        if not bool(torch.isfinite(bound).all()):
            raise ValueError(f"QAC: {name} must be finite to bound a tanh actor, got {value!r}")
        out.append(bound.expand(action_dim).clone())
    if not bool((out[0] < out[1]).all()):
        raise ValueError(f"QAC: need action_low < action_high in every dimension, got {low} and {high}")
    return out[0], out[1]


class QAC(nn.Module):
    """An actor and ``critic_num`` critics ``Q(s, a)`` for a ``Box`` action space ``[action_low, action_high]``.

    The defaults are Stable-Baselines3's SAC ``MlpPolicy``: ``[256, 256]`` ReLU trunks for the actor and for each
    critic (TD3 and DDPG in SB3 use ``[400, 300]``; set ``hidden_sizes``).

    Args:
        obs_dim: Observation size, or its shape (flattened).
        action_dim: Action dimensions.
        actor_type: ``'deterministic'``: ``action = loc + scale * tanh(net(s))`` (DDPG, TD3);
            ``'squashed_gaussian'``: ``mu`` and ``sigma = exp(clamp(log_std, -20, 2))`` of the pre-squash Gaussian
            (SAC; the policy squashes with ``TanhGaussianDist`` into the bounds).
        hidden_sizes: Widths of the actor's trunk and of each critic's.
        critic_num: Number of critics (1 for DDPG, 2 for TD3 and SAC).
        action_low, action_high: The env's ``Box`` bounds, numbers or per dimension (``loc = (high + low) / 2``,
            ``scale = (high - low) / 2``). The builder fills them from the env; left out, actions are in ``[-1, 1]``.
        activation: Hidden activation of every trunk.
        critic_hidden_sizes: Widths of each critic's trunk; None uses ``hidden_sizes``.

    Attributes:
        actor: The actor MLP (output ``action_dim``, or ``2 * action_dim`` for ``mu`` and ``log_std``).
        critic: ``BatchedCritics`` over ``[obs, action]``.
        action_low, action_high, action_loc, action_scale: ``(action_dim,)`` buffers (not in the state dict:
            they come from the constructor).

    Shapes:
        ``forward(obs, mode='compute_actor')``: ``obs`` ``(B, *obs_shape)`` -> ``action`` or ``mu``, ``sigma``
        ``(B, action_dim)``. ``forward({'obs', 'action'}, mode='compute_critic')`` -> ``q`` ``(critic_num, B)``.
    """

    def __init__(
        self,
        obs_dim: Union[int, Sequence[int]],
        action_dim: int,
        actor_type: ActorType = "deterministic",
        hidden_sizes: Sequence[int] = (256, 256),
        critic_num: int = 2,
        action_low: BoundArg = None,
        action_high: BoundArg = None,
        activation: str = "relu",
        critic_hidden_sizes: Optional[Sequence[int]] = None,
    ) -> None:
        super().__init__()
        if actor_type not in ACTOR_TYPES:
            close = difflib.get_close_matches(str(actor_type), ACTOR_TYPES, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ValueError(f"QAC actor_type must be one of {', '.join(ACTOR_TYPES)}, got {actor_type!r}{hint}")
        self.obs_shape = _as_shape(obs_dim, "QAC obs_dim")
        self.action_dim = _check_action_dim(action_dim, "QAC")
        self.actor_type = actor_type
        in_dim = math.prod(self.obs_shape)
        out_dim = self.action_dim * (2 if actor_type == "squashed_gaussian" else 1)
        self.actor = MLP(in_dim, hidden_sizes, out_dim=out_dim, activation=activation)
        critic_sizes = hidden_sizes if critic_hidden_sizes is None else critic_hidden_sizes
        self.critic = BatchedCritics(in_dim + self.action_dim, critic_sizes, critic_num, activation)
        low, high = _bounds(action_low, action_high, self.action_dim)
        self.register_buffer("action_low", low, persistent=False)
        self.register_buffer("action_high", high, persistent=False)
        self.register_buffer("action_loc", (high + low) / 2, persistent=False)
        self.register_buffer("action_scale", (high - low) / 2, persistent=False)

    @property
    def critic_num(self) -> int:
        return self.critic.num

    def forward(
        self,
        x: Union[torch.Tensor, Dict[str, torch.Tensor]],
        mode: str = "compute_actor",
        critics: Optional[int] = None,
        param_grad: bool = True,
    ):
        """The actor's output or the critics' values.

        Args:
            x: Observations for ``'compute_actor'``; ``{'obs': ..., 'action': ...}`` for ``'compute_critic'``.
            mode: ``'compute_actor'`` or ``'compute_critic'``.
            critics: ``'compute_critic'`` only: run the first ``critics`` critics (default: all).
            param_grad: ``'compute_critic'`` only: False keeps gradients away from the critics' weights (an actor's
                loss through the critics).

        Returns:
            ``{'action'}`` (deterministic actor) or ``{'mu', 'sigma', 'log_sigma'}`` (squashed Gaussian); ``{'q'}`` for
            the critics.

        Raises:
            ValueError: an unknown ``mode``, or inputs of the wrong shape.
        """
        if mode == "compute_actor":
            return self.compute_actor(x)
        if mode == "compute_critic":
            if not isinstance(x, dict) or "obs" not in x or "action" not in x:
                raise ValueError("QAC compute_critic needs {'obs': ..., 'action': ...}")
            return self.compute_critic(x["obs"], x["action"], critics, param_grad)
        close = difflib.get_close_matches(str(mode), QAC_MODES, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"QAC forward mode must be one of {', '.join(QAC_MODES)}, got {mode!r}{hint}")

    def flatten_obs(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations as the float ``(B, obs_dim)`` rows the actor and the critics read.

        Raises:
            ValueError: ``obs`` does not end in the model's ``obs_shape``.
        """
        _check_trailing_shape(obs, self.obs_shape, "QAC")
        if not obs.is_floating_point():
            obs = obs.float()
        return obs.flatten(start_dim=obs.dim() - len(self.obs_shape))

    def compute_actor(self, obs: torch.Tensor) -> Dict[str, torch.Tensor]:
        """``{'action'}`` in ``[action_low, action_high]``, or the pre-squash ``{'mu', 'sigma', 'log_sigma'}``.

        Shapes:
            ``obs`` ``(B, *obs_shape)`` -> ``(B, action_dim)`` each.
        """
        return self.actor_head(self.actor(self.flatten_obs(obs)))

    def actor_head(self, out: torch.Tensor) -> Dict[str, torch.Tensor]:
        """``compute_actor``'s output from the actor MLP's: the bounded action, or the clamped Gaussian.

        Shapes:
            ``out`` ``(B, action_dim)`` or ``(B, 2 * action_dim)`` -> ``(B, action_dim)`` each.
        """
        if self.actor_type == "deterministic":
            return {"action": self.action_loc + self.action_scale * torch.tanh(out)}
        mu, log_std = out.split(self.action_dim, dim=-1)
        log_sigma = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        return {"mu": mu, "sigma": log_sigma.exp(), "log_sigma": log_sigma}

    def compute_critic(
        self, obs: torch.Tensor, action: torch.Tensor, critics: Optional[int] = None, param_grad: bool = True
    ) -> Dict[str, torch.Tensor]:
        """Every critic's ``Q(obs, action)`` (or the first ``critics`` of them).

        Shapes:
            ``obs`` ``(B, *obs_shape)``, ``action`` ``(B, action_dim)`` -> ``q`` ``(critics or critic_num, B)``.
        """
        return {"q": self.critic(self.critic_input(obs, action), critics, param_grad)}

    def critic_input(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The critics' input ``[flat obs, action]`` (the action in the observations' dtype).

        Shapes:
            ``obs`` ``(B, *obs_shape)``, ``action`` ``(B, action_dim)`` -> ``(B, obs_dim + action_dim)``.

        Raises:
            ValueError: ``obs`` does not end in ``obs_shape``, or ``action`` is not ``(B, action_dim)``.
        """
        flat = self.flatten_obs(obs)
        if action.shape != flat.shape[:-1] + (self.action_dim,):
            raise ValueError(
                f"QAC compute_critic: action has shape {tuple(action.shape)}; expected "
                f"{tuple(flat.shape[:-1]) + (self.action_dim,)}"
            )
        if action.dtype != flat.dtype:  # a .to() that does nothing still costs ~2 us a call
            action = action.to(flat.dtype)
        return torch.cat([flat, action], dim=-1)


MODEL_REGISTRY.register("qac", QAC)
