"""``MatrixGameEnv``: a two-player matrix (normal-form) game as a turn-based nervex env (registered ``'matrix_game'``).

Seat 0 (the row player) chooses, then seat 1 (the column player) chooses without seeing seat 0's choice, then the
episode ends with rewards ``[R[i, j], C[i, j]]``: a one-shot simultaneous game played as two moves of the turn-based
contract of :class:`nervex.envs.PettingZooAECEnv`, so the league, the slots and exploitability treat it like any
other two-player game.
"""

from __future__ import annotations

import difflib
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import gymnasium as gym
import numpy as np

from nervex.utils.registry import ENV_REGISTRY

from .base_env import BaseEnv, BaseEnvInfo, BaseEnvTimestep
from .gym_env import check_env_cfg
from .pettingzoo_env import as_int_action

SEATS = ("player_0", "player_1")
MAX_ACTIONS = 1024  # per seat; a payoff larger than this is a mistake rather than a matrix game
MAX_PAYOFF = 1e9  # |payoff| bound: larger values are a unit mistake and break learning-rate scales

_RPS = np.array([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]])
_ZERO_SUM_2X2 = np.array([[3.0, -2.0], [-2.0, 1.0]])
_PD_ROW = np.array([[3.0, 0.0], [5.0, 1.0]])  # actions (cooperate, defect)

MATRIX_GAMES: Dict[str, np.ndarray] = {
    # rock, paper, scissors; zero-sum, Nash uniform, value 0
    "rps": np.stack([_RPS, -_RPS], axis=-1),
    # DI-engine's 2x2 zero-sum game: Nash (0.375, 0.625) for both seats, value -1/8 for seat 0
    "zero_sum_2x2": np.stack([_ZERO_SUM_2X2, -_ZERO_SUM_2X2], axis=-1),
    # prisoner's dilemma: (cooperate, defect) for both seats, C = R.T; (defect, defect) is the only equilibrium
    "prisoners_dilemma": np.stack([_PD_ROW, _PD_ROW.T], axis=-1),
}
"""Built-in payoffs shaped ``(A0, A1, 2)``: ``[i, j]`` is ``[seat 0's reward, seat 1's reward]`` when seat 0 plays
``i`` and seat 1 plays ``j``."""


def encode_matrix(seat: int, n_actions: Union[int, Sequence[int]]) -> Tuple[np.ndarray, np.ndarray]:
    """The observation ``MatrixGameEnv`` shows ``seat`` when it must move.

    Args:
        seat: 0 (row player) or 1 (column player).
        n_actions: ``(A0, A1)``, the number of actions of each seat (a payoff's ``shape[:2]``); an int: both seats.

    Returns:
        ``(obs, mask)``: ``obs`` the one-hot of the seat, float32 ``(2,)``; ``mask`` int8 ``(max(A0, A1),)``, 1 on
        the seat's own actions, 0 on the padding.

    Raises:
        ValueError: a seat other than 0 or 1, or an action count below 1.
    """
    counts = (int(n_actions), int(n_actions)) if np.ndim(n_actions) == 0 else tuple(int(n) for n in n_actions)
    if len(counts) != 2 or min(counts) < 1:
        raise ValueError(f"encode_matrix: n_actions must be (A0, A1) with both >= 1 (or one int), got {n_actions!r}")
    if seat not in (0, 1):
        raise ValueError(f"encode_matrix: seat must be 0 or 1, got {seat!r}")
    obs = np.zeros(2, np.float32)
    obs[seat] = 1.0
    mask = np.zeros(max(counts), np.int8)
    mask[: counts[seat]] = 1
    return obs, mask


def check_payoff(payoff: Any, key: str = "payoff") -> np.ndarray:
    """A user's payoff as a float64 ``(A0, A1, 2)`` array; a 2-D ``(A0, A1)`` one is seat 0's in a zero-sum game.

    Args:
        payoff: ``[[[r, c], ...], ...]`` (rows x columns x 2) or ``[[r, ...], ...]`` (zero-sum: ``C = -R``).
        key: The config key the payoff came from, for the messages.

    Raises:
        ValueError: ragged rows, entries that are not numbers, a shape other than ``(A0, A1, 2)`` or ``(A0, A1)``,
            more than ``MAX_ACTIONS`` actions per seat, or entries that are not finite or exceed ``MAX_PAYOFF``;
            the message names ``key`` and the shape expected.
    """
    expected = "(A0, A1, 2) as [[[r, c], ...], ...] or (A0, A1) as [[r, ...], ...] for a zero-sum game"
    try:
        array = np.asarray(payoff)
    except ValueError as e:  # NumPy refuses ragged nested lists
        raise ValueError(f"MatrixGameEnv config key '{key}' has rows of different lengths; expected {expected}") from e
    if array.dtype.kind not in "iuf":
        raise ValueError(
            f"MatrixGameEnv config key '{key}' must hold numbers only, got {array.dtype} entries; expected {expected}"
        )
    if array.ndim == 2:
        array = np.stack([array, -array], axis=-1)
    if array.ndim != 3 or array.shape[-1] != 2 or 0 in array.shape:
        raise ValueError(f"MatrixGameEnv config key '{key}' has shape {np.shape(payoff)}; expected {expected}")
    if max(array.shape[:2]) > MAX_ACTIONS:
        raise ValueError(
            f"MatrixGameEnv config key '{key}' has shape {array.shape}; at most {MAX_ACTIONS} actions per seat"
        )
    array = array.astype(np.float64)
    if not np.isfinite(array).all() or np.abs(array).max() > MAX_PAYOFF:
        raise ValueError(
            f"MatrixGameEnv config key '{key}' must hold finite numbers within +-{MAX_PAYOFF:g}; got min "
            f"{array.min()}, max {array.max()}"
        )
    return array


def resolve_payoff(game: Optional[str], payoff: Any) -> np.ndarray:
    """The ``(A0, A1, 2)`` payoff a config's ``game`` and ``payoff`` keys name (exactly one of them is set).

    Raises:
        KeyError: an unknown built-in game (names the closest one).
        ValueError: both keys set, neither set, or a malformed ``payoff`` (see :func:`check_payoff`).
    """
    if (game is None) == (payoff is None):
        raise ValueError(
            f"MatrixGameEnv needs exactly one of the config keys 'game' (one of {sorted(MATRIX_GAMES)}) and 'payoff' "
            f"(your own matrix); got game={game!r} and payoff={'None' if payoff is None else 'a matrix'}"
        )
    if payoff is not None:
        return check_payoff(payoff)
    if game not in MATRIX_GAMES:
        close = difflib.get_close_matches(str(game), list(MATRIX_GAMES), n=1, cutoff=0.4)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise KeyError(f"unknown MatrixGameEnv config key 'game' value {game!r}{hint} built-in: {sorted(MATRIX_GAMES)}")
    return MATRIX_GAMES[game].copy()


@ENV_REGISTRY.register("matrix_game")
class MatrixGameEnv(BaseEnv):
    """A two-player matrix game, played as two moves (seat 0 then seat 1, who does not see seat 0's choice).

    Config keys (``MatrixGameEnv.config``; give exactly one of ``game`` and ``payoff``):

    - ``game``: a built-in game, a key of ``MATRIX_GAMES`` (``'rps'``, ``'zero_sum_2x2'``, ``'prisoners_dilemma'``).
    - ``payoff``: your own matrix, ``[[[r, c], ...], ...]`` (A0 rows x A1 columns x 2) or ``[[r, ...], ...]``
      (zero-sum: the column player gets ``-r``).

    Observation: ``{'obs': float32 (2,) one-hot of the seat to move, 'action_mask': int8 (max(A0, A1),) 1 on that
    seat's actions, 'to_play': np.int64 seat}``, exactly :func:`encode_matrix`. Reward per move, per seat: ``[0, 0]``
    after seat 0's move, ``[R[i, j], C[i, j]]`` after seat 1's. At the end ``info`` has ``episode_return`` (2,),
    ``episode_len`` (2), ``outcome`` ``[s, -s]`` with ``s = sign(R[i, j] - C[i, j])`` and ``joint_action`` ``(i,
    j)``; the last ``obs`` is seat 0's with an all-zero mask (the game is over). The game has no chance: ``seed`` only
    seeds the action space.
    """

    config: Dict[str, Any] = dict(game=None, payoff=None)

    def __init__(self, cfg: Optional[Mapping[str, Any]] = None) -> None:
        merged = check_env_cfg(type(self), cfg)
        super().__init__(merged)
        self._payoff = resolve_payoff(merged["game"], merged["payoff"])
        self._counts = self._payoff.shape[:2]
        width = max(self._counts)
        low, high = min(0.0, float(self._payoff.min())), max(0.0, float(self._payoff.max()))
        self._info = BaseEnvInfo(
            agent_num=2,
            obs_space=gym.spaces.Dict(
                obs=gym.spaces.Box(0.0, 1.0, (2,), np.float32),
                action_mask=gym.spaces.Box(0, 1, (width,), np.int8),
                to_play=gym.spaces.Discrete(2),
            ),
            act_space=gym.spaces.Discrete(width),
            rew_space=gym.spaces.Box(low, high, (2,), np.float64),
            max_episode_steps=2,
            agent_ids=SEATS,
            turn_based=True,
        )
        self._first: Optional[int] = None  # seat 0's action, once played
        self._running = False

    @property
    def payoff(self) -> np.ndarray:
        """The game's ``(A0, A1, 2)`` payoff (a copy)."""
        return self._payoff.copy()

    def _observe(self, seat: int) -> Dict[str, Any]:
        obs, mask = encode_matrix(seat, self._counts)
        return {"obs": obs, "action_mask": mask, "to_play": np.int64(seat)}

    def seed(self, seed: int) -> None:
        """Seed the action space (the game itself has no randomness)."""
        self._info.act_space.seed(int(seed))

    def reset(self) -> Dict[str, Any]:
        """Start a game; return seat 0's observation."""
        self._first, self._running = None, True
        return self._observe(0)

    def step(self, action: Any) -> BaseEnvTimestep:
        """Play ``action`` for the seat to move; see the class docstring for what comes back.

        Raises:
            RuntimeError: no ``reset`` since construction or the last ``done``.
            ValueError: an action the seat does not have (names the seat and its legal actions).
        """
        if not self._running:
            raise RuntimeError(f"{self!r}: step() before reset(); reset the env first and after every done step")
        seat = 0 if self._first is None else 1
        index = as_int_action(action)
        if not 0 <= index < self._counts[seat]:
            raise ValueError(
                f"{self!r}: illegal action {index} for seat {SEATS[seat]} (move {seat}); legal: "
                f"{list(range(self._counts[seat]))}"
            )
        if seat == 0:
            self._first = index
            info = {"terminated": False, "truncated": False}
            return BaseEnvTimestep(self._observe(1), np.zeros(2), False, info)
        self._running = False
        reward = self._payoff[self._first, index].copy()
        sign = int(np.sign(reward[0] - reward[1]))
        obs = self._observe(0)
        obs["action_mask"][:] = 0
        info = dict(
            terminated=True,
            truncated=False,
            episode_return=reward.copy(),
            episode_len=2,
            outcome=np.array([sign, -sign], np.int64),
            joint_action=(self._first, index),
        )
        return BaseEnvTimestep(obs, reward, True, info)

    def info(self) -> BaseEnvInfo:
        """Spaces (``Discrete(max(A0, A1))`` actions, masked per seat), the seats and ``turn_based=True``."""
        return self._info

    def close(self) -> None:
        """Nothing to release; safe to call twice."""
        self._running = False

    def __repr__(self) -> str:
        game = self._cfg["game"] if self._cfg["game"] is not None else f"payoff {self._payoff.shape[:2]}"
        return f"{type(self).__name__}({game})"
