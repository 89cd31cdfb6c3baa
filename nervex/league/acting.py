"""How the league reads nervex policies as strategies: a snapshot's action probabilities, and the game of an env.

A snapshot plays as an opponent with its eval mode (``nervex.worker.actor.slots.PolicySlot``), so that is the
strategy the league scores: ``greedy_action_probs`` turns an eval mode into the ``ActionProbs`` that
``nervex.league.exploitability`` takes: a one-hot row on the action the eval mode picks for each observation (a pure
strategy; the league's mixed strategy is the mixture of its history).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from .exploitability import ActionProbs


def greedy_action_probs(eval_mode: Any) -> ActionProbs:
    """The strategy an eval mode plays: a one-hot row on its action for each observation.

    Args:
        eval_mode: ``policy.eval_mode`` of a policy over the game's observation dict
            (``{'obs', 'action_mask', 'to_play'}``).

    Example:
        >>> probs = greedy_action_probs(policy.eval_mode)
        >>> probs(obs, mask, seat).sum(axis=1)        # ones
    """

    def probs(obs: np.ndarray, mask: np.ndarray, seat: np.ndarray) -> np.ndarray:
        obs, mask, seat = np.asarray(obs, np.float32), np.asarray(mask, np.int8), np.asarray(seat, np.int64)
        keys = list(range(len(obs)))
        data = {k: {"obs": obs[k], "action_mask": mask[k], "to_play": seat[k]} for k in keys}
        out = eval_mode.forward(keys, data) if keys else {}
        rows = np.zeros(mask.shape, np.float64)
        for k in keys:
            action = int(np.asarray(out[k]["action"]).reshape(-1)[0])
            if not mask[k, action]:
                raise ValueError(f"the eval mode chose illegal action {action} (legal: {np.flatnonzero(mask[k])})")
            rows[k, action] = 1.0
        return rows

    return probs


def env_game(env_cfg: Mapping[str, Any]) -> Optional[Any]:
    """The game whose exploitability the league can compute for an ``env`` section, or None.

    ``matrix_game`` envs give their game name (or the payoff array of a user's game), ``open_spiel`` envs their
    loaded ``pyspiel.Game`` (with its ``game_kwargs``) when it is a two-player zero-sum game (kuhn_poker,
    leduc_poker...); other envs give None.
    """
    env_type = env_cfg.get("env_type")
    if env_type == "matrix_game":
        payoff = env_cfg.get("payoff")
        return np.asarray(payoff, dtype=np.float64) if payoff is not None else env_cfg.get("game")
    if env_type == "open_spiel":
        try:
            import pyspiel
        except ImportError:
            return None
        game = pyspiel.load_game(str(env_cfg.get("game")), dict(env_cfg.get("game_kwargs") or {}))
        info = game.get_type()
        if game.num_players() == 2 and info.utility == pyspiel.GameType.Utility.ZERO_SUM:
            return game
    return None


__all__ = ["ActionProbs", "greedy_action_probs", "env_game"]
