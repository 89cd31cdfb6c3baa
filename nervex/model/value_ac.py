"""Actor-critic models for PPO, A2C and IMPALA, with Stable-Baselines3's ``ActorCriticPolicy`` defaults.

``ValueAC`` is the MLP model for vector observations (discrete or diagonal-Gaussian actions), optionally with LSTM
cores (IMPALA's recurrent agent); ``ConvValueAC`` the Nature-DQN CNN model for images (discrete actions). Both
return a dict from ``forward(x, mode)``; sampling, log-probs and entropies belong to the policy, not here.

Recurrent state (``ValueAC(lstm_hidden_size=H)``), laid out as ``DRQN``'s: one env's is ``{'h': (R, H), 'c': (R, H)}``
(``initial_state()``, the ``hidden_state`` plugin's ``init_fn``) with ``R = lstm_layers`` for one shared core and
``2 * lstm_layers`` for separate policy and value cores (the policy core's layers first); a batch of them, what the
model takes and returns, the plugin keeps and a replay buffer collates from stored states, is
``{'h': (B, R, H), 'c': (B, R, H)}``, batch first.
"""

from __future__ import annotations

import difflib
import math
import operator
from typing import Any, Dict, Literal, Mapping, Optional, Sequence, Tuple, Union

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
RecurrentState = Dict[str, torch.Tensor]  # {'h': ..., 'c': ...}

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

    With ``lstm_hidden_size`` the model is recurrent: each trunk feeds its own LSTM core before its head
    (sb3-contrib's ``RecurrentPPO`` default: the value loss cannot swamp the policy's memory), or with
    ``share_encoder`` one trunk and one core feed both heads (IMPALA's agent). ``forward`` then takes
    ``{'obs', 'prev_state'}`` and returns ``next_state`` too (see ``forward``).

    Args:
        obs_dim: Observation size, or its shape (flattened).
        action_dim: Number of actions (discrete) or action dimensions (continuous).
        action_space: ``'discrete'`` (outputs ``logit``) or ``'continuous'`` (outputs ``mu`` and ``sigma``).
        hidden_sizes: Widths of the policy trunk, or of the shared trunk when ``share_encoder`` (with an LSTM: the
            layers before it; may be empty).
        share_encoder: One trunk (and LSTM core) feeds both heads; otherwise the policy and the value have their
            own.
        activation: Hidden-layer activation name (see ``nervex.torch_utils.get_activation``).
        ortho_init: Orthogonal weights with gain ``sqrt(2)`` in the trunks, 0.01 for the action head, 1 for the
            value head, zero biases (as SB3); False keeps PyTorch's default initialisation.
        log_std_init: Initial value of every entry of ``log_std`` (continuous only).
        value_hidden_sizes: Widths of the value trunk; None uses ``hidden_sizes``. Only with separate trunks.
        lstm_hidden_size: Width of an LSTM core after each trunk; None: no core (a feed-forward model).
        lstm_layers: Stacked LSTM layers of each core.

    Attributes:
        encoder: The shared trunk (``nn.Identity`` with separate trunks).
        policy_net: The policy trunk (``nn.Identity`` when shared).
        value_net: The value trunk (``nn.Identity`` when shared).
        action_head: Linear layer to ``logit`` or ``mu``.
        value_head: Linear layer to the value.
        log_std: ``(action_dim,)`` parameter, continuous only.
        core: The policy's (or the shared) ``nn.LSTM`` core; ``None`` without an LSTM.
        value_core: The value's ``nn.LSTM`` core; ``None`` without an LSTM or with ``share_encoder``.

    Raises:
        ValueError: an unknown ``action_space``, a non-positive ``action_dim``, ``value_hidden_sizes`` with
            ``share_encoder=True`` or a non-zero ``log_std_init`` with discrete actions (both would be ignored), a
            non-positive ``lstm_hidden_size`` or ``lstm_layers``.

    Shapes:
        ``forward``: ``x`` ``(B, *obs_shape)`` -> ``logit`` / ``mu`` / ``sigma`` ``(B, action_dim)``, ``value``
        ``(B,)``; extra leading dims (e.g. ``(T, B, ...)``) are kept. With an LSTM: one step ``(B, *obs_shape)`` or
        a time-major sequence ``(T, B, *obs_shape)``.
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
        lstm_hidden_size: Optional[int] = None,
        lstm_layers: int = 1,
    ) -> None:
        super().__init__()
        _check_value_ac_args(action_space, share_encoder, value_hidden_sizes, log_std_init)
        recurrent = lstm_hidden_size is not None
        self.obs_shape = _as_shape(obs_dim, "ValueAC obs_dim")
        self.action_dim = _check_action_dim(action_dim, "ValueAC")
        self.action_space = action_space
        self.share_encoder = bool(share_encoder)
        self.lstm_hidden_size = _positive_int(lstm_hidden_size, "lstm_hidden_size") if recurrent else None
        self.lstm_layers = _positive_int(lstm_layers, "lstm_layers") if recurrent else int(lstm_layers)
        self.encoder: nn.Module = nn.Identity()
        self.policy_net: nn.Module = nn.Identity()
        self.value_net: nn.Module = nn.Identity()
        policy_dim, value_dim = self._build_trunks(hidden_sizes, value_hidden_sizes, activation)
        self.core: Optional[nn.LSTM] = None
        self.value_core: Optional[nn.LSTM] = None
        if recurrent:
            policy_dim = value_dim = self._build_cores(policy_dim, value_dim)
        self.action_head = nn.Linear(policy_dim, self.action_dim)
        self.value_head = nn.Linear(value_dim, 1)
        if action_space == "continuous":
            self.log_std = nn.Parameter(torch.full((self.action_dim,), float(log_std_init)))
        # separate trunks run with their head as one fused MLP (one autograd node each; see fused_mlp)
        self._policy_plan = self._value_plan = None
        if not self.share_encoder and not recurrent:
            policy_fused, value_fused = self.policy_net._fused, self.value_net._fused
            if policy_fused is not None and value_fused is not None:
                self._policy_plan = policy_fused + [(self.action_head, None)]
                self._value_plan = value_fused + [(self.value_head, None)]
        if ortho_init:
            for trunk in (self.encoder, self.policy_net, self.value_net):
                init_orthogonal_(trunk, TRUNK_GAIN)
            init_orthogonal_(self.action_head, ACTION_HEAD_GAIN)
            init_orthogonal_(self.value_head, VALUE_HEAD_GAIN)

    def _build_trunks(
        self, hidden_sizes: Sequence[int], value_hidden_sizes: Optional[Sequence[int]], activation: str
    ) -> Tuple[int, int]:
        """The shared ``encoder``, or the separate ``policy_net`` and ``value_net``; returns their output widths."""
        in_dim = math.prod(self.obs_shape)
        if self.share_encoder:
            self.encoder = MLP(in_dim, hidden_sizes, activation=activation)
            return self.encoder.out_dim, self.encoder.out_dim
        value_sizes = hidden_sizes if value_hidden_sizes is None else value_hidden_sizes
        self.policy_net = MLP(in_dim, hidden_sizes, activation=activation)
        self.value_net = MLP(in_dim, value_sizes, activation=activation)
        return self.policy_net.out_dim, self.value_net.out_dim

    def _build_cores(self, policy_dim: int, value_dim: int) -> int:
        """The LSTM core after the policy (or shared) trunk and, with separate trunks, one after the value trunk;
        PyTorch's default initialisation (as sb3-contrib's RecurrentPPO). Returns the heads' input width."""
        self.core = nn.LSTM(policy_dim, self.lstm_hidden_size, self.lstm_layers)
        if not self.share_encoder:
            self.value_core = nn.LSTM(value_dim, self.lstm_hidden_size, self.lstm_layers)
        return self.lstm_hidden_size

    @property
    def recurrent(self) -> bool:
        """Whether the model has an LSTM core (and so takes and returns a recurrent state)."""
        return self.core is not None

    def forward(
        self, x: Union[torch.Tensor, Mapping[str, Any]], mode: ForwardMode = "compute_action_value"
    ) -> Dict[str, Any]:
        """Action-distribution parameters, state value, or both.

        Args:
            x: Observations; integer inputs are cast to float without scaling. With an LSTM, also
                ``{'obs': observations, 'prev_state': state}`` (what the ``hidden_state`` plugin passes), the state
                before the first step being ``{'h', 'c'}`` of ``(B, R, H)`` or ``None`` (zeros, as a bare
                tensor input).
            mode: ``'compute_action'`` (no value), ``'compute_value'`` (only the value; the policy trunk does not
                run when the trunks are separate) or ``'compute_action_value'``. The LSTM cores run in every mode.

        Returns:
            Discrete: ``{'logit'}``; continuous: ``{'mu', 'sigma'}`` with ``sigma = exp(log_std)`` (a broadcast
            view of ``log_std``); plus ``{'value'}`` unless ``mode='compute_action'``. With an LSTM also
            ``next_state``: ``{'h', 'c'}`` of ``(B, R, H)``, the state after the last step (``R``: see ``state_rows``).

        Raises:
            ValueError: an unknown ``mode``, ``x`` whose trailing dims are not ``obs_shape`` (with an LSTM: not one
                step ``(B, *obs_shape)`` or a sequence ``(T, B, *obs_shape)``), or a ``prev_state`` that does not
                fit the batch.
            TypeError: a dict input to a model without an LSTM.

        Shapes:
            ``x``: ``(B, *obs_shape)``; ``logit``, ``mu``, ``sigma``: ``(B, action_dim)``; ``value``: ``(B,)``.
            With an LSTM, a time-major sequence ``x`` ``(T, B, *obs_shape)`` gives ``(T, B, action_dim)`` and
            ``(T, B)``, every step conditioned on the steps before it.
        """
        _check_mode(mode, "ValueAC")
        if self.core is not None:
            return self._recurrent_forward(x, mode)
        if isinstance(x, Mapping):
            raise TypeError(
                "ValueAC without an LSTM takes an observation tensor, got a dict; set lstm_hidden_size for a "
                "recurrent model"
            )
        _check_trailing_shape(x, self.obs_shape, "ValueAC")
        if not x.is_floating_point():
            x = x.float()
        return self._heads(self.encoder(x.flatten(start_dim=x.dim() - len(self.obs_shape))), mode)

    def _heads(self, features: torch.Tensor, mode: str) -> Dict[str, Any]:
        """The trunks (when separate) and heads of a feed-forward model on the encoder's ``features``."""
        output: Dict[str, Any] = {}
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

    def _recurrent_forward(self, x: Union[torch.Tensor, Mapping[str, Any]], mode: str) -> Dict[str, Any]:
        obs, prev_state = (x["obs"], x.get("prev_state")) if isinstance(x, Mapping) else (x, None)
        one_step = obs.dim() == len(self.obs_shape) + 1
        trailing = tuple(obs.shape[obs.dim() - len(self.obs_shape) :])
        if not (one_step or obs.dim() == len(self.obs_shape) + 2) or trailing != self.obs_shape:
            dims = ", ".join(map(str, self.obs_shape))
            raise ValueError(
                f"ValueAC with an LSTM expects one step (B, {dims}) or a time-major sequence (T, B, {dims}), got "
                f"{tuple(obs.shape)}"
            )
        if not obs.is_floating_point():
            obs = obs.float()
        seq = obs.unsqueeze(0) if one_step else obs
        features = self.encoder(seq.flatten(start_dim=2))
        h0, c0 = self._initial_batch(prev_state, seq.shape[1], features)
        n = self.lstm_layers
        # both cores run in every mode: the state the actor stores must cover the value core too
        policy_out, (h, c) = self.core(self.policy_net(features), (h0[:n], c0[:n]))
        value_out = policy_out
        if self.value_core is not None:
            value_out, (hv, cv) = self.value_core(self.value_net(features), (h0[n:], c0[n:]))
            h, c = torch.cat([h, hv]), torch.cat([c, cv])
        if one_step:
            policy_out, value_out = policy_out.squeeze(0), value_out.squeeze(0)
        output: Dict[str, Any] = {}
        if mode != "compute_value":
            self._action_output(self.action_head(policy_out), output)
        if mode != "compute_action":
            output["value"] = self.value_head(value_out).squeeze(-1)
        output["next_state"] = {"h": h.transpose(0, 1), "c": c.transpose(0, 1)}
        return output

    @property
    def state_rows(self) -> int:
        """Rows of an env's recurrent state: ``lstm_layers`` per core (0 without an LSTM)."""
        if self.core is None:
            return 0
        return self.lstm_layers * (1 if self.value_core is None else 2)

    def initial_state(self, batch_size: Optional[int] = None) -> RecurrentState:
        """The zero state of one env ``{'h', 'c'}`` of ``(R, H)``, or of ``batch_size`` envs, ``(B, R, H)``
        (``R = state_rows``).

        Raises:
            RuntimeError: the model has no LSTM.
        """
        if self.core is None:
            raise RuntimeError("ValueAC.initial_state: the model has no LSTM (lstm_hidden_size is None)")
        shape = (self.state_rows, self.lstm_hidden_size)
        if batch_size is not None:
            shape = (int(batch_size),) + shape
        weight = self.core.weight_hh_l0
        return {"h": weight.new_zeros(shape), "c": weight.new_zeros(shape)}

    def _initial_batch(self, prev_state: Any, batch: int, like: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(h0, c0)`` as the LSTMs take them, ``(R, B, H)``, from a batch-first ``prev_state`` (or None)."""
        expected = (batch, self.state_rows, self.lstm_hidden_size)
        if prev_state is None:
            zeros = like.new_zeros((self.state_rows, batch, self.lstm_hidden_size))
            return zeros, zeros
        if not isinstance(prev_state, Mapping) or set(prev_state) != {"h", "c"}:
            got = sorted(prev_state) if isinstance(prev_state, Mapping) else type(prev_state).__name__
            raise ValueError(
                f"ValueAC prev_state must be None or {{'h', 'c'}} of shape (B, R, H) = {expected}, got {got}"
            )
        h, c = (torch.as_tensor(prev_state[k], dtype=like.dtype, device=like.device) for k in ("h", "c"))
        if h.shape != expected or c.shape != expected:
            raise ValueError(
                f"ValueAC prev_state needs 'h' and 'c' of shape (B, R, H) = {expected} (R = lstm_layers per core), "
                f"got {tuple(h.shape)} and {tuple(c.shape)}"
            )
        return h.transpose(0, 1).contiguous(), c.transpose(0, 1).contiguous()

    def _action_output(self, action_out: torch.Tensor, output: Dict[str, torch.Tensor]) -> None:
        if self.action_space == "discrete":
            output["logit"] = action_out
        else:
            output["mu"] = action_out
            output["sigma"] = self.log_std.exp().expand_as(action_out)


def _check_value_ac_args(
    action_space: str, share_encoder: bool, value_hidden_sizes: Optional[Sequence[int]], log_std_init: float
) -> None:
    """Raise ``ValueError`` for arguments ``ValueAC`` would otherwise ignore or misread."""
    if action_space not in ACTION_SPACES:
        raise ValueError(f"ValueAC action_space must be one of {', '.join(ACTION_SPACES)}, got {action_space!r}")
    if share_encoder and value_hidden_sizes is not None:
        raise ValueError(
            "ValueAC value_hidden_sizes applies only with share_encoder=False; "
            "with a shared trunk both heads read hidden_sizes"
        )
    if action_space == "discrete" and log_std_init != 0.0:
        raise ValueError("ValueAC log_std_init applies only to action_space='continuous'")


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"ValueAC {name} must be a positive int, got {value!r}")
    return value


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
