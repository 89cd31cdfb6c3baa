"""Seating: which slot acts for which seat, one forward per slot per env-manager step, and per-slot episode results.

``Seating`` routes one env-manager step: the acting seat of each env (``obs['to_play']`` in a turn-based env, seat 0
otherwise), then one forward per slot over the envs whose acting seat it holds. A slot's forward is keyed by
``env_id * seat_num + seat`` in a turn-based env (each seat of each env its own trajectory and recurrent state), by
``env_id`` otherwise (so a single-agent actor keys everything by env id, as it always has). With independent learners
(``nervex.worker.actor.agents``) every agent of a simultaneous-move env is a seat of its own, keyed
``env_id * agent_num + agent``, and its slot makes one forward over every alive agent of every env.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from nervex.envs import team_value

from .agents import AgentSplit
from .figures import episode_stats
from .slots import Slot, assign_seats, build_act_only, parse_slots, seat_names

Output = Dict[str, Any]
LearnSlotFactory = Callable[[str, np.random.Generator, Optional[Tuple[Any, ...]]], Slot]
"""Makes a learning slot from its name, its generator and (independent learners) each agent's action space."""


def build_seating(
    section: Optional[Mapping[str, Any]],
    env_info: Any,
    learn_slot: LearnSlotFactory,
    seed: int,
    eval_mode: Optional[Callable[[], Any]] = None,
) -> Seating:
    """The slots of ``actor.slots`` for this env, seated.

    Args:
        section: ``actor.slots`` (None: one learning slot for every seat).
        env_info: The env's ``BaseEnvInfo`` (seats, ``turn_based``, ``team_reward``, the action space).
        learn_slot: Makes a learning slot from its name, generator and agent spaces (the actor's collect mode, the
            evaluator's eval mode).
        seed: Slot ``i`` (in config order) draws its random actions from ``np.random.default_rng([seed, i])``.
        eval_mode: Makes a fresh eval-mode policy for a snapshot slot.

    Raises:
        ConfigError: the slots do not fit the env (``assign_seats``), or ``independent: true`` on an env whose agents
            cannot be split (``AgentSplit``).
    """
    specs = parse_slots(section)
    seat_slots = assign_seats(specs, env_info)
    split: Optional[AgentSplit] = None
    slots: Dict[str, Slot] = {}
    for i, spec in enumerate(specs):
        rng = np.random.default_rng([int(seed), i])
        if spec.learns:
            if spec.independent:
                split = AgentSplit(env_info, spec.agent_reward, spec.agent_obs, f"actor.slots.{spec.name}")
            slots[spec.name] = learn_slot(spec.name, rng, split.spaces if spec.independent else None)
        else:
            slots[spec.name] = build_act_only(spec, env_info.act_space, rng, eval_mode)
    return Seating(slots, seat_slots, env_info.turn_based, env_info.team_reward, seat_names(env_info), split)


@dataclass
class EpisodeResult:
    """What one episode of one env ended with.

    Attributes:
        env_id: The env that played it.
        length: Its env steps (every seat's moves).
        returns: The return per slot (a slot of several seats: the env's team reduction of theirs).
        outcomes: Games: the outcome per slot (+1 win, 0 draw, -1 loss) where its seats share one; else empty.
        agent_returns: A simultaneous-move env of several agents: each agent's return, by agent id; else empty.
        stats: The env's ``info['episode_stats']`` (finite floats, by name); empty when it reports none.
    """

    env_id: int
    length: int
    returns: Dict[str, float]
    outcomes: Dict[str, int] = field(default_factory=dict)
    agent_returns: Dict[str, float] = field(default_factory=dict)
    stats: Dict[str, float] = field(default_factory=dict)


class Seating:
    """Which slot acts for which seat, one forward per slot per step, and per-slot episode results.

    Args:
        slots: The slots by name, in config order (the first learning slot is the one ``rollout/`` figures follow).
        seat_slots: The slot name of every seat, in seat order (``assign_seats``).
        turn_based: One seat acts per step (``obs['to_play']``); else the slot of seat 0 acts for the whole env.
        team_reward: How a slot of several seats reduces their returns (``'sum'`` | ``'mean'``).
        seat_ids: The seats' names (``agent_ids``); default ``'0'``, ``'1'``...
        split: Independent learners: how an env step splits by agent (every agent its own seat and key).
    """

    def __init__(
        self,
        slots: Mapping[str, Slot],
        seat_slots: Sequence[str],
        turn_based: bool,
        team_reward: str = "sum",
        seat_ids: Sequence[str] = (),
        split: Optional[AgentSplit] = None,
    ) -> None:
        unknown = [name for name in seat_slots if name not in slots]
        if unknown:
            raise ValueError(f"seats assigned to unknown slot(s) {unknown}; slots: {list(slots)}")
        self.slots = dict(slots)
        self.seat_slots = tuple(seat_slots)
        self.seat_num = len(self.seat_slots)
        self.seat_ids = tuple(seat_ids) or tuple(str(i) for i in range(self.seat_num))
        self.turn_based = bool(turn_based)
        self.team_reward = team_reward
        self.split = split
        self.cooperative = not self.turn_based and self.seat_num > 1  # per-agent returns are logged
        self._per_seat = self.turn_based or split is not None  # every seat its own key
        self._stride = self.seat_num if self._per_seat else 1
        self.learning = [slot for slot in self.slots.values() if slot.learns]
        if not self.learning:
            raise ValueError(f"no learning slot among {list(slots)}")
        self.main = self.learning[0].name
        self._seats_of = {name: [s for s, n in enumerate(self.seat_slots) if n == name] for name in self.slots}

    def describe(self) -> str:
        """One line for the run's log: each slot's kind and seats, and how a slot of several seats adds up rewards.

        Example:
            ``slots: main (learn) seats [0]; opponent (random) seats [1]; turn-based``
        """
        parts = [f"{name} ({slot.kind}) seats {self._seats_of[name]}" for name, slot in self.slots.items()]
        text = "slots: " + "; ".join(parts) + ("; turn-based" if self.turn_based else "")
        if self.split is not None:
            text += "; " + self.split.describe()
        if any(len(seats) > 1 for seats in self._seats_of.values()):
            text += f"; a slot's reward and return are the {self.team_reward} over its seats (env team_reward)"
        return text

    def key(self, env_id: int, seat: int) -> int:
        """The key a seat's trajectory, Adder buffer and recurrent state have (``env_id`` unless turn-based or
        independent learners)."""
        return env_id * self._stride + seat

    def acting_seat(self, obs: Any) -> int:
        """The seat that acts on ``obs``: its ``to_play`` in a turn-based env, else 0 (one slot acts for all)."""
        if not self.turn_based:
            return 0
        seat = int(obs["to_play"])
        if not 0 <= seat < self.seat_num:
            raise ValueError(f"obs['to_play'] is {seat}; the env has seats 0..{self.seat_num - 1}")
        return seat

    def slot_of(self, seat: int) -> Slot:
        return self.slots[self.seat_slots[seat]]

    def learning_keys(self, env_id: int) -> List[Tuple[int, int]]:
        """``[(seat, key)]`` of the env's seats whose slot learns (one entry, seat 0, unless every seat has its own
        key: turn-based, independent learners)."""
        seats = range(self.seat_num) if self._per_seat else [0]
        return [(seat, self.key(env_id, seat)) for seat in seats if self.slot_of(seat).learns]

    def act(
        self, obs: Mapping[int, Any], setting: Mapping[str, Any], random_action: bool = False
    ) -> Dict[int, Tuple[int, Output]]:
        """One forward per slot over the envs whose acting seat it holds: ``{env_id: (seat, output)}``.

        ``setting`` and ``random_action`` (the warm-up) reach the learning slots only. With independent learners
        the output is the joint action, with every agent's output under ``'agents'`` (``AgentSplit.join``).
        """
        if self.split is not None:
            return self._act_per_agent(obs, setting, random_action)
        groups: Dict[str, Dict[int, Tuple[int, int]]] = {name: {} for name in self.slots}
        for env_id, o in obs.items():
            seat = self.acting_seat(o)
            groups[self.seat_slots[seat]][self.key(env_id, seat)] = (env_id, seat)
        out: Dict[int, Tuple[int, Output]] = {}
        for name, members in groups.items():
            if not members:
                continue
            slot = self.slots[name]
            keys = list(members)
            data = {k: obs[members[k][0]] for k in keys}
            learns = slot.learns
            outputs = slot.act(keys, data, setting if learns else {}, random_action and learns)
            for k, (env_id, seat) in members.items():
                out[env_id] = (seat, outputs[k])
        return out

    def _act_per_agent(
        self, obs: Mapping[int, Any], setting: Mapping[str, Any], random_action: bool
    ) -> Dict[int, Tuple[int, Output]]:
        """Independent learners: one forward of the (one, learning) slot over every alive agent of every env."""
        split, slot = self.split, self.slot_of(0)
        members: Dict[int, Tuple[int, int]] = {}
        data: Dict[int, Any] = {}
        for env_id, o in obs.items():
            for agent in np.flatnonzero(split.alive(o)).tolist():
                key = self.key(env_id, agent)
                members[key], data[key] = (env_id, agent), split.agent_obs(o, agent)
        outputs = slot.act(list(members), data, setting, random_action) if members else {}
        per_env: Dict[int, Dict[int, Output]] = {env_id: {} for env_id in obs}
        for key, (env_id, agent) in members.items():
            per_env[env_id][agent] = outputs[key]
        return {env_id: (0, split.join(obs[env_id], per_env[env_id])) for env_id in obs}

    def reset(self, env_ids: Optional[Sequence[int]]) -> None:
        """Reset every slot's recurrent state for these envs (None: all)."""
        for name, slot in self.slots.items():
            if env_ids is None:
                slot.reset(None)
                continue
            seats = self._seats_of[name] if self._per_seat else [0]
            slot.reset([self.key(env_id, seat) for env_id in env_ids for seat in seats])

    def result(self, env_id: int, info: Mapping[str, Any]) -> EpisodeResult:
        """The episode's result from the env's final ``info`` (``episode_return``, ``episode_len``, ``outcome``,
        ``episode_stats``)."""
        returns: Dict[str, float] = {}
        per_seat = np.asarray(info["episode_return"], dtype=np.float64)
        for name, seats in self._seats_of.items():
            if per_seat.ndim == 0:
                returns[name] = float(per_seat)
            else:
                returns[name] = team_value(per_seat[seats], self.team_reward)
        agent_returns: Dict[str, float] = {}
        if self.cooperative and per_seat.shape == (self.seat_num,):
            agent_returns = {agent: float(value) for agent, value in zip(self.seat_ids, per_seat)}
        length = int(info.get("episode_len", 0))
        return EpisodeResult(
            env_id, length, returns, self._outcomes(env_id, info), agent_returns, episode_stats(info, env_id)
        )

    def _outcomes(self, env_id: int, info: Mapping[str, Any]) -> Dict[str, int]:
        outcomes: Dict[str, int] = {}
        if info.get("outcome") is not None:
            outcome = np.asarray(info["outcome"]).reshape(-1)
            if not np.isin(outcome, (-1, 0, 1)).all():
                raise ValueError(
                    f"env {env_id}: info['outcome'] must hold +1, 0 or -1 per seat, got {outcome.tolist()}"
                )
            for name, seats in self._seats_of.items():
                values = {int(outcome[s]) for s in seats} if len(outcome) == self.seat_num else set()
                if len(values) == 1:
                    outcomes[name] = values.pop()
        return outcomes


__all__ = ["EpisodeResult", "Seating", "build_seating", "LearnSlotFactory"]
