"""Callbacks a user passes to ``SerialTrainer`` to observe or steer training (RLlib's names)."""

from __future__ import annotations

from typing import Any, Dict, List


class DefaultCallbacks:
    """Override any of these; each receives the trainer first. The defaults do nothing."""

    def on_episode_start(self, trainer: Any, env_id: int) -> None:
        """An env starts a new episode."""

    def on_episode_step(self, trainer: Any, env_id: int, transition: Dict[str, Any]) -> None:
        """An env made one step; ``transition`` is what the policy's ``_process_transition`` built."""

    def on_episode_end(self, trainer: Any, env_id: int, episode_return: float, episode_len: int) -> None:
        """An env finished an episode (terminated or truncated)."""

    def on_sample_end(self, trainer: Any, samples: List[Dict[str, Any]]) -> None:
        """The actor returned a batch of train samples (before they enter the replay buffer)."""

    def on_learn_on_batch(self, trainer: Any, batch: Dict[str, Any], info: Dict[str, Any]) -> None:
        """The learner made one gradient step on ``batch``; ``info`` holds its figures."""

    def on_train_result(self, trainer: Any, result: Dict[str, Any]) -> None:
        """One training iteration ended; ``result`` is what ``trainer.train()`` returns."""
