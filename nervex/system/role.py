"""What every parallel role shares: finding the coordinator, registering, heartbeats, signed calls, logs, signals.

A role process (actor, learner, league manager, manager) talks to the coordinator through a ``RoleLink``. Its id at
the coordinator is its ``worker_id``: that name stays on the wire, in the task table's ``workers`` table and in the
``--worker-id`` option, while "worker" elsewhere in nervex means ``nervex.worker`` (learner, actor, env managers) and an
env manager's subprocess.

The link:

* the address comes from ``--url`` (a manager hands its children its own relay address), else
  ``<run_dir>/coordinator.url``, waited for while the coordinator starts;
* ``register`` sends the protocol version and the config's hash (a mismatch is refused with 403 and the role
  exits with status 2: retrying cannot help);
* a daemon thread heartbeats every ``heartbeat_s`` the coordinator asked for, renewing the leases the role holds;
* ``call`` retries through a coordinator restart: when the address stops answering it re-reads
  ``coordinator.url`` (a restarted coordinator may listen on another port) until ``reconnect_s`` has passed.

Every response carries ``stop``; once one says so, ``link.stopping`` is set and the role winds down.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

from nervex.system.comm.auth import load_or_create_token
from nervex.system.comm.client import Client
from nervex.system.comm.errors import ProtocolError
from nervex.system.protocol import HEARTBEAT_PATH, KEYED_PATHS, PROTOCOL_VERSION, REGISTER_PATH, read_coordinator_url
from nervex.system.system_config import config_hash

URL_WAIT_S = 120.0
"""How long a role waits for ``coordinator.url`` to appear before giving up."""


class RoleExit(Exception):
    """The role cannot go on (refused at registration, coordinator gone for good); ``code`` is its exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def default_worker_id(role: str, index: Optional[int] = None) -> str:
    """``<role>[-<index>]-<host>-<pid>``: unique per process, so a restarted process registers anew."""
    suffix = f"-{index}" if index is not None else ""
    return f"{role}{suffix}-{socket.gethostname()}-{os.getpid()}"


def role_logger(run_dir: str, name: str) -> logging.Logger:
    """A logger writing ``<run_dir>/logs/<name>.log`` and stderr (one per name and run dir)."""
    logger = logging.getLogger(f"nervex.system.{name}.{os.path.abspath(run_dir)}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    if not logger.handlers:
        os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
        fmt = logging.Formatter(f"[%(asctime)s] %(levelname)s {name}: %(message)s")
        path = os.path.join(run_dir, "logs", f"{name}.log")
        for handler in (logging.FileHandler(path, encoding="utf-8"), logging.StreamHandler()):
            handler.setFormatter(fmt)
            logger.addHandler(handler)
    return logger


def close_role_logger(logger: logging.Logger) -> None:
    for handler in list(logger.handlers):
        handler.close()
        logger.removeHandler(handler)


class StopFlag:
    """SIGTERM / SIGINT mark a stop the role's loop polls with ``is_set()``; ``restore`` puts the old handlers back.

    The handler only increments a counter (no lock: an ``Event.set`` in a handler can deadlock with the main thread
    holding the event's lock).
    """

    def __init__(self, signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self._count = 0
        self.signal_name: Optional[str] = None
        self._previous: Dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in signals:
                self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.signal_name = signal.Signals(signum).name
        self._count += 1

    def set(self) -> None:
        """Ask for a stop from code (tests, another thread)."""
        self._count += 1

    def is_set(self) -> bool:
        return self._count > 0

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


class RoleLink:
    """A role's signed connection to the coordinator (or to the manager relaying for it).

    Args:
        cfg: The compiled parallel config (its hash is sent at registration).
        run_dir: The run directory (token, ``coordinator.url``).
        role: ``actor``, ``learner``, ``manager`` or ``league_manager``.
        worker_id: Unique id; registration is idempotent by it.
        url: The address to talk to; None: ``<run_dir>/coordinator.url``, waited for up to ``URL_WAIT_S``.
        token: The run's secret; ``load_or_create_token(run_dir)`` if None.
        logger: Where events go.
        deadline_s: Deadline of one call (retries included) before the address is looked up again.
        reconnect_s: How long calls keep retrying (re-reading ``coordinator.url``) before ``RoleExit``.
        info: Free-form facts sent at registration (host, pid, index).
    """

    def __init__(
        self,
        cfg: Mapping[str, Any],
        run_dir: str,
        role: str,
        worker_id: str,
        url: Optional[str] = None,
        token: Optional[bytes] = None,
        logger: Optional[logging.Logger] = None,
        deadline_s: float = 10.0,
        reconnect_s: float = 120.0,
        info: Optional[Dict[str, Any]] = None,
    ) -> None:
        self.run_dir = run_dir
        self.role = role
        self.worker_id = worker_id
        self.config_hash = config_hash(cfg)
        self.logger = logger or logging.getLogger(__name__)
        self.deadline_s = float(deadline_s)
        self.reconnect_s = float(reconnect_s)
        self.info = dict(info or {}, host=socket.gethostname(), pid=os.getpid())
        self._fixed_url = url
        self._token = token if token is not None else load_or_create_token(run_dir)
        self._local = threading.local()
        self._url_lock = threading.Lock()
        self.url = url or self._wait_for_url()
        self.stopping = threading.Event()
        self.stop_requested: Callable[[], bool] = lambda: False  # the role's signal flag: give up retrying
        self.lease_s = 30.0
        self.heartbeat_s = 10.0
        self._heartbeat_thread: Optional[threading.Thread] = None
        self._heartbeat_stop = threading.Event()
        self._leases: Callable[[], List[str]] = list

    # ---- the address ----------------------------------------------------------------------------------------
    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + URL_WAIT_S
        while True:
            url = read_coordinator_url(self.run_dir)
            if url:
                return url
            if time.monotonic() > deadline:
                raise RoleExit(
                    f"no coordinator: {os.path.join(self.run_dir, 'coordinator.url')} did not appear within "
                    f"{URL_WAIT_S:.0f} s; start nervex.system.coordinator_start with the same config and --run-dir",
                    code=2,
                )
            time.sleep(0.2)

    def _client(self) -> Client:
        """This thread's client for the current address (``requests`` sessions are per thread)."""
        client: Optional[Client] = getattr(self._local, "client", None)
        if client is None or client.base_url != self.url.rstrip("/"):
            if client is not None:
                client.close()
            client = Client(self.url, self._token, deadline_s=self.deadline_s, should_stop=self._giving_up)
            self._local.client = client
        return client

    def _refresh_url(self) -> None:
        if self._fixed_url is not None:
            return
        url = read_coordinator_url(self.run_dir)
        with self._url_lock:
            if url and url != self.url:
                self.logger.info("coordinator address changed: %s -> %s", self.url, url)
                self.url = url

    # ---- calls ----------------------------------------------------------------------------------------------
    def _giving_up(self) -> bool:
        """Whether a call that finds the coordinator unreachable stops retrying: the run is ending (``stopping``) or
        the role was asked to stop (``stop_requested``)."""
        return self.stopping.is_set() or self.stop_requested()

    def call(self, path: str, body: Dict[str, Any]) -> Dict[str, Any]:
        """POST ``body`` (with this role's ``worker_id``) to ``path``; retried through outages up to ``reconnect_s``.

        A call to one of ``KEYED_PATHS`` also carries a ``request_id``: a retry is known as the same request.

        Raises:
            ProtocolError: the coordinator refused the request (4xx other than 429, 5xx other than 502-504).
            RoleExit: the coordinator stayed unreachable for ``reconnect_s``.
        """
        body = dict(body, worker_id=self.worker_id)
        if path in KEYED_PATHS:
            body["request_id"] = uuid.uuid4().hex  # one per call, the same in each of its retries
        give_up = time.monotonic() + self.reconnect_s
        while True:
            try:
                response = self._client().post(path, body)
            except ProtocolError as error:
                if error.status not in (502, 503, 504):
                    raise
                if time.monotonic() > give_up:
                    raise RoleExit(f"coordinator unreachable for {self.reconnect_s:.0f} s: {error}") from None
                self.logger.warning("%s: %s; retrying", path, error)
                self._refresh_url()
                if self._giving_up() or self.stopping.wait(0.5) or self.stop_requested():
                    raise RoleExit("stopping while the coordinator is unreachable", code=0) from None
                continue
            if isinstance(response, dict) and response.get("stop"):
                self.stopping.set()
            return response if isinstance(response, dict) else {}

    def register(self) -> Dict[str, Any]:
        """Register (idempotent); sets ``lease_s``/``heartbeat_s`` from the answer.

        Raises:
            RoleExit: code 2 when refused (another protocol or config, an unknown role).
        """
        body = {"role": self.role, "protocol": PROTOCOL_VERSION, "config_hash": self.config_hash, "info": self.info}
        try:
            answer = self.call(REGISTER_PATH, body)
        except ProtocolError as error:
            raise RoleExit(f"registration refused: {error}", code=2) from None
        self.lease_s = float(answer.get("lease_s", self.lease_s))
        self.heartbeat_s = float(answer.get("heartbeat_s", self.heartbeat_s))
        self.logger.info("registered %s %s with %s", self.role, self.worker_id, self.url)
        return answer

    def call_registered(self, path: str, body: Dict[str, Any]) -> Dict[str, Any]:
        """``call``, registering again once if the coordinator does not know this ``worker_id`` (a fresh task table)."""
        try:
            return self.call(path, body)
        except ProtocolError as error:
            if error.status != 404 or error.field != "worker_id":
                raise
            self.register()
            return self.call(path, body)

    # ---- heartbeats -----------------------------------------------------------------------------------------
    def start_heartbeat(self, leases: Callable[[], List[str]] = list) -> None:
        """Heartbeat every ``heartbeat_s`` in a daemon thread, renewing the lease ids ``leases()`` returns."""
        self._leases = leases
        self._heartbeat_stop.clear()
        self._heartbeat_thread = threading.Thread(target=self._beat, name=f"nervex-{self.role}-heartbeat", daemon=True)
        self._heartbeat_thread.start()

    def _beat(self) -> None:
        while not self._heartbeat_stop.wait(self.heartbeat_s):
            if self.stopping.is_set():
                return  # the run finished (the coordinator said stop): nothing to renew, and it may be gone already
            try:
                answer = self.call_registered(HEARTBEAT_PATH, {"lease_ids": list(self._leases())})
            except RoleExit as error:
                self.logger.error("heartbeat: %s", error)
                self.stopping.set()
                return
            except ProtocolError as error:
                self.logger.warning("heartbeat refused: %s", error)
                continue
            except Exception:  # a heartbeat thread must not die silently
                self.logger.exception("heartbeat failed")
                continue
            if answer.get("stale"):
                self.logger.info(
                    "heartbeat: lease(s) %s no longer current (completed meanwhile, or ran out: a result for those is "
                    "dropped)",
                    answer["stale"],
                )

    def close(self) -> None:
        self._heartbeat_stop.set()
        thread, self._heartbeat_thread = self._heartbeat_thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.deadline_s + 1.0)
        client = getattr(self._local, "client", None)
        if client is not None:
            client.close()
            self._local.client = None


__all__ = [
    "StopFlag",
    "URL_WAIT_S",
    "RoleExit",
    "RoleLink",
    "close_role_logger",
    "default_worker_id",
    "role_logger",
]
