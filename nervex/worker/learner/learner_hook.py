"""Learner hooks: small objects the learner calls at fixed points (before/after the run, before/after each iter).

Hooks at one position run in ascending ``priority`` (lower first), so e.g. loading a checkpoint (priority 20)
happens before anything that reads the restored state.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Dict, List, Sequence

if TYPE_CHECKING:
    from .base_learner import BaseLearner

POSITIONS = ("before_run", "after_run", "before_iter", "after_iter")
LR_DECAY_TYPES = ("none", "linear", "cosine")


class LearnerHook:
    """Base hook.

    Args:
        name: For messages and de-duplication.
        position: One of ``before_run``, ``after_run``, ``before_iter``, ``after_iter``.
        priority: Lower runs first among hooks at the same position.
    """

    def __init__(self, name: str, position: str, priority: int = 100) -> None:
        if position not in POSITIONS:
            raise ValueError(f"hook '{name}': unknown position '{position}'; valid: {', '.join(POSITIONS)}")
        self.name = name
        self.position = position
        self.priority = priority

    def __call__(self, learner: BaseLearner) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.position}, priority={self.priority})"


class LoadCkptHook(LearnerHook):
    """Resume model, optimizer, ``train_iter`` and ``env_step`` from a checkpoint before the run."""

    def __init__(self, path: str, priority: int = 20) -> None:
        super().__init__("load_ckpt", "before_run", priority)
        self.path = path

    def __call__(self, learner: BaseLearner) -> None:
        learner.load_checkpoint(self.path)
        learner.logger.info(f"resumed from {self.path}: train_iter={learner.last_iter}, env_step={learner.env_step}")


class SaveCkptHook(LearnerHook):
    """Save ``ckpt/iteration_{n}.pt`` every ``freq`` iterations (after_iter) or ``ckpt/final.pt`` (after_run)."""

    def __init__(self, position: str, freq: int = 0, priority: int = 20) -> None:
        super().__init__("save_ckpt", position, priority)
        self.freq = freq

    def __call__(self, learner: BaseLearner) -> None:
        if self.position == "after_run":
            learner.save_checkpoint(os.path.join(learner.ckpt_dir, "final.pt"))
        elif self.freq > 0 and learner.last_iter % self.freq == 0:
            learner.save_checkpoint(os.path.join(learner.ckpt_dir, f"iteration_{learner.last_iter}.pt"))


class LogShowHook(LearnerHook):
    """Average the learner's figures over ``freq`` iterations, then print them and write ``train/*`` scalars."""

    NAMES = {"total_loss": "train/loss", "cur_lr": "train/learning_rate"}

    def __init__(self, freq: int, priority: int = 60) -> None:
        super().__init__("log_show", "after_iter", priority)
        self.freq = max(1, int(freq))
        self._sums: Dict[str, float] = defaultdict(float)
        self._count = 0

    def __call__(self, learner: BaseLearner) -> None:
        for key, value in learner.last_info.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._sums[key] += float(value)
        self._count += 1
        if learner.last_iter % self.freq != 0:
            return
        means = {k: v / self._count for k, v in self._sums.items()}
        self._sums.clear()
        self._count = 0
        scalars = {self.NAMES.get(k, f"train/{k}"): v for k, v in means.items()}
        scalars["train/n_updates"] = learner.last_iter
        learner.scalar_writer.add_scalars(scalars, learner.env_step)
        text = " ".join(f"{k}={v:.4g}" for k, v in means.items())
        learner.logger.info(f"[learner] iter={learner.last_iter} env_step={learner.env_step} {text}")


class LrDecayHook(LearnerHook):
    """Decay every param group's learning rate, of every optimizer, from its initial value to ``end_factor`` x it
    over ``total_iter`` gradient steps.

    ``type``: ``linear`` or ``cosine``.
    """

    def __init__(
        self, optimizers: Sequence[Any], type: str, end_factor: float, total_iter: int, priority: int = 40
    ) -> None:
        super().__init__("lr_decay", "after_iter", priority)
        if type not in ("linear", "cosine"):
            raise ValueError(f"learner.lr_decay.type must be 'none', 'linear' or 'cosine', got '{type}'")
        self.groups = [group for optimizer in optimizers for group in optimizer.param_groups]
        self.type = type
        self.end_factor = end_factor
        self.total_iter = max(1, int(total_iter))
        self.base_lrs: List[float] = [g["lr"] for g in self.groups]

    def factor(self, it: int) -> float:
        frac = min(1.0, it / self.total_iter)
        if self.type == "linear":
            return 1.0 + (self.end_factor - 1.0) * frac
        return self.end_factor + (1.0 - self.end_factor) * 0.5 * (1.0 + math.cos(math.pi * frac))

    def __call__(self, learner: BaseLearner) -> None:
        factor = self.factor(learner.last_iter)
        for group, base in zip(self.groups, self.base_lrs):
            group["lr"] = base * factor
