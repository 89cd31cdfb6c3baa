"""Actor-critic models for PPO and A2C, with Stable-Baselines3's ``ActorCriticPolicy`` defaults.

``ValueAC`` is the MLP model for vector observations (discrete or diagonal-Gaussian actions), ``ConvValueAC`` the
Nature-DQN CNN model for images (discrete actions). Both return a dict from ``forward(x, mode)``; sampling, log-probs
and entropies belong to the policy, not here.
"""

from __future__ import annotations

import difflib
import math
import operator
from typing import Dict, Literal, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from nervex.torch_utils import MLP
from nervex.torch_utils.fused_mlp import mlp_forward, mlps_forward
from nervex.torch_utils.network import init_orthogonal_, nature_cnn, pixels_to_float
from nervex.utils import MODEL_REGISTRY

from .discrete_net import _as_shape, _check_trailing_shape

ForwardMode = Literal["compute_action", "compute_value", "compute_action_value"]
FORWARD_MODES: Tuple[str, ...] = ("compute_action", "compute_value", "compute_action_value")
ACTION_SPACES: Tuple[str, ...] = ("discrete", "continuous")

# Stable-Baselines3's gains (from OpenAI Baselines): hidden layers, action output, value output
TRUNK_GAIN = math.sqrt(2)
ACTION_HEAD_GAIN = 0.01
VALUE_HEAD_GAIN = 1.0


def _check_mode(mode: str, model: str) -> None:
    if mode not in FORWARD_MODES:
        close = difflib.get_close_matches(str(mode), FORWARD_MODES, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"{model} forward mode must be one of {', '.join(FORWARD_MODES)}, got {mode!r}{hint}")


def _check_action_dim(action_dim: int, model: str) -> int:
    try:
        value = operator.index(action_dim)  # accepts numpy ints (``env.action_space.n``), rejects floats
    except TypeError:
        value = 0
    if isinstance(action_dim, bool) or value < 1:
        raise ValueError(f"{model} action_dim must be a positive int, got {action_dim!r}")
    return value


class ValueAC(nn.Module):
    """An MLP actor-critic: observation vector -> action logits or Gaussian mean / std, and a state value.

    The defaults are Stable-Baselines3's ``MlpPolicy`` for PPO and A2C: separate ``[64, 64]`` tanh trunks for the
    policy and the value (``net_arch=dict(pi=[64, 64], vf=[64, 64])``), orthogonal initialisation, and for continuous
    actions a state-independent ``log_std`` (``DiagGaussianDistribution``).

    Args:
        obs_dim: Observation size, or its shape (flattened).
        action_dim: Number of actions (discrete) or action dimensions (continuous).
        action_space: ``'discrete'`` (outputs ``logit``) or ``'continuous'`` (outputs ``mu`` and ``sigma``).
        hidden_sizes: Widths of the policy trunk, or of the shared trunk when ``share_encoder``.
        share_encoder: One trunk feeds both heads; otherwise the policy and the value have their own trunks.
        activation: Hidden-layer activation name (see ``nervex.torch_utils.get_activation``).
        ortho_init: Orthogonal weights with gain ``sqrt(2)`` in the trunks, 0.01 for the action head, 1 for the
            value head, zero biases (as SB3); False keeps PyTorch's default initialisation.
        log_std_init: Initial value of every entry of ``log_std`` (continuous only).
        value_hidden_sizes: Widths of the value trunk; None uses ``hidden_sizes``. Only with separate trunks.

    Attributes:
        encoder: The shared trunk (``nn.Identity`` with separate trunks).
        policy_net: The policy trunk (``nn.Identity`` when shared).
        value_net: The value trunk (``nn.Identity`` when shared).
        action_head: Linear layer to ``logit`` or ``mu``.
        value_head: Linear layer to the value.
        log_std: ``(action_dim,)`` parameter, continuous only.

    Raises:
        ValueError: an unknown ``action_space``, a non-positive ``action_dim``, ``value_hidden_sizes`` with
            ``share_encoder=True`` or a non-zero ``log_std_init`` with discrete actions (both would be ignored).

    Shapes:
        ``forward``: ``x`` ``(B, *obs_shape)`` -> ``logit`` / ``mu`` / ``sigma`` ``(B, action_dim)``, ``value``
        ``(B,)``; extra leading dims (e.g. ``(T, B, ...)``) are kept.
    """

    def __init__(
        self,
        obs_dim: Union[int, Sequence[int]],
        action_dim: int,
        action_space: Literal["discrete", "continuous"] = "discrete",
        hidden_sizes: Sequence[int] = (64, 64),
        share_encoder: bool = False,
        activation: str = "tanh",
        ortho_init: bool = True,
        log_std_init: float = 0.0,
        value_hidden_sizes: Optional[Sequence[int]] = None,
    ) -> None:
        super().__init__()
        if action_space not in ACTION_SPACES:
            raise ValueError(f"ValueAC action_space must be one of {', '.join(ACTION_SPACES)}, got {action_space!r}")
        if share_encoder and value_hidden_sizes is not None:
            raise ValueError(
                "ValueAC value_hidden_sizes applies only with share_encoder=False; "
                "with a shared trunk both heads read hidden_sizes"
            )
        if action_space == "discrete" and log_std_init != 0.0:
            raise ValueError("ValueAC log_std_init applies only to action_space='continuous'")
        self.obs_shape = _as_shape(obs_dim, "ValueAC obs_dim")
        self.action_dim = _check_action_dim(action_dim, "ValueAC")
        self.action_space = action_space
        self.share_encoder = bool(share_encoder)
        in_dim = math.prod(self.obs_shape)
        self.encoder: nn.Module = nn.Identity()
        self.policy_net: nn.Module = nn.Identity()
        self.value_net: nn.Module = nn.Identity()
        if self.share_encoder:
            shared = MLP(in_dim, hidden_sizes, activation=activation)
            self.encoder = shared
            policy_dim = value_dim = shared.out_dim
        else:
            value_sizes = hidden_sizes if value_hidden_sizes is None else value_hidden_sizes
            policy_trunk = MLP(in_dim, hidden_sizes, activation=activation)
            value_trunk = MLP(in_dim, value_sizes, activation=activation)
            self.policy_net, self.value_net = policy_trunk, value_trunk
            policy_dim, value_dim = policy_trunk.out_dim, value_trunk.out_dim
        self.action_head = nn.Linear(policy_dim, self.action_dim)
        self.value_head = nn.Linear(value_dim, 1)
        if action_space == "continuous":
            self.log_std = nn.Parameter(torch.full((self.action_dim,), float(log_std_init)))
        # separate trunks run with their head as one fused MLP (one autograd node each; see fused_mlp)
        self._policy_plan = self._value_plan = None
        if not self.share_encoder and policy_trunk._fused is not None and value_trunk._fused is not None:
            self._policy_plan = policy_trunk._fused + [(self.action_head, None)]
            self._value_plan = value_trunk._fused + [(self.value_head, None)]
        if ortho_init:
            for trunk in (self.encoder, self.policy_net, self.value_net):
                init_orthogonal_(trunk, TRUNK_GAIN)
            init_orthogonal_(self.action_head, ACTION_HEAD_GAIN)
            init_orthogonal_(self.value_head, VALUE_HEAD_GAIN)

    def forward(self, x: torch.Tensor, mode: ForwardMode = "compute_action_value") -> Dict[str, torch.Tensor]:
        """Action-distribution parameters, state value, or both.

        Args:
            x: Observations; integer inputs are cast to float without scaling.
            mode: ``'compute_action'`` (no value), ``'compute_value'`` (only the value; the policy trunk does not
                run when the trunks are separate) or ``'compute_action_value'``.

        Returns:
            Discrete: ``{'logit'}``; continuous: ``{'mu', 'sigma'}`` with ``sigma = exp(log_std)`` (a broadcast
            view of ``log_std``); plus ``{'value'}`` unless ``mode='compute_action'``.

        Raises:
            ValueError: an unknown ``mode``, or ``x`` whose trailing dims are not ``obs_shape``.

        Shapes:
            ``x``: ``(B, *obs_shape)``; ``logit``, ``mu``, ``sigma``: ``(B, action_dim)``; ``value``: ``(B,)``.
        """
        _check_mode(mode, "ValueAC")
        _check_trailing_shape(x, self.obs_shape, "ValueAC")
        if not x.is_floating_point():
            x = x.float()
        features = self.encoder(x.flatten(start_dim=x.dim() - len(self.obs_shape)))
        output: Dict[str, torch.Tensor] = {}
        if mode == "compute_action_value" and self._policy_plan is not None:
            # both trunks in one fused node: they read the same features
            action_out, value = mlps_forward(features, [self._policy_plan, self._value_plan])
            self._action_output(action_out, output)
            output["value"] = value.squeeze(-1)
            return output
        if mode != "compute_value":
            if self._policy_plan is not None:
                action_out = mlp_forward(features, self._policy_plan)
            else:
                action_out = F.linear(self.policy_net(features), self.action_head.weight, self.action_head.bias)
            self._action_output(action_out, output)
        if mode != "compute_action":
            if self._value_plan is not None:
                value = mlp_forward(features, self._value_plan)
            else:
                value = F.linear(self.value_net(features), self.value_head.weight, self.value_head.bias)
            output["value"] = value.squeeze(-1)
        return output

    def _action_output(self, action_out: torch.Tensor, output: Dict[str, torch.Tensor]) -> None:
        if self.action_space == "discrete":
            output["logit"] = action_out
        else:
            output["mu"] = action_out
            output["sigma"] = self.log_std.exp().expand_as(action_out)


class ConvValueAC(nn.Module):
    """A CNN actor-critic for images with discrete actions: the Nature-DQN trunk shared by a policy and a value head.

    Stable-Baselines3's ``CnnPolicy`` for PPO and A2C: ``NatureCNN`` features (``hidden_size`` wide) read directly by
    the action and value layers (no further MLP), orthogonal initialisation.

    Args:
        obs_shape: ``(C, H, W)``, e.g. ``(4, 84, 84)`` for four stacked Atari frames; H and W must be at least 36.
        action_dim: Number of actions.
        hidden_size: Width of the FC layer after the convolutions.
        ortho_init: Orthogonal weights with gain ``sqrt(2)`` in the trunk, 0.01 for the action head, 1 for the value
            head, zero biases (as SB3); False keeps PyTorch's default initialisation.

    Raises:
        ValueError: ``obs_shape`` not ``(C, H, W)`` or too small, a non-positive ``action_dim``.

    Shapes:
        ``forward``: ``x`` ``(B, C, H, W)`` -> ``logit`` ``(B, action_dim)``, ``value`` ``(B,)``; extra leading
        dims are kept.
    """

    def __init__(
        self, obs_shape: Sequence[int], action_dim: int, hidden_size: int = 512, ortho_init: bool = True
    ) -> None:
        super().__init__()
        self.obs_shape = _as_shape(obs_shape, "ConvValueAC obs_shape")
        self.action_dim = _check_action_dim(action_dim, "ConvValueAC")
        self.encoder = nature_cnn(self.obs_shape, int(hidden_size), owner="ConvValueAC")
        self.action_head = nn.Linear(int(hidden_size), self.action_dim)
        self.value_head = nn.Linear(int(hidden_size), 1)
        if ortho_init:
            init_orthogonal_(self.encoder, TRUNK_GAIN)
            init_orthogonal_(self.action_head, ACTION_HEAD_GAIN)
            init_orthogonal_(self.value_head, VALUE_HEAD_GAIN)

    def forward(self, x: torch.Tensor, mode: ForwardMode = "compute_action_value") -> Dict[str, torch.Tensor]:
        """Action logits, state value, or both.

        Args:
            x: Images; ``uint8`` pixels are scaled to ``[0, 1]``, float inputs are used as they are.
            mode: ``'compute_action'``, ``'compute_value'`` or ``'compute_action_value'``; the trunk runs in all three.

        Returns:
            ``{'logit'}``, ``{'value'}`` or both.

        Raises:
            ValueError: an unknown ``mode``, or ``x`` whose trailing dims are not ``obs_shape``.

        Shapes:
            ``x``: ``(B, C, H, W)``; ``logit``: ``(B, action_dim)``; ``value``: ``(B,)``.
        """
        _check_mode(mode, "ConvValueAC")
        _check_trailing_shape(x, self.obs_shape, "ConvValueAC")
        x = pixels_to_float(x)
        leading = x.shape[:-3]
        features = self.encoder(x.reshape(-1, *self.obs_shape))
        output: Dict[str, torch.Tensor] = {}
        if mode != "compute_value":
            output["logit"] = self.action_head(features).reshape(*leading, self.action_dim)
        if mode != "compute_action":
            output["value"] = self.value_head(features).reshape(leading)
        return output


MODEL_REGISTRY.register("value_ac", ValueAC)
MODEL_REGISTRY.register("conv_value_ac", ConvValueAC)
