"""Serial training: every part in one process (envs may still run in subprocesses).

``SerialTrainer`` builds a run from one config with the builder's ``make_*`` functions and reads the policy only
through its training contract (``Policy.contract``) and its four modes. It collects; the learn loop
(``nervex.worker.learner.LearnLoop``, which the parallel learner drives too) trains, evaluates and stops. One
iteration (``SerialTrainer.train``):

    setting = policy.command_mode.get_setting_collect(progress)      # e.g. epsilon for this env step
    samples = actor.collect(contract.collect, setting)               # the contract's unit: samples, rollout, episodes
    off-policy: loop.store(samples); loop.train_off_policy(update_per_collect)    # after learning_starts
    on-policy:  loop.train_rollout(samples)        # epoch_per_collect x shuffled minibatches of the rollout
    if it is time: loop.evaluate() -> eval.csv, ckpt/best.pt, stop once the mean return reaches stop_val
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional

import torch
from easydict import EasyDict

from nervex.config import is_compiled, read_config, save_config
from nervex.policy import set_seed
from nervex.torch_utils import load_checkpoint, save_checkpoint
from nervex.utils.log_helper import ScalarWriter, build_logger, close_logger
from nervex.worker.learner.loop import LearnLoop, Trained, train_scalar_name

from .builder import (
    compile_config,
    make_actor,
    make_buffer,
    make_env_managers,
    make_evaluator,
    make_learner,
    make_policy,
)
from .callbacks import DefaultCallbacks


def default_exp_name(cfg: Mapping[str, Any], seed: int) -> str:
    env = cfg["env"].get("env_id") or cfg["env"]["env_type"]
    return f"{env}__{cfg['policy']['policy_type']}__{seed}__{time.strftime('%Y%m%d-%H%M%S')}"


class SerialTrainer:
    """A whole serial training run, usable as a loop, one step at a time, or to the end.

    Args:
        cfg: A user config (compiled here) or a compiled one.
        seed: Overrides ``cfg.seed``. Seeds Python, NumPy, torch, collector env ``i`` (``seed + i``), evaluator
            env ``i`` (``seed + 100000 + i``), random warm-up actions and minibatch shuffling.
        exp_name: Run directory name under ``run_root`` (default: ``cfg.exp_name`` or ``{env}__{policy}__{seed}__{time}``).
        callbacks: An object with any of ``on_episode_start/step/end``, ``on_sample_end``, ``on_learn_on_batch``,
            ``on_train_result`` (see ``DefaultCallbacks``).
        run_root: Parent folder of run directories.

    Example:
        >>> trainer = SerialTrainer(read_config('cartpole_dqn.yaml'), seed=0)
        >>> for result in trainer:          # one dict of figures per iteration, until the target is reached
        ...     print(result['env_step'], result.get('eval/mean_reward'))
        >>> trainer.close()
    """

    def __init__(
        self,
        cfg: Mapping[str, Any],
        seed: Optional[int] = None,
        exp_name: Optional[str] = None,
        callbacks: Optional[Any] = None,
        run_root: str = "runs",
    ) -> None:
        cfg = cfg if is_compiled(cfg) else compile_config(cfg)
        if cfg.get("league") is not None:
            raise ValueError(
                "this config has a 'league' section: it trains every player of the league, with "
                "nervex.entry.LeagueTrainer (serial_pipeline and nervex -m serial choose it by themselves)"
            )
        cfg = EasyDict(cfg)
        if seed is not None:
            cfg.seed = int(seed)
        self.cfg = cfg
        self.seed = int(cfg.seed)
        set_seed(self.seed)
        if cfg.num_threads:
            torch.set_num_threads(int(cfg.num_threads))
        self.callbacks = callbacks or DefaultCallbacks()
        self.run_dir = os.path.join(run_root, exp_name or cfg.exp_name or default_exp_name(cfg, self.seed))
        os.makedirs(os.path.join(self.run_dir, "ckpt"), exist_ok=True)
        self.logger = build_logger(self.run_dir)
        try:
            self.scalar_writer = ScalarWriter(self.run_dir, cfg, self.logger)  # + W&B when logger.wandb says so
        except ImportError:
            close_logger(self.logger)
            raise
        self._closed = True
        self._env_managers: list = []
        try:
            self._build(cfg)
        except BaseException:
            # a config that fails half-way (a bad model kwarg, an unknown env id) must leave nothing open behind
            for manager in self._env_managers:
                manager.close()
            self.scalar_writer.close()
            close_logger(self.logger)
            raise
        self._closed = False
        save_config(cfg, os.path.join(self.run_dir, "config.yaml"))
        self.logger.info(f"run directory: {self.run_dir}")
        self.logger.info(f"[actor] {self.actor.seating.describe()}")

    # ---- construction ----------------------------------------------------------------------------------------
    def _build(self, cfg: EasyDict) -> None:
        collector_env, evaluator_env, self.env_info = make_env_managers(cfg, self.seed)
        self._env_managers += [collector_env, evaluator_env]
        self.policy = make_policy(cfg, self.env_info)
        self.contract = type(self.policy).contract(self.policy.cfg)
        self.learner = make_learner(cfg, self.policy, self.run_dir, self.logger, self.scalar_writer)
        self.actor = make_actor(cfg, collector_env, self.policy, self.seed, callbacks=_ActorCallbacks(self))
        self.evaluator = make_evaluator(cfg, evaluator_env, self.policy)
        self.evaluator.logger = self.logger  # its env-restart warnings go to the run's log.txt
        self.buffer = make_buffer(cfg, self.contract, self.seed)
        self.learner.call_hook("before_run")  # may resume from learner.hook.load_ckpt
        self.loop = LearnLoop(  # last: it opens eval.csv
            cfg,
            self.policy,
            self.learner,
            self.buffer,
            self.evaluator,
            run_dir=self.run_dir,
            logger=self.logger,
            scalar_writer=self.scalar_writer,
            seed=self.seed,
            prefetch=int(cfg.learner.prefetch),
            on_batch=lambda batch, info: self.callbacks.on_learn_on_batch(self, batch, info),
        )
        self.loop.set_progress(self.learner.env_step)
        self._logged_restarts = 0

    # ---- the loop --------------------------------------------------------------------------------------------
    @property
    def env_step(self) -> int:
        """Env steps of the run (counted by the learn loop, from a resumed checkpoint's on)."""
        return self.loop.env_step

    @property
    def train_iter(self) -> int:
        """Gradient steps taken so far."""
        return self.loop.train_iter

    @property
    def stopped(self) -> bool:
        """Whether the target return, ``max_env_step`` or ``max_train_iter`` was reached."""
        return self.loop.stopped

    @property
    def stop_reason(self) -> str:
        return self.loop.stop_reason

    @property
    def last_eval(self) -> Dict[str, Any]:
        """The figures of the last evaluation (empty before the first)."""
        return self.loop.last_eval

    def command_info(self) -> Dict[str, Any]:
        """The progress the command mode turns into settings (``learner_step`` is nerveX's name of ``train_iter``)."""
        return self.loop.command_info()

    def train(self) -> Dict[str, Any]:
        """Run one iteration (collect, learn, maybe evaluate) and return its figures."""
        if self._closed:
            raise RuntimeError("this SerialTrainer is closed")
        setting = self.policy.command_mode.get_setting_collect(self.command_info())
        learn = self.contract.learn
        warmup = learn.random_warmup and self.env_step < learn.learning_starts
        before = self.actor.env_step
        samples = self.actor.collect(self.contract.collect, setting, random_action=warmup)
        self.loop.env_step += self.actor.env_step - before
        self.callbacks.on_sample_end(self, samples)
        trained = self._learn(samples)
        rollout = self.actor.stats()
        result: Dict[str, Any] = {"env_step": self.env_step, "train_iter": self.train_iter}
        result.update({k: v for k, v in setting.items() if isinstance(v, (int, float))})
        result.update(rollout)
        result.update({train_scalar_name(k): v for k, v in trained.figures.items()})
        if self.loop.eval_due():
            result.update(self.loop.evaluate())
        result["stop"] = self.loop.check_limits()
        result.update(self.loop.time_figures())
        self._warn_env_restarts(rollout)
        self.loop.write_scalars(rollout)
        self.callbacks.on_train_result(self, result)
        return result

    def _learn(self, samples: List[Dict[str, Any]]) -> Trained:
        """On-policy: train on the rollout; off-policy: store it, then ``update_per_collect`` steps once the run
        is past ``learning_starts``."""
        if self.contract.on_policy:
            return self.loop.train_rollout(samples)
        self.loop.store(samples)
        learn = self.contract.learn
        return self.loop.train_off_policy(learn.update_per_collect if self.env_step >= learn.learning_starts else 0)

    def _warn_env_restarts(self, rollout: Mapping[str, float]) -> None:
        restarts = int(rollout.get("env/restarts", 0))
        if restarts > self._logged_restarts:
            self.logger.warning(
                f"[actor] env restarts: {restarts} (dropped episodes: {int(rollout.get('env/dropped_episodes', 0))}, "
                f"timeouts: {int(rollout.get('env/timeouts', 0))}, crashes: {int(rollout.get('env/crashes', 0))})"
            )
            self._logged_restarts = restarts

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        while not self.stopped:
            yield self.train()

    def run(self, progress: Optional[bool] = None) -> Dict[str, Any]:
        """Train until the target return, ``max_env_step`` or ``max_train_iter``; return the last figures.

        Args:
            progress: Show a tqdm bar over env steps (default: only when stderr is a terminal).
        """
        from tqdm import tqdm

        show = sys.stderr.isatty() if progress is None else progress
        result: Dict[str, Any] = {}
        with tqdm(
            total=int(self.cfg.max_env_step), initial=self.env_step, disable=not show, unit="step", dynamic_ncols=True
        ) as bar:
            for result in self:
                bar.update(self.env_step - bar.n)
                if "eval/mean_reward" in result:
                    bar.set_postfix(eval=f"{result['eval/mean_reward']:.1f}")
        self.logger.info(
            f"training stopped ({self.stop_reason}) at env_step={self.env_step} train_iter={self.train_iter} "
            f"after {self.loop.time_figures()['time/time_elapsed']:.1f}s"
        )
        return result

    # ---- checkpoints and acting ------------------------------------------------------------------------------
    def save_checkpoint(self, directory: Optional[str] = None, with_buffer: bool = False) -> str:
        """Save model, optimizer, ``train_iter`` and ``env_step`` to ``directory/iteration_{n}.pt``.

        Args:
            directory: Default: the run's ``ckpt/``.
            with_buffer: Also save the replay buffer's contents next to it (``.replay.npz``).

        Returns:
            The checkpoint's path.
        """
        directory = directory or os.path.join(self.run_dir, "ckpt")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"iteration_{self.train_iter}.pt")
        save_checkpoint(self.loop.state_dict(), path)
        if with_buffer and self.buffer is not None:
            self.buffer.save(path[: -len(".pt")] + ".replay.npz")
        return path

    def load_checkpoint(self, path: str, with_buffer: bool = False) -> None:
        """Restore model, optimizer, ``train_iter`` and ``env_step`` (and the replay buffer if saved)."""
        self.loop.load_state_dict(load_checkpoint(path))
        replay = path[: -len(".pt")] + ".replay.npz"
        if with_buffer and self.buffer is not None and os.path.exists(replay):
            self.buffer.load(replay)

    def compute_single_action(self, obs: Any, explore: bool = False) -> Any:
        """The action the trained policy takes for one observation (greedy unless ``explore``)."""
        if explore:
            setting = self.policy.command_mode.get_setting_collect(self.command_info())
            return self.policy.collect_mode.forward([0], {0: obs}, **setting)[0]["action"]
        setting = self.policy.command_mode.get_setting_eval(self.command_info())
        return self.policy.eval_mode.forward([0], {0: obs}, **setting)[0]["action"]

    def close(self) -> None:
        """Save the final checkpoint, stop every env process and close the logs; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self.loop.finish()
        finally:
            self.loop.close()
            self.actor.close()
            self.evaluator.close()
            self.scalar_writer.close()
            close_logger(self.logger)

    def __enter__(self) -> SerialTrainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.actor.close()
                self.evaluator.close()
        except Exception:
            pass


class _ActorCallbacks:
    """Adapts the trainer's callbacks (which receive the trainer) to the actor's episode events."""

    def __init__(self, trainer: SerialTrainer) -> None:
        self._trainer = trainer

    def on_episode_start(self, env_id: int) -> None:
        self._trainer.callbacks.on_episode_start(self._trainer, env_id)

    def on_episode_step(self, env_id: int, transition: Dict[str, Any]) -> None:
        self._trainer.callbacks.on_episode_step(self._trainer, env_id, transition)

    def on_episode_end(self, env_id: int, episode_return: float, episode_len: int) -> None:
        self._trainer.callbacks.on_episode_end(self._trainer, env_id, episode_return, episode_len)


def serial_pipeline(
    cfg: Mapping[str, Any],
    seed: int = 0,
    exp_name: Optional[str] = None,
    run_root: str = "runs",
    callbacks: Optional[Any] = None,
    progress: Optional[bool] = None,
) -> Any:
    """Train the policy a config describes until its target return (or step limit); return the trained policy.

    A config with a ``league`` section trains every player of its league (``LeagueTrainer``) and returns the main
    player's policy.

    Example:
        >>> policy = serial_pipeline(read_config('app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml'), seed=0)
    """
    if cfg.get("league") is not None:
        from .league_entry import league_pipeline

        league = league_pipeline(cfg, seed=seed, exp_name=exp_name, run_root=run_root, progress=progress)
        return league.players[league.league.main_player() or next(iter(league.players))].policy
    trainer = SerialTrainer(cfg, seed=seed, exp_name=exp_name, callbacks=callbacks, run_root=run_root)
    try:
        trainer.run(progress=progress)
    finally:
        trainer.close()
    return trainer.policy


def run_config_of(checkpoint: str) -> str:
    """The resolved ``config.yaml`` of the run a checkpoint belongs to (``runs/<name>/ckpt/x.pt``)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(checkpoint))), "config.yaml")


def load_policy(checkpoint: str, cfg: Optional[Mapping[str, Any]] = None, enable_field: Any = ("eval",)) -> Any:
    """A policy with only the modes it is asked for (eval by default), its state loaded from a checkpoint.

    Any checkpoint a learner wrote (``best.pt``, ``final.pt``, ``iteration_N.pt``) loads into any mode: the policy
    state has one format for all of them.

    Args:
        checkpoint: The checkpoint file.
        cfg: The run's config (default: ``config.yaml`` of the run directory the checkpoint is in).
        enable_field: The modes to build, e.g. ``('collect',)`` for an actor.

    Returns:
        The policy (``policy.eval_mode.forward([0], {0: obs})[0]['action']`` acts).
    """
    state = load_checkpoint(checkpoint)
    cfg = cfg if cfg is not None else read_config(run_config_of(checkpoint))
    cfg = cfg if is_compiled(cfg) else compile_config(cfg)
    from nervex.envs import create_env

    probe = create_env(cfg.env)
    env_info = probe.info()
    probe.close()
    policy = make_policy(cfg, env_info, enable_field=list(enable_field))
    mode = getattr(policy, f"{enable_field[0]}_mode")
    mode.load_state_dict(state["policy"])
    return policy


def serial_eval(
    checkpoint: str,
    cfg: Optional[Mapping[str, Any]] = None,
    seed: int = 0,
    n_episode: Optional[int] = None,
) -> Dict[str, Any]:
    """Evaluate a checkpoint with an eval-only policy on fresh evaluator envs; return the evaluator's figures."""
    cfg = cfg if cfg is not None else read_config(run_config_of(checkpoint))
    cfg = EasyDict(cfg if is_compiled(cfg) else compile_config(cfg))
    if n_episode is not None:
        cfg.evaluator.n_episode = int(n_episode)
    set_seed(seed)
    policy = load_policy(checkpoint, cfg)
    _, evaluator_env, _ = make_env_managers(cfg, seed, evaluator=True, collector=False)
    evaluator = make_evaluator(cfg, evaluator_env, policy)
    try:
        return evaluator.eval()
    finally:
        evaluator.close()


__all__ = [
    "SerialTrainer",
    "serial_pipeline",
    "serial_eval",
    "load_policy",
    "default_exp_name",
]
