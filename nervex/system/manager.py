"""The manager role: one per node; relays its actors' requests to the coordinator and restarts actors that die.

* **Relay**: a signed HTTP server on the node's loopback (port 0, ``<run_dir>/logs`` names it) that forwards every
  protocol route to the coordinator, body unchanged and signed anew, and returns the coordinator's answer or refusal
  (status, field, ``Retry-After``) unchanged. Its children get ``--url <relay>``; one connection to the coordinator
  per node instead of one per actor, and the coordinator's address is looked up in one place when it moves.
* **Supervision**: it starts ``system.manager.actors`` actor processes (``python -m nervex.system.actor_start``) and
  starts a dead one again (any exit before the run finished) after a backoff that doubles when it dies quickly, up to
  ``max_restarts`` per slot. A restarted actor registers under a new id: the leases of the dead one run out and are re-queued.
* **Heartbeats**: its actors' ``/v1/heartbeat`` are answered at once and sent on together, one ``/v1/heartbeats``
  every half heartbeat period (``nervex.system.heartbeat_batch``): the coordinator answers one request per node, not
  one per actor.
* It registers as a ``manager`` and heartbeats; when the coordinator says stop, or on SIGTERM/SIGINT, it stops its
  children (SIGTERM, then SIGKILL after a grace period) and exits.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from nervex.entry.builder import compile_parallel_config
from nervex.system.comm.auth import load_or_create_token
from nervex.system.comm.client import Client
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.server import Server
from nervex.system.heartbeat_batch import HeartbeatBatch
from nervex.system.protocol import HEARTBEAT_PATH, ROUTES
from nervex.system.role import RoleLink

RELAY_DEADLINE_S = 5.0
"""A relayed call's deadline upstream; past it the actor gets 503 and retries on its own schedule."""
GRACE_S = 10.0
QUICK_DEATH_S = 30.0
RESTART_WINDOW_S = 600.0
"""A child that lived this long before dying starts its slot's restart count afresh."""


@dataclass
class _Slot:
    index: int
    process: Optional[subprocess.Popen] = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = 0.0
    next_start: float = 0.0
    exits: List[int] = field(default_factory=list)
    given_up: bool = False


class ManagerRole:
    """A node's manager: relay server plus actor supervisor.

    Args:
        cfg: The run's config.
        run_dir: The run directory.
        worker_id: Its id at the coordinator.
        child_args: The shared command-line options to start children with (``cli.forward_args``).
        index: This manager's index: its actors get indices ``index * actors + i``.
        actors: Actor processes to start; ``system.manager.actors`` if None.
        url: The coordinator's address; None: ``<run_dir>/coordinator.url``.
        logger: Where events go.
        token: The run's secret (tests).
        host: The relay's bind address (loopback: the children run on this node).
    """

    def __init__(
        self,
        cfg: Mapping[str, Any],
        run_dir: str,
        worker_id: str,
        child_args: List[str],
        index: int = 0,
        actors: Optional[int] = None,
        url: Optional[str] = None,
        logger: Optional[logging.Logger] = None,
        token: Optional[bytes] = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.cfg = compile_parallel_config(cfg)
        self.settings = self.cfg.system.manager
        self.run_dir = run_dir
        self.logger = logger or logging.getLogger(__name__)
        self.index = int(index)
        self.n_actors = int(self.settings.actors if actors is None else actors)
        self.child_args = list(child_args)
        self._token = token if token is not None else load_or_create_token(run_dir)
        self.link = RoleLink(self.cfg, run_dir, "manager", worker_id, url=url, token=self._token, logger=self.logger)
        self._local = threading.local()
        self.server = Server("manager", self._token, host=host, port=0, logger=self.logger)
        self.heartbeats = HeartbeatBatch(worker_id, self._post_batch, self.logger)
        """Its actors' heartbeats, sent to the coordinator as one request every half heartbeat period."""
        for path in ROUTES:
            handler = self.heartbeats.beat if path == HEARTBEAT_PATH else self._relay_handler(path)
            self.server.route(path, ["POST"], handler)
        self.slots = [_Slot(self.index * self.n_actors + i) for i in range(self.n_actors)]
        self.relayed = 0

    # ---- relay ---------------------------------------------------------------------------------------------------
    def _upstream(self) -> Client:
        client: Optional[Client] = getattr(self._local, "client", None)
        if client is None or client.base_url != self.link.url.rstrip("/"):
            client = Client(self.link.url, self._token, deadline_s=RELAY_DEADLINE_S)
            self._local.client = client
        return client

    def _post_upstream(self, path: str, body: Any) -> Dict[str, Any]:
        try:
            answer = self._upstream().post(path, body)
        except ProtocolError as error:
            if error.status in (502, 503, 504):
                self.link._refresh_url()
            raise
        self.relayed += 1
        return answer if isinstance(answer, dict) else {}

    def _post_batch(self, path: str, body: Any) -> Dict[str, Any]:
        """The heartbeat batch, sent as this manager (registering again if the coordinator lost it, as ``RoleLink``
        does for its own calls)."""
        try:
            return self._post_upstream(path, body)
        except ProtocolError as error:
            if error.status != 404 or error.field != "worker_id":
                raise
            self.link.register()
            return self._post_upstream(path, body)

    def _relay_handler(self, path: str) -> Any:
        def relay(body: Any) -> Dict[str, Any]:
            return self._post_upstream(path, body)

        return relay

    @property
    def url(self) -> str:
        return self.server.url

    # ---- supervision ---------------------------------------------------------------------------------------------
    def _start(self, slot: _Slot) -> None:
        command = [
            sys.executable,
            "-m",
            "nervex.system.actor_start",
            *self.child_args,
            "--index",
            str(slot.index),
            "--url",
            self.url,
        ]
        env = dict(os.environ, NERVEX_ACTOR_RESTARTS=str(slot.restarts))  # a restarted actor seeds its envs anew
        slot.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)
        slot.started_at = time.monotonic()
        self.logger.info("started actor %d (pid %d)", slot.index, slot.process.pid)

    def supervise(self) -> None:
        """One pass: restart children that died (after their backoff)."""
        now = time.monotonic()
        for slot in self.slots:
            if slot.given_up:
                continue
            if slot.process is not None:
                code = slot.process.poll()
                if code is None:
                    continue
                slot.exits.append(code)
                slot.process = None
                if self.link.stopping.is_set():
                    continue
                lived = now - slot.started_at
                if lived > RESTART_WINDOW_S:
                    slot.restarts = 0  # max_restarts counts restarts of a slot that keeps dying, not over a whole run
                slot.backoff_s = (
                    min(30.0, max(float(self.settings.restart_backoff_s), 2 * slot.backoff_s))
                    if lived < QUICK_DEATH_S
                    else float(self.settings.restart_backoff_s)
                )
                if slot.restarts >= int(self.settings.max_restarts):
                    slot.given_up = True
                    self.logger.error(
                        "actor %d exited with %d; %d restarts used (system.manager.max_restarts): not restarting",
                        slot.index,
                        code,
                        slot.restarts,
                    )
                    continue
                slot.next_start = now + slot.backoff_s
                self.logger.warning(
                    "actor %d exited with %d after %.1f s; restarting in %.1f s",
                    slot.index,
                    code,
                    lived,
                    slot.backoff_s,
                )
                slot.restarts += 1
                continue
            if not self.link.stopping.is_set() and now >= slot.next_start:
                self._start(slot)

    def run(self, stop: Optional[Any] = None) -> None:
        """Serve the relay, register, start the actors and supervise them until the run finishes or ``stop``."""
        self.server.start()
        self.logger.info("manager relay listening on %s", self.url)
        try:
            if stop is not None:
                self.link.stop_requested = stop.is_set
            self.link.register()
            self.link.start_heartbeat()
            self.heartbeats.start(flush_s=self.link.heartbeat_s / 2)
            while not self.link.stopping.is_set() and not (stop is not None and stop.is_set()):
                self.supervise()
                time.sleep(0.2)
            # the run finished: let the actors see "stop" through the relay and exit on their own
            deadline = time.monotonic() + GRACE_S
            while time.monotonic() < deadline and any(s.process and s.process.poll() is None for s in self.slots):
                time.sleep(0.1)
        finally:
            self.stop_children()
            self.heartbeats.close()
            self.link.close()
            self.server.stop()

    def stop_children(self, grace_s: float = GRACE_S) -> None:
        """SIGTERM every running child, SIGKILL those still alive after ``grace_s``."""
        running = [s.process for s in self.slots if s.process is not None and s.process.poll() is None]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + grace_s
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def child_pids(self) -> Dict[int, int]:
        """``{actor index: pid}`` of the running children."""
        return {s.index: s.process.pid for s in self.slots if s.process is not None and s.process.poll() is None}


def manager_index_from_env(environ: Mapping[str, str] = os.environ) -> int:
    """This node's manager index under Slurm (``SLURM_NODEID``, else ``SLURM_PROCID``), else 0."""
    for name in ("SLURM_NODEID", "SLURM_PROCID"):
        value = environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"environment variable {name}={value!r} is not an integer") from None
    return 0


__all__ = ["ManagerRole", "manager_index_from_env"]
