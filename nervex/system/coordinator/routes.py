"""The coordinator's routes: each checks its request body, calls one transition of ``CoordinatorState``, and answers.

Every route is a signed ``POST`` of JSON (``nervex.system.comm.server.Server``). A route refuses a malformed body with
400 before anything changes (``check_known``, ``require``, ``optional`` of ``nervex.system.protocol``: unknown keys,
types, bounds); what a transition refuses because of the state (an unknown worker, another worker's lease,
back-pressure) it raises from ``CoordinatorState``. An SQLite "disk is full" becomes a retryable 507 (the transaction
was rolled back, nothing recorded).
"""

from __future__ import annotations

import sqlite3
from typing import Any, Callable, Dict

from nervex.system.comm.errors import ProtocolError
from nervex.system.coordinator.state import MAX_IDLE_WAIT_S, CoordinatorState
from nervex.system.protocol import (
    DATA_POLL_PATH,
    HEARTBEAT_PATH,
    HEARTBEATS_PATH,
    LEAGUE_UPDATE_PATH,
    LEARNER_PROGRESS_PATH,
    MAX_BEATS,
    MAX_POLL_LIMIT,
    PROTOCOL_VERSION,
    REGISTER_PATH,
    ROLES,
    RUN_FINISH_PATH,
    STATUS_PATH,
    TASK_COMPLETE_PATH,
    TASK_FAIL_PATH,
    TASK_LEASE_PATH,
    check_known,
    optional,
    require,
    require_storage_name,
    validate_collect_result,
)

Handler = Callable[[Any], Dict[str, Any]]
SHED_WAIT_PER_REQUEST_S = 0.1
"""An actor refused a lease for the backlog waits this long per waiting request. Of 0.01, 0.03 and 0.1 s, 0.1 kept the
most goodput with 1,000 actors at 4x capacity (175 tasks/s, p99 368 ms; bench/coordinator_load.py): a shed actor's
next poll costs a request too."""


class CoordinatorRoutes:
    """The request checking of the coordinator's routes, in front of its state.

    Args:
        state: The coordinator's state, open.
    """

    def __init__(self, state: CoordinatorState) -> None:
        self.state = state
        self.backlog: Callable[[], int] = lambda: 0
        """Requests waiting for a thread of the server (``Server.waiting_requests``, wired by the coordinator)."""
        self.shed = 0
        """Leases answered "no task" because of the backlog."""

    def handlers(self) -> Dict[str, Handler]:
        """Each route's path and handler (a handler takes the decoded JSON body and returns the answer)."""
        handlers: Dict[str, Handler] = {
            REGISTER_PATH: self.register,
            HEARTBEAT_PATH: self.heartbeat,
            HEARTBEATS_PATH: self.heartbeats,
            TASK_LEASE_PATH: self.lease,
            TASK_COMPLETE_PATH: self.complete,
            TASK_FAIL_PATH: self.fail,
            DATA_POLL_PATH: self.poll,
            LEARNER_PROGRESS_PATH: self.progress,
            RUN_FINISH_PATH: self.finish,
            STATUS_PATH: self.status,
            LEAGUE_UPDATE_PATH: self.league,
        }
        return {path: disk_full_as_507(self._durable(self._noting_stop(handler))) for path, handler in handlers.items()}

    def _durable(self, handler: Handler) -> Handler:
        """The handler, answering only once every change so far is on disk (``CoordinatorState.sync``: one fsync shared
        by the requests that wait meanwhile), whether it answers or refuses: an answer never shows a change a power
        loss could undo."""

        def durable(body: Any) -> Dict[str, Any]:
            try:
                return handler(body)
            finally:
                self.state.sync()

        return durable

    def _noting_stop(self, handler: Handler) -> Handler:
        """The handler, recording each worker that is answered "stop" (``CoordinatorState.told_stop``: a finished run
        is served until every live worker has been told)."""

        def noting(body: Any) -> Dict[str, Any]:
            answer = handler(body)
            if answer.get("stop") and isinstance(body, dict) and isinstance(body.get("worker_id"), str):
                self.state.told_stop.add(body["worker_id"])
            return answer

        return noting

    def register(self, body: Any) -> Dict[str, Any]:
        """``/v1/register``: a role with the same protocol and config hash registers (again) under its id."""
        check_known(body, ("worker_id", "role", "protocol", "config_hash", "info"))
        worker_id, role = require(body, "worker_id", str), require(body, "role", str)
        if role not in ROLES:
            raise ProtocolError(400, f"unknown role {role!r}; expected one of {', '.join(ROLES)}", field="role")
        protocol = require(body, "protocol", int)
        if protocol != PROTOCOL_VERSION:
            raise ProtocolError(
                403,
                f"worker {worker_id!r} speaks protocol {protocol}, this coordinator protocol {PROTOCOL_VERSION}: "
                "run the same nervex version in every role",
                field="protocol",
            )
        theirs = require(body, "config_hash", str)
        if theirs != self.state.config_hash:
            raise ProtocolError(
                403,
                f"worker {worker_id!r} has config hash {theirs}, this coordinator {self.state.config_hash}: start "
                "every role from the same YAML and the same --set overrides",
                field="config_hash",
            )
        self.state.register(worker_id, role, optional(body, "info", dict, {}))
        return {
            "worker_id": worker_id,
            "lease_s": self.state.settings.lease_s,
            "heartbeat_s": self.state.heartbeat_s,
            "run_id": self.state.run_id,
            "stop": self.state.is_finished(),
        }

    def heartbeat(self, body: Any) -> Dict[str, Any]:
        """``/v1/heartbeat``: renews the listed leases."""
        check_known(body, ("worker_id", "lease_ids"))
        worker_id = require(body, "worker_id", str)
        beat = self.state.heartbeat(worker_id, optional(body, "lease_ids", list, []))
        return {"renewed": beat["renewed"], "stale": beat["stale"], "stop": self.state.is_finished()}

    def heartbeats(self, body: Any) -> Dict[str, Any]:
        """``/v1/heartbeats``: a manager renews the leases of its node's actors, one beat per actor, in one request.

        A beat refused (an unknown actor, another worker's lease) is answered in its place (``error``, ``status``,
        ``field``) and changes nothing; the others apply."""
        check_known(body, ("worker_id", "beats"))
        worker_id = require(body, "worker_id", str)
        self.state.require_role(worker_id, "manager")
        beats = require(body, "beats", list)
        if len(beats) > MAX_BEATS:
            raise ProtocolError(400, f"'beats' lists {len(beats)} heartbeats, more than {MAX_BEATS}", field="beats")
        pairs = []
        for i, beat in enumerate(beats):
            where = f"beats[{i}]"
            check_known(beat, ("worker_id", "lease_ids"), where)
            pairs.append(
                (require(beat, "worker_id", str, where=where), optional(beat, "lease_ids", list, [], where=where))
            )
        answers = self.state.heartbeat_many(worker_id, pairs)
        for answer in answers.values():
            error = answer.pop("error", None)
            if error is not None:
                answer.update(error.to_json(), status=error.status)
        return {"beats": answers, "stop": self.state.is_finished()}

    def lease(self, body: Any) -> Dict[str, Any]:
        """``/v1/task/lease``: a task, or none (then, for collect, the snapshot the next task would name)."""
        check_known(body, ("worker_id", "kind", "request_id", "ahead"))
        worker_id, kind = require(body, "worker_id", str), require(body, "kind", str)
        request_id = optional(body, "request_id", str)
        ahead = optional(body, "ahead", bool, False)  # a prefetch by a worker busy with another task
        self.state.check_lease_kind(self.state.role_of(worker_id), kind, "kind")
        if self.state.is_finished():
            self.state.seen(worker_id)
            return {"task": None, "stop": True}
        backlog = self.backlog()
        if backlog > self.state.settings.shed_backlog:
            # overloaded: no new work until the queue drains, so reports and heartbeats (whose leases would run out
            # behind it) get through; the actor waits about the time the backlog takes
            self.shed += 1
            self.state.seen(worker_id)
            wait_s = min(MAX_IDLE_WAIT_S, max(self.state.idle_wait_s, backlog * SHED_WAIT_PER_REQUEST_S))
            return {"task": None, "stop": False, "wait_s": wait_s, **self._snapshot_hint()}
        task = self.state.lease(worker_id, kind, request_id, ahead)
        if task is None and kind == "collect":
            # no task now (the rate limiter, a full queue): the snapshot the next task would name, so an idle actor
            # loads it while it waits instead of after its next lease
            # (and how long to wait before asking again: the idle actors' polls together stay at idle_polls_per_s)
            return {"task": None, "stop": False, "wait_s": self.state.idle_wait_s, **self._snapshot_hint()}
        return {"task": task, "stop": False}

    def _snapshot_hint(self) -> Dict[str, Any]:
        choice = self.state.next_choice()
        return {"snapshot": choice.snapshot, "policy_iter": choice.policy_iter}

    def complete(self, body: Any) -> Dict[str, Any]:
        """``/v1/task/complete``: a task's result (accepted once), and with ``lease_next`` the next task's lease."""
        check_known(body, ("worker_id", "task_id", "lease_id", "result", "lease_next", "request_id", "ahead"))
        worker_id, task_id = require(body, "worker_id", str), require(body, "task_id", str)
        lease_id, result = require(body, "lease_id", str), require(body, "result", dict)
        lease_next = optional(body, "lease_next", str, None)
        role = self.state.role_of(worker_id)
        if lease_next is not None:  # refused before the report is recorded: a refusal has no side effect
            self.state.check_lease_kind(role, lease_next, "lease_next")
        answer = {"accepted": self.state.complete(worker_id, task_id, lease_id, result, validate_collect_result)}
        if lease_next is not None:  # report and lease the next task in one round trip
            next_body = dict(
                worker_id=worker_id, kind=lease_next, request_id=body.get("request_id"), ahead=body.get("ahead")
            )
            answer["next"] = self.lease({k: v for k, v in next_body.items() if v is not None})
        return answer

    def fail(self, body: Any) -> Dict[str, Any]:
        """``/v1/task/fail``: gives a leased task back."""
        check_known(body, ("worker_id", "task_id", "lease_id", "reason"))
        worker_id, task_id = require(body, "worker_id", str), require(body, "task_id", str)
        lease_id, reason = require(body, "lease_id", str), require(body, "reason", str)
        self.state.role_of(worker_id)
        return {"recorded": self.state.fail(worker_id, task_id, lease_id, reason)}

    def poll(self, body: Any) -> Dict[str, Any]:
        """``/v1/data/poll``: the learner reads the accepted collect results after ``since_seq``."""
        check_known(body, ("worker_id", "since_seq", "limit"))
        self.state.require_role(require(body, "worker_id", str), "learner")
        since_seq = require(body, "since_seq", int, ge=0)
        limit = optional(body, "limit", int, 100, ge=1)
        if limit > MAX_POLL_LIMIT:
            raise ProtocolError(400, f"'limit' must be <= {MAX_POLL_LIMIT}, got {limit}", field="limit")
        return {"items": self.state.poll(since_seq, limit), "stop": self.state.is_finished()}

    def progress(self, body: Any) -> Dict[str, Any]:
        """``/v1/learner/progress``: the learner's counters and newest snapshot."""
        fields = ("worker_id", "train_iter", "env_step", "sampled", "snapshot", "policy_iter", "buffer_size")
        check_known(body, fields)
        self.state.require_role(require(body, "worker_id", str), "learner")
        report = {name: require(body, name, int, ge=0) for name in ("train_iter", "env_step", "sampled", "policy_iter")}
        report["buffer_size"] = optional(body, "buffer_size", int, ge=0)
        snapshot = optional(body, "snapshot", str)
        report["snapshot"] = None if snapshot is None else require_storage_name(snapshot, "snapshot")
        self.state.record_progress(report)
        return {}

    def league(self, body: Any) -> Dict[str, Any]:
        """``/v1/league/update``: the league manager sets the snapshot (and opponent) of the next collect tasks; it
        gets the learner's progress and the accepted env steps back."""
        check_known(body, ("worker_id", "choice"))
        worker_id = require(body, "worker_id", str)
        self.state.require_role(worker_id, "league_manager")
        choice = optional(body, "choice", dict)
        if choice is not None:
            check_known(choice, ("snapshot", "policy_iter", "player", "opponent"), "choice")
            for name in ("snapshot", "opponent"):
                value = optional(choice, name, str, where="choice")
                if value is not None:
                    require_storage_name(value, f"choice.{name}")
            require(choice, "policy_iter", int, ge=0, where="choice")
            optional(choice, "player", str, where="choice")
            self.state.record_league_choice(worker_id, choice)
        self.state.seen(worker_id)
        return {
            "learner": self.state.learner_progress(),
            "env_steps_accepted": self.state.run_state.env_steps,
            "stop": self.state.is_finished(),
        }

    def finish(self, body: Any) -> Dict[str, Any]:
        """``/v1/run/finish``: any registered role ends the run."""
        check_known(body, ("worker_id", "reason"))
        worker_id, reason = require(body, "worker_id", str), require(body, "reason", str)
        self.state.role_of(worker_id)
        self.state.finish(worker_id, reason)
        return {"stop": True}

    def status(self, body: Any) -> Dict[str, Any]:
        """``/v1/status``: anyone with the token reads the run's counters."""
        check_known(body or {}, ("worker_id",))
        return self.state.status()


def disk_full_as_507(handler: Handler) -> Handler:
    """A handler whose SQLite "disk is full" becomes a retryable 507 (the transaction was rolled back)."""

    def guarded(body: Any) -> Dict[str, Any]:
        try:
            return handler(body)
        except sqlite3.OperationalError as error:
            if "full" not in str(error):
                raise
            message = f"the coordinator's disk is full ({error}); nothing was recorded, send again"
            raise ProtocolError(507, message, retry_after=5.0) from None

    return guarded


__all__ = ["CoordinatorRoutes", "disk_full_as_507"]
