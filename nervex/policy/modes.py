"""The four mode interfaces of a policy: what the learner, actor, evaluator and trainer may call.

Each is a named tuple of bound functions, so a process can be handed one mode without the others; every member is
used by a worker (``tests/entry/test_mode_members.py``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional

import torch

MODES = ("learn", "collect", "eval", "command")
Output = Dict[str, Any]


class LearnMode(NamedTuple):
    """What a learner uses: ``forward(batch, **setting) -> figures`` (a gradient step) and the policy's state."""

    forward: Callable[..., Output]
    state_dict: Callable[[], Dict[str, Any]]
    load_state_dict: Callable[[Mapping[str, Any]], None]
    optimizers: Callable[[], Dict[str, torch.optim.Optimizer]]


class CollectMode(NamedTuple):
    """What an actor uses.

    ``forward(data_id, {env_id: obs}, **setting) -> {env_id: output}``; ``process_transition(obs, output, timestep)``
    builds one transition; ``adder`` (``nervex.rl_utils.Adder``, or a ``TrajectoryAdder`` over the policy's own
    ``_get_train_sample``) owns the trajectories and turns transitions into train samples (``add_first / add /
    flush``); ``bootstrap`` (None when the policy needs none) evaluates observations that are not acted on (the last
    of a rollout, the final one of a truncated episode) in one batched call.
    """

    forward: Callable[..., Dict[int, Output]]
    process_transition: Callable[[Any, Output, Any], Dict[str, Any]]
    adder: Any
    bootstrap: Optional[Callable[[List[int], Mapping[int, Any]], Dict[int, Output]]]
    reset: Callable[[Optional[List[int]]], None]
    load_state_dict: Callable[[Mapping[str, Any]], None]


class EvalMode(NamedTuple):
    """What an evaluator uses: ``forward(data_id, {env_id: obs}, **setting) -> {env_id: output}`` (greedy)."""

    forward: Callable[..., Dict[int, Output]]
    reset: Callable[[Optional[List[int]]], None]
    load_state_dict: Callable[[Mapping[str, Any]], None]


class CommandMode(NamedTuple):
    """What a trainer uses to steer the other modes from progress (``env_step``, ``train_iter``...)."""

    get_setting_collect: Callable[[Dict[str, Any]], Dict[str, Any]]
    get_setting_learn: Callable[[Dict[str, Any]], Dict[str, Any]]
    get_setting_eval: Callable[[Dict[str, Any]], Dict[str, Any]]
