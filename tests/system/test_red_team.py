"""The red-team pass's findings (issue 31): each test failed on the main of 2026-11-28 and pins its fix.

A signed request whose numbers no task can hold, a result naming no file, strings and nestings JSON allows but no
handler can store, idle or trickling connections, refused requests in a loop: each is refused or cut with a clear
reason, and the run goes on (leases, ticks, a restarted coordinator). Everything is real: the coordinator on
127.0.0.1, its SQLite files, sockets.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import pytest
import requests
import torch

from nervex.system.comm.auth import sign_request
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.server import MAX_JSON_DEPTH, ConnectionLimits, RateLimitedLog, Server
from nervex.system.coordinator import Coordinator
from nervex.system.protocol import (
    DATA_POLL_PATH,
    LEARNER_PROGRESS_PATH,
    REGISTER_PATH,
    STATUS_PATH,
    TASK_COMPLETE_PATH,
)

from .test_coordinator import N_SAMPLE, TOKEN, FakeClock, Harness, refusal, signed_post


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    """Makes coordinators with a client (``test_coordinator.Harness``); each is stopped at the test's end."""
    made: List[Coordinator] = []

    def make(run_dir: Optional[Path] = None, **coordinator: Any) -> Harness:
        return Harness(run_dir or tmp_path / "run", FakeClock(), made, **coordinator)

    yield make
    for coordinator in made:
        coordinator.stop()


def _complete_body(task: Dict[str, Any], result: Dict[str, Any], worker_id: str = "actor0") -> Dict[str, Any]:
    return dict(worker_id=worker_id, task_id=task["task_id"], lease_id=task["lease_id"], result=result)


def _runs_on(h: Any) -> None:
    """The run is not jammed: a tick passes, a task is leased, completed and counted, the status answers."""
    h.coordinator.tick()
    task = h.lease("actor0")
    assert task is not None
    before = h.status()["env_steps_accepted"]
    assert h.complete("actor0", task, h.result()) is True
    assert h.status()["env_steps_accepted"] == before + N_SAMPLE
    h.coordinator.tick()


# --------------------------------------------------------------------------- numbers no task can hold


@pytest.mark.parametrize("env_steps", [2**63, 2**62, 10**400])
def test_a_result_with_an_absurd_env_step_count_is_400_and_the_run_goes_on(harness, env_steps):
    h = harness(max_pending_collect=2)
    h.register("actor0")
    task = h.lease("actor0")
    result = dict(h.result(), env_steps=env_steps)
    error = refusal(lambda: h.post(TASK_COMPLETE_PATH, _complete_body(task, result)))
    assert (error.status, error.field) == (400, "result.env_steps"), error.message
    assert h.coordinator.task_table.get_task(task["task_id"])["state"] == "leased"  # still the worker's
    assert h.status()["env_steps_accepted"] == 0
    assert h.complete("actor0", task, h.result()) is True  # the honest result of the same lease is accepted
    _runs_on(h)


def test_a_result_with_more_env_steps_than_its_task_can_take_is_400_naming_the_bound(harness):
    h = harness(max_pending_collect=2)
    h.register("actor0")
    task = h.lease("actor0")
    envs = int(h.coordinator.cfg.env.collector_env_num)
    bound = N_SAMPLE + envs - 1  # unit 'sample': n steps, the last round of the envs may overshoot by envs - 1
    assert h.complete("actor0", task, dict(h.result(), env_steps=bound)) is True
    task = h.lease("actor0")
    error = refusal(lambda: h.complete("actor0", task, dict(h.result(), env_steps=bound + 1)))
    assert (error.status, error.field) == (400, "result.env_steps")
    assert f"{N_SAMPLE} samples over {envs} envs" in error.message
    assert h.status()["env_steps_accepted"] == bound


def test_a_result_naming_a_file_that_does_not_exist_is_400_and_counts_nothing(harness):
    h = harness(max_pending_collect=2)
    h.register("actor0")
    task = h.lease("actor0")
    result = h.result()
    h.storage.delete(result["data"])
    error = refusal(lambda: h.complete("actor0", task, result))
    assert (error.status, error.field) == (400, "result.data") and "not in the storage" in error.message
    assert h.status()["env_steps_accepted"] == 0
    assert h.coordinator.task_table.results("collect", 0, 10) == []
    _runs_on(h)


@pytest.mark.parametrize("field", ["sampled", "train_iter", "env_step", "policy_iter", "buffer_size"])
def test_a_progress_report_with_an_absurd_count_is_400_and_the_rate_limiter_goes_on(harness, field):
    h = harness(max_pending_collect=2, samples_per_insert=2.0)
    h.register("learner0", role="learner")
    h.register("actor0")
    body = dict(worker_id="learner0", train_iter=1, env_step=0, sampled=0, snapshot=None, policy_iter=0)
    for value in (10**400, 2**63):
        error = refusal(lambda value=value: h.post(LEARNER_PROGRESS_PATH, dict(body, **{field: value})))
        assert (error.status, error.field) == (400, field), error.message
    assert "2**53 - 1" in error.message
    h.progress(sampled=0)
    _runs_on(h)


def test_since_seq_past_64_bits_is_400_not_500(harness):
    h = harness()
    h.register("learner0", role="learner")
    error = refusal(lambda: h.post(DATA_POLL_PATH, {"worker_id": "learner0", "since_seq": 2**63, "limit": 10}))
    assert (error.status, error.field) == (400, "since_seq")
    assert h.poll(0)["items"] == []


def test_a_lone_surrogate_is_400_naming_the_field_and_registers_nobody(harness):
    h = harness()
    response = signed_post(h.coordinator.url, REGISTER_PATH, {"worker_id": "actor\ud800", "role": "actor"})
    assert response.status_code == 400, response.text
    assert response.json()["field"] == "worker_id"
    response = signed_post(h.coordinator.url, REGISTER_PATH, {"worker_id": "a", "role": "actor", "info": {"\udc00": 1}})
    assert (response.status_code, response.json()["field"]) == (400, "info")
    assert h.status()["workers"] == []


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 975])
def test_json_nested_deeper_than_the_protocol_is_400_not_500(harness, depth):
    h = harness()
    info = '{"x":' * depth + "1" + "}" * depth  # by hand: json.dumps itself recurses too deep at 975
    body = ('{"worker_id": "deep", "role": "actor", "info": ' + info + "}").encode()
    headers = {"Content-Type": "application/json", **sign_request(TOKEN, "POST", REGISTER_PATH, body)}
    response = requests.post(h.coordinator.url + REGISTER_PATH, data=body, headers=headers, timeout=10)
    assert response.status_code == 400, response.text
    assert "nested deeper" in response.json()["error"]
    assert h.status()["workers"] == []


# --------------------------------------------------------------------------- a bad row stored by an older version


def test_a_stored_row_that_cannot_be_counted_fails_no_tick_and_no_restart(harness, tmp_path, caplog):
    """A database an older nervex wrote with an unbounded count (2**63 env steps): the pass that indexes it logs the
    row and counts it as 0, every later tick passes, and the coordinator restarts on the run directory."""
    run_dir = tmp_path / "run"
    h = harness(run_dir=run_dir, max_pending_collect=2)
    h.register("actor0")
    task = h.lease("actor0")
    forged = dict(h.result(), env_steps=2**63)
    assert h.coordinator.task_table.complete(task["task_id"], task["lease_id"], forged)  # as the old routes did
    with caplog.at_level(logging.ERROR):
        h.coordinator.tick()
    assert "cannot be counted (seq 1)" in caplog.text
    assert h.status()["env_steps_accepted"] == 0
    _runs_on(h)
    h.coordinator.stop()
    again = Coordinator(h.coordinator.cfg, str(run_dir), token=TOKEN).start()
    try:
        again.tick()
        assert again.state.run_state.env_steps == N_SAMPLE
    finally:
        again.stop()


# --------------------------------------------------------------------------- connections


PEER = ("127.0.0.2", 0)  # another loopback address: another peer


def _server(limits: ConnectionLimits, logger: logging.Logger) -> Server:
    server = Server("guarded", TOKEN, limits=limits, logger=logger)
    server.route(STATUS_PATH, ["POST"], lambda body: {"ok": True})
    return server.start()


def _healthy(url: str) -> bool:
    return signed_post(url, STATUS_PATH, {}).status_code == 200


def test_idle_unauthenticated_connections_cannot_lock_a_server_out(caplog):
    """150 idle connections from one peer (127.0.0.2; waitress's default limit is 100 in all): the per-peer cap
    closes those over it, a worker (127.0.0.1) still gets in, and the idle ones are closed after ``idle_s``."""
    limits = ConnectionLimits(connections=200, per_peer=100, idle_s=2.0, request_s=2.0)
    logger = logging.getLogger("test_red_team.idle")
    server = _server(limits, logger)
    idle: List[socket.socket] = []
    try:
        with caplog.at_level(logging.WARNING, logger="test_red_team.idle"):
            for _ in range(150):
                idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=PEER))
            time.sleep(0.5)
            assert _healthy(server.url)  # the cap refused the 50 over it, not this worker's connection
        assert "the per-peer limit" in caplog.text
        time.sleep(limits.idle_s + 2.5)
        closed = 0
        for sock in idle:
            sock.settimeout(0.5)
            try:
                closed += sock.recv(1) == b""
            except (TimeoutError, ConnectionResetError):
                closed += 1
        assert closed == len(idle)
        assert _healthy(server.url)
    finally:
        for sock in idle:
            sock.close()
        server.stop()


def test_a_request_trickled_a_byte_at_a_time_is_cut_after_request_s(caplog):
    limits = ConnectionLimits(connections=50, per_peer=50, idle_s=30.0, request_s=1.5)
    logger = logging.getLogger("test_red_team.slow")
    server = _server(limits, logger)
    try:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        started_at = time.monotonic()
        cut = False
        with caplog.at_level(logging.WARNING, logger="test_red_team.slow"):
            for byte in b"POST /v1/status HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200:
                try:
                    sock.sendall(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError):
                    cut = True
                    break
                time.sleep(0.1)  # never idle for idle_s, never whole
        elapsed = time.monotonic() - started_at
        sock.close()
        assert cut and elapsed < limits.request_s + 4.0, elapsed
        assert "a request not whole within 1.5 s" in caplog.text
        assert _healthy(server.url)
    finally:
        server.stop()


def test_refused_requests_in_a_loop_log_a_burst_then_one_summary(caplog):
    logger = logging.getLogger("test_red_team.log")
    log = RateLimitedLog(logger, burst=3, window_s=0.5)
    with caplog.at_level(logging.WARNING, logger="test_red_team.log"):
        logged = [log.warning("refused %d", i) for i in range(100)]
        assert logged == [True] * 3 + [False] * 97
        time.sleep(0.6)
        assert log.warning("refused again")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "refused 0",
        "refused 1",
        "refused 2",
        "refused again (97 similar line(s) not logged in the last 0.5 s)",
    ]


def test_a_server_refusing_unsigned_requests_in_a_loop_logs_a_bounded_number_of_lines(harness, caplog):
    h = harness()
    url = h.coordinator.url + STATUS_PATH
    with caplog.at_level(logging.WARNING):
        for _ in range(60):
            assert requests.post(url, data=json.dumps({}), timeout=5).status_code == 401
    refused = [r for r in caplog.records if "refused POST /v1/status" in r.getMessage()]
    assert len(refused) <= 10, len(refused)


def test_protocol_errors_still_name_their_field():
    """The JSON checks raise the route's usual ``ProtocolError`` (a 400 with a field), nothing else."""
    from nervex.system.comm.server import check_json_values

    with pytest.raises(ProtocolError) as info:
        check_json_values({"a": [1, {"b": 2**60}]})
    assert (info.value.status, info.value.field) == (400, "a[1].b")
    check_json_values({"a": [1, {"b": 2**53 - 1}], "s": "ok"})


# --------------------------------------------------------------------------- storage


def test_the_sweep_never_deletes_through_a_symlinked_kind_directory(tmp_path):
    """A ``samples`` (or any kind) directory that is a symbolic link out of the root: the sweep, ``delete`` and the
    temporary-file collection leave what it points to alone; a read or write through it is a 400 naming why."""
    from nervex.system.comm.storage import TEMP_PREFIX, Storage

    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / ("ab" * 32 + ".safetensors")
    victim.write_bytes(b"not nervex's")
    old_temp = outside / f"{TEMP_PREFIX}123-x"
    old_temp.write_bytes(b"")
    os.utime(old_temp, (0, 0))
    os.utime(victim, (0, 0))
    storage = Storage(str(tmp_path / "root"), min_free_bytes=0)
    (tmp_path / "root" / "samples").symlink_to(outside, target_is_directory=True)
    name = "samples/" + victim.name
    assert storage.list("samples") == []
    assert storage.age(name) is None
    storage.delete(name)
    storage.touch(name)
    assert storage.collect_temp(max_age_s=1.0) == 0
    assert victim.exists() and old_temp.exists()
    for call in (lambda: storage.get(name), lambda: storage.put(b"data", "samples")):
        with pytest.raises(ProtocolError) as info:
            call()
        assert info.value.status == 400 and "symbolic link" in info.value.message
    assert sorted(p.name for p in outside.iterdir()) == sorted([victim.name, old_temp.name])


def test_the_coordinators_sweep_leaves_a_symlinked_samples_directory_alone(harness, tmp_path):
    h = harness(max_pending_collect=2, lease_s=0.01)
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / ("cd" * 32 + ".safetensors")
    victim.write_bytes(b"keep me")
    os.utime(victim, (0, 0))
    link = Path(h.storage.root) / "samples"
    if link.exists():
        os.rmdir(link)
    link.symlink_to(outside, target_is_directory=True)
    assert h.coordinator.state.sweep() == {"temp": 0, "orphans": 0}
    assert victim.exists()


# --------------------------------------------------------------------------- replay after a restart


def test_a_request_captured_before_a_restart_cannot_be_replayed_after_it(harness, tmp_path):
    """The finding: a captured progress report (train_iter 10) replayed once the coordinator restarted rolled the
    learner's reported train_iter back from 5000 to 10. Now the restarted server refuses anything stamped before it
    started (503: an honest client signs again)."""
    run_dir = tmp_path / "run"
    h = harness(run_dir=run_dir)
    h.register("learner0", role="learner")
    body = dict(worker_id="learner0", train_iter=10, env_step=0, sampled=0, snapshot=None, policy_iter=0)
    data = json.dumps(body).encode()
    captured = {"Content-Type": "application/json", **sign_request(TOKEN, "POST", LEARNER_PROGRESS_PATH, data)}
    assert requests.post(h.coordinator.url + LEARNER_PROGRESS_PATH, data=data, headers=captured).status_code == 200
    h.post(LEARNER_PROGRESS_PATH, dict(body, train_iter=5000))
    url = h.coordinator.url
    h.coordinator.stop()
    again = Coordinator(h.coordinator.cfg, str(run_dir), token=TOKEN).start()
    try:
        assert again.url == url  # the same address: the captured request reaches the restarted server
        replay = requests.post(url + LEARNER_PROGRESS_PATH, data=data, headers=captured, timeout=10)
        assert replay.status_code == 503, replay.text
        assert again.learner_progress()["train_iter"] == 5000
        assert signed_post(url, LEARNER_PROGRESS_PATH, dict(body, train_iter=5001)).status_code == 200
        assert again.learner_progress()["train_iter"] == 5001
    finally:
        again.stop()


# --------------------------------------------------------------------------- the learner and well-formed bad samples


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Any]:
    """A coordinator and a learner on cartpole_dqn.yaml (``test_bad_input.make_cfg``), with helpers to post files."""
    from nervex.system.comm.client import Client
    from nervex.system.comm.storage import Storage
    from nervex.system.learner import LearnerRole
    from nervex.system.system_config import storage_root

    from .test_bad_input import make_cfg, register_body

    run_dir = tmp_path / "run"
    coordinator = Coordinator(make_cfg(), str(run_dir), token=TOKEN).start()
    client = Client(coordinator.url, TOKEN, deadline_s=10.0)
    learner = None
    try:
        learner = LearnerRole(
            make_cfg(), str(run_dir), "learner0", url=coordinator.url, token=TOKEN,
            logger=logging.getLogger("test_red_team.learner"),
        )  # fmt: skip
        storage = Storage(storage_root(coordinator.cfg, str(run_dir)), min_free_bytes=0)
        client.post(REGISTER_PATH, register_body(coordinator, "actor0"))

        def post(samples: List[Dict[str, Any]]) -> str:
            from nervex.system.protocol import TASK_LEASE_PATH
            from nervex.system.samples import encode_samples

            coordinator.tick()
            task = client.post(TASK_LEASE_PATH, {"worker_id": "actor0", "kind": "collect"})["task"]
            data = storage.put(encode_samples(samples), "samples")
            result = dict(data=data, n_samples=len(samples), env_steps=len(samples), episodes=[], policy_iter=0)
            assert client.post(TASK_COMPLETE_PATH, _complete_body(task, result))["accepted"]
            return task["task_id"]

        yield SimpleNamespace(coordinator=coordinator, learner=learner, storage=storage, post=post, run_dir=run_dir)
    finally:
        if learner is not None:
            learner.close()
        client.close()
        coordinator.stop()


def _good(n: int = 8, reward: float = 1.0) -> List[Dict[str, Any]]:
    from .test_bad_input import _sample

    return [_sample(i, reward) for i in range(n)]


@pytest.mark.parametrize(
    "case, change, field",
    [
        ("an action CartPole does not have", {"action": np.int64(7)}, "action"),
        (
            "a finite but huge observation in an unbounded dimension",
            {"obs": np.array([0, 1e32, 0, 0], np.float32)},
            "obs",
        ),
        ("an observation outside the declared bounds", {"next_obs": np.array([9.0, 0, 0, 0], np.float32)}, "next_obs"),
        ("a huge reward", {"reward": np.float32(1e30)}, "reward"),
        ("an observation of another shape", {"obs": np.zeros(5, np.float32)}, "obs"),
    ],
)
def test_samples_that_do_not_fit_the_envs_spaces_are_skipped_even_as_the_first_file(live, caplog, case, change, field):
    """The findings: ``action = 7`` on CartPole ended a live run (index error); 1e32 observations turned the weights
    NaN; the first file fixed the buffer's layout, so a bad first file got every real file refused. Each file is now
    checked against the env's declared spaces before it reaches the buffer: the bad one is skipped (counted, its
    field named), the good ones after it are stored."""
    bad = _good()
    if case == "an observation of another shape":  # a file holds one shape per field: all of them
        bad = [{**sample, **change} for sample in bad]
    else:
        bad[3] = {**bad[3], **change}
    with caplog.at_level(logging.WARNING, logger="test_red_team.learner"):
        bad_task = live.post(bad)  # the first file the learner ever sees
        live.post(_good(reward=10.0))
        assert live.learner.step() is True
    assert live.learner.counters["bad_data"] == 1 and live.learner.counters["results"] == 1, case
    assert len(live.learner.buffer) == 8
    line = next(r.getMessage() for r in caplog.records if bad_task in r.getMessage())
    assert f"field '{field}'" in line and ("sample 3" in line or "per sample does not end with" in line), line
    assert live.learner.step() is False  # and it goes on


def test_weights_turned_non_finite_roll_back_to_the_newest_checkpoint_and_are_never_checkpointed(live, caplog):
    learner = live.learner
    first = learner.save_checkpoint("periodic")
    assert first is not None
    good = {k: v.clone() for k, v in learner.policy.state_dict()["model"].items()}
    learner.learner.last_iter += 5
    with torch.no_grad():
        next(learner.policy._model.parameters()).fill_(float("nan"))  # what a diverging step leaves
    with caplog.at_level(logging.ERROR, logger="test_red_team.learner"):
        assert learner.save_checkpoint("periodic") is None
        assert "the weights are not finite" in caplog.text
        live.post(_good())
        assert learner.step() is True
    assert "rolled back to" in caplog.text and learner.rollbacks == 1
    assert learner.train_iter == 0
    now = learner.policy.state_dict()["model"]
    assert all(torch.equal(good[k], now[k]) for k in good)
    assert sorted(os.listdir(live.run_dir / "ckpt")) == ["iteration_0.pt"]


def test_non_finite_weights_with_no_checkpoint_stop_the_learner_and_write_none(live):
    learner = live.learner
    with torch.no_grad():
        next(learner.policy._model.parameters()).fill_(float("inf"))
    live.post(_good())
    stop = SimpleNamespace(stop_requested=lambda: False, checkpoint_requested=lambda: False)
    with pytest.raises(RuntimeError, match="no checkpoint was written yet to roll back to"):
        learner.run(stop)
    assert [f for f in os.listdir(live.run_dir / "ckpt") if f.endswith(".pt")] == []


def test_a_failed_step_leaves_no_checkpoint_on_the_way_out(live):
    """A step that raises (a gradient step failing midway) must not be followed by a checkpoint of what it left;
    the previous checkpoints are the restart's."""
    learner = live.learner
    assert learner.save_checkpoint("periodic") is not None
    learner.learner.last_iter += 3

    def failing_step() -> int:
        raise RuntimeError("a gradient step failed midway")

    learner.intake.train_owed = failing_step  # the fault, injected where a real step would fail
    stop = SimpleNamespace(stop_requested=lambda: False, checkpoint_requested=lambda: False)
    with pytest.raises(RuntimeError, match="failed midway"):
        learner.run(stop)
    assert sorted(os.listdir(live.run_dir / "ckpt")) == ["iteration_0.pt"]


def test_the_first_periodic_checkpoint_comes_within_a_minute():
    from nervex.system.checkpoints import CheckpointKeeper
    from nervex.system.learner import FIRST_CHECKPOINT_S

    clock = FakeClock(0.0)
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        keeper = CheckpointKeeper(directory, interval_s=600.0, first_interval_s=FIRST_CHECKPOINT_S, clock=clock)
        clock.now = FIRST_CHECKPOINT_S - 1
        assert not keeper.due()
        clock.now = FIRST_CHECKPOINT_S
        assert keeper.due()
        keeper.save({"x": 1}, 0)
        clock.now += FIRST_CHECKPOINT_S
        assert not keeper.due()  # then every interval_s
        clock.now += 600.0
        assert keeper.due()


def test_a_restarted_learner_deletes_its_earlier_snapshots_beyond_keep_snapshots(live):
    from nervex.system.comm.codec import encode_state_dict
    from nervex.system.learner import LearnerRole

    from .test_bad_input import make_cfg

    keep = int(live.learner.settings.keep_snapshots)
    earlier = []
    for i in range(keep + 5):  # what earlier incarnations left
        name = live.storage.put(encode_state_dict({"w": torch.full((2,), float(i))}), "snapshot")
        os.utime(os.path.join(live.storage.root, name), (1000 + i, 1000 + i))
        earlier.append(name)
    live.learner.close()
    again = LearnerRole(
        make_cfg(), str(live.run_dir), "learner0", url=live.coordinator.url, token=TOKEN,
        logger=logging.getLogger("test_red_team.learner"),
    )  # fmt: skip
    try:
        again.learner.last_iter += 1
        assert again._publish(force=True) is not None
        left = live.storage.list("snapshot")
        assert len(left) == keep and again.snapshot in left
        assert set(left) - {again.snapshot} == set(earlier[-(keep - 1) :])  # the newest earlier ones stay
    finally:
        again.close()


def test_a_full_storage_disk_keeps_the_previous_snapshot_and_retries(tmp_path, caplog):
    """The finding: the learner's snapshot write raised an uncaught 507 and the launcher stopped every role. Now the
    previous snapshot stays announced, the failure is logged and counted, and the write is retried."""
    from nervex.system.learner import SNAPSHOT_RETRY_S, LearnerRole

    from .test_bad_input import fill, make_cfg, tiny_disk  # noqa: F401

    mount = tmp_path / "disk"
    mount.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mount)], capture_output=True)
    if out.returncode != 0:
        pytest.skip("mounting a 1 MiB tmpfs needs root")
    learner = None
    filler = None
    try:
        learner = LearnerRole(
            make_cfg(), str(mount / "run"), "learner0", url="http://127.0.0.1:9", token=TOKEN,
            logger=logging.getLogger("test_red_team.learner"),
        )  # fmt: skip
        learner.link = None  # no coordinator: _publish's report is skipped
        learner.learner.last_iter = 1
        first = learner._publish(force=True)
        assert first is not None and learner.snapshot == first
        filler = fill(mount)
        learner.learner.last_iter = 2
        with torch.no_grad():
            next(learner.policy._model.parameters()).add_(1.0)  # new weights: a new file (names are content hashes)
        with caplog.at_level(logging.ERROR, logger="test_red_team.learner"):
            assert learner._publish(force=True) is None  # logged, not raised
        assert learner.snapshot == first and learner.snapshot_failures == 1
        assert "not written, actors keep" in caplog.text
        os.remove(filler)
        filler = None
        assert learner._publish(force=True) is None  # not before SNAPSHOT_RETRY_S
        learner._snapshot_retry_at -= SNAPSHOT_RETRY_S
        second = learner._publish(force=True)
        assert second is not None and second != first and learner.snapshot == second
    finally:
        if filler is not None:
            os.remove(filler)
        if learner is not None:
            learner.close()
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
