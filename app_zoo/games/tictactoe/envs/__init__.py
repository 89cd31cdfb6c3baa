from .tictactoe_env import TicTacToeEnv

__all__ = ["TicTacToeEnv"]
