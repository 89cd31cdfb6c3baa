"""DRQN: a Q-network with a recurrent core, acting one step at a time and learning on sequences (R2D2)."""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nervex.torch_utils import MLP
from nervex.torch_utils.network import nature_cnn, pixels_to_float
from nervex.utils import MODEL_REGISTRY

from .discrete_net import _as_shape
from .head import DiscreteHead

State = Dict[str, torch.Tensor]
_RNNS = {"lstm": (nn.LSTM, ("h", "c")), "gru": (nn.GRU, ("h",))}


class DRQN(nn.Module):
    """Deep recurrent Q-network (Hausknecht & Stone 2015) as used by R2D2 (Kapturowski et al. 2019).

    encoder (an MLP for vector observations, the Nature-DQN CNN for ``(C, H, W)`` images) -> LSTM or GRU ->
    Q-value head (dueling by default). The same weights serve both calls:

    - one step, for acting: ``forward({'obs': (B, *obs_shape), 'prev_state': state})``;
    - a sequence, for learning: ``forward({'obs': (T, B, *obs_shape), 'prev_state': state}, sequence=True)``,
      **time-major** like every sequence in nervex (a replay batch ``(B, T, ...)`` is transposed by the policy).

    The recurrent state is a dict with the **batch axis first**: ``{'h': (B, num_layers, hidden_size),
    'c': (B, num_layers, hidden_size)}`` for an LSTM, ``{'h': ...}`` for a GRU. That is the layout the
    ``hidden_state`` agent plugin stacks and splits per env and the replay buffer batches; the model moves the layer
    axis in front for torch's RNN. ``initial_state()`` is the zero state (``prev_state`` None means it too).

    Args:
        obs_shape: Observation size or shape: one dimension for the MLP encoder, ``(C, H, W)`` for the CNN.
        action_dim: Number of actions.
        encoder_hidden_sizes: Widths of the MLP encoder's layers; for images a single width, the CNN's FC layer.
        hidden_size: Width of the recurrent state.
        rnn: ``'lstm'`` or ``'gru'``.
        num_layers: Stacked recurrent layers.
        dueling: Use the dueling head, ``Q = V + A - mean_a(A)``.
        activation: The MLP encoder's activation.

    Shapes:
        one step: ``obs`` ``(B, *obs_shape)`` -> ``logit`` ``(B, action_dim)``, ``next_state`` leaves
        ``(B, num_layers, hidden_size)``. Sequence: ``obs`` ``(T, B, *obs_shape)`` -> ``logit``
        ``(T, B, action_dim)``, ``next_state`` the state after the last step (after step ``lengths[b] - 1`` of
        sample ``b`` when ``lengths`` is given).
    """

    def __init__(
        self,
        obs_shape: Union[int, Sequence[int]],
        action_dim: int,
        encoder_hidden_sizes: Sequence[int] = (128,),
        hidden_size: int = 128,
        rnn: str = "lstm",
        num_layers: int = 1,
        dueling: bool = True,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        self.obs_shape = _as_shape(obs_shape, "DRQN obs_shape")
        if rnn not in _RNNS:
            raise ValueError(f"DRQN rnn must be one of {sorted(_RNNS)}, got {rnn!r}")
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"DRQN num_layers must be a positive int, got {num_layers!r}")
        sizes = [int(s) for s in encoder_hidden_sizes]
        if not sizes:
            raise ValueError("DRQN encoder_hidden_sizes must name at least one layer width")
        if len(self.obs_shape) == 3:
            if len(sizes) != 1:
                raise ValueError(
                    f"DRQN on images (obs_shape {self.obs_shape}) takes one encoder width (the CNN's FC layer), "
                    f"got encoder_hidden_sizes={sizes}"
                )
            self.encoder: nn.Module = nature_cnn(self.obs_shape, sizes[0], owner="DRQN")
            self._image = True
        elif len(self.obs_shape) == 1:
            self.encoder = MLP(math.prod(self.obs_shape), sizes, activation=activation)
            self._image = False
        else:
            raise ValueError(f"DRQN obs_shape must be (D,) or (C, H, W), got {self.obs_shape}")
        rnn_cls, self.state_keys = _RNNS[rnn]
        self.rnn_type = rnn
        self.num_layers = num_layers
        self.hidden_size = int(hidden_size)
        self.rnn = rnn_cls(sizes[-1], self.hidden_size, num_layers=num_layers)
        self.head = DiscreteHead(self.hidden_size, action_dim, dueling=dueling)

    def initial_state(self, batch_size: Optional[int] = None) -> State:
        """The zero state on the model's device: leaves ``(num_layers, hidden_size)``, or with ``batch_size``
        ``(batch_size, num_layers, hidden_size)``. ``init_fn`` of the ``hidden_state`` plugin."""
        shape = (
            (self.num_layers, self.hidden_size)
            if batch_size is None
            else (batch_size, self.num_layers, self.hidden_size)
        )
        device = next(self.parameters()).device
        return {key: torch.zeros(shape, device=device) for key in self.state_keys}

    def _encode(self, obs: torch.Tensor) -> torch.Tensor:
        obs = pixels_to_float(obs) if self._image else (obs if obs.is_floating_point() else obs.float())
        leading = obs.shape[: obs.dim() - len(self.obs_shape)]
        flat = obs.reshape(-1, *self.obs_shape) if self._image else obs.reshape(-1, self.obs_shape[0])
        features = self.encoder(flat)
        return features.reshape(*leading, features.shape[-1])

    def _rnn_state(self, prev_state: Optional[Mapping[str, torch.Tensor]], batch: int, device: torch.device) -> Any:
        """Batch-first state dict -> what torch's RNN takes: ``(h, c)`` or ``h``, each ``(num_layers, B, H)``."""
        if prev_state is None:
            prev_state = self.initial_state(batch)
        if not isinstance(prev_state, Mapping) or set(prev_state) != set(self.state_keys):
            got = sorted(prev_state) if isinstance(prev_state, Mapping) else type(prev_state).__name__
            raise ValueError(
                f"DRQN ({self.rnn_type}) prev_state must be a dict with keys {list(self.state_keys)}, got {got}"
            )
        expected = (batch, self.num_layers, self.hidden_size)
        leaves = []
        for key in self.state_keys:
            leaf = torch.as_tensor(prev_state[key])
            if tuple(leaf.shape) != expected:
                raise ValueError(
                    f"DRQN prev_state['{key}'] has shape {tuple(leaf.shape)}, expected {expected} "
                    "(batch, num_layers, hidden_size): the batch axis comes first"
                )
            leaves.append(leaf.to(device=device, dtype=torch.float32).transpose(0, 1).contiguous())
        return tuple(leaves) if self.rnn_type == "lstm" else leaves[0]

    def _state_dict_of(self, rnn_state: Any) -> State:
        leaves = rnn_state if self.rnn_type == "lstm" else (rnn_state,)
        return {key: leaf.transpose(0, 1) for key, leaf in zip(self.state_keys, leaves)}

    def forward(self, data: Mapping[str, Any], sequence: bool = False) -> Dict[str, Any]:
        """Q-values and the next recurrent state.

        Args:
            data: ``{'obs': ..., 'prev_state': state or None}``; with ``sequence`` also optional ``'lengths'``
                ``(B,)``: sample ``b`` is run for its first ``lengths[b]`` steps only (0 leaves its state as it
                was; its ``logit`` past its length is not meaningful).
            sequence: ``obs`` is a time-major sequence ``(T, B, *obs_shape)`` instead of one step.

        Returns:
            ``{'logit': Q-values, 'next_state': the state after the (last) step}``.

        Raises:
            ValueError: ``obs`` or ``prev_state`` has the wrong shape, or ``lengths`` without ``sequence``.
        """
        if not isinstance(data, Mapping) or "obs" not in data:
            got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(f"DRQN takes a dict {{'obs': ..., 'prev_state': ...}}, got {got}")
        obs = data["obs"]
        lead = 2 if sequence else 1
        if obs.dim() != lead + len(self.obs_shape) or tuple(obs.shape[lead:]) != self.obs_shape:
            layout = "(T, B, " if sequence else "(B, "
            raise ValueError(
                f"DRQN expects obs of shape {layout}{', '.join(map(str, self.obs_shape))}), got {tuple(obs.shape)}"
                + ("" if sequence else "; pass sequence=True for a time-major sequence")
            )
        features = self._encode(obs)
        if not sequence:
            features = features.unsqueeze(0)
        batch = features.shape[1]
        state = self._rnn_state(data.get("prev_state"), batch, features.device)
        lengths = data.get("lengths")
        if lengths is not None:
            if not sequence:
                raise ValueError("DRQN: 'lengths' applies to a sequence; pass sequence=True")
            out, state = self._run_lengths(features, state, lengths)
        else:
            out, state = self.rnn(features, state)
        logit = self.head(out if sequence else out[0])
        return {"logit": logit, "next_state": self._state_dict_of(state)}

    def _run_lengths(self, features: torch.Tensor, state: Any, lengths: Any) -> Any:
        """Run each sample for its own number of steps (a packed sequence); samples of length 0 keep their state."""
        steps, batch = features.shape[:2]
        lengths = torch.as_tensor(lengths, dtype=torch.long).cpu()
        if lengths.shape != (batch,) or bool((lengths < 0).any()) or bool((lengths > steps).any()):
            raise ValueError(f"DRQN lengths must be (B,) = ({batch},) ints in [0, {steps}], got {lengths.tolist()}")
        out = features.new_zeros(steps, batch, self.hidden_size)
        run = (lengths > 0).nonzero().squeeze(1)
        if len(run) == 0:
            return out, state
        leaves = state if self.rnn_type == "lstm" else (state,)
        index = run.to(features.device)
        packed = pack_padded_sequence(features[:, index], lengths[run], enforce_sorted=False)
        sub_state = tuple(leaf[:, index].contiguous() for leaf in leaves)
        packed_out, sub_next = self.rnn(packed, sub_state if self.rnn_type == "lstm" else sub_state[0])
        sub_out, _ = pad_packed_sequence(packed_out, total_length=steps)
        out[:, index] = sub_out
        sub_next = sub_next if self.rnn_type == "lstm" else (sub_next,)
        merged = []
        for leaf, new in zip(leaves, sub_next):
            leaf = leaf.clone()
            leaf[:, index] = new
            merged.append(leaf)
        return out, (tuple(merged) if self.rnn_type == "lstm" else merged[0])


MODEL_REGISTRY.register("drqn", DRQN)
