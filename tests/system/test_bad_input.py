"""Bad input and faults at the parallel mode's roles beyond the coordinator's own tests.

Covered here: the manager's relay (unsigned, forged, replayed, oversize and malformed requests; refusals passed on;
loopback bind), the learner reading forged samples files, the actor handed a forged snapshot, a stale run token, the
token never written to a role's log, a port in use, a second coordinator, and a full disk under the coordinator and
the learner. The coordinator's routes get the same table of refusals, each checked for its status, its field and
that nothing changed.

Everything is real: servers on 127.0.0.1, files on disk (a 1 MiB tmpfs for the full disk), roles built in-process
from cartpole_dqn.yaml, and ``coordinator_start`` / ``actor_start`` as subprocesses where a log file or an exit status
is what is checked.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest
import requests
import torch

from nervex.config import apply_overrides, read_config
from nervex.entry import compile_parallel_config
from nervex.system.comm.auth import TOKEN_ENV, TOKEN_FILE, load_or_create_token, sign_request
from nervex.system.comm.client import Client
from nervex.system.comm.codec import encode_arrays, encode_state_dict
from nervex.system.comm.storage import Storage
from nervex.system.coordinator import Coordinator
from nervex.system.coordinator.task_table import TaskTableError
from nervex.system.protocol import (
    DATA_POLL_PATH,
    LEARNER_PROGRESS_PATH,
    PROTOCOL_VERSION,
    REGISTER_PATH,
    STATUS_PATH,
    TASK_COMPLETE_PATH,
    TASK_FAIL_PATH,
    TASK_LEASE_PATH,
    read_coordinator_url,
)
from nervex.system.role import RoleExit, RoleLink
from nervex.system.samples import SAMPLES_KEY, encode_samples
from nervex.system.system_config import config_hash, storage_root

from .test_coordinator import refusal

REPO_ROOT = Path(__file__).resolve().parents[2]
CARTPOLE_DQN = REPO_ROOT / "app_zoo" / "classic_control" / "cartpole" / "config" / "cartpole_dqn.yaml"
TOKEN = secrets.token_bytes(32)
CAP = 1 << 20  # every route's default body cap (http.Server max_body)
N = 8  # samples (and env steps) per collect result here


def make_cfg() -> Any:
    """cartpole_dqn.yaml with a small model, one env per env manager, no background pass, no free-space floor and no
    gradient step before 10**9 env steps."""
    cfg = read_config(CARTPOLE_DQN)
    cfg.env.collector_env_num = 1
    cfg.env.evaluator_env_num = 1
    cfg.policy.learn.learning_starts = 10**9
    cfg.policy.model.hidden_sizes = [32, 32]  # small checkpoints: a few fit on the 1 MiB disk
    cfg.system = {"coordinator": {"tick_s": 3600.0, "min_free_bytes": 0}}
    return compile_parallel_config(cfg)


class Canary:
    """Unpickling this creates the file at ``path``: proof that a pickle ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Tuple[Any, ...]:
        return open, (str(self.path), "w")


def canary_works(tmp_path: Path) -> None:
    control = tmp_path / "control-canary"
    pickle.loads(pickle.dumps(Canary(control)))
    assert control.exists(), "the canary must fire when unpickled, or its absence proves nothing"


def register_body(coordinator: Coordinator, worker_id: str, role: str = "actor", **changes: Any) -> Dict[str, Any]:
    body = dict(worker_id=worker_id, role=role, protocol=PROTOCOL_VERSION, config_hash=coordinator.config_hash)
    return {**body, **changes}


def workers(client: Client) -> List[str]:
    return [w["worker_id"] for w in client.post(STATUS_PATH, {})["workers"]]


def raw_request(port: int, head_lines: List[str], body: bytes = b"") -> Tuple[int, bytes]:
    """Bytes as given (a hand-made chunked body, a Content-Length never honoured); the status and body back."""
    head = "\r\n".join(head_lines + ["Host: 127.0.0.1", "Connection: close", "", ""]).encode("latin-1")
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(head + body)
        except (BrokenPipeError, ConnectionResetError):  # refused before the whole body was sent
            pass
        while True:
            try:
                received = sock.recv(65536)
            except ConnectionResetError:
                break
            if not received:
                break
            data += received
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split(b" ")[1]), rest.partition(b"\r\n\r\n")[2]


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def chunked(data: bytes, size: int = 65536) -> bytes:
    parts = [
        f"{len(data[i : i + size]):x}\r\n".encode() + data[i : i + size] + b"\r\n" for i in range(0, len(data), size)
    ]
    return b"".join(parts) + b"0\r\n\r\n"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture
def coordinator(run_dir: Path) -> Iterator[Coordinator]:
    coord = Coordinator(make_cfg(), str(run_dir), token=TOKEN, logger=logging.getLogger("test_bad_input.coordinator"))
    try:
        yield coord.start()
    finally:
        coord.stop()


@pytest.fixture
def client(coordinator: Coordinator) -> Iterator[Client]:
    with Client(coordinator.url, TOKEN, deadline_s=10.0) as c:
        yield c


# --------------------------------------------------------------------------- requests every server refuses

JSON_HEADERS = {"Content-Type": "application/json"}


def _post(url: str, path: str, body: bytes, headers: Dict[str, str], query: str = "") -> requests.Response:
    return requests.post(url + path + query, data=body, headers={**JSON_HEADERS, **headers}, timeout=10)


def unsigned(url: str, path: str, body: bytes) -> List[requests.Response]:
    return [_post(url, path, body, {})]


def wrong_token(url: str, path: str, body: bytes) -> List[requests.Response]:
    return [_post(url, path, body, sign_request(secrets.token_bytes(32), "POST", path, body))]


def expired(url: str, path: str, body: bytes) -> List[requests.Response]:
    return [_post(url, path, body, sign_request(TOKEN, "POST", path, body, timestamp=time.time() - 3600))]


def token_in_query(url: str, path: str, body: bytes) -> List[requests.Response]:
    return [_post(url, path, body, sign_request(TOKEN, "POST", path, body), query=f"?token={TOKEN.hex()}")]


def replayed(url: str, path: str, body: bytes) -> List[requests.Response]:
    """The same signed request twice: the first is accepted, the second is the refusal under test."""
    headers = sign_request(TOKEN, "POST", path, body)
    first = _post(url, path, body, headers)
    assert first.status_code == 200, first.text
    return [_post(url, path, body, headers)]


def malformed_json(url: str, path: str, body: bytes) -> List[requests.Response]:
    bad = b'{"worker_id": "intruder", "role": '
    return [_post(url, path, bad, sign_request(TOKEN, "POST", path, bad))]


def not_an_object(url: str, path: str, body: bytes) -> List[requests.Response]:
    bad = b'["worker_id", "intruder"]'
    return [_post(url, path, bad, sign_request(TOKEN, "POST", path, bad))]


def oversize(url: str, path: str, body: bytes) -> List[requests.Response]:
    big = json.dumps({**json.loads(body), "info": {"pad": "x" * CAP}}).encode()
    for attempt in range(3):
        try:
            return [_post(url, path, big, sign_request(TOKEN, "POST", path, big))]
        except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError):
            # waitress answers 413 and closes while the client may still be sending the body: on a loaded machine
            # the client can see the connection break before it reads the answer; the refusal itself is the same
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


# name: (send, status, field); each sends a register of worker 'intruder' (or a malformed one)
REFUSED = {
    "no token": (unsigned, 401, "header.X-Nervex-Timestamp"),
    "wrong token": (wrong_token, 401, "header.X-Nervex-Signature"),
    "expired timestamp": (expired, 401, "header.X-Nervex-Timestamp"),
    "token in the query string": (token_in_query, 400, "query_string"),
    "replayed nonce": (replayed, 401, "header.X-Nervex-Nonce"),
    "malformed JSON": (malformed_json, 400, "body"),
    "JSON not an object": (not_an_object, 400, "body"),
    # over the largest route cap waitress refuses before the app runs: a plain-text 413, no JSON field
    "oversize body": (oversize, 413, None),
}


def check_refused(response: requests.Response, status: int, field: Optional[str]) -> None:
    assert response.status_code == status, response.text
    if field is not None:
        assert response.json()["field"] == field, response.text
    assert TOKEN.hex() not in response.text


def check_logged(caplog: pytest.LogCaptureFixture, status: int) -> None:
    """A 401 is logged once (path and reason, never a header or the body); nothing logs the token."""
    refused = [r.getMessage() for r in caplog.records if "refused POST /v1/register from 127.0.0.1" in r.getMessage()]
    assert len(refused) == (1 if status == 401 else 0), refused
    assert TOKEN.hex() not in caplog.text


@pytest.mark.parametrize("case", list(REFUSED))
def test_the_coordinator_refuses_naming_the_field_and_registers_nobody(coordinator, client, case, caplog):
    send, status, field = REFUSED[case]
    body = json.dumps(register_body(coordinator, "intruder")).encode()
    with caplog.at_level(logging.INFO, logger="test_bad_input.coordinator"):
        for response in send(coordinator.url, REGISTER_PATH, body):
            check_refused(response, status, field)
    check_logged(caplog, status)
    expected = ["intruder"] if case == "replayed nonce" else []  # the first, genuine copy registered it
    assert workers(client) == expected


def test_a_chunked_body_over_the_cap_is_refused_by_the_coordinator(coordinator, client):
    body = json.dumps({**register_body(coordinator, "intruder"), "info": {"pad": "y" * CAP}}).encode()
    head = [f"POST {REGISTER_PATH} HTTP/1.1", "Transfer-Encoding: chunked", "Content-Type: application/json"]
    head += [f"{k}: {v}" for k, v in sign_request(TOKEN, "POST", REGISTER_PATH, body).items()]
    status, _ = raw_request(_port(coordinator.url), head, chunked(body))
    assert status == 413
    assert workers(client) == []


# --------------------------------------------------------------------------- task routes: unknown ids, other leases


def _leased(coordinator: Coordinator, client: Client, worker_id: str = "actor0") -> Dict[str, Any]:
    client.post(REGISTER_PATH, register_body(coordinator, worker_id))
    task = client.post(TASK_LEASE_PATH, {"worker_id": worker_id, "kind": "collect"})["task"]
    assert task is not None
    return task


def _result(coordinator: Coordinator) -> Dict[str, Any]:
    storage = Storage(storage_root(coordinator.cfg, coordinator.run_dir), min_free_bytes=0)
    data = storage.put(encode_samples([_sample(i) for i in range(N)]), "samples")
    return dict(data=data, n_samples=N, env_steps=N, episodes=[], policy_iter=0)


def test_unknown_task_ids_are_404_naming_task_id_and_change_nothing(coordinator, client):
    task = _leased(coordinator, client)
    before = coordinator.task_table.get_task(task["task_id"])
    complete = dict(
        worker_id="actor0", task_id="collect-99999999", lease_id=task["lease_id"], result=_result(coordinator)
    )
    fail = dict(worker_id="actor0", task_id="no-such-task", lease_id=task["lease_id"], reason="x")
    for path, body in ((TASK_COMPLETE_PATH, complete), (TASK_FAIL_PATH, fail)):
        error = refusal(lambda path=path, body=body: client.post(path, body))
        assert (error.status, error.field) == (404, "task_id") and body["task_id"] in error.message
    assert coordinator.task_table.get_task(task["task_id"]) == before
    assert coordinator.task_table.results("collect", 0, 10) == []


def test_another_workers_lease_is_403_naming_lease_id_and_records_nothing(coordinator, client):
    task = _leased(coordinator, client, "actor0")
    client.post(REGISTER_PATH, register_body(coordinator, "actor1"))
    before = coordinator.task_table.get_task(task["task_id"])
    body = dict(worker_id="actor1", task_id=task["task_id"], lease_id=task["lease_id"])
    for path, extra in ((TASK_COMPLETE_PATH, {"result": _result(coordinator)}), (TASK_FAIL_PATH, {"reason": "x"})):
        error = refusal(lambda path=path, extra=extra: client.post(path, {**body, **extra}))
        assert (error.status, error.field) == (403, "lease_id")
    assert coordinator.task_table.get_task(task["task_id"]) == before
    assert before["state"] == "leased" and before["worker_id"] == "actor0"
    assert coordinator.task_table.results("collect", 0, 10) == []


# --------------------------------------------------------------------------- the manager's relay


@pytest.fixture
def relay(coordinator: Coordinator, run_dir: Path) -> Iterator[Any]:
    from nervex.system.manager import ManagerRole

    manager = ManagerRole(
        make_cfg(), str(run_dir), "manager0", [], actors=0, url=coordinator.url, token=TOKEN,
        logger=logging.getLogger("test_bad_input.manager"),
    )  # fmt: skip
    manager.server.start()  # what ManagerRole.run does first; no actor is started
    try:
        yield manager
    finally:
        manager.server.stop()
        manager.link.close()


def test_the_relay_binds_loopback_by_default(relay):
    assert relay.server._server.socket.getsockname()[0] == "127.0.0.1"
    assert relay.url == f"http://127.0.0.1:{relay.server.port}"


@pytest.mark.parametrize("case", list(REFUSED))
def test_the_relay_refuses_what_the_coordinator_would_and_forwards_nothing(coordinator, client, relay, case, caplog):
    send, status, field = REFUSED[case]
    body = json.dumps(register_body(coordinator, "intruder")).encode()
    with caplog.at_level(logging.INFO, logger="test_bad_input.manager"):
        for response in send(relay.url, REGISTER_PATH, body):
            check_refused(response, status, field)
    check_logged(caplog, status)
    forwarded = 1 if case == "replayed nonce" else 0  # the genuine first copy only
    assert relay.relayed == forwarded
    assert workers(client) == (["intruder"] if forwarded else [])


def test_the_relay_refuses_a_chunked_or_announced_body_over_the_cap_without_forwarding(coordinator, client, relay):
    body = json.dumps({**register_body(coordinator, "intruder"), "info": {"pad": "y" * CAP}}).encode()
    signed = [f"{k}: {v}" for k, v in sign_request(TOKEN, "POST", REGISTER_PATH, body).items()]
    head = [f"POST {REGISTER_PATH} HTTP/1.1", "Content-Type: application/json"] + signed
    assert raw_request(relay.server.port, head + ["Transfer-Encoding: chunked"], chunked(body))[0] == 413
    start = time.monotonic()
    assert raw_request(relay.server.port, head + ["Content-Length: 1000000000"])[0] == 413  # body never sent
    assert time.monotonic() - start < 3
    assert relay.relayed == 0 and workers(client) == []


def test_the_relay_passes_the_coordinators_refusals_on_with_status_and_field(coordinator, client, relay):
    with Client(relay.url, TOKEN, deadline_s=10.0) as via_relay:
        error = refusal(lambda: via_relay.post(REGISTER_PATH, register_body(coordinator, "a9", config_hash="f" * 64)))
        assert (error.status, error.field) == (403, "config_hash") and coordinator.config_hash in error.message
        error = refusal(lambda: via_relay.post(REGISTER_PATH, register_body(coordinator, "a9", protocol=99)))
        assert (error.status, error.field) == (403, "protocol")
        assert workers(client) == []
        task = _leased(coordinator, via_relay, "actor0")
        via_relay.post(REGISTER_PATH, register_body(coordinator, "actor1"))
        other = dict(worker_id="actor1", task_id=task["task_id"], lease_id=task["lease_id"], reason="x")
        assert refusal(lambda: via_relay.post(TASK_FAIL_PATH, other)).field == "lease_id"
        unknown = dict(other, worker_id="actor0", task_id="nope")
        error = refusal(lambda: via_relay.post(TASK_FAIL_PATH, unknown))
        assert (error.status, error.field) == (404, "task_id")
    assert coordinator.task_table.get_task(task["task_id"])["state"] == "leased"


# --------------------------------------------------------------------------- the learner reads forged samples files


def _sample(i: int, reward: float = 1.0) -> Dict[str, Any]:
    obs = np.full(4, 0.01 * i, np.float32)  # inside CartPole's observation space, as the learner checks
    return {"obs": obs, "action": np.int64(i % 2), "reward": np.float32(reward), "next_obs": obs + 0.001, "done": False}


def _raw(header: Any, buffer: bytes = b"", length: Optional[int] = None) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head) if length is None else length) + head + buffer


def _layout(n: int, **kinds: str) -> Dict[str, str]:
    return {SAMPLES_KEY: json.dumps({"n": n, "kinds": kinds})}


def _pickle(canary: Path) -> bytes:
    return pickle.dumps({"obs": np.zeros((N, 4), np.float32), "reward": Canary(canary)})


def _object_npz(canary: Path) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, reward=np.zeros(N, np.float32), obs=np.array([Canary(canary)] * N, dtype=object))
    return buffer.getvalue()


F32_N = {"dtype": "F32", "shape": [N], "data_offsets": [0, 4 * N]}
# name: (the file's bytes from the canary's path, the field the learner's warning must name)
FORGED: Dict[str, Tuple[Callable[[Path], bytes], str]] = {
    "a pickle": (_pickle, "header"),
    "an object-array npz": (_object_npz, "header"),
    "huge header length": (lambda c: _raw({}, length=2**62), "header"),
    "offsets past the end": (
        lambda c: _raw({"reward": {**F32_N, "data_offsets": [0, 4 * N + 400]}}, bytes(4 * N)),
        "reward.data_offsets",
    ),
    "wrong dtype": (lambda c: _raw({"reward": {**F32_N, "dtype": "O"}}, bytes(4 * N)), "reward.dtype"),
    "shape mismatch": (
        lambda c: encode_arrays({"obs": np.zeros((N - 1, 4), np.float32)}, _layout(N, obs="ndarray")),
        "obs",
    ),
    "NaN reward": (lambda c: encode_samples([_sample(0), _sample(1, float("nan"))]), "reward"),
    "an empty array of a 2**62 x 2**62 shape": (
        lambda c: _raw({"obs": {"dtype": "F32", "shape": [0, 2**62, 2**62], "data_offsets": [0, 0]}}),
        "obs.shape",
    ),
    "a layout nested 100000 deep": (
        lambda c: _raw({"__metadata__": {SAMPLES_KEY: "[" * 100_000}}),
        f"__metadata__.{SAMPLES_KEY}",
    ),
    "10**12 samples of no bytes": (
        lambda c: encode_arrays({"obs": np.zeros((10**12, 0), np.float32)}, _layout(10**12, obs="ndarray")),
        f"__metadata__.{SAMPLES_KEY}.n",
    ),
    "fields other than the buffer's": (
        lambda c: encode_samples([{**_sample(i), "obs": np.zeros(5, np.float32)} for i in range(N)]),
        "obs",
    ),
}


@pytest.fixture
def learner(coordinator: Coordinator, run_dir: Path) -> Iterator[Any]:
    from nervex.system.learner import LearnerRole

    role = LearnerRole(
        make_cfg(), str(run_dir), "learner0", url=coordinator.url, token=TOKEN,
        logger=logging.getLogger("test_bad_input.learner"),
    )  # fmt: skip
    try:
        yield role
    finally:
        role.close()


def test_the_learner_skips_each_forged_samples_file_naming_its_field_and_keeps_the_good_data(
    tmp_path, coordinator, client, learner, caplog
):
    canary_works(tmp_path)
    canary = tmp_path / "canary"
    storage = Storage(storage_root(coordinator.cfg, coordinator.run_dir), min_free_bytes=0)
    good = [encode_samples([_sample(i, reward=10.0 * k) for i in range(N)]) for k in (1, 2)]
    files = [("good 1", storage.put(good[0], "samples"), None)]
    for case, (make, field) in FORGED.items():
        files.append((case, storage.put(make(canary), "samples"), field))
    altered = storage.put(encode_samples([_sample(i, reward=3.0) for i in range(N)]), "samples")
    with open(os.path.join(storage.root, altered), "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"\x01")  # no longer the content its SHA-256 name promises
    files.append(("SHA-256 not its name", altered, "name"))
    files.append(("good 2", storage.put(good[1], "samples"), None))

    task_of = {}
    for case, name, _ in files:
        task = _leased(coordinator, client)
        result = dict(data=name, n_samples=N, env_steps=N, episodes=[{"return": 9.0, "length": 9}], policy_iter=0)
        body = dict(worker_id="actor0", task_id=task["task_id"], lease_id=task["lease_id"], result=result)
        assert client.post(TASK_COMPLETE_PATH, body) == {"accepted": True}
        task_of[case] = task["task_id"]

    with caplog.at_level(logging.WARNING, logger="test_bad_input.learner"):
        assert learner.step() is True  # one poll brings every result; none of them stops the learner

    bad = [(case, field) for case, _, field in files if field is not None]
    assert learner.counters == {"results": 2, "dropped_stale": 0, "missing": 0, "bad_data": len(bad)}
    assert len(learner.buffer) == 2 * N
    rewards = {float(r) for _ in range(20) for r in np.asarray(learner.buffer.sample(2 * N)["reward"])}
    assert sorted(rewards) == [10.0, 20.0]  # the good files' samples, and nothing else
    assert learner.env_step == N * len(files) and learner.seq == len(files)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for case, field in bad:
        lines = [w for w in warnings if f"skipped the data of {task_of[case]}:" in w]
        assert len(lines) == 1, (case, warnings)
        assert f"field '{field}'" in lines[0], (case, lines[0])
    assert len(warnings) == len(bad), warnings
    assert not canary.exists(), "a pickle ran"
    assert storage.list("samples") == [], "every file read (or refused) is deleted"
    assert learner.step() is False  # and the learner goes on
    assert TOKEN.hex() not in caplog.text


# --------------------------------------------------------------------------- the actor is handed a forged snapshot


def _pickled_state(canary: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save({"model": {"w": Canary(canary)}}, buffer)  # what a torch.load-ing actor would run
    return buffer.getvalue()


def _wrong_shape(state: Dict[str, Any]) -> bytes:
    model = {k: torch.full_like(v, 7.0) for k, v in state["model"].items()}
    last = list(model)[-1]
    model[last] = torch.zeros(model[last].numel() + 1)  # one tensor of the wrong shape, the others plausible
    return encode_state_dict({"model": model, "extra": state["extra"]})


# name: (the file's bytes from (canary path, the actor's own policy state), what the failure reason must name)
SNAPSHOTS: Dict[str, Tuple[Callable[[Path, Dict[str, Any]], bytes], str]] = {
    "a torch.save pickle": (lambda c, s: _pickled_state(c), "field 'header'"),
    "an object-array npz": (lambda c, s: _object_npz(c), "field 'header'"),
    "truncated": (lambda c, s: encode_state_dict(s), "field 'name'"),  # cut after it is stored: SHA-256 mismatch
    "a tensor of the wrong shape": (lambda c, s: _wrong_shape(s), "size mismatch"),
}


@pytest.mark.parametrize(
    "case",
    list(SNAPSHOTS),
)
def test_an_actor_handed_a_forged_snapshot_fails_the_task_and_keeps_its_weights(
    tmp_path, coordinator, client, run_dir, case, caplog
):
    from nervex.system.actor import ActorRole

    canary_works(tmp_path)
    canary = tmp_path / "canary"
    actor = ActorRole(
        make_cfg(), str(run_dir), 0, "actor0", url=coordinator.url, token=TOKEN,
        logger=logging.getLogger("test_bad_input.actor"),
    )  # fmt: skip
    stop = threading.Event()
    thread = threading.Thread(target=actor.run, args=(stop,), daemon=True)
    try:
        before = {k: v.clone() for k, v in actor.policy.state_dict()["model"].items()}
        make, named = SNAPSHOTS[case]
        storage = Storage(storage_root(coordinator.cfg, coordinator.run_dir), min_free_bytes=0)
        snapshot = storage.put(make(canary, actor.policy.state_dict()), "snapshot")
        if case == "truncated":
            path = os.path.join(storage.root, snapshot)
            os.truncate(path, os.path.getsize(path) // 2)
        client.post(REGISTER_PATH, register_body(coordinator, "learner0", role="learner"))
        progress = dict(worker_id="learner0", train_iter=5, env_step=0, sampled=0, snapshot=snapshot, policy_iter=5)
        client.post(LEARNER_PROGRESS_PATH, progress)
        with caplog.at_level(logging.WARNING, logger="test_bad_input.coordinator"):
            thread.start()
            deadline = time.monotonic() + 8.0
            while not any(t["error"] for t in coordinator.task_table.tasks(kind="collect")):
                assert time.monotonic() < deadline, "the actor never reported the task as failed"
                time.sleep(0.05)
        failures = [r.getMessage() for r in caplog.records if "failed task" in r.getMessage()]
        first = failures[0].split(": ", 1)[1]  # later ones may say 404: the corrupt file was deleted
        assert first.startswith("ProtocolError: 400:"), first
        assert named in first, first
    finally:
        stop.set()
        if thread.ident is not None:
            thread.join(timeout=10)
        actor.close()
    assert not thread.is_alive()
    assert not canary.exists(), "a pickle ran"
    assert actor.tasks_done == 0 and actor.snapshot is None
    assert coordinator.task_table.results("collect", 0, 10) == []
    after = actor.policy.state_dict()["model"]
    assert all(torch.equal(before[k], after[k]) for k in before), "the forged snapshot changed the actor's weights"


def test_an_on_policy_learner_skips_rollouts_it_cannot_train_on_and_keeps_training(tmp_path, run_dir, caplog):
    """PPO trains on each rollout as it comes (no replay buffer to check the fields): a well-formed file of other
    samples (a DQN transition's fields, or the right fields with another observation shape) is counted and skipped,
    before and after the first real rollout, and the real ones are trained on."""
    from nervex.entry.builder import make_actor, make_env_managers, make_policy
    from nervex.system.learner import LearnerRole
    from nervex.system.system_config import collect_spec

    raw = read_config(REPO_ROOT / "app_zoo" / "classic_control" / "cartpole" / "config" / "cartpole_ppo.yaml")
    raw.env.collector_env_num = 1
    raw.env.evaluator_env_num = 1
    raw.system = {"coordinator": {"tick_s": 3600.0, "min_free_bytes": 0}}
    cfg = compile_parallel_config(raw)
    env, _, env_info = make_env_managers(cfg, 0, evaluator=False)
    policy = make_policy(cfg, env_info, enable_field=["collect", "command"])
    actor = make_actor(cfg, env, policy, 0)
    try:
        setting = policy.command_mode.get_setting_collect(dict(env_step=0, train_iter=0, learner_step=0))
        rollouts = [actor.collect(collect_spec(cfg), setting) for _ in range(2)]
    finally:
        actor.close()
    wide = [{**sample, "obs": np.zeros(5, np.float32)} for sample in rollouts[0]]
    files = [
        ("DQN transitions", encode_samples([_sample(i) for i in range(N)]), "policy cannot train"),
        ("rollout 1", encode_samples(rollouts[0]), None),
        ("another obs shape", encode_samples(wide), "field 'obs'"),
        ("rollout 2", encode_samples(rollouts[1]), None),
    ]
    coord = Coordinator(cfg, str(run_dir), token=TOKEN, logger=logging.getLogger("test_bad_input.coordinator"))
    coord.start()
    learner = None
    try:
        storage = Storage(storage_root(coord.cfg, coord.run_dir), min_free_bytes=0)
        with Client(coord.url, TOKEN, deadline_s=10.0) as client:
            for case, data, _ in files:
                task = _leased(coord, client)
                n = N if case == "DQN transitions" else len(rollouts[0])
                result = dict(data=storage.put(data, "samples"), n_samples=n, env_steps=n, episodes=[], policy_iter=0)
                body = dict(worker_id="actor0", task_id=task["task_id"], lease_id=task["lease_id"], result=result)
                assert client.post(TASK_COMPLETE_PATH, body) == {"accepted": True}, case
        learner = LearnerRole(
            raw,
            str(run_dir),
            "learner0",
            url=coord.url,
            token=TOKEN,
            logger=logging.getLogger("test_bad_input.learner"),
        )
        with caplog.at_level(logging.WARNING, logger="test_bad_input.learner"):
            while learner.seq < len(files):
                learner.step()
        assert learner.counters == {"results": 2, "dropped_stale": 0, "missing": 0, "bad_data": 2}
        assert learner.train_iter > 0
        warnings = [r.getMessage() for r in caplog.records if "skipped the data" in r.getMessage()]
        for (case, _, named), warning in zip([f for f in files if f[2]], warnings):
            assert named in warning, (case, warning)
    finally:
        if learner is not None:
            learner.close()
        coord.stop()


# --------------------------------------------------------------------------- stale token, secrets in logs


@pytest.fixture
def no_env_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def test_a_worker_holding_a_stale_token_is_refused_at_once_with_exit_status_2(tmp_path, no_env_token, caplog):
    run_dir = tmp_path / "run"
    stale = load_or_create_token(str(run_dir))  # what a worker started earlier read
    os.remove(run_dir / TOKEN_FILE)  # the run was reset: the coordinator makes a new token
    coordinator = Coordinator(make_cfg(), str(run_dir), logger=logging.getLogger("test_bad_input.coordinator"))
    try:
        with caplog.at_level(logging.INFO):
            coordinator.start()
            fresh = (run_dir / TOKEN_FILE).read_bytes()
            assert len(fresh) == 32 and fresh != stale
            link = RoleLink(coordinator.cfg, str(run_dir), "actor", "actor0", token=stale)
            start = time.monotonic()
            with pytest.raises(RoleExit) as info:
                link.register()
            assert time.monotonic() - start < 3.0, "a 401 is not retried"
            link.close()
            with Client(coordinator.url, fresh, deadline_s=10.0) as client:
                assert workers(client) == []
                again = RoleLink(coordinator.cfg, str(run_dir), "actor", "actor0")  # reads the token file anew
                assert again.register()["worker_id"] == "actor0"
                again.close()
                assert workers(client) == ["actor0"]
    finally:
        coordinator.stop()
    assert info.value.code == 2
    message = str(info.value)
    assert message.startswith("registration refused: 401: bad signature") and "header.X-Nervex-Signature" in message
    assert "refused POST /v1/register from 127.0.0.1: 401" in caplog.text
    for secret in (stale.hex(), fresh.hex()):
        assert secret not in message and secret not in caplog.text


SUBPROCESS_OVERRIDES = ["env.collector_env_num=1", "env.evaluator_env_num=1"]
SUBPROCESS_HASH = config_hash(compile_parallel_config(apply_overrides(read_config(CARTPOLE_DQN), SUBPROCESS_OVERRIDES)))


def _start(module: str, run_dir: Path, token: bytes, *args: str) -> subprocess.Popen:
    """``python -m nervex.system.<module>`` on cartpole_dqn.yaml with ``$NERVEX_RUN_TOKEN`` set to ``token``."""
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env[TOKEN_ENV] = token.hex()
    command = [
        sys.executable,
        "-m",
        f"nervex.system.{module}",
        "--config",
        str(CARTPOLE_DQN),
        "--run-dir",
        str(run_dir),
    ]
    overrides = [arg for item in SUBPROCESS_OVERRIDES for arg in ("--set", item)]
    return subprocess.Popen(
        command + overrides + list(args), cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def _wait_for_url(run_dir: Path, process: subprocess.Popen, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        url = read_coordinator_url(str(run_dir))
        if url:
            return url
        assert process.poll() is None, process.stdout.read().decode(errors="replace")[-2000:]
        time.sleep(0.05)
    raise AssertionError(f"coordinator_start wrote no coordinator.url within {timeout_s} s")


def _finish(process: subprocess.Popen, timeout_s: float = 20.0, terminate: bool = True) -> Tuple[int, str]:
    """SIGTERM (unless ``terminate`` is False: the process is expected to exit by itself), wait, return (status, output).
    A process still running after ``timeout_s`` is killed."""
    if terminate and process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    return process.returncode, out.decode(errors="replace")


def test_no_role_writes_the_token_to_its_log_whatever_it_is_sent(tmp_path):
    run_dir = tmp_path / "run"
    coordinator = _start("coordinator_start", run_dir, TOKEN)
    actor: Optional[subprocess.Popen] = None
    try:
        url = _wait_for_url(run_dir, coordinator)
        body = json.dumps(
            dict(worker_id="intruder", role="actor", protocol=PROTOCOL_VERSION, config_hash=SUBPROCESS_HASH)
        )
        for send, status, field in REFUSED.values():
            for response in send(url, REGISTER_PATH, body.encode()):
                check_refused(response, status, field)
        stale = secrets.token_bytes(32)
        actor = _start("actor_start", run_dir, stale, "--url", url)
        actor_status, actor_out = _finish(actor, timeout_s=60.0, terminate=False)
    finally:
        if actor is not None and actor.poll() is None:
            _finish(actor)
        status, coordinator_out = _finish(coordinator)
    assert actor_status == 2, actor_out[-2000:]
    assert status == 0, coordinator_out[-2000:]
    coordinator_log = (run_dir / "logs" / "coordinator.log").read_text()
    actor_log = (run_dir / "logs" / "actor-0.log").read_text()
    assert "registration refused: 401: bad signature" in actor_log
    # no token, wrong token, expired timestamp, replayed nonce and the stale actor: each refusal logged once
    assert coordinator_log.count("refused POST /v1/register from 127.0.0.1: 401") == 5, coordinator_log
    for text in (coordinator_log, actor_log, coordinator_out, actor_out):
        assert TOKEN.hex() not in text and stale.hex() not in text


# --------------------------------------------------------------------------- port in use, a second coordinator


def test_a_port_in_use_is_named_and_leaves_the_run_dir_to_the_next_start(tmp_path, run_dir):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        coordinator = Coordinator(make_cfg(), str(run_dir), token=TOKEN, port=port)
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}: address already in use"):
            coordinator.start()
        assert read_coordinator_url(str(run_dir)) is None, "no address was published"
        process = _start("coordinator_start", tmp_path / "run2", TOKEN, "--port", str(port))
        code, out = _finish(process, timeout_s=60.0, terminate=False)
    assert code == 2, out[-2000:]
    log = (tmp_path / "run2" / "logs" / "coordinator.log").read_text()
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in log
    assert read_coordinator_url(str(tmp_path / "run2")) is None
    again = Coordinator(make_cfg(), str(run_dir), token=TOKEN)  # the failed start released the task table
    try:
        again.start()
        with Client(again.url, TOKEN, deadline_s=10.0) as client:
            client.post(REGISTER_PATH, register_body(again, "actor0"))
            assert workers(client) == ["actor0"]
    finally:
        again.stop()


def test_a_second_coordinator_on_the_run_dir_is_refused_and_the_first_serves_on(coordinator, client, run_dir):
    url = read_coordinator_url(str(run_dir))
    assert url == coordinator.url
    second = Coordinator(make_cfg(), str(run_dir), token=TOKEN)
    try:
        with pytest.raises(TaskTableError, match="already open by another coordinator"):
            second.start()
    finally:
        second.stop()
    assert read_coordinator_url(str(run_dir)) == url, "the second one did not publish its address"
    client.post(REGISTER_PATH, register_body(coordinator, "actor0"))
    assert workers(client) == ["actor0"]


# --------------------------------------------------------------------------- a full disk


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a real ENOSPC from the kernel (needs root, as tests/system/test_checkpoints.py's)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no 'mount' command to create a 1 MiB tmpfs")
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mount_point)], capture_output=True, text=True, timeout=10
    )
    if out.returncode != 0:
        pytest.skip(f"mounting a 1 MiB tmpfs is not permitted here ({out.stderr.strip()}); needs root")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=10)


def fill(directory: Path) -> Path:
    """Write zeros to ``directory/filler`` until the file system is full."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, bytes(1 << 16))
    except OSError as error:
        assert error.errno == 28, error  # ENOSPC
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_under_the_coordinator_is_507_and_loses_nothing(tiny_disk):
    coordinator = Coordinator(make_cfg(), str(tiny_disk / "run"), token=TOKEN)
    try:
        coordinator.start()
        with Client(coordinator.url, TOKEN, deadline_s=10.0) as client:
            task = _leased(coordinator, client)
            result = _result(coordinator)  # the samples file was written before the disk filled
            filler = fill(tiny_disk)
            storage = Storage(storage_root(coordinator.cfg, coordinator.run_dir), min_free_bytes=0)
            error = refusal(lambda: storage.put(secrets.token_bytes(200_000), "samples"))
            assert (error.status, error.field) == (507, "data") and "bytes free under" in error.message
            assert os.listdir(os.path.join(storage.root, "samples")) == [result["data"].split("/")[1]], "no temp file"
            padded = dict(result, info={"pad": "z" * 300_000})  # a row SQLite needs new pages for
            body = dict(worker_id="actor0", task_id=task["task_id"], lease_id=task["lease_id"], result=padded)
            error = refusal(lambda: client.post(TASK_COMPLETE_PATH, body))
            assert error.status == 507 and "disk is full" in error.message and error.retry_after == 5.0
            assert coordinator.task_table.get_task(task["task_id"])["state"] == "leased"
            assert coordinator.task_table.results("collect", 0, 10) == []
            os.remove(filler)
            assert client.post(TASK_COMPLETE_PATH, body) == {"accepted": True}  # the same report, sent again
            client.post(REGISTER_PATH, register_body(coordinator, "learner0", role="learner"))
            items = client.post(DATA_POLL_PATH, {"worker_id": "learner0", "since_seq": 0})["items"]
            assert [item["result"]["data"] for item in items] == [result["data"]]
            assert storage.get(result["data"]) == encode_samples([_sample(i) for i in range(N)])
    finally:
        coordinator.stop()


def test_a_full_disk_fails_the_learners_checkpoint_and_keeps_the_previous_one(tiny_disk, caplog):
    from nervex.system.learner import LearnerRole

    learner = LearnerRole(
        make_cfg(), str(tiny_disk / "run"), "learner0", url="http://127.0.0.1:9", token=TOKEN,
        logger=logging.getLogger("test_bad_input.learner"),
    )  # fmt: skip
    filler: Optional[Path] = None
    try:
        first = learner.save_checkpoint("periodic")
        assert first is not None and first.endswith("iteration_0.pt")
        saved = Path(first).read_bytes()
        learner.learner.last_iter += 1  # as a gradient step would: the next checkpoint has a new name
        filler = fill(tiny_disk)
        with caplog.at_level(logging.ERROR, logger="test_bad_input.learner"):
            assert learner.save_checkpoint("periodic") is None  # logged, not raised: training goes on
        assert learner.checkpoint_failures == 1
        assert "checkpoint (periodic) failed, the previous ones are intact" in caplog.text
        ckpt = tiny_disk / "run" / "ckpt"
        assert sorted(os.listdir(ckpt)) == ["iteration_0.pt"], "no half file under the final name, no temp file"
        assert Path(first).read_bytes() == saved
        path, state = learner.keeper.load_latest()
        assert path == first and state["train_iter"] == 0
    finally:
        if filler is not None:
            os.remove(filler)
        learner.close()
