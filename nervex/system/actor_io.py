"""The actor's I/O process: it stores the samples and makes the lease and report round trips for the actor.

Why a process and not a thread: an actor collects in Python (the env manager, the policy's forward, the Adder), and
the work of a task's round trip is Python too (``requests``, HMAC, JSON, the samples file's SHA-256 and write). On a
thread the two share the GIL: on CartPole the I/O thread took a sixth of it and the actor collected at 0.75x the
serial rate. Forked off, that work runs on another core and the actor's process only encodes the samples.

The protocol between the two ends is private (a ``socketpair`` from ``multiprocessing.Pipe``), and carries no pickle:
each request is two byte messages, a JSON header ``{"path", "body"}`` and the samples file's bytes (empty for a
lease); each reply one JSON message ``{"answer"}`` or ``{"error"}``, with ``stopping`` (the coordinator said stop) and
the seconds spent storing and calling. A ``ProtocolError`` or ``RoleExit`` raised in the I/O process is raised
again, with the same status, field and code, in the actor.

Lifetime: the process is forked while the actor has no other threads and no env processes (so it holds none of
their pipes), ignores SIGINT and SIGTERM (the actor decides when to stop: it sets the shared stop event, which ends
the retries of a call in flight, then the ``closing`` event, which ends the process: env processes forked later hold
the pipe's ends too, so end of file alone may never come), and dies with the actor (``PR_SET_PDEATHSIG`` on
Linux; a closed pipe elsewhere). Heartbeats, failure reports and giving back leases stay on the actor's own link, so
a frozen actor (SIGSTOP, a hung step) stops renewing its leases even though this process is still alive.
"""

from __future__ import annotations

import ctypes
import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, Mapping, Optional

from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.storage import Storage
from nervex.system.role import RoleExit, RoleLink

POLL_S = 0.2
"""How often the actor's end checks, while it waits for a reply, whether to stop and whether the process is alive."""
CLOSE_WAIT_S = 5.0
"""How long ``close`` waits for the process to end before it is killed."""
_PR_SET_PDEATHSIG = 1


def fork_available() -> bool:
    """Whether this platform can fork the I/O process (not on Windows)."""
    return "fork" in multiprocessing.get_all_start_methods()


class ActorIO:
    """The actor's end: forks the I/O process and makes calls through it, one at a time.

    Args:
        cfg: The compiled parallel config (the link's config hash).
        run_dir: The run directory (``coordinator.url``, the default storage path).
        worker_id: The actor's id: the I/O process talks to the coordinator as the actor.
        url: The actor's fixed address (a relaying manager), or None to follow ``<run_dir>/coordinator.url``.
        token: The run's secret.
        storage: The actor's storage (its root and ``min_free_bytes`` are used by the I/O process).
        info: What the actor sends at registration (the I/O process registers again only after a coordinator that
            lost the actor answers 404).
        logger: Where the I/O process logs (retries, a re-registration): the actor's log.
    """

    def __init__(
        self,
        cfg: Mapping[str, Any],
        run_dir: str,
        worker_id: str,
        url: Optional[str],
        token: bytes,
        storage: Storage,
        info: Dict[str, Any],
        logger: logging.Logger,
    ) -> None:
        if not fork_available():
            raise RuntimeError("the actor's I/O process needs fork; set system.actor.io_process: false")
        ctx = multiprocessing.get_context("fork")
        self._conn, child_end = ctx.Pipe(duplex=True)
        self._stop = ctx.Event()
        self._closing = ctx.Event()  # (env processes forked later hold the pipe too: EOF alone may never come)
        self._lock = threading.Lock()
        self.logger = logger
        link = dict(cfg=cfg, run_dir=run_dir, role="actor", worker_id=worker_id, url=url, token=token, logger=logger)
        args = (child_end, self._conn, self._stop, self._closing, dict(link, info=info), storage)
        self._process = ctx.Process(target=_serve, args=args, name=f"{worker_id}-io", daemon=True)
        self._process.start()
        child_end.close()
        self.pid = self._process.pid

    def call(
        self, path: str, body: Dict[str, Any], data: bytes = b"", stop_requested: Callable[[], bool] = lambda: False
    ) -> Dict[str, Any]:
        """POST ``body`` to ``path`` from the I/O process; with ``data``, store it first as a samples file and put
        its name in ``body['result']['data']``.

        Args:
            stop_requested: Polled while waiting: once true, the I/O process stops retrying an unreachable coordinator.

        Returns:
            ``{'answer': the coordinator's answer, 'stopping': bool, 'store_s': float, 'call_s': float}``.

        Raises:
            ProtocolError: the coordinator's refusal, or the storage's (507 full, as ``Storage.put``).
            RoleExit: the coordinator stayed unreachable, or the I/O process is gone.
        """
        header = json.dumps({"path": path, "body": body}, separators=(",", ":"), allow_nan=False).encode("utf-8")
        with self._lock:
            try:
                self._conn.send_bytes(header)
                self._conn.send_bytes(data)
                while not self._conn.poll(POLL_S):
                    if stop_requested():
                        self._stop.set()
                    if not self._process.is_alive():
                        raise EOFError
                reply = json.loads(self._conn.recv_bytes())
            except (EOFError, OSError):
                self._process.join(timeout=1.0)
                raise RoleExit(
                    f"the actor's I/O process (pid {self.pid}) is gone (exit code {self._process.exitcode})"
                ) from None
        error = reply.get("error")
        if error is None:
            return reply
        if error["type"] == "ProtocolError":
            raise ProtocolError(error["status"], error["message"], error.get("field"), error.get("retry_after"))
        if error["type"] == "RoleExit":
            raise RoleExit(error["message"], code=int(error["code"]))
        raise RuntimeError(f"in the actor's I/O process: {error['message']}")

    def close(self) -> None:
        """Stop the I/O process (a call in flight gives up its retries) and wait for it; idempotent."""
        self._stop.set()
        self._closing.set()
        self._conn.close()
        self._process.join(timeout=CLOSE_WAIT_S)
        if self._process.is_alive():
            self.logger.warning("the actor's I/O process did not stop within %.0f s; killing it", CLOSE_WAIT_S)
            self._process.kill()
            self._process.join(timeout=CLOSE_WAIT_S)


def _die_with(parent_pid: int) -> None:
    """Have the kernel kill this process when the actor dies (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the closed pipe still ends this process
            pass
    if os.getppid() != parent_pid:
        os._exit(0)


def _serve(conn: Any, parent_end: Any, stop: Any, closing: Any, link_args: Dict[str, Any], storage: Storage) -> None:
    """(I/O process) Answer the actor's requests until it closes (``closing``, or its end of the pipe)."""
    parent_pid = os.getppid()
    _die_with(parent_pid)
    parent_end.close()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    link = RoleLink(**link_args)
    link.info["pid"] = parent_pid  # it registers (again) as the actor, not as itself
    link.stop_requested = stop.is_set
    try:
        while True:
            try:
                while not conn.poll(POLL_S):
                    if closing.is_set():
                        return
                header, data = conn.recv_bytes(), conn.recv_bytes()
            except (EOFError, OSError):
                return
            conn.send_bytes(json.dumps(_answer(link, storage, header, data), allow_nan=False).encode("utf-8"))
    finally:
        link.close()


def _answer(link: RoleLink, storage: Storage, header: bytes, data: bytes) -> Dict[str, Any]:
    reply: Dict[str, Any] = {"store_s": 0.0, "call_s": 0.0}
    try:
        request = json.loads(header)
        body = request["body"]
        start = time.perf_counter()
        if data:
            body["result"]["data"] = storage.put(data, "samples")
        reply["store_s"] = time.perf_counter() - start
        reply["answer"] = link.call_registered(request["path"], body)
        reply["call_s"] = time.perf_counter() - start - reply["store_s"]
    except ProtocolError as error:
        reply["error"] = {
            "type": "ProtocolError",
            "status": error.status,
            "message": error.message,
            "field": error.field,
            "retry_after": error.retry_after,
        }
    except RoleExit as error:
        reply["error"] = {"type": "RoleExit", "message": str(error), "code": error.code}
    except Exception as error:  # reported to the actor, which fails its task; this process goes on
        link.logger.exception("the actor's I/O process: %s", error)
        reply["error"] = {"type": type(error).__name__, "message": f"{type(error).__name__}: {error}"}
    reply["stopping"] = link.stopping.is_set()
    return reply


__all__ = ["ActorIO", "fork_available"]
