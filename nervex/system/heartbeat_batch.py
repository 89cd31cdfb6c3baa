"""A node's heartbeats as one request: the manager's relay answers its actors' ``/v1/heartbeat`` at once and sends
them to the coordinator together, as one ``/v1/heartbeats``, every ``flush_s``.

A coordinator serving 1,000 actors would otherwise answer ``1000 / heartbeat_s`` heartbeats a second (300 with 10 s
leases), each a request and a transaction of its own; batched by 16-actor nodes it answers 63 every ``flush_s``.

What an actor sees changes in one way: the answer to a beat reports what the coordinator said of that actor's
*previous* beat (its renewed and stale leases, a refusal such as an unknown worker), and ``stop`` as of the last flush.
A lease is renewed at most ``flush_s`` after the actor's beat, well inside a lease (``flush_s`` is half the heartbeat
period, itself a third of the lease). An actor that beats twice before a flush is sent once, with its newer leases.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, List, Optional

from nervex.system.comm.connections import RateLimitedLog
from nervex.system.comm.errors import ProtocolError
from nervex.system.protocol import HEARTBEATS_PATH, MAX_BEATS, check_known, optional, require

Post = Callable[[str, Dict[str, Any]], Dict[str, Any]]


class HeartbeatBatch:
    """The heartbeats of a node's actors, answered at once and flushed to the coordinator together.

    Example::

        batch = HeartbeatBatch("manager-0", post=upstream_client.post)
        relay.route("/v1/heartbeat", ["POST"], batch.beat)        # what each actor sends
        batch.start(flush_s=link.heartbeat_s / 2)                  # one /v1/heartbeats per flush_s, if any beat came

    Args:
        manager_id: The manager's worker id (registered as ``manager``: only a manager may send a batch).
        post: Sends one signed request to the coordinator and returns its JSON answer (raises ``ProtocolError``).
        logger: Where a failed flush is logged (rate-limited).
    """

    def __init__(self, manager_id: str, post: Post, logger: Optional[logging.Logger] = None) -> None:
        self.manager_id = manager_id
        self._post = post
        self._log = RateLimitedLog(logger or logging.getLogger(__name__))
        self._lock = threading.Lock()
        self._pending: Dict[str, List[Any]] = {}  # actor id -> lease ids of its newest beat, not yet sent
        self._answers: Dict[str, Dict[str, Any]] = {}  # actor id -> the coordinator's answer to its last sent beat
        self.stop = False
        """The coordinator's ``stop`` at the last flush."""
        self._thread: Optional[threading.Thread] = None
        self._closing = threading.Event()

    def beat(self, body: Any) -> Dict[str, Any]:
        """An actor's ``/v1/heartbeat``: queued for the next flush; answered with what its previous beat got.

        Raises:
            ProtocolError: 400 a malformed beat; the coordinator's refusal of this actor's previous beat (404 unknown
                worker: the actor registers again, as it would talking to the coordinator).
        """
        check_known(body, ("worker_id", "lease_ids"))
        worker_id = require(body, "worker_id", str)
        lease_ids = optional(body, "lease_ids", list, [])
        with self._lock:
            if worker_id not in self._pending and len(self._pending) >= MAX_BEATS:
                raise ProtocolError(503, f"{MAX_BEATS} heartbeats wait for the coordinator", retry_after=1.0)
            self._pending[worker_id] = lease_ids
            previous = self._answers.pop(worker_id, {})
            stop = self.stop
        if "error" in previous:
            raise ProtocolError(int(previous.get("status", 400)), str(previous["error"]), field=previous.get("field"))
        return {"renewed": previous.get("renewed", {}), "stale": previous.get("stale", []), "stop": stop}

    def flush(self) -> int:
        """Send the beats queued since the last flush as one request; returns how many were sent.

        A flush that fails (coordinator unreachable) keeps its beats queued for the next, unless newer beats of the
        same actors came meanwhile; the failure is logged, rate-limited.
        """
        with self._lock:
            beats, self._pending = self._pending, {}
        if not beats:
            return 0
        body = {
            "worker_id": self.manager_id,
            "beats": [{"worker_id": worker_id, "lease_ids": ids} for worker_id, ids in beats.items()],
        }
        try:
            answer = self._post(HEARTBEATS_PATH, body)
        except ProtocolError as error:
            with self._lock:
                self._pending = {**beats, **self._pending}
            self._log.warning("heartbeats of %d actor(s) not delivered, kept for the next flush: %s", len(beats), error)
            return 0
        answers = answer.get("beats", {}) if isinstance(answer, dict) else {}
        with self._lock:
            for worker_id in beats:
                self._answers[worker_id] = answers.get(worker_id, {})
            self.stop = bool(answer.get("stop", False)) if isinstance(answer, dict) else self.stop
        return len(beats)

    def start(self, flush_s: float) -> None:
        """Flush every ``flush_s`` in a daemon thread until ``close``."""
        self._closing.clear()
        self._thread = threading.Thread(target=self._run, args=(float(flush_s),), name="nervex-heartbeats", daemon=True)
        self._thread.start()

    def _run(self, flush_s: float) -> None:
        while not self._closing.wait(flush_s):
            try:
                self.flush()
            except Exception:  # the flusher must not die silently: actors' leases would run out
                self._log.logger.exception("heartbeat flush failed")

    def close(self) -> None:
        """Stop the flusher (what is queued is not sent: the run is ending)."""
        self._closing.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5.0)


__all__ = ["HeartbeatBatch"]
