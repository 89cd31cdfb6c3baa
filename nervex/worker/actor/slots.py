"""Player slots: who acts for which seat of an env, and what an episode's result is per slot.

An actor acts for a mapping of *slots*, configured in the ``actor`` section::

    actor:
      slots:                                   # default: {main: {kind: learn, seats: all}}
        main: {kind: learn, seats: [0]}        # the policy's collect mode and its Adder: its transitions are samples
        opponent: {kind: random, seats: [1]}   # act-only: random | snapshot (path) | callable (fn: 'module:function')

Every seat of the env (an index into ``BaseEnvInfo.agent_ids``, or the id itself) belongs to exactly one slot, and
at least one slot learns. A single-agent env has one seat, so the default is one learning slot and nothing changes.

- ``learn``: the policy's collect mode (the evaluator: its eval mode); a random warm-up draws a legal action instead.
- ``random``: a uniformly random legal action (``nervex.envs.sample_action`` under the observation's mask).
- ``snapshot``: the eval mode of a policy loaded from a checkpoint (``path``) or from a state dict
  (``SerialActor.load_slot``: the parallel actor loads a task's opponent so).
- ``callable``: a user function ``fn(obs) -> action``, imported from ``'module:function'``.

A learning slot of a simultaneous-move env of several agents may act for each agent on its own (independent
learners with shared parameters, ``nervex.worker.actor.agents``)::

    actor:
      slots:
        main: {kind: learn, seats: all, independent: true}   # agent_reward: own | team, agent_obs: auto | row

``nervex.worker.actor.seating.Seating`` routes one env-manager step through the slots.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import gymnasium as gym
import numpy as np

from nervex.config import ConfigError, suggest_choice
from nervex.envs import sample_action

from .agents import AGENT_OBS, AGENT_REWARDS

Output = Dict[str, Any]
SLOT_KINDS = ("learn", "random", "snapshot", "callable")
SLOT_KEYS: Dict[str, Tuple[str, ...]] = {
    "learn": ("kind", "seats", "independent", "agent_reward", "agent_obs"),
    "random": ("kind", "seats"),
    "snapshot": ("kind", "seats", "path"),
    "callable": ("kind", "seats", "fn"),
}
DEFAULT_SLOTS: Dict[str, Dict[str, Any]] = {"main": {"kind": "learn", "seats": "all"}}
OUTCOME_NAMES = {1: "win", 0: "draw", -1: "loss"}


# ---- the config ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SlotSpec:
    """One slot of ``actor.slots`` as written: its name, kind, seats (``'all'`` or a tuple) and kind's options
    (``independent``, ``agent_reward``, ``agent_obs``: a learning slot's per-agent trajectories)."""

    name: str
    kind: str
    seats: Union[str, Tuple[Union[int, str], ...]]
    path: Optional[str] = None
    fn: Optional[str] = None
    independent: bool = False
    agent_reward: str = "own"
    agent_obs: str = "auto"

    @property
    def learns(self) -> bool:
        return self.kind == "learn"


def _parse_slot(name: str, entry: Any, where: str) -> SlotSpec:
    path = f"actor.slots.{name}"
    if not isinstance(entry, Mapping):
        raise ConfigError(f"key '{path}'{where} expects a mapping like {{kind: learn, seats: [0]}}, got {entry!r}")
    kind = entry.get("kind")
    if kind not in SLOT_KINDS:
        raise ConfigError(
            f"key '{path}.kind'{where} is {kind!r}; {suggest_choice(kind, SLOT_KINDS)} (kinds: {SLOT_KINDS})"
        )
    for key in entry:
        if key not in SLOT_KEYS[kind]:
            raise ConfigError(
                f"unknown key '{path}.{key}'{where} for a slot of kind '{kind}'; {suggest_choice(key, SLOT_KEYS[kind])}"
            )
    seats = entry.get("seats", "all")
    if isinstance(seats, (int, str)) and not isinstance(seats, bool):
        seats = "all" if seats == "all" else (seats,)
    elif isinstance(seats, (list, tuple)) and seats and all(isinstance(s, (int, str)) for s in seats):
        seats = tuple(seats)
    else:
        raise ConfigError(f"key '{path}.seats'{where} expects 'all' or a non-empty list of seats, got {seats!r}")
    if kind == "callable" and not (isinstance(entry.get("fn"), str) and ":" in entry["fn"]):
        raise ConfigError(f"key '{path}.fn'{where} must name a function as 'module:function', got {entry.get('fn')!r}")
    if kind == "snapshot" and entry.get("path") is not None and not isinstance(entry["path"], str):
        raise ConfigError(f"key '{path}.path'{where} must be a checkpoint file (a string), got {entry['path']!r}")
    independent = _parse_independent(entry, path, where)
    return SlotSpec(str(name), kind, seats, entry.get("path"), entry.get("fn"), *independent)


def _parse_independent(entry: Mapping[str, Any], path: str, where: str) -> Tuple[bool, str, str]:
    """A learning slot's ``independent``, ``agent_reward`` and ``agent_obs`` (the last two need the first)."""
    independent = entry.get("independent", False)
    if not isinstance(independent, bool):
        raise ConfigError(f"key '{path}.independent'{where} expects true or false, got {independent!r}")
    options = []
    for key, valid, default in (("agent_reward", AGENT_REWARDS, "own"), ("agent_obs", AGENT_OBS, "auto")):
        value = entry.get(key, default)
        if key in entry and not independent:
            raise ConfigError(
                f"key '{path}.{key}'{where} applies to independent learners only; add '{path}.independent: true' or "
                "drop it"
            )
        if value not in valid:
            raise ConfigError(f"key '{path}.{key}'{where} is {value!r}; {suggest_choice(value, valid)}")
        options.append(value)
    return independent, options[0], options[1]


def parse_slots(section: Optional[Mapping[str, Any]], where: str = "") -> List[SlotSpec]:
    """The slots of ``actor.slots`` (None: one learning slot for every seat), checked without the env.

    Raises:
        ConfigError: an unknown kind or key (with the nearest valid one), seats that are not a list, a callable
            without ``fn``, or no learning slot; the message names the dotted key.
    """
    section = DEFAULT_SLOTS if section is None else section
    if not isinstance(section, Mapping) or not section:
        raise ConfigError(f"key 'actor.slots'{where} expects a mapping of slot names, got {section!r}")
    specs = [_parse_slot(name, entry, where) for name, entry in section.items()]
    if not any(spec.learns for spec in specs):
        raise ConfigError(
            f"key 'actor.slots'{where} has no learning slot ({', '.join(s.name for s in specs)}); give one slot "
            "kind: learn"
        )
    return specs


def check_slots(cfg: Mapping[str, Any], where: str = "") -> None:
    """A ``ConfigParts`` check: ``actor.slots`` is well formed (seats are checked against the env when built)."""
    parse_slots((cfg.get("actor") or {}).get("slots"), where)


def seat_names(env_info: Any) -> Tuple[str, ...]:
    """The env's seats by name: its ``agent_ids``, or ``('0',)`` ... for an env that declares none."""
    ids = tuple(getattr(env_info, "agent_ids", ()) or ())
    return ids if ids else tuple(str(i) for i in range(max(1, int(env_info.agent_num))))


def assign_seats(specs: Sequence[SlotSpec], env_info: Any, where: str = "") -> Tuple[str, ...]:
    """The slot name of every seat of the env, in seat order.

    Raises:
        ConfigError: a seat the env does not have, a seat in two slots or in none, or the agents of a
            simultaneous-move env split across slots.
    """
    names = seat_names(env_info)
    owner: Dict[int, str] = {}
    for spec in specs:
        seats = range(len(names)) if spec.seats == "all" else spec.seats
        for seat in seats:
            index = _seat_index(seat, names, f"actor.slots.{spec.name}.seats", where)
            if index in owner:
                raise ConfigError(
                    f"key 'actor.slots.{spec.name}.seats'{where}: seat {names[index]!r} already belongs to slot "
                    f"'{owner[index]}'; every seat belongs to exactly one slot"
                )
            owner[index] = spec.name
    missing = [names[i] for i in range(len(names)) if i not in owner]
    if missing:
        raise ConfigError(f"key 'actor.slots'{where}: no slot acts for seat(s) {missing} of the env's seats {names}")
    by_seat = tuple(owner[i] for i in range(len(names)))
    if len(set(by_seat)) > 1 and not getattr(env_info, "turn_based", False):
        raise ConfigError(
            f"key 'actor.slots'{where}: this env's agents {names} act simultaneously; one slot must act for all of "
            "them (splitting a simultaneous-move env's agents across slots is not supported)"
        )
    return by_seat


def _seat_index(seat: Union[int, str], names: Tuple[str, ...], path: str, where: str) -> int:
    if isinstance(seat, int) and 0 <= seat < len(names):
        return seat
    if isinstance(seat, str) and seat in names:
        return names.index(seat)
    raise ConfigError(
        f"key '{path}'{where} names seat {seat!r}; the env's seats are 0..{len(names) - 1} or the ids {list(names)}"
    )


def import_function(spec: str, path: str) -> Callable[[Any], Any]:
    """The function ``'module:function'`` names (a callable slot's ``fn``, from the local config file)."""
    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"key '{path}' names {spec!r}, which cannot be imported: {error}") from None
    if not callable(fn):
        raise ConfigError(f"key '{path}' names {spec!r}, which is not callable")
    return fn


# ---- slots at run time --------------------------------------------------------------------------------------------
def action_mask(obs: Any) -> Optional[np.ndarray]:
    """The observation's ``action_mask`` (1 = legal), or None when it has none."""
    if isinstance(obs, Mapping) and "action_mask" in obs:
        return np.asarray(obs["action_mask"])
    return None


class Slot:
    """A player: acts for its seats, one forward per env-manager step over the envs (keys) it acts in.

    Args:
        name: The slot's name in ``actor.slots``.
        kind: One of ``SLOT_KINDS``.
    """

    def __init__(self, name: str, kind: str) -> None:
        self.name = name
        self.kind = kind

    @property
    def learns(self) -> bool:
        """Whether this slot plays a learning slot's seats (in the evaluator: with the eval mode)."""
        return self.kind == "learn"

    def act(self, keys: List[int], obs: Mapping[int, Any], setting: Mapping[str, Any], random_action: bool) -> Dict:
        """``{key: {'action': ...}}`` for the observations ``obs`` (keyed as ``keys``)."""
        raise NotImplementedError

    def reset(self, keys: Optional[List[int]]) -> None:
        """Forget the recurrent state of ``keys`` (None: all)."""


class LearnSlot(Slot):
    """The learning slot: the policy's collect mode (its Adder takes the transitions); warm-up draws legal actions.

    Args:
        collect_mode: ``policy.collect_mode``.
        act_space: The env's action space (of the acting seat).
        rng: Draws the warm-up's random actions.
        agent_spaces: Independent learners: each agent's action space; key ``k`` is agent ``k % len(agent_spaces)``
            (keys ``env_id * agent_num + i``), whose space the warm-up draws from.
    """

    def __init__(
        self,
        name: str,
        collect_mode: Any,
        act_space: gym.Space,
        rng: np.random.Generator,
        agent_spaces: Optional[Sequence[gym.Space]] = None,
    ) -> None:
        super().__init__(name, "learn")
        self.mode = collect_mode
        self._space = act_space
        self._agent_spaces = tuple(agent_spaces) if agent_spaces else None
        self._rng = rng

    def _space_of(self, key: int) -> gym.Space:
        if self._agent_spaces is None:
            return self._space
        return self._agent_spaces[key % len(self._agent_spaces)]

    def _random_action(self, key: int, obs: Any) -> Any:
        space, mask = self._space_of(key), action_mask(obs)
        if mask is not None and self._agent_spaces is not None and isinstance(space, gym.spaces.Discrete):
            mask = mask[: int(space.n)]  # an agent with fewer actions than the widest: its mask row is padded
        return sample_action(space, mask, self._rng)

    def act(self, keys: List[int], obs: Mapping[int, Any], setting: Mapping[str, Any], random_action: bool) -> Dict:
        if random_action:
            return {k: {"action": self._random_action(k, obs[k])} for k in keys}
        return self.mode.forward(keys, obs, **setting)

    def reset(self, keys: Optional[List[int]]) -> None:
        self.mode.reset(keys)


class PolicySlot(Slot):
    """A policy's eval mode acts: a ``snapshot`` slot (no weights until loaded), or, in the evaluator, a learning
    slot's seats (kind ``learn``: the evaluator's eval setting reaches its forward)."""

    def __init__(self, name: str, kind: str, eval_mode: Any, loaded: bool = True) -> None:
        super().__init__(name, kind)
        self.mode = eval_mode
        self.loaded = loaded

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.mode.load_state_dict(state)
        self.loaded = True

    def act(self, keys: List[int], obs: Mapping[int, Any], setting: Mapping[str, Any], random_action: bool) -> Dict:
        if not self.loaded:
            raise RuntimeError(
                f"slot '{self.name}' (kind {self.kind}) has no weights: give it a checkpoint (actor.slots."
                f"{self.name}.path) or load a state dict with actor.load_slot('{self.name}', state)"
            )
        return self.mode.forward(keys, obs, **setting)

    def reset(self, keys: Optional[List[int]]) -> None:
        self.mode.reset(keys)


class RandomSlot(Slot):
    """A uniformly random legal action (``sample_action`` under the observation's ``action_mask``)."""

    def __init__(self, name: str, act_space: gym.Space, rng: np.random.Generator) -> None:
        super().__init__(name, "random")
        self._space = act_space
        self._rng = rng

    def act(self, keys: List[int], obs: Mapping[int, Any], setting: Mapping[str, Any], random_action: bool) -> Dict:
        return {k: {"action": sample_action(self._space, action_mask(obs[k]), self._rng)} for k in keys}


class CallableSlot(Slot):
    """A user function ``fn(obs) -> action`` acts, one observation at a time."""

    def __init__(self, name: str, fn: Callable[[Any], Any]) -> None:
        super().__init__(name, "callable")
        self._fn = fn

    def act(self, keys: List[int], obs: Mapping[int, Any], setting: Mapping[str, Any], random_action: bool) -> Dict:
        return {k: {"action": self._fn(obs[k])} for k in keys}


def build_act_only(
    spec: SlotSpec, act_space: gym.Space, rng: np.random.Generator, eval_mode: Optional[Callable[[], Any]]
) -> Slot:
    """An act-only slot of ``spec``; ``eval_mode()`` makes a fresh eval-mode policy for a snapshot slot (None: the
    caller cannot build one, and a snapshot slot is an error)."""
    if spec.kind == "random":
        return RandomSlot(spec.name, act_space, rng)
    if spec.kind == "callable":
        return CallableSlot(spec.name, import_function(str(spec.fn), f"actor.slots.{spec.name}.fn"))
    if spec.kind != "snapshot":
        raise ValueError(f"slot '{spec.name}' of kind {spec.kind!r} is not act-only")
    if eval_mode is None:
        raise ConfigError(
            f"slot '{spec.name}' (kind snapshot) needs a policy to load its weights into: build the actor with "
            "nervex.entry.builder.make_actor (or pass SerialActor(policy_factory=...))"
        )
    slot = PolicySlot(spec.name, "snapshot", eval_mode(), loaded=False)
    if spec.path is not None:
        from nervex.torch_utils.checkpoint import load_checkpoint

        state = load_checkpoint(spec.path)
        slot.load_state_dict(state["policy"] if "policy" in state else state)
    return slot


__all__ = [
    "SLOT_KINDS",
    "SLOT_KEYS",
    "DEFAULT_SLOTS",
    "SlotSpec",
    "parse_slots",
    "check_slots",
    "assign_seats",
    "seat_names",
    "import_function",
    "action_mask",
    "Slot",
    "LearnSlot",
    "PolicySlot",
    "RandomSlot",
    "CallableSlot",
    "build_act_only",
]
