"""The parallel mode through a faulty network: workers reach the coordinator through a TCP proxy (``tcp_proxy.py``)
that delays every burst, swallows answers after the server acted on the request, resets connections mid-answer and
goes dark for longer than one call may take.

Nothing may be lost or counted twice: every accepted collect task once, every samples file named once, the learner's
env steps equal to the accepted env steps up to its poll cursor; and no role may die of a fault.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
import time
import urllib.parse
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from nervex.system.comm.client import Client
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.server import Server
from nervex.system.coordinator import Coordinator
from nervex.system.protocol import TASK_COMPLETE_PATH, TASK_LEASE_PATH
from nervex.system.role import RoleLink
from tests.system.tcp_proxy import FaultyProxy
from tests.system.test_coordinator import make_cfg
from tests.system.test_parallel_run import (
    DQN,
    Roles,
    _query,
    _status,
    _wait,
    accepted_results,
    assert_exact_accounting,
    no_role_left,
)

OUTAGE_S = 13.0
"""Longer than one call may retry (``RoleLink.deadline_s``, 10 s), shorter than a worker reconnects (120 s)."""


# ---------------------------------------------------------------------------------------------------- the proxy


@pytest.fixture
def echo_server() -> Iterator[Tuple[Server, List[int], bytes]]:
    """A signed server whose ``/echo`` records every request it acted on."""
    token = secrets.token_bytes(32)
    acted: List[int] = []
    server = Server("echo", token)
    server.route("/echo", ["POST"], lambda body: acted.append(body["i"]) or {"i": body["i"]})
    with server:
        yield server, acted, token


def test_every_lost_answer_is_a_request_the_server_acted_on_twice(echo_server):
    """What the proxy does to the client: each swallowed or reset answer is one more execution of the handler (the
    client sent the request again), a refused connection is none, and every call still gets its own answer."""
    server, acted, token = echo_server
    with FaultyProxy("127.0.0.1", server.port, seed=1, drop_p=0.2, reset_p=0.2) as proxy:
        with Client(proxy.url, token, deadline_s=10.0) as client:
            answers = [client.post("/echo", {"i": i})["i"] for i in range(30)]
    counts = proxy.counts
    assert answers == list(range(30))
    assert counts.refused > 0 and counts.dropped > 0 and counts.reset > 0, counts
    assert len(acted) == 30 + counts.dropped + counts.reset
    assert sorted(set(acted)) == answers
    assert {kind for kind, _ in proxy.faults} == {"dropped", "reset"}
    assert all(line == "POST /echo HTTP/1.1" for _, line in proxy.faults)


def test_an_outage_holds_requests_until_it_ends(echo_server):
    server, acted, token = echo_server
    with FaultyProxy("127.0.0.1", server.port) as proxy:
        proxy.pause()
        with Client(proxy.url, token, deadline_s=1.0) as client:
            with pytest.raises(ProtocolError) as refused:
                client.post("/echo", {"i": 1})
        assert refused.value.status == 503 and acted == []
        proxy.resume()
        _wait(lambda: acted == [1], 5, "the held request delivered after the outage")
        with Client(proxy.url, token, deadline_s=5.0) as client:
            assert client.post("/echo", {"i": 2}) == {"i": 2}


def test_a_lease_whose_answer_was_lost_reaches_the_worker_on_its_retry(tmp_path):
    """Lease answers swallowed or reset after the coordinator leased: the worker's retries (``RoleLink`` keeps the
    call's ``request_id``) get that lease back, so every lease handed out is one the worker knows, each task once."""
    token = secrets.token_bytes(32)
    with Coordinator(make_cfg(), str(tmp_path), token=token) as coordinator:
        port = urllib.parse.urlsplit(coordinator.url).port
        with FaultyProxy("127.0.0.1", port, seed=3, drop_p=0.3, reset_p=0.2) as proxy:
            link = RoleLink(coordinator.cfg, str(tmp_path), "actor", "actor0", url=proxy.url, token=token)
            try:
                link.register()
                known = [link.call(TASK_LEASE_PATH, {"kind": "collect"})["task"] for _ in range(12)]
            finally:
                link.close()
        lost = [line for _, line in proxy.faults if TASK_LEASE_PATH in line]
        handed = coordinator.task_table.tasks(state="leased", kind="collect")
    assert len(lost) >= 3, proxy.faults
    assert sorted(t["lease_id"] for t in handed) == sorted(t["lease_id"] for t in known)
    assert len({t["task_id"] for t in known}) == 12 and all(t["attempts"] == 1 for t in handed)


# ---------------------------------------------------------------------------------------------------- end to end


@contextlib.contextmanager
def proxied_run(run_dir: Path, seed: int, *overrides: str, **faults: float) -> Iterator[Tuple[Roles, FaultyProxy]]:
    """A coordinator and a proxy to it; on the way out every worker is stopped through a clean pipe, then the
    coordinator, then the proxy."""
    with Roles(run_dir, DQN, *overrides) as roles:
        roles.start("coordinator")
        port = urllib.parse.urlsplit(roles.launch.wait_for_coordinator()).port
        with FaultyProxy("127.0.0.1", port, seed=seed, **faults) as proxy:
            try:
                yield roles, proxy
            finally:
                proxy.set_faults()
                proxy.resume()
                roles.launch.stop_all(grace_s=30.0)


def _no_tracebacks(run_dir: Path) -> None:
    for path in sorted((run_dir / "logs").iterdir()):
        assert "Traceback" not in path.read_text(errors="replace"), f"{path.name}:\n{path.read_text()[-3000:]}"


def test_workers_behind_a_delaying_dropping_resetting_proxy_lose_and_duplicate_nothing(tmp_path):
    """Actor, learner and league manager talk to the coordinator through 200 ms of latency, with answers swallowed
    after the coordinator acted and connections reset mid-answer. The run goes to ``max_env_step`` and finishes on its
    own, every role exits 0, and the accounting is exact although lease, complete and poll requests were acted on
    twice."""
    run_dir = tmp_path / "run"
    overrides = (
        "system.coordinator.n_sample=64",  # 24 tasks: many leases and completes for the faults to hit
        "system.coordinator.samples_per_insert=null",  # collection paced by the proxy, not by the learner
        "evaluator.stop_val=100000",
        "max_env_step=1500",
    )
    with proxied_run(run_dir, 7, *overrides, delay_s=0.2, drop_p=0.15, reset_p=0.1) as (roles, proxy):
        workers = {role: roles.start(role, "--url", proxy.url) for role in ("league_manager", "learner", "actor")}
        assert workers["learner"].wait(timeout=150) == 0
        for role in ("actor", "league_manager"):  # they stop when the coordinator says the run finished
            assert workers[role].wait(timeout=30) == 0, role
    counts, faults = proxy.counts, proxy.faults
    assert counts.dropped > 0 and counts.reset > 0, counts
    # a task leased or a result accepted, and the answer lost: the retry must not lease or count it again
    assert any(TASK_LEASE_PATH in line or TASK_COMPLETE_PATH in line for _, line in faults), faults
    results = accepted_results(run_dir)
    assert sum(int(r["result"]["env_steps"]) for r in results) >= 1500
    assert_exact_accounting(run_dir)
    # a lost lease answer is handed out again on the retry: no lease is left to run out unseen (lease_s is 10 s)
    assert _query(run_dir, "SELECT COUNT(*) FROM leases WHERE state='expired'") == [(0,)]
    assert "max_env_step 1500 reached" in (run_dir / "logs" / "learner-0.log").read_text()
    _no_tracebacks(run_dir)
    no_role_left(run_dir)


@pytest.mark.slow  # 37 s; the three-node partition tests (slow) cover a longer outage through the real network
def test_an_outage_longer_than_one_call_is_survived(tmp_path):
    """The proxy forwards nothing for 13 s: the calls in flight give up (one call's deadline is 10 s) and are sent
    again, nothing is accepted meanwhile, and once the proxy forwards again the actor and the learner go on."""
    run_dir = tmp_path / "run"
    overrides = (
        "system.coordinator.lease_s=3.0",  # the leases held through the outage run out: their late results dropped
        "system.coordinator.n_sample=64",
        "system.coordinator.samples_per_insert=null",
        "evaluator.stop_val=100000",
    )
    with proxied_run(run_dir, 11, *overrides, delay_s=0.05) as (roles, proxy):
        roles.start("league_manager", "--url", proxy.url)
        learner = roles.start("learner", "--url", proxy.url)
        actor = roles.start("actor", "--url", proxy.url)
        _wait(lambda: _learner_env_steps(run_dir) > 0, 90, "the learner ingesting results")
        proxy.pause()
        time.sleep(1.0)  # a request forwarded just before the outage may still be accepted
        accepted, ingested = len(accepted_results(run_dir)), _learner_env_steps(run_dir)
        time.sleep(OUTAGE_S - 1.0)
        assert len(accepted_results(run_dir)) == accepted, "a result was accepted during the outage"
        assert actor.poll() is None and learner.poll() is None
        proxy.resume()
        _wait(lambda: len(accepted_results(run_dir)) >= accepted + 3, 60, "3 more results accepted after the outage")
        _wait(lambda: _learner_env_steps(run_dir) > ingested, 60, "the learner ingesting after the outage")
        learner.send_signal(signal.SIGTERM)  # its stop checkpoint holds the poll cursor
        assert learner.wait(timeout=60) == 0
    assert actor.returncode == 0
    for log in ("actor-0.log", "learner-0.log"):  # a call outlived its deadline and was sent again
        text = (run_dir / "logs" / log).read_text()
        assert "unreachable after" in text and "retrying" in text, log
    assert_exact_accounting(run_dir)
    _no_tracebacks(run_dir)
    no_role_left(run_dir)


def _learner_env_steps(run_dir: Path) -> int:
    """The env steps the learner last reported to the coordinator (read from the coordinator directly)."""
    return int(_status(run_dir)["learner"].get("env_step", 0))
