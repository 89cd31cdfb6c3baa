"""Serial training: every part in one process (envs may still run in subprocesses).

``SerialTrainer`` wires env managers, policy, learner, actor, replay buffer and evaluator together from one
config; ``serial_pipeline`` runs it to the end. The loop of one training iteration (``SerialTrainer.train``) is:

    setting = policy.command_mode.get_setting_collect(...)      # e.g. epsilon for this env step
    samples = actor.generate_data(n_sample, setting)             # transitions -> train samples (Adder)
    buffer.extend(samples)
    for _ in range(train_iteration):
        info = learner.train(buffer.sample(batch_size)); buffer.update(info['priority'])
    if it is time: evaluator.eval() -> stop once the mean return reaches stop_val
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from typing import Any, Dict, Iterator, Mapping, Optional

import numpy as np
import torch
from easydict import EasyDict

from nervex.config import compile_config, save_config
from nervex.data import PrioritizedBuffer, ReplayBuffer
from nervex.envs import ENV_PIPELINE_KEYS
from nervex.policy import create_policy, set_seed
from nervex.torch_utils import collate
from nervex.utils import ENV_MANAGER_REGISTRY, ENV_REGISTRY, MODEL_REGISTRY
from nervex.utils.log_helper import CsvWriter, ScalarWriter, build_logger, close_logger
from nervex.worker.actor import SerialActor, SerialEvaluator, eval_episodes_per_env
from nervex.worker.learner import BaseLearner

from .callbacks import DefaultCallbacks

EVAL_SEED_OFFSET = 100_000  # evaluator envs are seeded apart from every collector env
EVAL_CSV_FIELDS = [
    "env_step",
    "train_iter",
    "mean_reward",
    "std_reward",
    "min_reward",
    "max_reward",
    "n_episode",
    "wall_time",
    "eval_time",
]


def default_exp_name(cfg: Mapping[str, Any], seed: int) -> str:
    env = cfg["env"].get("env_id") or cfg["env"]["env_type"]
    return f"{env}__{cfg['policy']['policy_type']}__{seed}__{time.strftime('%Y%m%d-%H%M%S')}"


def fill_model_from_env(model_cfg: Dict[str, Any], env_info: Any) -> None:
    """Fill ``obs_dim``/``obs_shape``/``action_dim`` of the model config from the env's spaces when left out."""
    cls = MODEL_REGISTRY.get(model_cfg["model_type"])
    params = inspect.signature(cls.__init__).parameters
    obs_shape = tuple(env_info.obs_space.shape or ())
    act_space = env_info.act_space
    if "obs_dim" in params and model_cfg.get("obs_dim") is None:
        model_cfg["obs_dim"] = int(np.prod(obs_shape)) if len(obs_shape) <= 1 else list(obs_shape)
    if "obs_shape" in params and model_cfg.get("obs_shape") is None:
        model_cfg["obs_shape"] = list(obs_shape)
    if "action_dim" in params and model_cfg.get("action_dim") is None:
        model_cfg["action_dim"] = int(act_space.n) if hasattr(act_space, "n") else int(np.prod(act_space.shape))


def _is_compiled(cfg: Any) -> bool:
    return bool(getattr(cfg, "_compiled", False))


class SerialTrainer:
    """A whole serial training run, usable as a loop, one step at a time, or to the end.

    Args:
        cfg: A user config (compiled here) or a compiled one.
        seed: Overrides ``cfg.seed``. Seeds Python, NumPy, torch, collector env ``i`` (``seed + i``) and evaluator
            env ``i`` (``seed + 100000 + i``).
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
        cfg = cfg if _is_compiled(cfg) else compile_config(cfg)
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
        self.scalar_writer = ScalarWriter(self.run_dir)
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

    # ---- construction ----------------------------------------------------------------------------------------
    def _build(self, cfg: EasyDict) -> None:
        env_cls = ENV_REGISTRY.get(cfg.env.env_type)
        env_cfg = {k: v for k, v in cfg.env.items() if k not in ENV_PIPELINE_KEYS}
        probe = env_cls(env_cfg)
        self.env_info = probe.info()
        probe.close()
        fill_model_from_env(cfg.policy.model, self.env_info)
        manager_cls = ENV_MANAGER_REGISTRY.get(cfg.env.manager_type)
        collector_env = manager_cls(env_cls, env_cfg, cfg.env.collector_env_num, **cfg.env.manager)
        self._env_managers.append(collector_env)
        collector_env.seed(self.seed)
        n_eval_env = max(1, min(cfg.env.evaluator_env_num, cfg.evaluator.n_episode))
        # an env class may play evaluation differently (e.g. Atari: whole games instead of lives)
        eval_env_cfg = {**env_cfg, **getattr(env_cls, "eval_overrides", {})}
        evaluator_env = manager_cls(
            env_cls,
            eval_env_cfg,
            n_eval_env,
            episode_num=eval_episodes_per_env(cfg.evaluator.n_episode, n_eval_env),
            **cfg.env.manager,
        )
        self._env_managers.append(evaluator_env)
        evaluator_env.seed(self.seed + EVAL_SEED_OFFSET)
        self.policy = create_policy(cfg.policy)
        self.learner = BaseLearner(cfg.learner, self.policy.learn_mode, self.run_dir, self.logger, self.scalar_writer)
        self.actor = SerialActor(
            cfg.actor,
            collector_env,
            self.policy.collect_mode,
            callbacks=_ActorCallbacks(self),
            data_writer=self._make_data_writer(cfg.actor.save_data),
        )
        self.evaluator = SerialEvaluator(cfg.evaluator, evaluator_env, self.policy.eval_mode)
        self.on_policy = bool(getattr(self.policy, "on_policy", False))
        buffer_cls = PrioritizedBuffer if cfg.policy.get("priority", False) else ReplayBuffer
        self.buffer = None if self.on_policy else _build_buffer(buffer_cls, cfg.replay_buffer, self.seed)
        self.eval_csv = CsvWriter(os.path.join(self.run_dir, "eval.csv"), EVAL_CSV_FIELDS)
        self._loader: Optional[Any] = None  # AsyncDataLoader when learner.prefetch > 0, made at the first batch
        self.learner.call_hook("before_run")  # may resume from learner.hook.load_ckpt
        self.actor.env_step = self.learner.env_step
        self.stopped = False
        self.stop_reason = ""
        self.last_eval: Dict[str, Any] = {}
        self._start_time = time.time()
        self._start_env_step = self.actor.env_step
        self._last_log_step = self.actor.env_step
        self._logged_restarts = 0

    @staticmethod
    def _make_data_writer(path: str) -> Optional[Any]:
        if not path:
            return None
        from nervex.data import TrajectoryWriter

        return TrajectoryWriter(path)

    # ---- the loop --------------------------------------------------------------------------------------------
    @property
    def env_step(self) -> int:
        return self.actor.env_step

    @property
    def train_iter(self) -> int:
        return self.learner.last_iter

    def train(self) -> Dict[str, Any]:
        """Run one iteration (collect, learn, maybe evaluate) and return its figures."""
        if self._closed:
            raise RuntimeError("this SerialTrainer is closed")
        cfg = self.cfg
        setting = self.policy.command_mode.get_setting_collect(
            {"env_step": self.env_step, "train_iter": self.train_iter}
        )
        samples = self.actor.generate_data(cfg.policy.collect.n_sample, setting)
        self.callbacks.on_sample_end(self, samples)
        learn_info = self._learn(samples)
        result: Dict[str, Any] = {"env_step": self.env_step, "train_iter": self.train_iter}
        result.update({k: v for k, v in setting.items() if isinstance(v, (int, float))})
        result.update(self.actor.stats())
        if learn_info:
            result["train/loss"] = learn_info.get("total_loss")
        result.update(self._maybe_eval())
        self._check_limits()
        result["stop"] = self.stopped
        self._log(result)
        self.callbacks.on_train_result(self, result)
        return result

    def _learn(self, samples: list) -> Dict[str, Any]:
        learn = self.cfg.policy.learn
        info: Dict[str, Any] = {}
        if self.on_policy:
            batch = collate(samples)
            for _ in range(learn.train_iteration):
                info = self.learner.train(batch, self.env_step)
                self.callbacks.on_learn_on_batch(self, batch, info)
            return info
        self.buffer.extend(samples, learner_iter=self.train_iter)
        if self.env_step < learn.get("learning_starts", 0) or len(self.buffer) < learn.batch_size:
            return info
        for _ in range(learn.train_iteration):
            batch = self._next_batch(learn.batch_size)
            if batch is None:
                break
            info = self.learner.train(batch, self.env_step)
            self.callbacks.on_learn_on_batch(self, batch, info)
            if "priority" in info and isinstance(self.buffer, PrioritizedBuffer):
                self.buffer.update(info["priority"])
        return info

    def _next_batch(self, batch_size: int) -> Optional[Dict[str, Any]]:
        prefetch = int(self.cfg.learner.get("prefetch", 0))
        if prefetch <= 0:
            return self.buffer.sample(batch_size, learner_iter=self.train_iter)
        if self._loader is None:
            from nervex.data import AsyncDataLoader

            self._loader = AsyncDataLoader(
                self.buffer,
                batch_size=batch_size,
                queue_size=prefetch,
                pin_memory=self.policy.device.type == "cuda",
                learner_iter_fn=lambda: self.train_iter,
            )
        return next(self._loader)

    def _maybe_eval(self) -> Dict[str, Any]:
        if not self.evaluator.should_eval(self.env_step):
            return {}
        res = self.evaluator.eval(self.train_iter, self.env_step)
        self.last_eval = res
        wall = time.time() - self._start_time
        self.eval_csv.write(
            {k.split("/")[-1]: v for k, v in res.items()} | {"wall_time": wall, "eval_time": res["eval/time"]}
        )
        self.logger.info(
            f"[evaluator] env_step={self.env_step} train_iter={self.train_iter} "
            f"mean_reward={res['eval/mean_reward']:.2f} (+-{res['eval/std_reward']:.2f}, {res['eval/n_episode']} episodes)"
        )
        if res["best"]:
            self.learner.save_checkpoint(os.path.join(self.run_dir, "ckpt", "best.pt"))
        if res["stop"]:
            self.stopped = True
            self.stop_reason = (
                f"evaluation mean {res['eval/mean_reward']:.2f} >= stop_val {self.cfg.evaluator.stop_val}"
            )
            self.logger.info(f"target reached: {self.stop_reason}")
        return {k: v for k, v in res.items() if k.startswith("eval/")}

    def _check_limits(self) -> None:
        if self.stopped:
            return
        if self.env_step >= self.cfg.max_env_step:
            self.stopped, self.stop_reason = True, f"max_env_step {self.cfg.max_env_step} reached"
        elif self.train_iter >= self.cfg.max_train_iter:
            self.stopped, self.stop_reason = True, f"max_train_iter {self.cfg.max_train_iter} reached"

    def _log(self, result: Dict[str, Any]) -> None:
        restarts = int(result.get("env/restarts", 0))
        if restarts > self._logged_restarts:
            self.logger.warning(
                f"[actor] env restarts: {restarts} (dropped episodes: {int(result.get('env/dropped_episodes', 0))}, "
                f"timeouts: {int(result.get('env/timeouts', 0))}, crashes: {int(result.get('env/crashes', 0))})"
            )
            self._logged_restarts = restarts
        elapsed = max(1e-9, time.time() - self._start_time)
        result["time/fps"] = (self.env_step - self._start_env_step) / elapsed
        result["time/time_elapsed"] = elapsed
        # rollout/time scalars every 1000 env steps keep event files small; eval scalars whenever there are some
        if self.env_step - self._last_log_step >= 1000 or any(k.startswith("eval/") for k in result) or self.stopped:
            self._last_log_step = self.env_step
            scalars = {k: v for k, v in result.items() if "/" in k and v is not None}
            if self.buffer is not None:
                scalars.update(self.buffer.stats())
            self.scalar_writer.add_scalars(scalars, self.env_step)

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
            f"after {time.time() - self._start_time:.1f}s"
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
        self.learner.env_step = self.env_step
        path = self.learner.save_checkpoint(os.path.join(directory, f"iteration_{self.train_iter}.pt"))
        if with_buffer and self.buffer is not None:
            self.buffer.save(path[: -len(".pt")] + ".replay.npz")
        return path

    def load_checkpoint(self, path: str, with_buffer: bool = False) -> None:
        """Restore model, optimizer, ``train_iter`` and ``env_step`` (and the replay buffer if saved)."""
        self.learner.load_checkpoint(path)
        self.actor.env_step = self.learner.env_step
        self._start_env_step = self.actor.env_step
        replay = path[: -len(".pt")] + ".replay.npz"
        if with_buffer and self.buffer is not None and os.path.exists(replay):
            self.buffer.load(replay)

    def compute_single_action(self, obs: Any, explore: bool = False) -> Any:
        """The action the trained policy takes for one observation (greedy unless ``explore``)."""
        if explore:
            setting = self.policy.command_mode.get_setting_collect({"env_step": self.env_step})
            return self.policy.collect_mode.forward([0], {0: obs}, **setting)[0]["action"]
        return self.policy.eval_mode.forward([0], {0: obs})[0]["action"]

    def close(self) -> None:
        """Save the final checkpoint, stop every env process and close the logs; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self.learner.env_step = self.env_step
            self.learner.call_hook("after_run")
        finally:
            if self._loader is not None:
                self._loader.close()
            self.actor.close()
            self.evaluator.close()
            self.eval_csv.close()
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


def _build_buffer(buffer_cls: type, buffer_cfg: Mapping[str, Any], seed: int) -> Any:
    kwargs = dict(buffer_cfg)
    params = inspect.signature(buffer_cls.__init__).parameters
    if "seed" in params and kwargs.get("seed") is None:
        kwargs["seed"] = seed
    kwargs = {k: v for k, v in kwargs.items() if k in params}
    return buffer_cls(**kwargs)


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

    Example:
        >>> policy = serial_pipeline(read_config('app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml'), seed=0)
    """
    trainer = SerialTrainer(cfg, seed=seed, exp_name=exp_name, callbacks=callbacks, run_root=run_root)
    try:
        trainer.run(progress=progress)
    finally:
        trainer.close()
    return trainer.policy


__all__ = ["SerialTrainer", "serial_pipeline", "default_exp_name", "fill_model_from_env"]
