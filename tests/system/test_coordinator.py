"""Tests of the coordinator: handshake, the task routes, back-pressure, finish, auth, and kill -9 with restart.

In-process coordinators use a fake clock and no background pass (``tick_s`` of an hour; the test calls ``tick()``),
so what a test sees does not depend on timing. The kill -9 test runs the real ``coordinator_start`` module.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
import requests

from nervex.config import ConfigError, read_config, save_config, to_plain
from nervex.entry import compile_parallel_config
from nervex.system.comm.auth import load_or_create_token, sign_request
from nervex.system.comm.client import Client
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.storage import Storage
from nervex.system.coordinator import Coordinator, CoordinatorError
from nervex.system.coordinator import backpressure as backpressure_module
from nervex.system.coordinator.backpressure import collect_budget
from nervex.system.coordinator.task_table import TaskTableError
from nervex.system.protocol import (
    COORDINATOR_URL_FILE,
    DATA_POLL_PATH,
    HEARTBEAT_PATH,
    LEAGUE_UPDATE_PATH,
    LEARNER_PROGRESS_PATH,
    PROTOCOL_VERSION,
    REGISTER_PATH,
    RUN_FINISH_PATH,
    STATUS_PATH,
    TASK_COMPLETE_PATH,
    TASK_FAIL_PATH,
    TASK_LEASE_PATH,
    read_coordinator_url,
)
from nervex.system.system_config import config_hash, storage_root

REPO_ROOT = Path(__file__).resolve().parents[2]
CARTPOLE_DQN = REPO_ROOT / "app_zoo" / "classic_control" / "cartpole" / "config" / "cartpole_dqn.yaml"
TOKEN = secrets.token_bytes(32)
N_SAMPLE = 8  # policy.collect.n_sample of cartpole_dqn.yaml
MANUAL = dict(tick_s=3600.0, min_free_bytes=0)  # no background pass: tests call tick()


class FakeClock:
    """Wall clock under the test's control."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_cfg(learning_starts: Optional[int] = None, **coordinator: Any) -> Any:
    """cartpole_dqn.yaml with a ``system.coordinator`` section, compiled (what a coordinator reads)."""
    cfg = read_config(CARTPOLE_DQN)
    cfg.system = {"coordinator": dict(MANUAL, **coordinator)}
    if learning_starts is not None:
        cfg.policy.learn.learning_starts = learning_starts
    return compile_parallel_config(cfg)


class Harness:
    """One in-process coordinator with a client, an actor-side storage and helpers for each route."""

    def __init__(self, run_dir: Path, clock: FakeClock, started: List[Coordinator], **coordinator: Any) -> None:
        self.run_dir, self.clock = run_dir, clock
        self.coordinator = Coordinator(make_cfg(**coordinator), str(run_dir), token=TOKEN, clock=clock)
        started.append(self.coordinator)
        self.coordinator.start()
        self.client = Client(self.coordinator.url, TOKEN, deadline_s=10.0)
        self.storage = Storage(storage_root(self.coordinator.cfg, str(run_dir)), min_free_bytes=0)

    def post(self, path: str, body: Dict[str, Any]) -> Any:
        return self.client.post(path, body)

    def register(self, worker_id: str, role: str = "actor", **changes: Any) -> Any:
        body = dict(worker_id=worker_id, role=role, protocol=PROTOCOL_VERSION, info={"host": "node0"})
        body["config_hash"] = self.coordinator.config_hash
        return self.post(REGISTER_PATH, {**body, **changes})

    def lease(self, worker_id: str) -> Optional[Dict[str, Any]]:
        return self.post(TASK_LEASE_PATH, {"worker_id": worker_id, "kind": "collect"})["task"]

    def result(self, content: bytes = b"", env_steps: int = N_SAMPLE) -> Dict[str, Any]:
        data = self.storage.put(content or secrets.token_bytes(64), "traj")
        episodes = [{"return": 12.0, "length": 12}]
        return dict(data=data, n_samples=env_steps, env_steps=env_steps, episodes=episodes, policy_iter=0)

    def complete(self, worker_id: str, task: Dict[str, Any], result: Dict[str, Any]) -> bool:
        body = dict(worker_id=worker_id, task_id=task["task_id"], lease_id=task["lease_id"], result=result)
        return self.post(TASK_COMPLETE_PATH, body)["accepted"]

    def poll(self, since_seq: int, worker_id: str = "learner0") -> Dict[str, Any]:
        return self.post(DATA_POLL_PATH, {"worker_id": worker_id, "since_seq": since_seq, "limit": 100})

    def progress(self, sampled: int, snapshot: Optional[str] = None, policy_iter: int = 0) -> Any:
        body = dict(worker_id="learner0", train_iter=1, env_step=0, sampled=sampled, snapshot=snapshot)
        return self.post(LEARNER_PROGRESS_PATH, {**body, "policy_iter": policy_iter})

    def status(self) -> Dict[str, Any]:
        return self.post(STATUS_PATH, {})


@pytest.fixture
def started() -> Iterator[List[Coordinator]]:
    """Every coordinator a test starts, stopped at its end even when it fails."""
    coordinators: List[Coordinator] = []
    yield coordinators
    for coordinator in coordinators:
        coordinator.stop()


@pytest.fixture
def harness(tmp_path: Path, started: List[Coordinator]) -> Callable[..., Harness]:
    def make(run_dir: Optional[Path] = None, clock: Optional[FakeClock] = None, **coordinator: Any) -> Harness:
        return Harness(run_dir or tmp_path / "run", clock or FakeClock(), started, **coordinator)

    return make


def refusal(call: Callable[[], Any]) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        call()
    return info.value


def signed_post(url: str, path: str, body: Dict[str, Any], sign: bool = True) -> requests.Response:
    data = json.dumps(body).encode("utf-8")
    headers = {"Content-Type": "application/json", **(sign_request(TOKEN, "POST", path, data) if sign else {})}
    return requests.post(url + path, data=data, headers=headers, timeout=10)


# --------------------------------------------------------------------------- handshake


def test_register_answers_lease_settings_and_run_id(harness):
    h = harness(lease_s=12.0)
    reply = h.register("actor0")
    assert reply == {
        "worker_id": "actor0",
        "lease_s": 12.0,
        "heartbeat_s": 4.0,
        "run_id": h.coordinator.run_id,
        "stop": False,
    }
    assert [w["worker_id"] for w in h.status()["workers"]] == ["actor0"]


@pytest.mark.parametrize(
    "changes, names",
    [
        ({"protocol": PROTOCOL_VERSION + 1}, [f"protocol {PROTOCOL_VERSION + 1}", f"protocol {PROTOCOL_VERSION}"]),
        ({"config_hash": "f" * 64}, ["f" * 64]),
    ],
    ids=["protocol mismatch", "config hash mismatch"],
)
def test_register_mismatch_is_403_naming_both_values_and_registers_nothing(harness, changes, names):
    h = harness()
    error = refusal(lambda: h.register("actor0", **changes))
    assert error.status == 403 and error.field == next(iter(changes))
    for name in names + ([h.coordinator.config_hash] if "config_hash" in changes else []):
        assert name in error.message
    assert h.status()["workers"] == []
    assert refusal(lambda: h.lease("actor0")).status == 404


@pytest.mark.parametrize(
    "body_changes, field",
    [
        ({"role": "critic"}, "role"),
        ({"protocol": "1"}, "protocol"),
        ({"worker_idd": "x"}, "worker_idd"),
    ],
    ids=["unknown role", "protocol as string", "unknown field"],
)
def test_register_malformed_is_400_naming_the_field(harness, body_changes, field):
    h = harness()
    error = refusal(lambda: h.register("actor0", **body_changes))
    assert (error.status, error.field) == (400, field)
    if field == "worker_idd":
        assert "did you mean 'worker_id'" in error.message


# --------------------------------------------------------------------------- lease -> complete -> poll


def test_lease_complete_then_poll_returns_the_result_once_with_its_seq(harness):
    h = harness()
    h.register("actor0")
    h.register("learner0", role="learner")
    task = h.lease("actor0")
    assert task["task_id"] == "collect-00000000"
    assert task["payload"] == {
        "unit": "sample",
        "n": N_SAMPLE,
        "restart_envs": False,
        "snapshot": None,
        "policy_iter": 0,
        "task_index": 0,
        "opponent": None,
        "env_step": 0,
        "train_iter": 0,
    }
    result = h.result()
    assert h.complete("actor0", task, result) is True
    assert h.complete("actor0", task, result) is True  # a retry after a lost response
    first = h.poll(0)
    assert first == {"items": [{"seq": 1, "task_id": task["task_id"], "result": result}], "stop": False}
    assert h.poll(1)["items"] == []
    status = h.status()
    assert (status["env_steps_accepted"], status["queued_results"], status["tasks"]["done"]) == (N_SAMPLE, 0, 1)


def test_new_tasks_name_the_learners_newest_snapshot(harness):
    h = harness(max_pending_collect=1)
    h.register("actor0")
    h.register("learner0", role="learner")
    snapshot = h.storage.put(b"weights", "policy")
    h.progress(sampled=0, snapshot=snapshot, policy_iter=7)
    h.complete("actor0", h.lease("actor0"), h.result())
    h.coordinator.tick()
    payload = h.lease("actor0")["payload"]
    assert (payload["snapshot"], payload["policy_iter"], payload["task_index"]) == (snapshot, 7, 1)
    assert (payload["env_step"], payload["train_iter"]) == (N_SAMPLE, 1)


def test_the_snapshot_is_chosen_when_the_task_is_leased_not_when_it_was_queued(harness):
    h = harness(max_pending_collect=2)
    h.register("actor0")
    h.register("learner0", role="learner")
    h.coordinator.tick()  # two tasks queued before any snapshot exists
    snapshot = h.storage.put(b"weights", "policy")
    h.progress(sampled=0, snapshot=snapshot, policy_iter=3)
    payload = h.lease("actor0")["payload"]
    assert (payload["task_index"], payload["snapshot"], payload["policy_iter"]) == (0, snapshot, 3)


def test_the_league_managers_choice_wins_while_it_is_fresh_then_the_learners_newest(harness):
    h = harness(max_pending_collect=4)
    h.register("actor0")
    h.register("learner0", role="learner")
    h.register("league0", role="league_manager")
    learner_snap = h.storage.put(b"learner weights", "snapshot")
    league_snap = h.storage.put(b"league weights", "league")
    h.progress(sampled=0, snapshot=learner_snap, policy_iter=9)
    h.coordinator.tick()
    client = h.client
    answer = client.post(
        LEAGUE_UPDATE_PATH,
        {"worker_id": "league0", "choice": {"snapshot": league_snap, "policy_iter": 5, "player": "main"}},
    )
    assert answer["learner"]["snapshot"] == learner_snap
    assert h.lease("actor0")["payload"]["snapshot"] == league_snap
    h.clock.now += 3600.0  # the league manager went quiet: fall back to the learner's newest
    h.progress(sampled=0, snapshot=learner_snap, policy_iter=9)
    assert h.lease("actor0")["payload"]["snapshot"] == learner_snap
    error = refusal(lambda: client.post(LEAGUE_UPDATE_PATH, {"worker_id": "actor0", "choice": None}))
    assert error.status == 403
    error = refusal(
        lambda: client.post(
            LEAGUE_UPDATE_PATH, {"worker_id": "league0", "choice": {"snapshot": "../x", "policy_iter": 1}}
        )
    )
    assert (error.status, error.field) == (400, "choice.snapshot")


@pytest.mark.parametrize(
    "change, field",
    [
        ({"data": "../../etc/passwd"}, "result.data"),
        ({"env_steps": -1}, "result.env_steps"),
        ({"n_samples": 1.5}, "result.n_samples"),
        ({"episodes": [{"return": 1.0, "length": 0}]}, "result.episodes[0].length"),
        ({"episodes": [{"return": "high", "length": 3}]}, "result.episodes[0].return"),
        ({"policy_iter": True}, "result.policy_iter"),
        ({"extra": 1}, "result.extra"),
    ],
    ids=["path as data", "negative env_steps", "float n_samples", "empty episode", "text return", "bool", "unknown"],
)
def test_complete_with_a_malformed_result_is_400_naming_the_field_and_records_nothing(harness, change, field):
    h = harness()
    h.register("actor0")
    task = h.lease("actor0")
    error = refusal(lambda: h.complete("actor0", task, {**h.result(), **change}))
    assert (error.status, error.field) == (400, field)
    assert h.coordinator.task_table.get_task(task["task_id"])["state"] == "leased"


def test_complete_or_fail_of_another_workers_lease_is_403(harness):
    h = harness()
    h.register("actor0")
    h.register("actor1")
    task = h.lease("actor0")
    assert refusal(lambda: h.complete("actor1", task, h.result())).status == 403
    fail = dict(worker_id="actor1", task_id=task["task_id"], lease_id=task["lease_id"], reason="x")
    assert refusal(lambda: h.post(TASK_FAIL_PATH, fail)).status == 403
    assert h.coordinator.task_table.get_task(task["task_id"])["state"] == "leased"


def test_fail_requeues_the_task_for_the_next_lease(harness):
    h = harness()
    h.register("actor0")
    task = h.lease("actor0")
    body = dict(worker_id="actor0", task_id=task["task_id"], lease_id=task["lease_id"], reason="env crashed")
    assert h.post(TASK_FAIL_PATH, body) == {"recorded": True}
    again = h.lease("actor0")
    assert again["task_id"] == task["task_id"] and again["lease_id"] != task["lease_id"]


def test_a_lease_request_sent_again_gets_the_task_its_first_sending_leased(harness):
    """The answer to a lease was lost and the worker sends the request again (same ``request_id``): it gets the same
    task and lease, not a second task that would stay leased to it, unseen, until the lease ran out."""
    h = harness()
    h.register("actor0")
    first_body = {"worker_id": "actor0", "kind": "collect", "request_id": "r1"}
    first = h.post(TASK_LEASE_PATH, first_body)["task"]
    assert h.post(TASK_LEASE_PATH, first_body)["task"] == first
    second_body = dict(first_body, request_id="r2")
    second = h.post(TASK_LEASE_PATH, second_body)["task"]
    assert second["task_id"] != first["task_id"]
    assert h.complete("actor0", second, h.result())
    third = h.post(TASK_LEASE_PATH, second_body)["task"]  # its lease ended: a late copy of r2 leases anew
    assert third["task_id"] not in (first["task_id"], second["task_id"])
    table = h.coordinator.task_table
    assert [table.get_task(t["task_id"])["attempts"] for t in (first, second, third)] == [1, 1, 1]
    assert h.post(TASK_LEASE_PATH, {"worker_id": "actor0", "kind": "collect"})["task"]["task_id"] not in {
        first["task_id"],
        second["task_id"],
        third["task_id"],
    }  # without a request id, every request leases


def test_a_complete_with_lease_next_sent_again_gets_the_same_next_task(harness):
    """Report-and-lease in one round trip whose answer was lost: the retry is accepted again and gets the same next
    task, not a second one."""
    h = harness()
    h.register("actor0")
    task = h.lease("actor0")
    body = dict(worker_id="actor0", task_id=task["task_id"], lease_id=task["lease_id"], result=h.result())
    body.update(lease_next="collect", request_id="r1")
    first = h.post(TASK_COMPLETE_PATH, body)
    again = h.post(TASK_COMPLETE_PATH, body)
    assert first["accepted"] and again == first
    assert len(h.coordinator.task_table.tasks(state="leased", kind="collect")) == 1


def test_a_prefetch_lease_leaves_the_last_waiting_task_to_an_idle_actor(harness):
    h = harness(max_pending_collect=2)
    h.register("actor0")
    h.register("actor1")
    busy = h.lease("actor0")  # two tasks are created, one is left waiting
    ahead = {"worker_id": "actor0", "kind": "collect", "ahead": True}
    assert h.post(TASK_LEASE_PATH, ahead)["task"] is None  # actor0 is busy: the last task is not its
    assert h.lease("actor1") is not None
    prefetched = h.post(TASK_LEASE_PATH, ahead)["task"]  # two new tasks: one may go ahead
    assert prefetched is not None and prefetched["task_id"] != busy["task_id"]
    body = dict(worker_id="actor0", task_id=busy["task_id"], lease_id=busy["lease_id"], result=h.result())
    answer = h.post(TASK_COMPLETE_PATH, dict(body, lease_next="collect", ahead=True))
    assert answer["accepted"] and answer["next"]["task"] is None  # the same rule for report-and-lease


@pytest.mark.parametrize("kind, status", [("dance", 400), ("learn", 400)])  # "learn": the removed kind
def test_a_complete_with_a_bad_lease_next_is_refused_and_records_nothing(harness, kind, status):
    h = harness()
    h.register("actor0")
    task = h.lease("actor0")
    body = dict(worker_id="actor0", task_id=task["task_id"], lease_id=task["lease_id"], result=h.result())
    error = refusal(lambda: h.post(TASK_COMPLETE_PATH, dict(body, lease_next=kind)))
    assert (error.status, error.field) == (status, "lease_next")
    assert h.coordinator.task_table.get_task(task["task_id"])["state"] == "leased"
    answer = h.post(TASK_COMPLETE_PATH, dict(body, lease_next="collect"))
    assert answer["accepted"] and answer["next"]["task"]["task_id"] != task["task_id"]


def test_heartbeat_renews_a_current_lease_and_reports_an_expired_one_stale(harness):
    h = harness(lease_s=30.0)
    h.register("actor0")
    task = h.lease("actor0")
    h.clock.now += 20
    beat = h.post(HEARTBEAT_PATH, {"worker_id": "actor0", "lease_ids": [task["lease_id"]]})
    assert beat == {"renewed": {task["lease_id"]: h.clock.now + 30.0}, "stale": [], "stop": False}
    h.clock.now += 31
    beat = h.post(HEARTBEAT_PATH, {"worker_id": "actor0", "lease_ids": [task["lease_id"]]})
    assert (beat["renewed"], beat["stale"]) == ({}, [task["lease_id"]])


# --------------------------------------------------------------------------- stale leases


def test_a_stale_leases_late_result_is_refused_and_its_file_deleted(harness):
    h = harness(lease_s=30.0)
    h.register("actor0")
    h.register("actor1")
    task = h.lease("actor0")
    h.clock.now += 31
    h.coordinator.tick()  # the lease ran out: the task is pending again, first in line
    retry = h.lease("actor1")
    assert retry["task_id"] == task["task_id"]
    late = h.result()
    assert h.complete("actor0", task, late) is False
    assert not os.path.exists(os.path.join(h.storage.root, late["data"]))
    fresh = h.result()
    assert h.complete("actor1", retry, fresh) is True
    assert h.coordinator.task_table.get_task(task["task_id"])["result"] == fresh
    assert os.path.exists(os.path.join(h.storage.root, fresh["data"]))


def test_a_stale_result_naming_accepted_content_keeps_the_file(harness):
    h = harness(lease_s=30.0)
    h.register("actor0")
    h.register("actor1")
    task = h.lease("actor0")
    h.clock.now += 31
    h.coordinator.tick()
    retry = h.lease("actor1")
    same = h.result(content=b"identical trajectories")
    assert h.complete("actor1", retry, same) is True
    assert h.complete("actor0", task, h.result(content=b"identical trajectories")) is False
    assert h.storage.get(same["data"]) == b"identical trajectories"


# --------------------------------------------------------------------------- back-pressure


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        pytest.param(dict(pending=1, in_flight=1, accepted_env_steps=0), 3, id="queue has room"),
        pytest.param(dict(pending=4, in_flight=4, accepted_env_steps=0), 0, id="queue full"),
        pytest.param(dict(pending=0, in_flight=2, accepted_env_steps=84), 0, id="max_env_step reached in flight"),
        pytest.param(dict(pending=0, in_flight=1, accepted_env_steps=88), 1, id="max_env_step room for one"),
        pytest.param(dict(pending=0, in_flight=0, accepted_env_steps=0, insert_limit=16.0), 3, id="rate: 0, 8, 16"),
        pytest.param(dict(pending=0, in_flight=1, accepted_env_steps=8, insert_limit=16.0), 1, id="rate: at limit"),
        pytest.param(dict(pending=0, in_flight=1, accepted_env_steps=9, insert_limit=16.0), 0, id="rate: past it"),
        pytest.param(dict(pending=0, in_flight=0, accepted_env_steps=0, insert_limit=0.0), 1, id="rate: no deadlock"),
    ],
)
def test_collect_budget(kwargs, expected):
    arguments = dict(max_pending=4, task_env_steps=8, max_env_step=100, insert_limit=None)
    assert collect_budget(**{**arguments, **kwargs}) == expected


def test_samples_per_insert_stops_task_creation_until_the_learner_samples(harness):
    h = harness(learning_starts=16, samples_per_insert=2.0, max_pending_collect=4)
    h.register("actor0")
    h.register("learner0", role="learner")
    tasks = [h.lease("actor0") for _ in range(4)]
    assert [t is not None for t in tasks] == [True, True, True, False]  # projected 0, 8, 16 <= 16; 24 > 16
    for task in tasks[:3]:
        assert h.complete("actor0", task, h.result())
    h.poll(0)
    h.coordinator.tick()
    assert h.lease("actor0") is None  # 24 env steps accepted > 16 + 0 / 2
    h.progress(sampled=16)  # limit 16 + 16 / 2 = 24: room for exactly one more task
    h.coordinator.tick()
    assert h.lease("actor0") is not None
    h.coordinator.tick()
    assert h.lease("actor0") is None  # 24 + 8 in flight > 24


def test_an_answer_without_a_task_names_the_snapshot_the_next_task_would_use(harness):
    """An actor held back by the rate limiter learns the newest snapshot from its empty lease answers (and from the
    report-and-lease answer), so it can load the weights while it waits."""
    h = harness(learning_starts=8, samples_per_insert=2.0, max_pending_collect=4)
    h.register("actor0")
    h.register("learner0", role="learner")
    first, second = h.lease("actor0"), h.lease("actor0")  # projected 0, 8 <= 8
    assert second is not None
    empty = h.post(TASK_LEASE_PATH, {"worker_id": "actor0", "kind": "collect"})
    assert empty.pop("wait_s") >= 0
    assert empty == {"task": None, "stop": False, "snapshot": None, "policy_iter": 0}  # no snapshot yet
    snapshot = h.storage.put(b"weights", "snapshot")
    h.progress(sampled=0, snapshot=snapshot, policy_iter=12)
    empty = h.post(TASK_LEASE_PATH, {"worker_id": "actor0", "kind": "collect"})
    assert (empty["task"], empty["snapshot"], empty["policy_iter"]) == (None, snapshot, 12)
    body = dict(worker_id="actor0", task_id=first["task_id"], lease_id=first["lease_id"], result=h.result())
    answer = h.post(TASK_COMPLETE_PATH, dict(body, lease_next="collect"))
    assert answer["accepted"] and answer["next"]["task"] is None and answer["next"]["snapshot"] == snapshot


def test_a_restarted_learner_with_an_empty_buffer_is_refilled_up_to_learning_starts(harness):
    """After a learner restart its replay buffer is empty: what it sampled before must not hold collection back
    (it could never sample again), but only learning_starts samples are let in before the ratio rules again."""
    h = harness(learning_starts=16, samples_per_insert=2.0, max_pending_collect=4)
    h.register("actor0")
    h.register("learner0", role="learner")
    for task in [h.lease("actor0") for _ in range(3)]:  # 24 env steps accepted
        assert h.complete("actor0", task, h.result())
    h.progress(sampled=0)
    h.coordinator.tick()
    assert h.lease("actor0") is None  # 24 > 16 + 0 / 2
    body = dict(worker_id="learner0", train_iter=1, env_step=24, sampled=0, snapshot=None, policy_iter=0)
    h.post(LEARNER_PROGRESS_PATH, dict(body, buffer_size=0))  # restarted: its buffer is empty
    h.coordinator.tick()
    refill = [h.lease("actor0") for _ in range(4)]
    assert [t is not None for t in refill] == [True, True, True, False]  # 24 + 0, 8, 16 <= 24 + 16; 48 > 40
    h.post(LEARNER_PROGRESS_PATH, dict(body, buffer_size=16))  # refilled (as far as it has read)
    h.coordinator.tick()
    assert h.lease("actor0") is None  # the ratio rules again: 48 in flight > 16 + 0 / 2


def test_max_queued_results_stops_creation_and_a_hard_cap_answers_429(harness):
    h = harness(max_pending_collect=4, max_queued_results=2, hard_queued_results=3)
    h.register("actor0")
    h.register("learner0", role="learner")
    tasks = [h.lease("actor0") for _ in range(4)]
    for task in tasks[:3]:
        assert h.complete("actor0", task, h.result())
    h.coordinator.tick()
    assert h.lease("actor0") is None  # 3 results not polled >= 2: no new task
    body = dict(worker_id="actor0", task_id=tasks[3]["task_id"], lease_id=tasks[3]["lease_id"], result=h.result())
    response = signed_post(h.coordinator.url, TASK_COMPLETE_PATH, body)
    assert response.status_code == 429 and response.headers["Retry-After"] == "1"
    assert h.coordinator.task_table.get_task(tasks[3]["task_id"])["state"] == "leased"
    assert os.path.exists(os.path.join(h.storage.root, body["result"]["data"]))  # the actor keeps it
    assert len(h.poll(0)["items"]) == 3
    assert h.post(TASK_COMPLETE_PATH, body) == {"accepted": True}
    h.coordinator.tick()
    assert h.lease("actor0") is not None


def test_a_full_disk_answers_507_without_losing_an_accepted_result(harness, monkeypatch):
    h = harness(min_free_bytes=1 << 20)
    h.register("actor0")
    first, second = h.lease("actor0"), h.lease("actor0")
    result = h.result()
    assert h.complete("actor0", first, result) is True
    monkeypatch.setattr(backpressure_module, "free_bytes", lambda path: 1000)
    assert h.complete("actor0", first, result) is True  # a retry of an accepted result still says so
    second_result = h.result()
    error = refusal(lambda: h.complete("actor0", second, second_result))
    assert error.status == 507 and "min_free_bytes" in error.message
    assert h.coordinator.task_table.get_task(second["task_id"])["state"] == "leased"
    path = os.path.join(h.storage.root, second_result["data"])
    assert os.path.exists(path)
    os.utime(path, (1.0, 1.0))  # as old as an orphan: the actor has been sending it again for a long time
    assert refusal(lambda: h.complete("actor0", second, second_result)).status == 507
    assert h.storage.age(second_result["data"]) < 60  # each refusal makes the file young again ...
    assert h.coordinator.sweep()["orphans"] == 0 and os.path.exists(path)  # ... so the sweep keeps it
    pending = h.status()["collect"]["pending"]
    h.coordinator.tick()
    assert h.status()["collect"]["pending"] == pending  # no task is created on a full disk
    monkeypatch.undo()
    assert h.complete("actor0", second, second_result) is True


# --------------------------------------------------------------------------- finish, auth, lifecycle


def test_finish_stops_every_worker_and_survives_a_restart(harness, tmp_path):
    h = harness()
    h.register("actor0")
    h.register("learner0", role="learner")
    assert h.post(RUN_FINISH_PATH, {"worker_id": "learner0", "reason": "max_env_step"}) == {"stop": True}
    assert h.post(RUN_FINISH_PATH, {"worker_id": "actor0", "reason": "again"}) == {"stop": True}
    assert h.post(TASK_LEASE_PATH, {"worker_id": "actor0", "kind": "collect"}) == {"task": None, "stop": True}
    assert h.post(HEARTBEAT_PATH, {"worker_id": "actor0", "lease_ids": []})["stop"] is True
    assert h.poll(0)["stop"] is True
    assert h.status()["finished"]["reason"] == "max_env_step"
    h.coordinator.stop()
    again = harness(run_dir=tmp_path / "run")
    assert again.post(TASK_LEASE_PATH, {"worker_id": "actor0", "kind": "collect"}) == {"task": None, "stop": True}


def test_an_unsigned_request_is_401_and_changes_nothing(harness):
    h = harness()
    body = dict(worker_id="intruder", role="actor", protocol=PROTOCOL_VERSION, config_hash=h.coordinator.config_hash)
    response = signed_post(h.coordinator.url, REGISTER_PATH, body, sign=False)
    assert response.status_code == 401
    assert h.status()["workers"] == []


def test_a_second_coordinator_on_the_same_run_dir_is_refused(harness, started, tmp_path):
    harness()
    second = Coordinator(make_cfg(), str(tmp_path / "run"), token=TOKEN)
    started.append(second)
    with pytest.raises(TaskTableError, match="already open by another coordinator"):
        second.start()


def test_binds_loopback_by_default_and_writes_its_url(harness, tmp_path):
    h = harness()
    assert h.coordinator.url.startswith("http://127.0.0.1:")
    assert read_coordinator_url(str(tmp_path / "run")) == h.coordinator.url


def test_config_hash_ignores_addresses_but_not_settings():
    base = config_hash(compile_parallel_config(make_cfg()))
    assert config_hash(compile_parallel_config(make_cfg(host="10.0.0.5", port=4000))) == base
    assert config_hash(compile_parallel_config(make_cfg(lease_s=5.0))) != base


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"lease": 3}, "did you mean 'system.coordinator.lease_s'"),
        ({"lease_s": 10.0, "heartbeat_s": 10.0}, "system.coordinator.heartbeat_s"),
        ({"max_queued_results": 8, "hard_queued_results": 4}, "system.coordinator.hard_queued_results"),
        ({"port": 70000}, "system.coordinator.port"),
    ],
    ids=["typo", "heartbeat not below lease", "hard cap below soft cap", "port out of range"],
)
def test_a_bad_coordinator_section_is_a_config_error(settings, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        compile_parallel_config(make_cfg(**settings))


# --------------------------------------------------------------------------- the real process


def test_help_works():
    out = subprocess.run(
        [sys.executable, "-m", "nervex.system.coordinator_start", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "--config" in out.stdout and "--run-dir" in out.stdout


def _start_process(config: Path, run_dir: Path, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "nervex.system.coordinator_start", "--config", str(config)]
    with open(log, "ab") as out:
        return subprocess.Popen(command + ["--run-dir", str(run_dir)], cwd=REPO_ROOT, stdout=out, stderr=out)


def _wait_for_url(run_dir: Path, process: subprocess.Popen, timeout_s: float = 90.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        url = read_coordinator_url(str(run_dir))
        if url:
            return url
        assert process.poll() is None, f"the coordinator exited with {process.returncode}"
        time.sleep(0.1)
    raise AssertionError(f"no {COORDINATOR_URL_FILE} in {run_dir} after {timeout_s} s")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(timeout=10)


def test_kill_9_and_restart_keeps_the_task_table_and_the_client_reconnects(tmp_path):
    config, run_dir, log = tmp_path / "dist.yaml", tmp_path / "run", tmp_path / "coordinator.out"
    cfg = to_plain(make_cfg())
    cfg["system"] = {"coordinator": {"lease_s": 3.0, "tick_s": 0.1, "min_free_bytes": 0}}
    save_config(cfg, config)
    cfg_hash = config_hash(compile_parallel_config(read_config(config)))
    processes = [_start_process(config, run_dir, log)]
    try:
        url = _wait_for_url(run_dir, processes[0])
        client = Client(url, load_or_create_token(str(run_dir)), deadline_s=90.0, max_retries=1000)
        storage = Storage(str(run_dir / "storage"), min_free_bytes=0)
        for worker_id, role in (("actor0", "actor"), ("learner0", "learner")):
            info = dict(worker_id=worker_id, role=role, protocol=PROTOCOL_VERSION, config_hash=cfg_hash, info={})
            client.post(REGISTER_PATH, info)
        done, leased = [client.post(TASK_LEASE_PATH, {"worker_id": "actor0", "kind": "collect"})["task"] for _ in "ab"]
        result = dict(data=storage.put(b"traj", "traj"), n_samples=8, env_steps=8, episodes=[], policy_iter=0)
        complete = dict(worker_id="actor0", task_id=done["task_id"], lease_id=done["lease_id"], result=result)
        assert client.post(TASK_COMPLETE_PATH, complete) == {"accepted": True}

        second = subprocess.run(
            [sys.executable, "-m", "nervex.system.coordinator_start", "--config", str(config), "--run-dir", run_dir],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2 and "already open by another coordinator" in second.stderr

        processes[0].send_signal(signal.SIGKILL)
        processes[0].wait(timeout=10)
        processes.append(_start_process(config, run_dir, log))
        items = client.post(DATA_POLL_PATH, {"worker_id": "learner0", "since_seq": 0, "limit": 10})["items"]
        assert items == [{"seq": 1, "task_id": done["task_id"], "result": result}]
        assert read_coordinator_url(str(run_dir)) == url  # the same port again: the old client just reconnected

        time.sleep(max(0.0, leased["deadline"] - time.time()) + 0.5)  # the killed lease runs out
        again = client.post(TASK_LEASE_PATH, {"worker_id": "actor0", "kind": "collect"})["task"]
        assert again["task_id"] == leased["task_id"] and again["lease_id"] != leased["lease_id"]
        progress = ("env_step", "train_iter")  # filled in at lease time: the run has moved on since
        assert {k: v for k, v in again["payload"].items() if k not in progress} == {
            k: v for k, v in leased["payload"].items() if k not in progress
        }
        assert again["payload"]["env_step"] == leased["payload"]["env_step"] + N_SAMPLE

        processes[1].send_signal(signal.SIGTERM)
        assert processes[1].wait(timeout=30) == 0
        assert "received SIGTERM" in (run_dir / "logs" / "coordinator.log").read_text()
    finally:
        for process in processes:
            _stop(process)


def test_a_restart_with_another_config_is_refused_naming_both_hashes(harness, started, tmp_path):
    h = harness()
    first_hash = h.coordinator.config_hash
    h.coordinator.stop()
    other = Coordinator(make_cfg(lease_s=5.0), str(tmp_path / "run"), token=TOKEN)
    started.append(other)
    with pytest.raises(CoordinatorError) as info:
        other.start()
    assert first_hash in str(info.value) and other.config_hash in str(info.value)


def test_sweep_deletes_orphaned_samples_and_keeps_accepted_ones(harness):
    h = harness(lease_s=1.0, max_attempts=1)
    h.register("actor0")
    h.register("learner0", role="learner")
    task = h.lease("actor0")
    accepted = h.result(b"accepted samples")
    assert h.complete("actor0", task, accepted)
    storage = h.coordinator.state.storage
    orphan = storage.put(b"written, never reported", "samples")
    fresh = storage.put(b"written a moment ago", "samples")
    kept = storage.put(b"accepted, not read yet", "samples")
    h.coordinator.state.run_state.ingest([{"seq": 99, "task_id": "x", "result": dict(accepted, data=kept)}])
    old = time.time() - 60
    for name in (orphan, kept):
        os.utime(os.path.join(storage.root, *name.split("/")), (old, old))
    assert h.coordinator.sweep() == {"temp": 0, "orphans": 1}
    assert storage.list("samples") == sorted([fresh, kept])
