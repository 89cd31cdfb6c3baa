"""The child side of ``SubprocessEnvManager``: one process hosts several envs and answers one message per command.

Protocol (parent -> child, each a ``(command, argument)`` tuple; the child answers each with one message):

- ``('step', (actions, no_reset))``: ``actions`` is ``{env_id: action}``; a ``done`` env is reset at once unless
  its id is in ``no_reset`` (its last episode). Answer ``('step', results, failures)``.
- ``('reset', {env_id: seed_or_None})``: reset (building the env first if needed). Answer ``('reset', ...)``.
- ``('restart', {env_id: seed_or_None})``: close the env, build a new one with ``env_fn``, seed, reset.
- ``('close', None)``: close every env and exit.

``results`` lists ``(env_id, status, reward, info, obs, final_obs)`` (see the ``STEP``... constants); with shared
memory (:class:`SharedSlots`), ``obs`` and ``reward`` are ``None`` and live in the shared arrays at row ``env_id``. ``failures`` lists
``(env_id, phase, error, traceback_text)``; a failed env is left for the parent to restart.

Besides answering, the child keeps its :class:`PhaseSlot` up to date (idle, stepping or resetting, and since when),
so that the parent times a step and a reset inside it (an auto-reset) against their own budgets.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import time
import traceback
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from nervex.envs.base_env import EnvResetRequest

# result statuses of a 'step'
STEP = 0  # not done; obs is the step's observation
DONE = 1  # done and not reset (last episode, or the reset failed: see failures); obs is the final observation
DONE_RESET = 2  # done and reset; final_obs is the final observation, obs the next episode's first
RESET_REQUEST = 3  # the env raised EnvResetRequest and was reset; obs is the new first observation; info the reason

# what a worker is doing, as written to its PhaseSlot
IDLE = 0  # between commands (or sending an answer)
STEPPING = 1  # in a 'step' command, stepping envs
RESETTING = 2  # building or resetting an env: a 'reset' or 'restart' command, or an auto-reset inside a 'step'

PARENT_CHECK_S = 1.0  # how often an idle child checks that its parent is still alive
Failure = Tuple[int, str, str, str]


class PhaseSlot:
    """What one worker process is doing (``IDLE``, ``STEPPING``, ``RESETTING``) and since when, in shared memory.

    The child writes, the parent reads, without a lock (a worker killed mid-write must not leave one held): phase
    and start time share one aligned 64-bit word, ``time.monotonic()`` in milliseconds shifted left by 2, or-ed
    with the phase, so a read never mixes two writes. ``time.monotonic`` is system-wide (``CLOCK_MONOTONIC`` on
    Linux), so parent and child read the same clock.

    Args:
        array: A shared ``'q'`` (int64) array with one element per worker (``ctx.RawArray('q', worker_num)``).
        index: This worker's element.
    """

    def __init__(self, array: Any, index: int) -> None:
        self._array = array
        self._index = index

    def set(self, phase: int) -> None:
        """Record that the worker enters ``phase`` now."""
        self._array[self._index] = (time.monotonic_ns() // 1_000_000) << 2 | phase

    def get(self) -> Tuple[int, float]:
        """The current phase and the ``time.monotonic()`` at which it began (millisecond resolution)."""
        word = self._array[self._index]
        return word & 3, (word >> 2) / 1000.0


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class EnvHost:
    """The envs of one worker process, and how commands act on them."""

    def __init__(
        self,
        env_fn: Callable[[Any], Any],
        env_cfgs: Dict[int, Any],
        obs_buf: Optional[np.ndarray],
        rew_buf: Optional[np.ndarray],
        phase: PhaseSlot,
    ) -> None:
        self._env_fn = env_fn
        self._cfgs = env_cfgs
        self._envs: Dict[int, Any] = {}
        self._obs = obs_buf
        self._rew = rew_buf
        self._phase = phase

    def _put_obs(self, env_id: int, obs: Any) -> Any:
        """Write ``obs`` to the shared row of ``env_id`` and return None, or return it to be pickled."""
        if self._obs is None:
            return obs
        row = self._obs[env_id]
        if np.shape(obs) != row.shape:
            raise ValueError(
                f"observation of shape {np.shape(obs)} does not fit the shared-memory slot {row.shape} sized from "
                f"env_info().obs_space; return observations of the declared shape or use shared_memory=False"
            )
        row[...] = obs
        return None

    def _put_reward(self, env_id: int, reward: Any) -> None:
        """Write ``reward`` to the shared row of ``env_id`` (no broadcasting: its shape must be the row's)."""
        row_shape = self._rew.shape[1:]
        if np.shape(reward) != row_shape:
            raise ValueError(
                f"reward of shape {np.shape(reward)} does not fit the shared-memory slot {row_shape} sized from "
                f"env_info().rew_space; return rewards of the declared shape (a float when rew_space is None)"
            )
        self._rew[env_id] = reward
        return None

    def step(self, actions: Dict[int, Any], no_reset: Sequence[int]) -> Tuple[str, List[Any], List[Failure]]:
        results: List[Any] = []
        failures: List[Failure] = []
        rew, phase = self._rew, self._phase
        phase.set(STEPPING)
        for env_id, action in actions.items():
            env = self._envs[env_id]
            try:
                obs, reward, done, info = env.step(action)
                if rew is not None:
                    reward = self._put_reward(env_id, reward)
            except EnvResetRequest as e:
                phase.set(RESETTING)
                self._reset_one(env_id, None, results, failures, RESET_REQUEST, _describe(e))
                phase.set(STEPPING)  # the next env's step is timed from the end of this reset
                continue
            except Exception as e:  # noqa: BLE001 - user env code; the parent's retry policy decides
                failures.append((env_id, "step", _describe(e), traceback.format_exc()))
                continue
            if done and env_id not in no_reset:
                phase.set(RESETTING)
                try:
                    first = env.reset()
                    results.append((env_id, DONE_RESET, reward, info, self._put_obs(env_id, first), obs))
                except Exception as e:  # noqa: BLE001
                    results.append((env_id, DONE, reward, info, None, obs))
                    failures.append((env_id, "reset", _describe(e), traceback.format_exc()))
                phase.set(STEPPING)
                continue
            try:
                results.append((env_id, DONE if done else STEP, reward, info, self._put_obs(env_id, obs), None))
            except Exception as e:  # noqa: BLE001 - an observation that does not fit the shared slot
                failures.append((env_id, "step", _describe(e), traceback.format_exc()))
        return "step", results, failures

    def _reset_one(
        self, env_id: int, seed: Optional[int], results: List[Any], failures: List[Failure], status: int, info: Any
    ) -> None:
        try:
            env = self._envs.get(env_id)
            if env is None:
                env = self._envs[env_id] = self._env_fn(self._cfgs[env_id])
            if seed is not None:
                env.seed(seed)
            results.append((env_id, status, None, info, self._put_obs(env_id, env.reset()), None))
        except Exception as e:  # noqa: BLE001
            failures.append((env_id, "reset", _describe(e), traceback.format_exc()))

    def reset(self, seeds: Dict[int, Optional[int]], rebuild: bool) -> Tuple[str, List[Any], List[Failure]]:
        results: List[Any] = []
        failures: List[Failure] = []
        self._phase.set(RESETTING)
        for env_id, seed in seeds.items():
            if rebuild:
                self.close_env(env_id)
            self._reset_one(env_id, seed, results, failures, STEP, None)
        return ("restart" if rebuild else "reset"), results, failures

    def close_env(self, env_id: int) -> None:
        env = self._envs.pop(env_id, None)
        if env is not None:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - a broken env may fail to close; it is replaced anyway
                pass

    def close(self) -> None:
        for env_id in list(self._envs):
            self.close_env(env_id)


class SharedSlots(NamedTuple):
    """The shared-memory rows of one manager: observations and rewards, one row per env (row ``env_id``).

    ``obs_shape`` / ``rew_shape`` include the leading ``env_num`` axis; ``rew_shape`` is ``(env_num,)`` for scalar
    rewards and ``(env_num, agent_num)`` for per-agent ones (sized from the env's ``rew_space``).
    """

    obs_raw: Any
    rew_raw: Any
    obs_dtype: str
    obs_shape: Tuple[int, ...]
    rew_dtype: str
    rew_shape: Tuple[int, ...]

    @classmethod
    def allocate(cls, ctx: Any, obs_dtype: Any, obs_shape: Tuple[int, ...], rew_dtype: Any, rew_shape: Tuple[int, ...]):
        """Allocate both arrays from ``ctx`` (``RawArray``: no lock, each row has one writer at a time)."""
        raws = [
            ctx.RawArray("b", max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize))
            for dtype, shape in ((obs_dtype, obs_shape), (rew_dtype, rew_shape))
        ]
        return cls(
            raws[0], raws[1], np.dtype(obs_dtype).str, tuple(obs_shape), np.dtype(rew_dtype).str, tuple(rew_shape)
        )

    def arrays(self) -> Tuple[np.ndarray, np.ndarray]:
        """NumPy views of the observation and reward rows."""
        views = [
            np.frombuffer(raw, dtype=dtype, count=int(np.prod(shape))).reshape(shape)
            for raw, dtype, shape in (
                (self.obs_raw, self.obs_dtype, self.obs_shape),
                (self.rew_raw, self.rew_dtype, self.rew_shape),
            )
        ]
        return views[0], views[1]


def _arrays(shm: Optional[SharedSlots]) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    return (None, None) if shm is None else shm.arrays()


def _setup_child(parent_conn: Any, fault_path: Optional[str]) -> Any:
    # Ctrl-C reaches the whole process group: the parent handles it and closes us in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent_conn is not None:
        parent_conn.close()  # forked children inherit the parent's end; keeping it would hide the parent's death
    if fault_path is None:
        return None
    fault_file = open(fault_path, "w")  # noqa: SIM115 - lives as long as the process
    faulthandler.enable(file=fault_file, all_threads=True)  # SIGSEGV & co. leave the Python traceback here
    if hasattr(faulthandler, "register") and hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=fault_file, all_threads=True)  # the parent asks on a timeout
    return fault_file


def worker_main(
    conn: Any,
    parent_conn: Any,
    env_fn: Callable[[Any], Any],
    env_cfgs: Dict[int, Any],
    shm: Optional[SharedSlots],
    phase: PhaseSlot,
    parent_pid: int,
    fault_path: Optional[str],
) -> None:
    """Entry point of a worker process: serve commands until ``close``, a closed pipe or the parent's death."""
    fault_file = _setup_child(parent_conn, fault_path)
    obs_buf, rew_buf = _arrays(shm)
    host = EnvHost(env_fn, env_cfgs, obs_buf, rew_buf, phase)
    poller = select.poll()  # one poller for the process: conn.poll() would build a selector per message
    poller.register(conn.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
    try:
        while True:
            try:
                if not poller.poll(PARENT_CHECK_S * 1000):
                    if os.getppid() != parent_pid:
                        return  # orphaned: the parent died without closing us
                    continue
                command, arg = conn.recv()
            except (EOFError, OSError):
                return
            if command == "step":
                reply = host.step(*arg)
            elif command in ("reset", "restart"):
                reply = host.reset(arg, rebuild=command == "restart")
            elif command == "close":
                return
            else:
                reply = ("fatal", f"unknown command {command!r}", [])
            phase.set(IDLE)
            try:
                conn.send(reply)
            except (BrokenPipeError, EOFError, OSError):
                return
            except Exception as e:  # noqa: BLE001 - e.g. an info dict that cannot be pickled
                conn.send(("fatal", f"could not send the reply to '{command}': {_describe(e)}", []))
    finally:
        host.close()
        if fault_file is not None:
            faulthandler.disable()
            fault_file.close()
