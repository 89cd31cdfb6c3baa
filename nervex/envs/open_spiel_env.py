"""``OpenSpielEnv``: a two-player turn-based OpenSpiel game as a nervex env (registered ``'open_spiel'``).

One nervex step is one decision of a player; chance nodes (the deal in poker) are sampled inside the env with its
own seeded ``np.random.Generator``. The contract is that of :class:`nervex.envs.PettingZooAECEnv`: a dict
observation of the seat to move, a reward per seat per move, ``outcome`` per seat at the end.

OpenSpiel is an optional dependency (``pip install open_spiel``), imported when a game is built, so ``nervex.envs``
imports without it. Also here: :func:`one_ply_connect_four`, the one-ply-lookahead connect-four opponent of the
league's connect_four target, usable as an act-only ``callable`` slot.
"""

from __future__ import annotations

import difflib
from typing import Any, Dict, List, Mapping, Optional, Tuple

import gymnasium as gym
import numpy as np

from nervex.utils.registry import ENV_REGISTRY

from .base_env import BaseEnv, BaseEnvInfo, BaseEnvTimestep
from .gym_env import check_env_cfg, check_episode_limit
from .pettingzoo_env import as_int_action

SEATS = ("player_0", "player_1")
_SEAT_INDEX = (np.int64(0), np.int64(1))  # NumPy scalars are immutable: every observation may share them
_PARAM_TYPES = (bool, int, float, str)
_UNIFORM_BLOCK = 256
_OBSERVER_CHECK_STATES = 10_000  # a bound on the one game played to check the fast observation path


def import_pyspiel() -> Any:
    """Import and return ``pyspiel``.

    Raises:
        ImportError: OpenSpiel is not installed; says ``pip install open_spiel``.
    """
    try:
        import pyspiel
    except ImportError as e:
        raise ImportError("env_type 'open_spiel' needs OpenSpiel: pip install open_spiel") from e
    return pyspiel


def load_two_player_game(name: str, game_kwargs: Optional[Mapping[str, Any]] = None) -> Any:
    """Load an OpenSpiel game the env can play: two players, sequential moves, a tensor observation.

    Args:
        name: An OpenSpiel game name (``'kuhn_poker'``, ``'connect_four'``...).
        game_kwargs: The game's parameters (``{'players': 2}``...): bool, int, float or str values.

    Raises:
        ImportError: OpenSpiel is not installed.
        KeyError: an unknown game name (names the closest registered one).
        ValueError: bad parameters, or a game that is not 2-player, is simultaneous-move, or has no tensor
            observation.
    """
    pyspiel = import_pyspiel()
    names = list(pyspiel.registered_names())
    if name not in names:
        close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise KeyError(f"unknown OpenSpiel game {name!r} (OpenSpielEnv config key 'game'){hint}")
    params = dict(game_kwargs or {})
    for key, value in params.items():
        if not isinstance(key, str) or not isinstance(value, _PARAM_TYPES):
            raise ValueError(
                f"OpenSpielEnv config key 'game_kwargs.{key}' must be a bool, int, float or str, got {value!r}"
            )
    try:
        game = pyspiel.load_game(name, params)
    except pyspiel.SpielError as e:
        raise ValueError(f"OpenSpiel cannot load {name!r} with game_kwargs {params}: {e}") from e
    kind = game.get_type()
    if game.num_players() != 2:
        raise ValueError(
            f"OpenSpielEnv plays two-player games; {name!r} with game_kwargs {params} has {game.num_players()} players"
        )
    if kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
        raise ValueError(
            f"OpenSpielEnv plays turn-based games; {name!r} has {kind.dynamics} moves (a simultaneous-move game: play "
            f"a matrix game with env_type 'matrix_game', or convert it with pyspiel.convert_to_turn_based)"
        )
    if not (kind.provides_information_state_tensor or kind.provides_observation_tensor):
        raise ValueError(f"OpenSpielEnv needs a tensor observation; {name!r} provides neither kind of tensor")
    return game


def _tensor_fn(game: Any) -> str:
    """The ``State`` method the observation comes from: the information state where the game has one."""
    return "information_state_tensor" if game.get_type().provides_information_state_tensor else "observation_tensor"


def encode_open_spiel(state: Any, player: int) -> Tuple[np.ndarray, np.ndarray]:
    """What ``OpenSpielEnv`` shows ``player`` in ``state``.

    Args:
        state: A ``pyspiel.State`` of a game :func:`load_two_player_game` accepts.
        player: 0 or 1.

    Returns:
        ``(obs, mask)``: ``obs`` float32 ``(D,)``, ``state.information_state_tensor(player)`` (games without one:
        ``state.observation_tensor(player)``); ``mask`` int8 ``(A,)``, ``state.legal_actions_mask(player)`` over
        ``game.num_distinct_actions()`` (all zeros when ``player`` is not to move, e.g. at the end).
    """
    tensor = getattr(state, _tensor_fn(state.get_game()))(player)
    return np.asarray(tensor, np.float32), np.asarray(state.legal_actions_mask(player), np.int8)


def _fast_observer(game: Any, tensor_fn: str) -> Any:
    """OpenSpiel's ``Observation`` for ``tensor_fn``, writing into one NumPy buffer (2 us a connect_four
    observation instead of 15 us through a Python list), or None where it does not reproduce ``tensor_fn`` exactly.

    It is checked against ``tensor_fn`` for both players at every state of one seeded random game, and the env falls
    back to the list path when any value differs, so the env always shows what :func:`encode_open_spiel` builds.
    """
    try:
        import pyspiel
        from open_spiel.python.observation import make_observation

        kind = pyspiel.IIGObservationType(perfect_recall=True) if tensor_fn[0] == "i" else None
        observer = make_observation(game, kind)
    except Exception:  # noqa: BLE001 - any failure of the optional fast path means: use the plain one
        return None
    rng, state = np.random.default_rng(0), game.new_initial_state()
    for _ in range(_OBSERVER_CHECK_STATES):
        if not state.is_chance_node():
            for player in (0, 1):
                observer.set_from(state, player)
                expected = np.asarray(getattr(state, tensor_fn)(player), np.float32)
                if observer.tensor.shape != expected.shape or not np.array_equal(observer.tensor, expected):
                    return None
        if state.is_terminal():
            return observer
        actions = [a for a, _ in state.chance_outcomes()] if state.is_chance_node() else state.legal_actions()
        state.apply_action(actions[rng.integers(len(actions))])
    return observer


@ENV_REGISTRY.register("open_spiel")
class OpenSpielEnv(BaseEnv):
    """A two-player sequential OpenSpiel game with discrete actions (kuhn_poker, leduc_poker, tic_tac_toe,
    connect_four...).

    Config keys (``OpenSpielEnv.config``):

    - ``game``: the OpenSpiel game name.
    - ``game_kwargs``: the game's parameters, passed to ``pyspiel.load_game``.
    - ``max_episode_steps``: a limit on decisions (``None``: the game's own end); reaching it truncates.
    - ``swap_planes``: ``None``, or two plane indices ``[a, b]`` of the observation tensor (its first axis) that
      are swapped when seat 1 observes, so both seats see the board from the mover's side (connect_four: ``[0, 1]``,
      each player's stones; tic_tac_toe: ``[1, 2]``): one network then plays both seats with the same features.

    Observation: ``{'obs': float32 (D,), 'action_mask': int8 (A,), 'to_play': np.int64 seat}``, exactly
    :func:`encode_open_spiel` of the seat to move (seat = OpenSpiel's player). An action the mask forbids raises
    ``ValueError``. Reward per decision, per seat: the change of ``state.returns()`` it (and the chance events
    sampled after it) caused, so the rewards of an episode sum to ``state.returns()`` (games with terminal rewards:
    ``[0, 0]`` until the end, then the returns). When done, ``info`` has ``episode_return`` (``state.returns()``),
    ``episode_len`` (decisions), ``outcome`` ``[s, -s]`` with ``s = sign(return_0 - return_1)``. The last ``obs`` of
    a finished game is the final state seen by the seat that did not move last, with an all-zero mask; of a truncated
    one, the state seen by the seat to move, with its legal moves. Seeding: ``seed(s)`` seeds the next reset's chance
    sampling and the action space; later resets continue the same random stream.
    """

    config: Dict[str, Any] = dict(game="kuhn_poker", game_kwargs={}, max_episode_steps=None, swap_planes=None)

    def __init__(self, cfg: Optional[Mapping[str, Any]] = None) -> None:
        merged = check_env_cfg(type(self), cfg)
        super().__init__(merged)
        limit = check_episode_limit(type(self).__name__, merged["max_episode_steps"])
        if not isinstance(merged["game_kwargs"], Mapping):
            raise ValueError(
                f"{type(self).__name__} config key 'game_kwargs' must be a mapping, got {merged['game_kwargs']!r}"
            )
        self._limit = limit if limit is not None else np.inf
        self._swap: Optional[Tuple[int, int]] = None  # checked against the game's tensor shape when it is built
        self._shape: Tuple[int, ...] = ()
        self._game: Any = None
        self._info: Optional[BaseEnvInfo] = None
        self._rng = np.random.default_rng()
        self._uniforms: List[float] = []
        self._uniform_at = 0
        self._pending_seed: Optional[int] = None
        self._state: Any = None
        self._running = False
        self._returns = np.zeros(2)
        self._moves = 0
        self._mask = np.zeros(0, np.int8)  # the legal actions of the seat to move
        self._seat = 0
        # set when the game is built (on first use, or after unpickling)
        self._observer: Any = None  # the fast observation buffer, or None: the tensor method's list
        self._tensor = "information_state_tensor"  # or "observation_tensor"
        self._terminal_rewards = True  # OpenSpiel's reward model: rewards only at the end
        self._no_moves = np.zeros(0, np.int8)  # the mask of a finished game

    # ---- building ---------------------------------------------------------------------------------------------
    def _build(self) -> Any:
        game = load_two_player_game(self._cfg["game"], self._cfg["game_kwargs"])
        pyspiel = import_pyspiel()
        self._terminal_rewards = game.get_type().reward_model == pyspiel.GameType.RewardModel.TERMINAL
        self._tensor = _tensor_fn(game)
        self._observer = _fast_observer(game, self._tensor)
        shape = game.information_state_tensor_shape() if self._tensor[0] == "i" else game.observation_tensor_shape()
        self._shape, self._swap = tuple(shape), self._check_swap(self._cfg["swap_planes"], tuple(shape))
        n_actions = game.num_distinct_actions()
        self._no_moves = np.zeros(n_actions, np.int8)
        if self._terminal_rewards:  # a step's reward is 0 or the returns, within the game's utility bounds
            low, high = min(0.0, game.min_utility()), max(0.0, game.max_utility())
        else:
            low, high = -np.inf, np.inf
        act_space = gym.spaces.Discrete(n_actions)
        if self._pending_seed is not None:
            act_space.seed(self._pending_seed)
        self._info = BaseEnvInfo(
            agent_num=2,
            obs_space=gym.spaces.Dict(
                obs=gym.spaces.Box(-np.inf, np.inf, (int(np.prod(shape)),), np.float32),
                action_mask=gym.spaces.Box(0, 1, (n_actions,), np.int8),
                to_play=gym.spaces.Discrete(2),
            ),
            act_space=act_space,
            rew_space=gym.spaces.Box(low, high, (2,), np.float64),
            max_episode_steps=self._cfg["max_episode_steps"],
            agent_ids=SEATS,
            turn_based=True,
        )
        self._game = game
        return game

    def _check_swap(self, planes: Any, shape: Tuple[int, ...]) -> Optional[Tuple[int, int]]:
        if planes is None:
            return None
        ok = isinstance(planes, (list, tuple)) and len(planes) == 2 and len(shape) >= 2
        ok = ok and all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p < shape[0] for p in planes)
        if not ok or planes[0] == planes[1]:
            raise ValueError(
                f"{type(self).__name__} config key 'swap_planes' must be two different plane indices in "
                f"[0, {shape[0] if len(shape) >= 2 else 0}) of {self._cfg['game']}'s observation tensor {list(shape)}, "
                f"got {planes!r}"
            )
        return int(planes[0]), int(planes[1])

    @property
    def game(self) -> Any:
        """The ``pyspiel.Game`` (loaded on first use)."""
        return self._game if self._game is not None else self._build()

    @property
    def state(self) -> Any:
        """The current ``pyspiel.State`` (None before the first reset); read it, do not apply actions to it."""
        return self._state

    def _uniform(self) -> float:
        """The next U[0, 1) draw of the env's generator (drawn in blocks: one ``rng.random()`` call costs ~1.5 us)."""
        if self._uniform_at >= len(self._uniforms):
            self._uniforms, self._uniform_at = self._rng.random(_UNIFORM_BLOCK).tolist(), 0
        self._uniform_at += 1
        return self._uniforms[self._uniform_at - 1]

    def _sample_chance(self) -> None:
        state = self._state
        while state.is_chance_node():
            outcomes = state.chance_outcomes()
            u, total = self._uniform(), 0.0
            action = outcomes[-1][0]  # float round-off leaving u >= the total falls back to the last outcome
            for candidate, prob in outcomes:
                total += prob
                if u < total:
                    action = candidate
                    break
            state.apply_action(action)

    def _observe(self, seat: int, over: bool = False) -> Dict[str, Any]:
        state = self._state
        mask = self._no_moves.copy() if over else np.asarray(state.legal_actions_mask(seat), np.int8)
        self._mask = mask
        if self._observer is not None:
            self._observer.set_from(state, seat)
            obs = self._observer.tensor.copy()
        else:
            obs = np.asarray(getattr(state, self._tensor)(seat), np.float32)
        if self._swap is not None and seat == 1:
            planes = obs.reshape(self._shape)
            a, b = self._swap
            planes[[a, b]] = planes[[b, a]]
            obs = planes.reshape(-1)
        return {"obs": obs, "action_mask": mask, "to_play": _SEAT_INDEX[seat]}

    # ---- the contract -----------------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        """Make the next ``reset`` sample chance events from ``np.random.default_rng(seed)``; seed the action space."""
        self._pending_seed = int(seed)
        if self._info is not None:
            self._info.act_space.seed(self._pending_seed)

    def reset(self) -> Dict[str, Any]:
        """Start a game (sampling its opening chance events); return the first deciding seat's observation.

        Raises:
            ValueError: the game ends before any decision.
        """
        game = self.game
        if self._pending_seed is not None:
            self._rng = np.random.default_rng(self._pending_seed)
            self._uniforms, self._uniform_at, self._pending_seed = [], 0, None
        self._state = game.new_initial_state()
        self._sample_chance()
        if self._state.is_terminal():
            raise ValueError(f"{self!r}: the game ended before any player decided; there is nothing to play")
        self._running, self._moves = True, 0
        self._returns = np.zeros(2)
        self._seat = self._state.current_player()
        return self._observe(self._seat)

    def step(self, action: Any) -> BaseEnvTimestep:
        """Play ``action`` for the seat ``to_play``; see the class docstring for what comes back.

        Raises:
            RuntimeError: no ``reset`` since construction or the last ``done``.
            ValueError: the action is illegal here (names the seat, the action and the legal actions).
        """
        if not self._running:
            raise RuntimeError(f"{self!r}: step() before reset(); reset the env first and after every done step")
        index = action if type(action) is int else as_int_action(action)
        if not 0 <= index < len(self._mask) or not self._mask[index]:
            legal: List[int] = np.flatnonzero(self._mask).tolist()
            raise ValueError(
                f"{self!r}: illegal action {index} for seat {SEATS[self._seat]} (move {self._moves}); legal: {legal}"
            )
        state = self._state
        state.apply_action(index)
        self._sample_chance()
        self._moves += 1
        terminated = state.is_terminal()
        if terminated or not self._terminal_rewards:
            returns = np.array(state.returns())
            reward, self._returns = returns - self._returns, returns
        else:
            reward = np.zeros(2)
        truncated = not terminated and self._moves >= self._limit
        self._seat = 1 - self._seat if terminated else state.current_player()
        obs = self._observe(self._seat, over=terminated)
        info: Dict[str, Any] = {"terminated": terminated, "truncated": truncated}
        if terminated or truncated:
            self._running = False
            lead = self._returns[0] - self._returns[1]
            sign = int(lead > 0) - int(lead < 0)
            info.update(
                episode_return=self._returns.copy(),
                episode_len=self._moves,
                outcome=np.array([sign, -sign], np.int64),
            )
        return BaseEnvTimestep(obs, reward, terminated or truncated, info)

    def info(self) -> BaseEnvInfo:
        """Spaces, the seats (``player_0``, ``player_1``: OpenSpiel's players), per-seat rewards, ``turn_based``."""
        if self._info is None:
            self._build()
        return self._info

    def close(self) -> None:
        """Drop the game's state; safe to call twice. A later ``reset`` starts a new game."""
        self._state, self._running = None, False

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_game=None, _info=None, _state=None, _observer=None, _running=False)
        return state

    def __repr__(self) -> str:
        kwargs = f", {self._cfg['game_kwargs']}" if self._cfg["game_kwargs"] else ""
        return f"{type(self).__name__}({self._cfg['game']!r}{kwargs})"


# ---- the connect-four heuristic -------------------------------------------------------------------------------------
C4_ROWS, C4_COLS = 6, 7
_C4_RNG = np.random.default_rng()
_C4_DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))


def _c4_planes(state_or_obs: Any) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(own, opponent, legal)`` from an env observation or a ``pyspiel`` connect_four state."""
    if isinstance(state_or_obs, Mapping):
        board, mask = state_or_obs["obs"], state_or_obs["action_mask"]
    else:
        board, mask = encode_open_spiel(state_or_obs, state_or_obs.current_player())
    planes = np.asarray(board).reshape(3, C4_ROWS, C4_COLS) > 0.5
    # OpenSpiel 2.0.2's connect_four tensor is (player 0's stones, player 1's stones, empty), row 0 at the bottom,
    # the same for both players (tests/envs/test_open_spiel_env.py pins this layout); an env with swap_planes [0, 1]
    # shows seat 1 its own stones first. Either way the mover's stones are the plane with fewer stones (seat 0 moves
    # at equal counts, and then plane 0 is its own), so the stone counts decide, not the seat.
    own = 0 if planes[0].sum() <= planes[1].sum() else 1
    return planes[own], planes[1 - own], np.flatnonzero(np.asarray(mask))


def _c4_wins(stones: np.ndarray, row: int, col: int) -> bool:
    """Whether a stone at ``(row, col)`` joins ``stones`` into four in a line."""
    for d_row, d_col in _C4_DIRECTIONS:
        count = 1
        for sign in (1, -1):
            r, c = row + sign * d_row, col + sign * d_col
            while 0 <= r < C4_ROWS and 0 <= c < C4_COLS and stones[r, c]:
                count += 1
                r, c = r + sign * d_row, c + sign * d_col
        if count >= 4:
            return True
    return False


def one_ply_connect_four(state_or_obs: Any, rng: Optional[np.random.Generator] = None) -> int:
    """A one-ply-lookahead connect-four move: win now, else block the opponent's immediate win, else random.

    Usable as an act-only ``callable`` slot (``fn: 'nervex.envs.open_spiel_env:one_ply_connect_four'``): it needs
    only the observation the ``open_spiel`` env gives for ``game: connect_four``. Where several columns qualify at
    the first tier that has one, it picks among them uniformly.

    Args:
        state_or_obs: The env's observation ``{'obs': (126,), 'action_mask': (7,), 'to_play': seat}`` or a
            ``pyspiel`` connect_four state with a player to move.
        rng: Draws the random choices; None: a module-level generator.

    Returns:
        The column to play (0..6), a legal one.

    Raises:
        ValueError: no legal move (the game is over).
    """
    own, opponent, legal = _c4_planes(state_or_obs)
    if len(legal) == 0:
        raise ValueError("one_ply_connect_four: no legal move (the game is over)")
    heights = (own | opponent).sum(axis=0)  # stones fall to the lowest empty row: row = column height
    wins = [c for c in legal if _c4_wins(own, heights[c], c)]
    blocks = [c for c in legal if _c4_wins(opponent, heights[c], c)]
    choices = wins or blocks or legal.tolist()
    return int(choices[(rng or _C4_RNG).integers(len(choices))])
