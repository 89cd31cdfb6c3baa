"""What lets one coordinator serve many actors: a manager's batched heartbeats, the idle actors' poll-rate hint, group
commit, TCP_NODELAY, and task creation and lease reads whose cost does not grow with the queue.

The load itself is measured by ``bench/coordinator_load.py`` (docs/benchmarks.md); these tests check that each piece
does what it promises, against a real coordinator on loopback."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest

from nervex.system.comm.client import Client
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.server import Server
from nervex.system.coordinator.run_state import RunState
from nervex.system.coordinator.task_table import TaskTable
from nervex.system.heartbeat_batch import HeartbeatBatch
from nervex.system.protocol import (
    HEARTBEAT_PATH,
    HEARTBEATS_PATH,
    MAX_BEATS,
    RUN_FINISH_PATH,
    TASK_COMPLETE_PATH,
    TASK_LEASE_PATH,
)
from nervex.utils import sqlite as sqlite_module
from nervex.utils.sqlite import Database
from tests.system.test_coordinator import TOKEN, FakeClock, Harness, make_cfg, refusal


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    """test_coordinator's in-process coordinator with a client; every one made is stopped at the end."""
    made: List[Any] = []
    yield lambda **coordinator: Harness(tmp_path / "run", FakeClock(), made, **coordinator)
    for coordinator in made:
        coordinator.stop()


def beats_of(h: Any, sender: str, beats: List[Dict[str, Any]]) -> Dict[str, Any]:
    return h.post(HEARTBEATS_PATH, {"worker_id": sender, "beats": beats})


# --------------------------------------------------------------------------- /v1/heartbeats


def test_a_managers_batch_renews_each_actors_leases_and_refuses_beats_one_by_one(harness):
    h = harness(lease_s=10.0)
    for worker_id, role in (("manager0", "manager"), ("actor0", "actor"), ("actor1", "actor"), ("actor2", "actor")):
        h.register(worker_id, role=role)
    tasks = {a: h.lease(a) for a in ("actor0", "actor1", "actor2")}
    h.clock.now += 4.0
    answer = beats_of(
        h,
        "manager0",
        [
            {"worker_id": "actor0", "lease_ids": [tasks["actor0"]["lease_id"]]},
            {"worker_id": "actor1", "lease_ids": [tasks["actor1"]["lease_id"], tasks["actor2"]["lease_id"]]},
            {"worker_id": "ghost", "lease_ids": []},
            {"worker_id": "actor2"},
        ],
    )
    beats = answer["beats"]
    assert answer["stop"] is False
    assert beats["actor0"] == {"renewed": {tasks["actor0"]["lease_id"]: h.clock.now + 10.0}, "stale": []}
    assert (beats["actor1"]["status"], beats["actor1"]["field"]) == (403, "lease_id")  # actor2's lease
    assert (beats["ghost"]["status"], beats["ghost"]["field"]) == (404, "worker_id")
    assert beats["actor2"] == {"renewed": {}, "stale": []}
    table = h.coordinator.task_table
    assert table.get_task(tasks["actor0"]["task_id"])["deadline"] == h.clock.now + 10.0
    # the refused beat changed nothing, not even the lease it was allowed to renew
    assert table.get_task(tasks["actor1"]["task_id"])["deadline"] == tasks["actor1"]["deadline"]
    seen = {w["worker_id"]: w["last_seen"] for w in h.status()["workers"]}
    assert seen["actor0"] == seen["manager0"] == seen["actor2"] == h.clock.now
    assert seen["actor1"] < h.clock.now


def test_only_a_manager_sends_a_batch_and_a_batch_is_bounded(harness):
    h = harness()
    h.register("manager0", role="manager")
    h.register("actor0")
    assert refusal(lambda: beats_of(h, "actor0", [])).status == 403
    too_many = [{"worker_id": f"a{i}"} for i in range(MAX_BEATS + 1)]
    error = refusal(lambda: beats_of(h, "manager0", too_many))
    assert (error.status, error.field) == (400, "beats")
    error = refusal(lambda: beats_of(h, "manager0", [{"worker_id": "actor0", "lease": []}]))
    assert (error.status, error.field) == (400, "beats[0].lease")


@pytest.fixture
def relay(harness) -> Iterator[Any]:
    from nervex.system.manager import ManagerRole

    h = harness(lease_s=10.0)
    manager = ManagerRole(
        make_cfg(lease_s=10.0), str(h.run_dir), "manager0", [], actors=0, url=h.coordinator.url, token=TOKEN,
        logger=logging.getLogger("test_scale.manager"),
    )  # fmt: skip
    manager.server.start()
    manager.link.register()
    client = Client(manager.url, TOKEN, deadline_s=10.0)
    try:
        yield h, manager, client
    finally:
        client.close()
        manager.server.stop()
        manager.link.close()


def test_the_relay_answers_heartbeats_at_once_and_sends_them_as_one_request(relay):
    h, manager, client = relay
    actors = [f"actor{i}" for i in range(5)]
    for actor in actors:
        h.register(actor)
    tasks = {a: h.lease(a) for a in actors}
    h.clock.now += 3.0
    for actor in actors:  # the first beat of each: nothing known yet
        answer = client.post(HEARTBEAT_PATH, {"worker_id": actor, "lease_ids": [tasks[actor]["lease_id"]]})
        assert answer == {"renewed": {}, "stale": [], "stop": False}
    assert all(h.coordinator.task_table.get_task(t["task_id"])["deadline"] == t["deadline"] for t in tasks.values())
    relayed = manager.relayed
    assert manager.heartbeats.flush() == 5
    assert manager.relayed == relayed + 1  # five actors, one request upstream
    for actor in actors:
        assert h.coordinator.task_table.get_task(tasks[actor]["task_id"])["deadline"] == h.clock.now + 10.0
        answer = client.post(HEARTBEAT_PATH, {"worker_id": actor, "lease_ids": [tasks[actor]["lease_id"]]})
        assert answer == {"renewed": {tasks[actor]["lease_id"]: h.clock.now + 10.0}, "stale": [], "stop": False}
    assert manager.heartbeats.flush() == 5 and manager.heartbeats.flush() == 0  # nothing new: nothing sent


def test_the_relay_passes_a_refusal_of_an_actors_beat_to_that_actor_only(relay):
    h, manager, client = relay
    h.register("actor0")
    client.post(HEARTBEAT_PATH, {"worker_id": "actor0", "lease_ids": []})
    client.post(HEARTBEAT_PATH, {"worker_id": "never-registered", "lease_ids": []})
    manager.heartbeats.flush()
    assert client.post(HEARTBEAT_PATH, {"worker_id": "actor0", "lease_ids": []})["stop"] is False
    error = refusal(lambda: client.post(HEARTBEAT_PATH, {"worker_id": "never-registered", "lease_ids": []}))
    assert (error.status, error.field) == (404, "worker_id")  # a RoleLink registers again on this
    error = refusal(lambda: client.post(HEARTBEAT_PATH, {"worker_id": "actor0", "leases": []}))
    assert (error.status, error.field) == (400, "leases")  # malformed: refused at once, not queued


def test_a_batch_that_cannot_be_delivered_is_kept_for_the_next_flush():
    sent: List[Dict[str, Any]] = []
    reachable = False

    def post(path: str, body: Dict[str, Any]) -> Dict[str, Any]:
        if not reachable:
            raise ProtocolError(503, "coordinator unreachable")
        sent.append(body)
        return {"beats": {b["worker_id"]: {"renewed": {}, "stale": []} for b in body["beats"]}, "stop": True}

    batch = HeartbeatBatch("manager0", post)
    batch.beat({"worker_id": "a", "lease_ids": ["old"]})
    batch.beat({"worker_id": "b", "lease_ids": ["b1"]})
    assert batch.flush() == 0
    batch.beat({"worker_id": "a", "lease_ids": ["new"]})  # newer than what the failed flush held
    reachable = True
    assert batch.flush() == 2
    assert sent[0]["beats"] == [{"worker_id": "a", "lease_ids": ["new"]}, {"worker_id": "b", "lease_ids": ["b1"]}]
    assert batch.beat({"worker_id": "a", "lease_ids": []})["stop"] is True


# --------------------------------------------------------------------------- the idle actors' poll rate


def test_an_empty_lease_asks_each_idle_actor_to_wait_so_all_poll_at_idle_polls_per_s(harness):
    h = harness(idle_polls_per_s=100.0, lease_s=10.0, learning_starts=8, samples_per_insert=2.0)
    actors = [f"actor{i}" for i in range(250)]
    for actor in actors:
        h.register(actor)
    h.register("learner0", role="learner")
    h.coordinator.tick()
    assert h.lease("actor0") is not None and h.lease("actor0") is not None  # the rate limiter allows two
    empty = h.post(TASK_LEASE_PATH, {"worker_id": "actor1", "kind": "collect"})
    assert empty["task"] is None and empty["wait_s"] == pytest.approx(250 / 100.0)
    h.clock.now += 11.0  # all but the one that asks again are silent longer than a lease: no longer live
    assert h.lease("actor0") is None
    h.coordinator.tick()  # (which also re-queues actor0's two expired leases: leased again here)
    assert h.lease("actor0") is not None and h.lease("actor0") is not None
    assert h.post(TASK_LEASE_PATH, {"worker_id": "actor0", "kind": "collect"})["wait_s"] == pytest.approx(0.01)


# --------------------------------------------------------------------------- group commit


def test_a_route_answers_only_after_its_changes_are_flushed(harness):
    h = harness()
    h.register("actor0")
    task = h.lease("actor0")
    h.complete("actor0", task, h.result())
    table, state = h.coordinator.task_table.db, h.coordinator.state.run_state._db
    assert table.group_commit and table.unsynced == 0 and state.unsynced == 0
    (mode,) = table.connection().execute("PRAGMA synchronous").fetchone()
    assert mode == 1  # NORMAL: COMMIT writes the WAL, the route's sync() flushes it


def test_callers_waiting_on_a_flush_share_the_next_one(tmp_path: Path, monkeypatch):
    db = Database(str(tmp_path / "g.sqlite"), group_commit=True)
    db.script("CREATE TABLE t (x INTEGER)")
    db.sync()
    flushes: List[int] = []
    real_fsync = sqlite_module.os.fsync
    monkeypatch.setattr(sqlite_module.os, "fsync", lambda fd: (flushes.append(fd), real_fsync(fd))[1])
    committed = threading.Barrier(9)

    def writer(i: int) -> None:
        with db.transaction() as conn:
            conn.execute("INSERT INTO t VALUES (?)", (i,))
        committed.wait()
        db.sync()

    with db._sync_lock:  # a flush in progress: every writer commits, then waits for it
        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        committed.wait()
    for thread in threads:
        thread.join()
    assert len(flushes) == 1 and db.unsynced == 0  # eight commits, one fsync
    assert db.one("SELECT COUNT(*) FROM t") == 8
    db.close()
    plain = Database(str(tmp_path / "p.sqlite"))
    assert plain.unsynced == 0 and plain.connection().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    plain.close()


# --------------------------------------------------------------------------- the connection, the table


def test_answers_are_sent_without_nagle_delay():
    server = Server("nodelay", TOKEN, host="127.0.0.1", port=0)
    server.route("/v1/x", ["POST"], lambda body: {})
    server.start()
    try:
        with Client(server.url, TOKEN) as client:
            client.post("/v1/x", {})
            channels = list(server._server.active_channels.values())
            assert channels
            for channel in channels:
                assert channel.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        server.stop()


def test_tasks_are_added_all_or_none_and_a_lease_counts_no_further_than_it_needs(tmp_path: Path):
    with TaskTable(str(tmp_path / "t.sqlite")) as table:
        table.add_task("collect", {"i": 0}, task_id="t0")
        with pytest.raises(ProtocolError) as info:
            table.add_tasks("collect", [("t1", {"i": 1}), ("t0", {"i": "other"}), ("t2", {"i": 2})])
        assert info.value.status == 409 and table.count() == 1
        assert table.add_tasks("collect", [("t1", {"i": 1}), ("t0", {"i": 0}), (None, {"i": 2})])[:2] == ["t1", "t0"]
        assert table.pending_count("collect") == 3 and table.pending_count("collect", at_most=2) == 2


def test_run_state_reads_come_from_its_cache_as_fresh_copies(tmp_path: Path):
    state = RunState(str(tmp_path / "s.sqlite"))
    assert state.get("learner") is None and state.get("learner", {}) == {}
    state.put("learner", {"sampled": 5})
    state.get("learner")["sampled"] = 99  # a caller's change is not the stored value
    assert state.get("learner") == {"sampled": 5}
    assert state.put_default("learner", {"sampled": 0}) == {"sampled": 5}
    assert state.put_default("run_id", "abc") == "abc"
    state.close()
    again = RunState(str(tmp_path / "s.sqlite"))
    assert (again.get("learner"), again.get("run_id")) == ({"sampled": 5}, "abc")
    again.close()


def test_the_finished_run_is_written_down_before_anyone_is_told_to_stop(harness, tmp_path: Path):
    """run_slurm.sh starts a step that ended with 0 again unless run_finished.json exists: it must exist by the time
    any answer says stop, and a coordinator restarted on a finished run whose file was lost writes it again."""
    h = harness()
    h.register("learner0", role="learner")
    path = tmp_path / "run" / "run_finished.json"
    assert not path.exists()
    assert h.post(RUN_FINISH_PATH, {"worker_id": "learner0", "reason": "max_env_step"}) == {"stop": True}
    assert json.loads(path.read_text())["reason"] == "max_env_step"
    h.coordinator.stop()
    path.unlink()
    harness()
    assert json.loads(path.read_text())["worker_id"] == "learner0"


# --------------------------------------------------------------------------- overload


def test_a_server_reports_the_requests_waiting_for_a_thread():
    release = threading.Event()
    server = Server("slow", TOKEN, host="127.0.0.1", port=0, threads=1)
    server.route("/v1/x", ["POST"], lambda body: (release.wait(10), {})[1])
    server.start()
    try:
        assert server.waiting_requests() == 0
        clients = [Client(server.url, TOKEN, deadline_s=20.0) for _ in range(4)]
        callers = [threading.Thread(target=client.post, args=("/v1/x", {})) for client in clients]
        for caller in callers:
            caller.start()
        deadline = time.monotonic() + 10
        while server.waiting_requests() < 3:  # one in the only thread, three waiting
            assert time.monotonic() < deadline, server.waiting_requests()
            time.sleep(0.01)
        release.set()
        for caller in callers:
            caller.join(timeout=10)
        assert server.waiting_requests() == 0
        for client in clients:
            client.close()
    finally:
        release.set()
        server.stop()


def test_an_overloaded_coordinator_sheds_leases_but_takes_reports(harness):
    h = harness(shed_backlog=64)
    h.register("actor0")
    task = h.lease("actor0")
    routes = h.coordinator.routes
    routes.backlog = lambda: 100  # 100 requests waiting for a thread
    shed = h.post(TASK_LEASE_PATH, {"worker_id": "actor0", "kind": "collect"})
    assert shed["task"] is None and shed["wait_s"] == pytest.approx(10.0) and routes.shed == 1  # 100 x 0.1 s
    body = dict(worker_id="actor0", task_id=task["task_id"], lease_id=task["lease_id"], result=h.result())
    answer = h.post(TASK_COMPLETE_PATH, dict(body, lease_next="collect"))
    assert answer["accepted"] is True and answer["next"]["task"] is None  # the report is taken, no new work given
    assert h.status()["collect"]["pending"] >= 1  # the tasks wait for the backlog to drain
    routes.backlog = lambda: 64
    assert h.lease("actor0") is not None
