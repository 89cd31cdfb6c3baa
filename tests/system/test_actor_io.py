"""The actor's I/O process (``nervex.system.actor_io``) against a real coordinator on loopback: what it stores and
reports, the errors it hands back to the actor with their status and field, and its lifetime (it stops retrying when
told to, the actor notices when it is gone, and it does not outlive a killed actor)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator

import numpy as np
import pytest

from nervex.system.actor_io import ActorIO
from nervex.system.comm.client import Client
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.storage import Storage
from nervex.system.coordinator import Coordinator
from nervex.system.protocol import TASK_COMPLETE_PATH, TASK_LEASE_PATH
from nervex.system.role import RoleExit
from nervex.system.samples import decode_samples, encode_samples
from nervex.system.system_config import storage_root

from .test_bad_input import TOKEN, make_cfg, register_body

REPO_ROOT = Path(__file__).resolve().parents[2]
LOGGER = logging.getLogger("test_actor_io")


@pytest.fixture
def coord(tmp_path: Path) -> Iterator[Coordinator]:
    coordinator = Coordinator(make_cfg(), str(tmp_path / "run"), token=TOKEN, logger=LOGGER)
    try:
        yield coordinator.start()
    finally:
        coordinator.stop()


@pytest.fixture
def registered(coord: Coordinator) -> Coordinator:
    """The coordinator, with ``actor0`` registered."""
    with Client(coord.url, TOKEN, deadline_s=10.0) as client:
        client.post("/v1/register", register_body(coord, "actor0"))
    return coord


def _io(coordinator: Any, worker_id: str = "actor0", min_free_bytes: int = 0, url: Any = "coordinator") -> ActorIO:
    cfg = make_cfg()
    storage = Storage(storage_root(coordinator.cfg, coordinator.run_dir), min_free_bytes=min_free_bytes)
    address = coordinator.url if url == "coordinator" else url
    return ActorIO(cfg, str(coordinator.run_dir), worker_id, address, TOKEN, storage, {"index": 0}, LOGGER)


def _samples(n: int) -> list:
    return [
        {"obs": np.full(4, i, np.float32), "action": np.int64(i % 2), "reward": np.ones(1, np.float32), "done": False}
        for i in range(n)
    ]


def _result(n: int) -> Dict[str, Any]:
    return {"data": None, "n_samples": n, "env_steps": n, "episodes": [], "policy_iter": 0, "info": {}}


def _lease(io: ActorIO) -> Dict[str, Any]:
    reply = io.call(TASK_LEASE_PATH, {"kind": "collect"})
    task = reply["answer"]["task"]
    assert task is not None, reply
    return task


def test_a_lease_and_a_report_through_the_io_process(registered):
    """The samples land in storage under the name the coordinator records; the I/O process is another process."""
    coordinator = registered
    io = _io(coordinator)
    try:
        task = _lease(io)
        samples = _samples(8)
        body = {"task_id": task["task_id"], "lease_id": task["lease_id"], "result": _result(8)}
        reply = io.call(TASK_COMPLETE_PATH, body, encode_samples(samples, {"nervex.task_id": task["task_id"]}))
        assert reply["answer"]["accepted"] is True
        assert reply["store_s"] > 0 and reply["call_s"] > 0 and reply["stopping"] is False
        [result] = coordinator.task_table.results("collect", 0, 10)
        name = result["result"]["data"]
        assert name.startswith("samples/")
        storage = Storage(storage_root(coordinator.cfg, coordinator.run_dir), min_free_bytes=0)
        decoded, meta = decode_samples(storage.get(name))
        assert [float(s["obs"][0]) for s in decoded] == list(range(8))
        assert meta["nervex.task_id"] == task["task_id"]
    finally:
        io.close()
    assert not io._process.is_alive()


def test_refusals_reach_the_actor_with_their_status_and_field_and_the_process_goes_on(registered):
    coordinator = registered
    io = _io(coordinator)
    try:
        task = _lease(io)
        forged = {"task_id": "no-such-task", "lease_id": task["lease_id"], "result": _result(2)}
        with pytest.raises(ProtocolError) as info:
            io.call(TASK_COMPLETE_PATH, forged, encode_samples(_samples(2)))
        assert info.value.status == 404 and info.value.field == "task_id", info.value
        with pytest.raises(RuntimeError, match="KeyError"):  # data but no result to name it in: a bug, reported
            io.call(TASK_COMPLETE_PATH, {"task_id": task["task_id"]}, b"bytes")
        body = {"task_id": task["task_id"], "lease_id": task["lease_id"], "result": _result(2)}
        assert io.call(TASK_COMPLETE_PATH, body, encode_samples(_samples(2)))["answer"]["accepted"] is True
    finally:
        io.close()


def test_a_full_disk_is_a_507_naming_data_and_writes_nothing(registered):
    coordinator = registered
    io = _io(coordinator, min_free_bytes=1 << 62)
    root = Path(storage_root(coordinator.cfg, coordinator.run_dir))
    try:
        task = _lease(io)
        body = {"task_id": task["task_id"], "lease_id": task["lease_id"], "result": _result(2)}
        with pytest.raises(ProtocolError) as info:
            io.call(TASK_COMPLETE_PATH, body, encode_samples(_samples(2)))
        assert info.value.status == 507 and info.value.field == "data"
    finally:
        io.close()
    assert not list(root.glob("samples/*"))
    assert coordinator.task_table.results("collect", 0, 10) == []


def test_a_dead_io_process_is_a_worker_exit_naming_it(coord):
    io = _io(coord)
    try:
        os.kill(io.pid, signal.SIGKILL)
        io._process.join(timeout=5)
        with pytest.raises(RoleExit, match=f"I/O process \\(pid {io.pid}\\) is gone"):
            io.call(TASK_LEASE_PATH, {"kind": "collect"})
    finally:
        io.close()


def test_a_call_to_an_unreachable_coordinator_gives_up_once_the_actor_stops(coord):
    """The I/O process retries an unreachable coordinator for reconnect_s (120 s); the actor's stop ends that."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens once the socket is closed
    io = _io(coord, url=dead)
    stop = threading.Event()
    outcome: Dict[str, Any] = {}

    def call() -> None:
        try:
            io.call(TASK_LEASE_PATH, {"kind": "collect"}, stop_requested=stop.is_set)
        except RoleExit as error:
            outcome["error"] = error

    thread = threading.Thread(target=call)
    try:
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive(), "the call should still be retrying"
        stopped = time.monotonic()
        stop.set()
        thread.join(timeout=10)
        assert not thread.is_alive()
        assert time.monotonic() - stopped < 5.0
        assert outcome["error"].code == 0 and "stopping" in str(outcome["error"])
    finally:
        io.close()


KILLED_ACTOR = """
import sys, time
sys.path.insert(0, sys.argv[1])
from tests.system import test_actor_io as t
from tests.system.test_bad_input import make_cfg, TOKEN
from nervex.system.coordinator import Coordinator
coordinator = Coordinator(make_cfg(), sys.argv[2], token=TOKEN).start()
io = t._io(coordinator)
print(io.pid, flush=True)
time.sleep(3600)  # SIGKILLed here
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_the_io_process_dies_with_a_killed_actor(tmp_path):
    parent = subprocess.Popen(
        [sys.executable, "-c", KILLED_ACTOR, str(REPO_ROOT), str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        child = int(parent.stdout.readline())
        os.kill(child, 0)  # alive
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 5.0
        while _alive(child):
            assert time.monotonic() < deadline, f"the I/O process {child} outlived its killed actor"
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.stdout.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie (reaped by init later) is dead
    except FileNotFoundError:
        return False


def test_close_ends_the_io_process_even_while_a_later_fork_holds_the_pipe(coord):
    """Env processes forked after the I/O process (the subprocess env manager forks) inherit the actor's end of the
    pipe, so the I/O process never sees end of file: ``close`` must still end it promptly, not kill it after 5 s."""
    import multiprocessing

    io = _io(coord)
    holder = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,), daemon=True)
    holder.start()
    try:
        start = time.monotonic()
        io.close()
        assert time.monotonic() - start < 2.0
        assert io._process.exitcode == 0  # it returned; a kill would be -9
    finally:
        holder.kill()
        holder.join()
