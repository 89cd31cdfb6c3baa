"""Tic-tac-toe as a nervex env (registered as ``'tictactoe'``): PettingZoo's ``classic/tictactoe-v3``."""

from __future__ import annotations

from typing import Any, Dict

from nervex.envs import PettingZooAECEnv
from nervex.utils import ENV_REGISTRY


@ENV_REGISTRY.register("tictactoe")
class TicTacToeEnv(PettingZooAECEnv):
    """Two seats (``player_1`` moves first, then ``player_2``), 9 actions (the cells), a move per step.

    Observation: ``{'obs': float32 (18,), 'action_mask': int8 (9,), 'to_play': 0 | 1}``; ``obs`` is PettingZoo's
    3x3x2 planes of the acting seat (plane 0: its own marks, plane 1: the opponent's) flattened in C order, so a
    policy sees the board from the mover's side whichever seat it plays. Reward per move: ``[0, 0]`` until the end,
    then ``[+1, -1]`` or ``[-1, +1]`` for a win, ``[0, 0]`` for a draw; ``info['outcome']`` says the same as ints.
    An occupied cell raises ``ValueError`` (PettingZoo's own rule, a loss for the mover, is never reached).

    Example:
        >>> env = TicTacToeEnv(cfg={})
        >>> obs = env.reset()
        >>> int(obs['to_play']), int(obs['action_mask'].sum())
        (0, 9)
    """

    config: Dict[str, Any] = dict(PettingZooAECEnv.config, env_id="classic/tictactoe-v3")
