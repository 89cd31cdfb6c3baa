"""Tic-tac-toe (PettingZoo ``classic/tictactoe-v3``)."""
