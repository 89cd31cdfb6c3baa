"""Evaluation of a two-seat game's player in both seats (``BothSeatsEvaluator``)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional

from .serial_evaluator import SerialEvaluator

SEATS = (0, 1)


class BothSeatsEvaluator:
    """A player's evaluation in both seats of a two-seat game against one act-only opponent.

    Each seat plays ``evaluator.n_episode`` episodes on its own env manager. Reports what ``SerialEvaluator.eval``
    reports over all the episodes, plus ``eval/seat<k>/win_rate`` and ``eval/seat<k>/mean_reward`` per seat (a
    game's first mover often has the edge).

    Args:
        cfg: The run's compiled config (its ``evaluator`` section).
        managers: The evaluator env managers of seat 0 and seat 1.
        policy: The policy whose eval mode plays.
        name: The learning slot's name (its outcomes are reported under it).
        opponent: The act-only slot (``{kind: random | snapshot | callable, ...}``, no seats).
        seed: Seeds the opponent's random actions (seat ``k``: ``seed + k``).
        policy_factory: Makes an eval-mode policy for a ``snapshot`` opponent.
    """

    def __init__(
        self,
        cfg: Mapping[str, Any],
        managers: List[Any],
        policy: Any,
        name: str,
        opponent: Mapping[str, Any],
        seed: int,
        policy_factory: Optional[Callable[[], Any]] = None,
    ) -> None:
        self.evaluators = []
        for seat, manager in zip(SEATS, managers):
            slots = {name: {"kind": "learn", "seats": [seat]}, "opponent": {**dict(opponent), "seats": [1 - seat]}}
            self.evaluators.append(
                SerialEvaluator(
                    cfg["evaluator"],
                    manager,
                    policy.eval_mode,
                    slots=slots,
                    seed=seed + seat,
                    policy_factory=policy_factory,
                )
            )
        self.figure_names = [f"seat{seat}/{k}" for seat in SEATS for k in ("win_rate", "mean_reward")]

    def should_eval(self, env_step: int) -> bool:
        return self.evaluators[0].should_eval(env_step)

    def eval(self, train_iter: int = 0, env_step: int = 0, setting: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        results = [e.eval(train_iter, env_step, setting) for e in self.evaluators]
        out = dict(results[0])
        n = [r["eval/n_episode"] for r in results]
        total = max(1, sum(n))
        for key in ("eval/mean_reward", "eval/mean_ep_len", "eval/win_rate"):
            if all(key in r for r in results):
                out[key] = sum(r[key] * k for r, k in zip(results, n)) / total
        for key in ("eval/wins", "eval/draws", "eval/losses", "eval/n_episode", "eval/time"):
            if all(key in r for r in results):
                out[key] = sum(r[key] for r in results)
        out["eval/min_reward"] = min(r["eval/min_reward"] for r in results)
        out["eval/max_reward"] = max(r["eval/max_reward"] for r in results)
        for seat, r in zip(SEATS, results):
            out[f"eval/seat{seat}/mean_reward"] = r["eval/mean_reward"]
            if "eval/win_rate" in r:
                out[f"eval/seat{seat}/win_rate"] = r["eval/win_rate"]
        out["stop"] = all(r["stop"] for r in results)
        out["best"] = any(r["best"] for r in results)
        return out

    def close(self) -> None:
        for evaluator in self.evaluators:
            evaluator.close()


__all__ = ["BothSeatsEvaluator", "SEATS"]
