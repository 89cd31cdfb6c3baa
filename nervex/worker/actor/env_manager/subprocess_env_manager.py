"""``SubprocessEnvManager``: envs in worker processes, stepped in parallel, restarted when they fail.

Layout: ``env_num`` envs over ``worker_num`` processes in contiguous blocks (envs 0-3 in worker 0...). One step
sends one message per worker with the actions of its envs and gets one answer back; observations and rewards
travel through shared memory (rows of one array per manager; reward rows shaped like the env's ``rew_space``: a
float, or one per agent) when the observation space is a Box, the rest (``info``, final observations, dict
observations and their rewards) through the pipe.

Failures (see :func:`~nervex.worker.actor.env_manager.base_env_manager.abnormal_timestep` for what the actor
receives):

- an exception in an env's ``step``/``reset``: that env alone is rebuilt in its worker;
- a worker that dies (``os._exit``, SIGKILL, SIGSEGV...), or stays in a step longer than ``step_timeout`` or in a
  reset longer than ``reset_timeout``: the worker is killed and started again, and each of its envs is rebuilt.
  The worker writes what it is doing and since when to shared memory (a :class:`~.subprocess_worker.PhaseSlot`), so the auto-reset of
  an env whose episode ended inside a step is timed as a reset, and the step goes on with a fresh ``step_timeout``
  from the end of that reset;
- ``EnvResetRequest`` from an env's ``step``: the env is reset (not rebuilt).

An episode cut by a failure is dropped and counted (``stats``). An env that fails more than ``max_retry`` times in a
row (no good step in between) raises :class:`EnvError` naming the env, the error and the child's traceback (for
a crash: what ``faulthandler`` wrote, for a timeout: where the child was stuck).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import gymnasium as gym
import numpy as np

from nervex.config import Field, signature_config
from nervex.envs.base_env import BaseEnvTimestep
from nervex.envs.multi_agent import reward_shape
from nervex.utils.registry import ENV_MANAGER_REGISTRY

from .base_env_manager import _MISSING, BaseEnvManager, EnvError, EnvFn, abnormal_timestep
from .subprocess_worker import DONE, DONE_RESET, RESET_REQUEST, RESETTING, STEP, STEPPING, SharedSlots
from .worker_pool import WorkerHandle, WorkerPool, describe_exit, split_envs

_new_timestep = tuple.__new__
DEFAULT_CONTEXT = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
CLOSE_TIMEOUT_S = 2.0  # how long close() waits for workers to exit before killing them
# longest wait between two looks at the workers' phases: the end of a reset inside a step moves that step's deadline
# earlier (step_timeout from now instead of reset_timeout from the reset's start), which no pipe event announces
PHASE_CHECK_S = 0.1


class SubprocessEnvManager(BaseEnvManager):
    """Steps envs in worker processes; same arguments and contract as :class:`BaseEnvManager`, plus the options
    below (``SubprocessEnvManager.config`` holds their defaults).

    Args:
        worker_num: Worker processes; ``None``: ``min(env_num, os.cpu_count())``.
        context: Start method: ``'fork'`` (fast; the default where available), ``'spawn'`` or ``'forkserver'``
            (``env_fn`` and ``env_cfg`` must then be picklable).
        shared_memory: Observations (Box spaces) and rewards through shared memory instead of the pipe.
        step_timeout: Seconds a worker may take to step its envs once, counted from the start of the step or from
            the end of the last auto-reset inside it (an env whose episode ended is reset before the worker
            answers; that reset is timed against ``reset_timeout``); ``None``: wait forever.
        reset_timeout: Seconds a worker may take to (re)build and reset its envs, and for each auto-reset inside a
            step; ``None``: wait forever.
        max_retry: Consecutive failures of one env answered by a restart; one more raises :class:`EnvError`.
        retry_delay: Seconds to wait before the second and later consecutive restart of the same env.
        wait_num: Async mode: ``step`` returns once this many envs have answered (the others keep stepping and
            answer in a later ``step``); ``None``: wait for all (sync). In async mode an actor must keep, per env,
            the observation it acted on: a returned timestep may answer an action of an earlier ``step``.
    """

    def __init__(
        self,
        env_fn: EnvFn,
        env_cfg: Union[Mapping[str, Any], Sequence[Mapping[str, Any]], None],
        env_num: int,
        episode_num: float = float("inf"),
        worker_num: Optional[int] = None,
        context: str = DEFAULT_CONTEXT,
        shared_memory: bool = True,
        step_timeout: Optional[float] = 60.0,
        reset_timeout: Optional[float] = 120.0,
        max_retry: int = 3,
        retry_delay: float = 0.5,
        wait_num: Optional[int] = None,
    ) -> None:
        super().__init__(env_fn, env_cfg, env_num, episode_num, max_retry=max_retry, retry_delay=retry_delay)
        if context not in mp.get_all_start_methods():
            raise ValueError(f"context must be one of {mp.get_all_start_methods()}, got {context!r}")
        if worker_num is not None and (not isinstance(worker_num, int) or worker_num < 1):
            raise ValueError(f"worker_num must be None or an int >= 1, got {worker_num!r}")
        if wait_num is not None and (not isinstance(wait_num, int) or wait_num < 1):
            raise ValueError(f"wait_num must be None (sync) or an int >= 1, got {wait_num!r}")
        for name, value in (("step_timeout", step_timeout), ("reset_timeout", reset_timeout)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be None or > 0 seconds, got {value!r}")
        self._ctx = mp.get_context(context)
        self._worker_num = min(env_num, worker_num or os.cpu_count() or 1)
        self._use_shm = bool(shared_memory)
        self._step_timeout = math.inf if step_timeout is None else float(step_timeout)
        self._reset_timeout = math.inf if reset_timeout is None else float(reset_timeout)
        self._wait_num = wait_num
        self._pool: Optional[WorkerPool] = None
        self._workers: List[WorkerHandle] = []
        self._worker_of: List[int] = []
        self._obs_buf: Optional[np.ndarray] = None
        self._rew_buf: Optional[np.ndarray] = None
        self._in_flight: Dict[int, Any] = {}  # env id -> the observation its pending action was chosen on
        self._results: Dict[int, BaseEnvTimestep] = {}

    config = signature_config(
        __init__,
        skip=("env_fn", "env_cfg", "env_num", "episode_num"),
        worker_num=Field(..., ge=1, kind="int"),
        context=Field(..., choices=tuple(mp.get_all_start_methods())),
        step_timeout=Field(..., gt=0, kind="number"),
        reset_timeout=Field(..., gt=0, kind="number"),
        max_retry=Field(..., ge=0),
        retry_delay=Field(..., ge=0),
        wait_num=Field(..., ge=1, kind="int"),
    )

    @property
    def worker_num(self) -> int:
        return self._worker_num

    @property
    def worker_pids(self) -> List[Optional[int]]:
        """The pid of each worker process (for tests and monitoring)."""
        return self._pool.pids if self._pool is not None else []

    # ---- starting ----------------------------------------------------------------------------------------------
    def launch(self) -> None:
        """Start the worker processes and reset every env (a launched manager just resets)."""
        if self._launched:
            self.reset()
            return
        self._closed = False
        shm = self._setup_shared_memory()
        blocks = split_envs(self._env_num, self._worker_num)
        self._pool = WorkerPool(self._ctx, self._env_fn, self._env_cfgs, blocks, shm)
        self._workers = self._pool.workers
        self._worker_of = [w for w, ids in enumerate(blocks) for _ in ids]
        self._launched = True
        try:
            for worker in self._workers:
                self._pool.start(worker)
            self.reset()
        except BaseException:
            self.close()
            raise

    def _setup_shared_memory(self) -> Optional[SharedSlots]:
        """Rows for Box observations and for rewards shaped like ``rew_space`` (its float dtype, else float64)."""
        self._obs_buf = self._rew_buf = None
        if not self._use_shm:
            return None
        info = self.env_info()
        space = info.obs_space
        if not isinstance(space, gym.spaces.Box):
            return None  # Dict/Tuple/Discrete observations (and then rewards too) go through the pipe
        rew_space = info.rew_space
        declared = getattr(rew_space, "dtype", None)
        rew_dtype = declared if declared is not None and np.dtype(declared).kind == "f" else np.float64
        shm = SharedSlots.allocate(
            self._ctx, space.dtype, (self._env_num, *space.shape), rew_dtype, (self._env_num, *reward_shape(info))
        )
        self._obs_buf, self._rew_buf = shm.arrays()
        return shm

    # ---- the answer loop ---------------------------------------------------------------------------------------
    def _send(self, worker: WorkerHandle, command: str, arg: Any) -> None:
        if not self._pool.send(worker, command, arg):
            self._on_worker_lost(worker, "crash")

    def _busy(self, worker: WorkerHandle) -> Tuple[str, float, str, float]:
        """What ``worker`` is doing for its oldest pending message: ``(activity, since, budget name, budget)``.

        Read from the phase the worker writes: stepping (``step_timeout``) or resetting (``reset_timeout``, also
        for an auto-reset inside a step). An idle worker has the message, or its answer, still in the pipe; it is
        timed from the later of sending and idling, with the budget of the command.
        """
        phase, since = worker.phase.get()
        if phase == STEPPING:
            return "stepping", since, "step_timeout", self._step_timeout
        if phase == RESETTING:
            return "resetting", since, "reset_timeout", self._reset_timeout
        command, sent_at = worker.pending[0]
        if command == "step":
            return "not taking up 'step'", max(since, sent_at), "step_timeout", self._step_timeout
        return f"not taking up '{command}'", max(since, sent_at), "reset_timeout", self._reset_timeout

    def _deadline(self, worker: WorkerHandle) -> float:
        _, since, _, budget = self._busy(worker)
        return since + budget

    def _enough(self, until_idle: bool) -> bool:
        if not any(w.pending for w in self._workers):
            return True
        if until_idle:
            return False
        # async: enough answers (or all there can be), and something for the caller to act on
        results = len(self._results)
        return results >= min(self._wait_num, results + len(self._in_flight)) and bool(results or self._ready)

    def _wait(self, until_idle: bool) -> None:
        """Handle answers until no message is pending (``until_idle``) or, in async mode, enough envs answered."""
        while not self._enough(until_idle):
            deadline = min(self._deadline(w) for w in self._workers if w.pending)
            news = self._pool.poll(min(deadline - time.monotonic(), PHASE_CHECK_S))
            for worker, generation, has_answer, has_exited in news:
                if generation != worker.generation:
                    continue  # restarted while handling an earlier entry
                if has_answer and worker.pending:
                    self._receive(worker)  # an exited worker's last answers are read before calling it a crash
                elif has_exited:
                    self._on_worker_lost(worker, "crash")
            if not news:
                now = time.monotonic()
                for worker in self._workers:
                    if worker.pending and self._deadline(worker) <= now:
                        self._on_worker_lost(worker, "timeout")

    def _receive(self, worker: WorkerHandle) -> None:
        try:
            kind, results, failures = worker.conn.recv()
        except (EOFError, OSError):
            self._on_worker_lost(worker, "crash")
            return
        worker.pending.popleft()
        if kind == "fatal":
            raise EnvError(f"worker {worker.index} (envs {list(worker.env_ids)}): {results}")
        if kind == "step":
            self._on_step_results(worker, results)
        else:
            self._on_reset_results(worker, results)
        for env_id, phase, error, tb in failures:
            self._on_env_failure(worker, env_id, phase, error, tb)

    def _read_shared(self, worker: WorkerHandle) -> Tuple[Optional[np.ndarray], Optional[Sequence[Any]]]:
        if self._obs_buf is None:
            return None, None
        lo, hi = worker.env_ids[0], worker.env_ids[-1] + 1
        # one copy per answer: later steps overwrite the shared rows, the views handed out must not change
        rewards = self._rew_buf[lo:hi]
        return self._obs_buf[lo:hi].copy(), rewards.tolist() if rewards.ndim == 1 else rewards.copy()

    def _on_step_results(self, worker: WorkerHandle, results: List[Any]) -> None:
        obs_rows, rewards = self._read_shared(worker)
        lo = worker.env_ids[0]
        ready, out, counts = self._ready, self._results, self._episode_count
        for env_id, status, reward, info, obs, final_obs in results:
            if obs_rows is not None:
                obs, reward = obs_rows[env_id - lo], rewards[env_id - lo]
            last_obs = self._in_flight.pop(env_id)
            if self._failing:
                self._failing.pop(env_id, None)
            if status == STEP:
                ready[env_id] = obs
                out[env_id] = _new_timestep(BaseEnvTimestep, (obs, reward, False, info))
            elif status == DONE_RESET:
                ready[env_id] = obs
                counts[env_id] += 1
                out[env_id] = _new_timestep(BaseEnvTimestep, (final_obs, reward, True, info))
            elif status == DONE:  # its last episode, or its reset failed (a failure entry follows)
                counts[env_id] += 1
                if counts[env_id] >= self._episode_num:
                    self._finished_num += 1
                out[env_id] = _new_timestep(
                    BaseEnvTimestep, (final_obs if final_obs is not None else obs, reward, True, info)
                )
            elif status == RESET_REQUEST:
                ready[env_id] = obs
                self._stats["reset_requests"] += 1
                self._stats["dropped_episodes"] += 1
                out[env_id] = abnormal_timestep(env_id, last_obs, "reset_request", str(info))

    def _on_reset_results(self, worker: WorkerHandle, results: List[Any]) -> None:
        obs_rows, _ = self._read_shared(worker)
        lo = worker.env_ids[0]
        for env_id, _status, _reward, _info, obs, _final in results:
            self._ready[env_id] = obs_rows[env_id - lo] if obs_rows is not None else obs

    # ---- failures ----------------------------------------------------------------------------------------------
    def _count_failure(self, env_id: int, error: str, tb: str) -> None:
        failures = self._failing[env_id] = self._failing.get(env_id, 0) + 1
        if failures > self._max_retry:
            raise EnvError(
                f"env {env_id} failed {failures} time(s) in a row (max_retry={self._max_retry}); last error: {error}"
                f"\n--- traceback from the worker process of env {env_id} ---\n{tb or '(none)'}",
                env_id=env_id,
                child_traceback=tb,
            )

    def _drop_episode(self, env_id: int, reason: str, error: str, tb: str) -> None:
        """Answer an env whose episode was cut with an abnormal timestep (if it had an episode going)."""
        obs = self._in_flight.pop(env_id, _MISSING)
        if obs is _MISSING:
            obs = self._ready.pop(env_id, _MISSING)
        if obs is not _MISSING:
            self._stats["dropped_episodes"] += 1
            self._results[env_id] = abnormal_timestep(env_id, obs, reason, error, tb)

    def _on_env_failure(self, worker: WorkerHandle, env_id: int, phase: str, error: str, tb: str) -> None:
        self._stats["exceptions"] += 1
        if env_id in self._in_flight:  # the failure cut an episode (a failed reset after a done step did not)
            self._drop_episode(env_id, "exception", error, tb)
        self._count_failure(env_id, f"{error} (in {phase})", tb)
        if self._failing[env_id] > 1:
            time.sleep(self._retry_delay)
        self._stats["restarts"] += 1
        self._send(worker, "restart", {env_id: self._restart_seed(env_id)})

    def _on_worker_lost(self, worker: WorkerHandle, reason: str) -> None:
        """Kill a crashed or hung worker, drop its envs' episodes, start it again and rebuild its envs."""
        phase = worker.pending[0][0] if worker.pending else "idle"
        pid = worker.process.pid
        if reason == "timeout":  # read before stop(): it waits for the traceback dump
            activity, since, budget_name, budget = self._busy(worker)
            late = f"{activity} for {time.monotonic() - since:.1f} s, over {budget_name}={budget:g} s"
        exitcode, tb = self._pool.stop(worker, dump_traceback=reason == "timeout")
        if reason == "timeout":
            self._stats["timeouts"] += 1
            error = f"worker {worker.index} (pid {pid}) did not answer '{phase}': {late}"
        else:
            self._stats["crashes"] += 1
            error = f"worker {worker.index} (pid {pid}) {describe_exit(exitcode)} during '{phase}'"
        active = [i for i in worker.env_ids if self._episode_count[i] < self._episode_num]
        for env_id in active:
            self._drop_episode(env_id, reason, error, tb)
        for env_id in active:
            self._count_failure(env_id, error, tb)
        if any(self._failing.get(i, 0) > 1 for i in active):
            time.sleep(self._retry_delay)
        self._pool.start(worker)
        if active:
            self._stats["restarts"] += len(active)
            self._send(worker, "restart", {i: self._restart_seed(i) for i in active})

    # ---- the contract ------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Reset every env (launching first if needed) and restart episode counting; answers still on their way
        are waited for and discarded."""
        if not self._launched:
            self.launch()
            return
        self._wait(until_idle=True)
        self._ready.clear()
        self._in_flight.clear()
        self._episode_count = [0] * self._env_num
        self._finished_num = 0
        for worker in self._workers:
            self._send(worker, "reset", {i: self._pending_seeds.pop(i, None) for i in worker.env_ids})
        self._wait(until_idle=True)
        self._results.clear()

    def step(self, actions: Mapping[int, Any]) -> Dict[int, BaseEnvTimestep]:
        """Send each worker the actions of its envs and collect the answers (see :class:`BaseEnvManager`).

        Returns:
            Sync mode: ``{env_id: timestep}`` for every env in ``actions`` (plus abnormal timesteps of envs whose
            worker died while they waited). Async mode: the answers that have arrived, at least ``wait_num``.
        """
        ready = self._ready
        for env_id in actions:
            if env_id not in ready:
                raise self._not_ready_error(env_id)
        per_worker: Dict[int, Dict[int, Any]] = {}
        worker_of, in_flight = self._worker_of, self._in_flight
        for env_id, action in actions.items():
            in_flight[env_id] = ready.pop(env_id)
            per_worker.setdefault(worker_of[env_id], {})[env_id] = action
        for w, worker_actions in per_worker.items():
            self._send(self._workers[w], "step", (worker_actions, self._last_episode_ids(worker_actions)))
        self._wait(until_idle=self._wait_num is None)
        out, self._results = self._results, {}
        if self._wait_num is None:
            # workers answer in whatever order they finish; env-id order keeps a seeded run reproducible
            out = {env_id: out[env_id] for env_id in sorted(out)}
        return out

    def _last_episode_ids(self, actions: Dict[int, Any]) -> Tuple[int, ...]:
        if self._episode_num == math.inf:
            return ()
        counts, last = self._episode_count, self._episode_num - 1
        return tuple(i for i in actions if counts[i] >= last)

    def close(self) -> None:
        """Stop every worker (asking first, killing after ``CLOSE_TIMEOUT_S``); safe to call twice."""
        pool, self._pool = self._pool, None
        self._workers = []
        self._launched = False
        self._closed = True
        self._ready.clear()
        self._in_flight.clear()
        self._results.clear()
        if pool is not None:
            pool.close(CLOSE_TIMEOUT_S)


ENV_MANAGER_REGISTRY.register("subprocess", SubprocessEnvManager)
