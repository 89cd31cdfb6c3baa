"""Transitions of the seats of a turn-based env: each runs from a seat's decision to its next one.

In a turn-based env (board games) one seat acts per step and every step may reward every seat (a loss is known only
when the opponent has moved). A learning seat's transition therefore starts at its decision (the observation it
acted on and the action) and ends at its next decision, or at the episode's end, with the seat's rewards of every
step in between summed. ``OpenDecisions`` holds those transitions while they are open; ``seat_timesteps`` turns one
env step into the seat timesteps it completes, which the policy's ``process_transition`` takes as it takes an env's
timestep.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from nervex.envs import BaseEnvTimestep

Decision = Tuple[int, Any, Dict[str, Any], BaseEnvTimestep]
"""A completed decision: ``(seat, obs acted on, policy output, the seat's timestep)``."""


class OpenDecisions:
    """Per env and learning seat: the decision waiting for the seat's next observation, and its summed reward."""

    def __init__(self) -> None:
        self._open: Dict[int, Dict[int, List[Any]]] = {}  # env_id -> {seat: [obs, output, reward]}

    def open(self, env_id: int, seat: int, obs: Any, output: Dict[str, Any]) -> None:
        self._open.setdefault(env_id, {})[seat] = [obs, output, 0.0]

    def add_rewards(self, env_id: int, rewards: np.ndarray) -> None:
        """Add this step's reward of every seat with an open decision in ``env_id``."""
        for seat, entry in self._open.get(env_id, {}).items():
            entry[2] += float(rewards[seat])

    def close(self, env_id: int, seat: int) -> Optional[Tuple[Any, Dict[str, Any], float]]:
        """The seat's open decision ``(obs, output, summed reward)``, removed; None when it has none."""
        entry = self._open.get(env_id, {}).pop(seat, None)
        return None if entry is None else (entry[0], entry[1], entry[2])

    def drop(self, env_id: Optional[int] = None) -> None:
        """Forget the open decisions of an env (None: of every env): a crashed env, a reset, a rollout's end."""
        if env_id is None:
            self._open.clear()
        else:
            self._open.pop(env_id, None)

    def seats(self, env_id: int) -> List[int]:
        return sorted(self._open.get(env_id, {}))


def seat_rewards(reward: Any, seat_num: int) -> np.ndarray:
    """A step's reward per seat (a turn-based env's reward is an array shaped ``(seat_num,)``)."""
    rewards = np.asarray(reward, dtype=np.float64).reshape(-1)
    if rewards.shape != (seat_num,):
        raise ValueError(
            f"a turn-based env's reward must hold one value per seat ({seat_num}), got shape {np.shape(reward)}"
        )
    return rewards


def seat_timesteps(
    decisions: OpenDecisions,
    env_id: int,
    seat: int,
    obs: Any,
    output: Dict[str, Any],
    timestep: BaseEnvTimestep,
    learning_seats: Tuple[int, ...],
    next_seat: Optional[int],
    seat_num: int,
) -> List[Decision]:
    """Record one env step of a turn-based env and return the learning seats' decisions it completes.

    Args:
        decisions: The open decisions (updated in place).
        env_id, seat, obs, output: Who acted, on what, with which policy output.
        timestep: The env's timestep (``reward`` per seat).
        learning_seats: The seats whose slot learns (only their decisions are kept).
        next_seat: The seat that acts on ``timestep.obs`` (None when the episode ended).
        seat_num: The env's seats.

    Returns:
        ``[(seat, obs, output, seat_timestep)]``: at the episode's end every open decision (the final observation as
        ``next_obs``, ``done`` and the env's ``terminated``/``truncated``), else the next seat's (its new observation
        as ``next_obs``, not done). A seat timestep's reward is the seat's summed reward.
    """
    if seat in learning_seats:
        decisions.open(env_id, seat, obs, output)
    decisions.add_rewards(env_id, seat_rewards(timestep.reward, seat_num))
    closing = decisions.seats(env_id) if timestep.done else [s for s in (next_seat,) if s in learning_seats]
    info = timestep.info if timestep.done else {"terminated": False, "truncated": False}
    completed: List[Decision] = []
    for s in closing:
        entry = decisions.close(env_id, s)
        if entry is not None:
            acted_on, acted, reward = entry
            completed.append((s, acted_on, acted, BaseEnvTimestep(timestep.obs, reward, timestep.done, info)))
    return completed


__all__ = ["OpenDecisions", "Decision", "seat_rewards", "seat_timesteps"]
