"""The coordinator process: its databases and storage opened, its routes served, its background pass run.

It owns ``<run_dir>/coordinator.sqlite`` (the ``TaskTable``: tasks, workers, leases) and
``<run_dir>/coordinator_state.sqlite`` (the run's own state: run id, config hash, finished flag, the learner's last
progress, how far the learner has polled, and an index of the accepted collect results). Both are on node-local disk,
WAL with ``synchronous=FULL``, so whatever a route acknowledged survives a ``kill -9``; a restarted coordinator
re-queues the leases that ran out while it was down and goes on.

Every route is a ``POST`` of JSON, signed (``nervex.system.comm.auth``), and idempotent: a request whose response was
lost is sent again by the client. A lease request is made so by its ``request_id``: sent again, it gets the task its
first sending leased. A background thread (every ``tick_s``) expires leases and tops up collect tasks:

* at most ``max_pending_collect`` collect tasks wait for an actor;
* none is created while ``max_queued_results`` accepted results wait for the learner, while the storage root or run
  dir has less than ``min_free_bytes`` free, after ``max_env_step`` env steps, or after the run finished;
* with ``samples_per_insert`` (off-policy, Reverb's rate limiter), a task is created only while
  ``accepted_env_steps + in_flight_env_steps <= learning_starts + sampled / samples_per_insert``, where ``sampled`` is
  what the learner reported and ``in_flight_env_steps`` counts the collect tasks already queued or running (so the
  limit is overshot by one task at most, not by the whole queue).

Which policy snapshot a new collect task names is a seam (``SnapshotSource``): the league manager's choice while it is
alive, else the learner's newest.

The layers: ``Coordinator`` (here) wires ``CoordinatorRoutes`` (request checking, load shedding, ``routes.py``) to
``CoordinatorState`` (transitions and the sweep, ``state.py``; back-pressure and task creation, ``supply.py``) over
``TaskTable`` (``task_table.py``; its workers' records and heartbeats in ``workers.py``), ``RunState``
(``run_state.py``) and the run's ``Storage``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Dict, Mapping, Optional

from nervex.system.comm.auth import load_or_create_token
from nervex.system.comm.connections import ConnectionLimits
from nervex.system.comm.server import Server
from nervex.system.comm.storage import Storage
from nervex.system.coordinator.routes import CoordinatorRoutes
from nervex.system.coordinator.run_state import RunState
from nervex.system.coordinator.snapshots import SnapshotSource
from nervex.system.coordinator.state import CoordinatorState
from nervex.system.coordinator.task_table import TaskTable
from nervex.system.protocol import read_coordinator_url, write_coordinator_url
from nervex.system.system_config import COORDINATOR_CONFIG, compile_coordinator_config, config_hash, storage_root

TABLE_FILE = "coordinator.sqlite"
STATE_FILE = "coordinator_state.sqlite"


class Coordinator:
    """The parallel run's coordinator: task table, routes, lease expiry and collect-task creation.

    Example::

        with Coordinator(cfg, "runs/cartpole_dist") as coordinator:   # or start() ... stop() in a finally
            print(coordinator.url)                                   # also in <run_dir>/coordinator.url

    Args:
        cfg: The run's compiled config (``nervex.entry.compile_parallel_config``, or its ``config.yaml`` read back);
            re-validated with ``compile_coordinator_config``, which imports no policy.
        run_dir: The run directory on node-local disk (the SQLite files, the token, ``coordinator.url``).
        token: The run's secret; ``load_or_create_token(run_dir)`` if None.
        host: Bind address; ``system.coordinator.host`` if None.
        port: Port; ``system.coordinator.port`` if None (0: the previous run's port if free, else any).
        clock: Wall-clock seconds for leases (injected by tests).
        snapshot_source: Chooses each collect task's snapshot; the league's or the learner's newest if None.
        logger: Where events go; ``nervex.system.coordinator`` if None.
    """

    config = COORDINATOR_CONFIG

    def __init__(
        self,
        cfg: Mapping[str, Any],
        run_dir: str,
        token: Optional[bytes] = None,
        host: Optional[str] = None,
        port: Optional[int] = None,
        clock: Callable[[], float] = time.time,
        snapshot_source: Optional[SnapshotSource] = None,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        self.cfg = compile_coordinator_config(cfg)
        self.settings = self.cfg.system.coordinator
        self.run_dir = os.path.abspath(run_dir)
        self.config_hash = config_hash(self.cfg)
        self.logger = logger or logging.getLogger("nervex.system.coordinator")
        self._token = token
        self._host = self.settings.host if host is None else host
        self._port = int(self.settings.port if port is None else port)
        self._clock = clock
        self._snapshot_source = snapshot_source
        self._stop_event = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._server: Optional[Server] = None
        self._state: Optional[CoordinatorState] = None
        self.routes: Optional[CoordinatorRoutes] = None
        """The request checking in front of the state, once listening (its ``shed`` counts leases refused under
        overload)."""

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> Coordinator:
        """Open the databases, recover, listen, write ``coordinator.url`` and start the background pass.

        Raises:
            TaskTableError: another coordinator holds this run directory's task table.
            CoordinatorError: the run directory was started with another config.
            OSError: the address cannot be bound.
        """
        os.makedirs(self.run_dir, exist_ok=True)
        token = self._token if self._token is not None else load_or_create_token(self.run_dir)
        try:
            self._state = self._open_state()
            self._state.tick()  # the leases that ran out while no coordinator was up, then the first tasks
            self._server = self._listen(token)
            write_coordinator_url(self.run_dir, self._server.url)
            self._stop_event.clear()
            self._thread = threading.Thread(target=self._tick_loop, name="nervex-coordinator-tick", daemon=True)
            self._thread.start()
        except BaseException:
            self.stop()
            raise
        self.logger.info("coordinator %s listening on %s (run dir %s)", self.run_id, self.url, self.run_dir)
        return self

    def _open_state(self) -> CoordinatorState:
        s = self.settings
        table = TaskTable(
            os.path.join(self.run_dir, TABLE_FILE), s.lease_s, s.max_attempts, self._clock, group_commit=True
        )
        run_state: Optional[RunState] = None
        try:
            run_state = RunState(os.path.join(self.run_dir, STATE_FILE), group_commit=True)
            storage = Storage(storage_root(self.cfg, self.run_dir), min_free_bytes=s.min_free_bytes)
            return CoordinatorState(
                self.cfg,
                self.run_dir,
                self.config_hash,
                table,
                run_state,
                storage,
                self._clock,
                self._snapshot_source,
                self.logger,
            )
        except BaseException:
            if run_state is not None:
                run_state.close()
            table.close()
            raise

    def stop(self) -> None:
        """Stop the background pass and the server, close the databases; idempotent."""
        self._stop_event.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=10.0)
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        state, self._state = self._state, None
        if state is not None:
            with state.lock:  # a transition still running in a server thread finishes first
                state.run_state.close()
                state.table.close()

    def __enter__(self) -> Coordinator:
        return self if self._server is not None else self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    @property
    def state(self) -> CoordinatorState:
        """The coordinator's state (for inspection; change it through the routes)."""
        if self._state is None:
            raise RuntimeError("the coordinator's state is closed; call start()")
        return self._state

    @property
    def url(self) -> str:
        """``http://host:port`` of the running coordinator."""
        if self._server is None:
            raise RuntimeError("the coordinator has no address before start()")
        return self._server.url

    @property
    def run_id(self) -> str:
        """The run's id, stored in the run directory at its first start."""
        return self.state.run_id

    @property
    def task_table(self) -> TaskTable:
        """The task table (for inspection; change it through the routes)."""
        return self.state.table

    def learner_progress(self) -> Dict[str, Any]:
        """The learner's last ``/v1/learner/progress`` report (``{}`` before the first)."""
        return self.state.learner_progress()

    def league_update(self) -> Dict[str, Any]:
        """The league manager's last ``/v1/league/update`` (``{}`` before the first)."""
        return self.state.league_update()

    def finished(self) -> Optional[Dict[str, Any]]:
        """``{reason, worker_id, at}`` once the run has finished, else None."""
        return self.state.finished()

    def tick(self) -> None:
        """One background pass (``CoordinatorState.tick``): expire leases, index results, create collect tasks."""
        self.state.tick()

    def sweep(self) -> Dict[str, int]:
        """Delete orphaned payload files now (``CoordinatorState.sweep``); returns the counts."""
        return self.state.sweep()

    def _listen(self, token: bytes) -> Server:
        """Serve on the requested port; with port 0, first try the port of the previous ``coordinator.url``."""
        previous = _port_of(read_coordinator_url(self.run_dir)) if self._port == 0 else None
        if previous:
            try:
                return self._make_server(token, previous).start()
            except OSError as error:
                self.logger.info("previous port %d is taken (%s); listening on a free one", previous, error)
        return self._make_server(token, self._port).start()

    def _make_server(self, token: bytes, port: int) -> Server:
        settings = self.settings
        limits = ConnectionLimits(
            connections=int(settings.max_connections),
            per_peer=int(settings.max_connections_per_peer),
            idle_s=float(settings.idle_timeout_s),
            request_s=float(settings.request_timeout_s),
        )
        server = Server("coordinator", token, host=self._host, port=port, logger=self.logger, limits=limits)
        routes = self.routes = CoordinatorRoutes(self.state)
        routes.backlog = server.waiting_requests  # leases are shed while the server is far behind
        for path, handler in routes.handlers().items():
            server.route(path, ["POST"], handler)
        return server

    def _tick_loop(self) -> None:
        while not self._stop_event.wait(self.settings.tick_s):
            try:
                self.tick()
            except Exception:
                self.logger.exception("coordinator: background pass failed; retrying in %.1f s", self.settings.tick_s)


def _port_of(url: Optional[str]) -> Optional[int]:
    if not url:
        return None
    try:
        return int(url.rsplit(":", 1)[1].strip("/"))
    except (IndexError, ValueError):
        return None


__all__ = ["Coordinator", "STATE_FILE", "TABLE_FILE"]
