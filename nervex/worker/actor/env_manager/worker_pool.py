"""The processes behind ``SubprocessEnvManager``: starting, watching, killing and cleaning up env workers.

Nothing here knows about episodes: the manager decides what to send and what an answer means.
"""

from __future__ import annotations

import math
import os
import pickle
import select
import shutil
import signal
import tempfile
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from .subprocess_worker import IDLE, PhaseSlot, worker_main

TIMEOUT_DUMP_WAIT_S = 0.2  # after asking a hung worker for its traceback, before killing it
_READ_EVENTS = select.POLLIN | select.POLLHUP | select.POLLERR


@dataclass
class WorkerHandle:
    """One worker process, its pipe, what it is doing (``phase``, written by the process), and the messages sent to
    it that await an answer (oldest first)."""

    index: int
    env_ids: Tuple[int, ...]
    phase: PhaseSlot
    process: Any = None
    conn: Any = None
    fault_path: str = ""
    generation: int = 0  # bumped by every (re)start: tells stale poll events apart
    pending: Deque[Tuple[str, float]] = field(default_factory=deque)  # (command, time.monotonic() when sent)


def split_envs(env_num: int, worker_num: int) -> List[Tuple[int, ...]]:
    """Contiguous blocks of env ids, as even as possible: ``split_envs(5, 2) == [(0, 1, 2), (3, 4)]``."""
    base, extra = divmod(env_num, worker_num)
    blocks, start = [], 0
    for w in range(worker_num):
        size = base + (1 if w < extra else 0)
        blocks.append(tuple(range(start, start + size)))
        start += size
    return blocks


def describe_exit(exitcode: Optional[int]) -> str:
    """``'killed by SIGSEGV'``, ``'exited with code 3'``..."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _kill_processes(processes: List[Any], tmpdir: str) -> None:
    """Last-resort cleanup (close, garbage collection, interpreter exit); must not reference the pool."""
    for p in processes:
        if p.is_alive():
            p.kill()
    for p in processes:
        p.join(1.0)
    processes.clear()
    shutil.rmtree(tmpdir, ignore_errors=True)


class WorkerPool:
    """Worker processes running :func:`~.subprocess_worker.worker_main`, watched by one ``select.poll`` object.

    A finalizer kills every process this pool started when the pool is closed, garbage-collected, or at
    interpreter exit, so a forgotten ``close()`` leaves no orphan; workers are also daemonic, and each one exits
    on its own when its parent dies (it checks ``os.getppid()`` whenever idle for a second).
    """

    def __init__(
        self, ctx: Any, env_fn: Callable[[Any], Any], env_cfgs: List[Any], blocks: List[Tuple[int, ...]], shm: Any
    ) -> None:
        self._ctx = ctx
        self._env_fn = env_fn
        self._env_cfgs = env_cfgs
        self._shm = shm
        self._tmpdir = tempfile.mkdtemp(prefix="nervex_env_workers_")
        self._processes: List[Any] = []  # alive or not yet reaped; shared with the finalizer
        self._finalizer = weakref.finalize(self, _kill_processes, self._processes, self._tmpdir)
        self._poller = select.poll()
        self._fds: Dict[int, Tuple[WorkerHandle, bool]] = {}  # fd -> (worker, is the process sentinel)
        phases = ctx.RawArray("q", len(blocks))  # one PhaseSlot word per worker
        self.workers = [WorkerHandle(w, ids, PhaseSlot(phases, w)) for w, ids in enumerate(blocks)]

    def start(self, worker: WorkerHandle) -> None:
        """Start ``worker``'s process (again); its envs are built on their first reset."""
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        worker.generation += 1
        worker.fault_path = os.path.join(self._tmpdir, f"worker{worker.index}_{worker.generation}.txt")
        # a forked child closes its copy of the parent's end; other start methods need not receive it at all
        inherited = parent_conn if self._ctx.get_start_method() == "fork" else None
        cfgs = {i: self._env_cfgs[i] for i in worker.env_ids}
        worker.phase.set(IDLE)  # a killed predecessor may have left 'stepping since ...'
        args = (child_conn, inherited, self._env_fn, cfgs, self._shm, worker.phase, os.getpid(), worker.fault_path)
        process = self._ctx.Process(target=worker_main, args=args, daemon=True, name=f"nervex_env_worker{worker.index}")
        try:
            process.start()
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            child_conn.close()
            parent_conn.close()
            raise TypeError(
                f"start method '{self._ctx.get_start_method()}' pickles env_fn and env_cfg for the worker, which "
                f"failed: {e}; use a module-level env class or function (not a lambda or a local function), "
                f"or context='fork'"
            ) from e
        self._processes.append(process)
        child_conn.close()
        worker.process, worker.conn = process, parent_conn
        worker.pending.clear()
        for fd, is_sentinel in ((parent_conn.fileno(), False), (process.sentinel, True)):
            self._poller.register(fd, _READ_EVENTS)
            self._fds[fd] = (worker, is_sentinel)

    def send(self, worker: WorkerHandle, command: str, arg: Any) -> bool:
        """Send one command; False when the pipe is broken (the worker died)."""
        worker.pending.append((command, time.monotonic()))
        try:
            worker.conn.send((command, arg))
            return True
        except (BrokenPipeError, EOFError, OSError):
            return False

    def poll(self, timeout: float) -> List[Tuple[WorkerHandle, int, bool, bool]]:
        """Wait up to ``timeout`` seconds (``inf``: no limit) for answers or exits.

        Returns:
            ``(worker, generation, has_answer, has_exited)`` per worker with news; compare ``generation`` with
            ``worker.generation`` before acting on an entry, in case handling an earlier one restarted it.
        """
        ms = None if timeout == math.inf else max(0, math.ceil(timeout * 1000))
        news: Dict[int, List[Any]] = {}
        for fd, _ in self._poller.poll(ms):
            entry = self._fds.get(fd)
            if entry is not None:
                worker, is_sentinel = entry
                item = news.setdefault(worker.index, [worker, worker.generation, False, False])
                item[3 if is_sentinel else 2] = True
        return [tuple(item) for item in news.values()]

    def stop(self, worker: WorkerHandle, dump_traceback: bool) -> Tuple[Optional[int], str]:
        """Kill ``worker``'s process (after asking it to dump its stack when ``dump_traceback``) and reap it.

        Returns:
            The exit code and what the child's faulthandler wrote (a crash's or a hang's Python traceback).
        """
        process = worker.process
        if dump_traceback and process.is_alive() and hasattr(signal, "SIGUSR1"):
            try:
                os.kill(process.pid, signal.SIGUSR1)
                time.sleep(TIMEOUT_DUMP_WAIT_S)
            except OSError:
                pass
        exitcode = process.exitcode  # before kill: a crash's own code, not our SIGKILL
        if process.is_alive():
            process.kill()
        process.join(5.0)
        exitcode = exitcode if exitcode is not None else process.exitcode
        self._forget(worker)
        if process in self._processes and not process.is_alive():
            self._processes.remove(process)
        try:
            with open(worker.fault_path) as f:
                text = f.read().strip()
            os.unlink(worker.fault_path)
        except OSError:
            text = ""
        return exitcode, text

    def _forget(self, worker: WorkerHandle) -> None:
        for fd in (worker.conn.fileno(), worker.process.sentinel):
            if self._fds.pop(fd, None) is not None:
                self._poller.unregister(fd)
        worker.conn.close()
        worker.pending.clear()

    def close(self, timeout: float) -> None:
        """Ask every worker to exit, wait up to ``timeout`` seconds in all, then kill what is left."""
        for worker in self.workers:
            if worker.conn is not None and not worker.conn.closed:
                try:
                    worker.conn.send(("close", None))
                except (OSError, EOFError):
                    pass
        deadline = time.monotonic() + timeout
        for process in list(self._processes):
            process.join(max(0.0, deadline - time.monotonic()))
        self._finalizer()  # kills the rest, reaps every process, removes the temp dir
        for worker in self.workers:
            if worker.conn is not None and not worker.conn.closed:
                worker.conn.close()
        self._fds.clear()

    @property
    def pids(self) -> List[Optional[int]]:
        return [w.process.pid if w.process is not None else None for w in self.workers]
