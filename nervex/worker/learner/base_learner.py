"""BaseLearner: runs a policy's learn mode on batches and calls hooks around it."""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, List, Optional

from nervex.config import Field, compile_section
from nervex.torch_utils import load_checkpoint, save_checkpoint
from nervex.utils.log_helper import ScalarWriter

from .learner_hook import LR_DECAY_TYPES, POSITIONS, LearnerHook, LoadCkptHook, LogShowHook, LrDecayHook, SaveCkptHook

CHECKPOINT_VERSION = 2  # 2: one policy state format for every mode (model, extra, learn)


class BaseLearner:
    """Trains a policy's learn mode one batch at a time.

    Args:
        cfg: The compiled ``learner`` section (see ``config``).
        learn_mode: ``policy.learn_mode``.
        run_dir: The run directory; checkpoints go to ``run_dir/ckpt``. None keeps everything in memory.
        logger: Text logger (default: the ``nervex`` logger).
        scalar_writer: TensorBoard writer shared with the other workers (default: none).

    Example:
        >>> learner = BaseLearner(cfg.learner, policy.learn_mode, run_dir)
        >>> learner.call_hook('before_run')
        >>> info = learner.train(batch, env_step=1000)
    """

    config: Dict[str, Any] = dict(
        hook=dict(
            load_ckpt="",  # path of a checkpoint to resume from before training
            save_ckpt_after_iter=Field(0, ge=0),  # save ckpt/iteration_{n}.pt every n iterations; 0 = never
            save_ckpt_after_run=True,  # save ckpt/final.pt when training ends
            log_show_after_iter=Field(500, ge=0),  # print and write train/* scalars every n iterations; 0 = never
        ),
        lr_decay=dict(
            type=Field("none", choices=LR_DECAY_TYPES),
            end_factor=Field(0.1, ge=0),
            total_iter=Field(100000, ge=1),
        ),
        # batches a background thread samples ahead from the replay buffer (AsyncDataLoader); 0 samples in the
        # learner's own thread. Prefetching trades exact reproducibility for not waiting on sampling.
        prefetch=Field(0, ge=0),
    )

    def __init__(
        self,
        cfg: Dict[str, Any],
        learn_mode: Any,
        run_dir: Optional[str] = None,
        logger: Optional[logging.Logger] = None,
        scalar_writer: Optional[ScalarWriter] = None,
    ) -> None:
        self._cfg = compile_section(BaseLearner, cfg, "learner")
        self._policy = learn_mode
        self.run_dir = run_dir
        self.ckpt_dir = os.path.join(run_dir, "ckpt") if run_dir else None
        self.logger = logger or logging.getLogger("nervex")
        self.scalar_writer = scalar_writer or ScalarWriter(None)
        self.last_iter = 0
        self.env_step = 0
        self.last_info: Dict[str, Any] = {}
        self.train_time = 0.0
        self._hooks: Dict[str, List[LearnerHook]] = {p: [] for p in POSITIONS}
        self._setup_hooks(self._cfg)

    @property
    def optimizers(self) -> Dict[str, Any]:
        """Every optimizer of the policy's learn mode, by name (what lr hooks act on)."""
        return self._policy.optimizers()

    def _setup_hooks(self, cfg: Dict[str, Any]) -> None:
        hook_cfg = cfg.hook
        if hook_cfg.get("load_ckpt"):
            self.register_hook(LoadCkptHook(hook_cfg["load_ckpt"]))
        if self.ckpt_dir is not None:
            if hook_cfg.get("save_ckpt_after_iter", 0) > 0:
                self.register_hook(SaveCkptHook("after_iter", hook_cfg["save_ckpt_after_iter"]))
            if hook_cfg.get("save_ckpt_after_run", True):
                self.register_hook(SaveCkptHook("after_run"))
        if hook_cfg.get("log_show_after_iter", 0) > 0:
            self.register_hook(LogShowHook(hook_cfg["log_show_after_iter"]))
        lr_cfg = cfg.lr_decay
        if lr_cfg.type != "none":
            optimizers = self.optimizers
            if not optimizers:
                raise ValueError("learner.lr_decay is set but the policy's learn mode has no optimizer to decay")
            self.register_hook(
                LrDecayHook(list(optimizers.values()), lr_cfg.type, lr_cfg.end_factor, lr_cfg.total_iter)
            )

    def register_hook(self, hook: LearnerHook) -> None:
        """Add a hook; hooks at one position run in ascending priority."""
        hooks = self._hooks[hook.position]
        hooks.append(hook)
        hooks.sort(key=lambda h: h.priority)

    def call_hook(self, position: str) -> None:
        """Run every hook registered at ``position``."""
        for hook in self._hooks[position]:
            hook(self)

    def train(
        self, data: Dict[str, Any], env_step: Optional[int] = None, setting: Optional[Dict[str, Any]] = None
    ) -> Dict[str, Any]:
        """One gradient step on ``data`` (a batch dict).

        Args:
            data: The batch.
            env_step: The actor's env step count (for logs and checkpoints).
            setting: The command mode's learn settings (a learning-rate or clip schedule's current value).

        Returns:
            The policy's figures for this step (``total_loss``, ``cur_lr``, ..., and ``priority`` when the policy
            uses prioritized replay).
        """
        if env_step is not None:
            self.env_step = int(env_step)
        self.call_hook("before_iter")
        start = time.perf_counter()
        info = self._policy.forward(data, **(setting or {}))
        self.train_time += time.perf_counter() - start
        self.last_iter += 1
        self.last_info = info
        self.call_hook("after_iter")
        return info

    def state_dict(self) -> Dict[str, Any]:
        """Only state_dicts and plain numbers, so the file loads with ``torch.load(weights_only=True)``."""
        return {
            "version": CHECKPOINT_VERSION,
            "policy": self._policy.state_dict(),
            "train_iter": int(self.last_iter),
            "env_step": int(self.env_step),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        version = state.get("version")
        if version != CHECKPOINT_VERSION:
            raise ValueError(
                f"checkpoint version {version!r} is not supported (expected {CHECKPOINT_VERSION}); version 1 came "
                "from nervex 0.1, whose weights are in state['policy']['model']['model']"
            )
        self._policy.load_state_dict(state["policy"])
        self.last_iter = int(state["train_iter"])
        self.env_step = int(state["env_step"])

    def save_checkpoint(self, path: str) -> str:
        save_checkpoint(self.state_dict(), path)
        return path

    def load_checkpoint(self, path: str) -> None:
        self.load_state_dict(load_checkpoint(path))
