"""Board and card games (turn-based, with legal-action masks); importing this package registers ``'tictactoe'``.

The games come from PettingZoo's classic family (``pip install 'nervex[games]'``), imported when an env is built.
"""

from .tictactoe.envs import TicTacToeEnv

__all__ = ["TicTacToeEnv"]
