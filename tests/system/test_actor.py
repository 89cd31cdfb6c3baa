"""The actor role against a real coordinator on 127.0.0.1: what it does while the rate limiter holds it back.

An idle actor (no collect task to be had: the learner has not sampled enough) loads the snapshot its empty lease
answers name, so new weights reach it within its back-off instead of at its next lease; a snapshot that will not load
is logged once, and the weights stay as they were.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest
import torch

from nervex.config import read_config
from nervex.entry import compile_parallel_config
from nervex.system.comm.client import Client
from nervex.system.comm.codec import encode_state_dict
from nervex.system.comm.storage import Storage
from nervex.system.coordinator import Coordinator
from nervex.system.protocol import LEARNER_PROGRESS_PATH, PROTOCOL_VERSION, REGISTER_PATH
from nervex.system.system_config import storage_root

REPO_ROOT = Path(__file__).resolve().parents[2]
CARTPOLE_DQN = REPO_ROOT / "app_zoo" / "classic_control" / "cartpole" / "config" / "cartpole_dqn.yaml"
TOKEN = secrets.token_bytes(32)
LEARNING_STARTS = 16  # env steps let in before the learner has sampled anything: 8-step tasks starting at 0, 8, 16
LET_IN = 3


def make_cfg() -> Any:
    """cartpole_dqn.yaml with one env, a small model, and a rate limiter that lets in three 8-step tasks and no more
    until the learner reports samples (it never does here)."""
    cfg = read_config(CARTPOLE_DQN)
    cfg.env.collector_env_num = 1
    cfg.env.evaluator_env_num = 1
    cfg.policy.learn.learning_starts = LEARNING_STARTS
    cfg.policy.model.hidden_sizes = [32, 32]
    cfg.system = {"coordinator": {"tick_s": 3600.0, "min_free_bytes": 0, "samples_per_insert": 1000.0}}
    return compile_parallel_config(cfg)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll ``condition`` until it holds; the seconds it took. Fails the test after ``timeout_s``."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, f"{what} within {timeout_s} s"
        time.sleep(0.01)
    return time.monotonic() - start


@pytest.fixture
def idle_actor(tmp_path: Path) -> Iterator[Tuple[Any, Coordinator, Client, Storage]]:
    """A coordinator, a learner registered with it, and an actor thread that has collected the three tasks the rate
    limiter lets in and now waits; everything stopped at the end, even when the test fails."""
    from nervex.system.actor import ActorRole

    run_dir = tmp_path / "run"
    coordinator = Coordinator(make_cfg(), str(run_dir), token=TOKEN, logger=logging.getLogger("test_actor.coord"))
    coordinator.start()
    client = Client(coordinator.url, TOKEN, deadline_s=10.0)
    actor = thread = None
    stop = threading.Event()
    try:
        body = dict(worker_id="learner0", role="learner", protocol=PROTOCOL_VERSION)
        client.post(REGISTER_PATH, dict(body, config_hash=coordinator.config_hash))
        actor = ActorRole(
            make_cfg(), str(run_dir), 0, "actor0", url=coordinator.url, token=TOKEN,
            logger=logging.getLogger("test_actor.actor"),
        )  # fmt: skip
        thread = threading.Thread(target=actor.run, args=(stop,), daemon=True)
        thread.start()
        wait_for(lambda: actor.tasks_done == LET_IN, 20.0, "the actor collects the tasks the rate limiter lets in")
        storage = Storage(storage_root(coordinator.cfg, coordinator.run_dir), min_free_bytes=0)
        yield actor, coordinator, client, storage
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=10)
        if actor is not None:
            actor.close()
        client.close()
        coordinator.stop()
    assert thread is None or not thread.is_alive()


def publish(client: Client, storage: Storage, state: Dict[str, Any], policy_iter: int) -> str:
    """Store ``state`` as a snapshot and report it as the learner's newest, as the learner role does."""
    name = storage.put(encode_state_dict(state), "snapshot")
    progress = dict(worker_id="learner0", train_iter=policy_iter, env_step=0, sampled=0, policy_iter=policy_iter)
    client.post(LEARNER_PROGRESS_PATH, dict(progress, snapshot=name))
    return name


def leases_handed_out(coordinator: Coordinator) -> int:
    return sum(1 for task in coordinator.task_table.tasks(kind="collect") if task["state"] != "pending")


def test_an_idle_actor_loads_a_new_snapshot_without_waiting_for_a_task(idle_actor):
    actor, coordinator, client, storage = idle_actor
    leased = leases_handed_out(coordinator)
    state = actor.policy.state_dict()
    trained = {**state, "model": {k: v + 0.25 for k, v in state["model"].items()}}
    name = publish(client, storage, trained, policy_iter=40)
    took = wait_for(lambda: actor.snapshot == name, 3.0, "the idle actor loads the new snapshot")
    assert took < 1.5  # within its back-off (at most 0.5 s) and a round trip through the coordinator
    assert actor.snapshot_iter == 40
    loaded = actor.policy.state_dict()["model"]
    assert all(torch.equal(loaded[k], trained["model"][k]) for k in loaded)
    assert actor.tasks_done == LET_IN and leases_handed_out(coordinator) == leased  # no task was needed for it


def test_an_idle_actor_logs_a_snapshot_it_cannot_load_once_and_keeps_its_weights(idle_actor, caplog):
    actor, coordinator, client, storage = idle_actor
    before = {k: v.clone() for k, v in actor.policy.state_dict()["model"].items()}
    forged = {k: v.clone() for k, v in before.items()}
    last = list(forged)[-1]
    forged[last] = torch.zeros(forged[last].numel() + 1)  # one tensor of the wrong shape
    with caplog.at_level(logging.WARNING, logger="test_actor.actor"):
        name = publish(client, storage, {**actor.policy.state_dict(), "model": forged}, policy_iter=7)
        wait_for(lambda: actor._refused_snapshot == name, 3.0, "the idle actor tries the snapshot")
        time.sleep(1.2)  # two more back-off periods, each answered with the same snapshot
    warnings = [r.getMessage() for r in caplog.records if "could not preload" in r.getMessage()]
    assert len(warnings) == 1 and name in warnings[0] and "size mismatch" in warnings[0], warnings
    assert actor.snapshot is None
    after = actor.policy.state_dict()["model"]
    assert all(torch.equal(before[k], after[k]) for k in before)


# ---- protocol 3: opponents and outcomes ---------------------------------------------------------------------------
def test_a_role_of_the_previous_protocol_is_refused_at_registration(tmp_path, monkeypatch):
    """A protocol-2 actor (no outcomes, ignores opponents) cannot join: its registration is refused with both
    versions named, and the worker exits with status 2 instead of retrying."""
    import nervex.system.role as role
    from nervex.system.role import RoleExit, RoleLink

    coordinator = Coordinator(make_cfg(), str(tmp_path / "run"), token=TOKEN, logger=logging.getLogger("test_actor.v2"))
    coordinator.start()
    monkeypatch.setattr(role, "PROTOCOL_VERSION", PROTOCOL_VERSION - 1)
    link = RoleLink(coordinator.cfg, coordinator.run_dir, "actor", "old-actor", url=coordinator.url, token=TOKEN)
    try:
        with pytest.raises(RoleExit) as refused:
            link.register()
        assert refused.value.code == 2
        message = str(refused.value)
        assert f"speaks protocol {PROTOCOL_VERSION - 1}, this coordinator protocol {PROTOCOL_VERSION}" in message
    finally:
        link.close()
        coordinator.stop()


RESULT = dict(data="samples/" + "0" * 64 + ".safetensors", n_samples=4, env_steps=8, policy_iter=0)


@pytest.mark.parametrize(
    "episodes, field",
    [
        ([{"return": 1.0, "length": 5, "outcome": 2}], "result.episodes[0].outcome"),
        ([{"return": 1.0, "length": 5, "outcome": True}], "result.episodes[0].outcome"),
        ([{"return": 1.0, "length": 5, "outcome": "win"}], "result.episodes[0].outcome"),
        ([{"return": 1.0, "length": 5, "winner": 0}], "result.episodes[0].winner"),
        ([{"return": 1.0, "length": 1, "outcome": 1}] * 9, "result.episodes"),
    ],
    ids=["out of range", "a boolean", "a string", "unknown field", "more episodes than env steps"],
)
def test_a_collect_result_with_a_bad_outcome_is_refused(episodes, field):
    from nervex.system.comm.errors import ProtocolError
    from nervex.system.protocol import validate_collect_result

    with pytest.raises(ProtocolError) as refused:
        validate_collect_result(dict(RESULT, episodes=episodes))
    assert refused.value.status == 400 and refused.value.field == field
    good = [{"return": r, "length": 5, "outcome": o} for r, o in ((1.0, 1), (0.0, 0), (-1.0, -1))]
    assert (
        validate_collect_result(dict(RESULT, episodes=good + [{"return": 3.0, "length": 2}]))["episodes"][0] == good[0]
    )


def test_the_actor_seats_a_tasks_opponent_and_reports_outcomes(tmp_path):
    """Tic-tac-toe: a task naming an opponent snapshot seats it at seat 1 (an eval-mode policy holding those weights);
    a task without one gives seat 1 back to the random slot; every ended game is reported with its outcome."""
    pytest.importorskip("pettingzoo")
    from nervex.system.actor import ActorRole

    cfg = read_config(REPO_ROOT / "app_zoo" / "games" / "tictactoe" / "dist" / "tictactoe_dqn_dist.yaml")
    cfg.env.collector_env_num = 2
    cfg.system.coordinator.tick_s = 3600.0
    cfg = compile_parallel_config(cfg)
    run_dir = tmp_path / "run"
    coordinator = Coordinator(cfg, str(run_dir), token=TOKEN, logger=logging.getLogger("test_actor.ttt"))
    coordinator.start()
    actor = None
    try:
        actor = ActorRole(cfg, str(run_dir), 0, "actor0", url=coordinator.url, token=TOKEN)
        storage = Storage(storage_root(coordinator.cfg, coordinator.run_dir), min_free_bytes=0)
        state = actor.policy.state_dict()
        opponent = {**state, "model": {k: v + 0.5 for k, v in state["model"].items()}}
        name = storage.put(encode_state_dict(opponent), "snapshot")
        gathered = actor._gather({"unit": "sample", "n": 64, "opponent": name, "env_step": 10**6}, "t1")
        seated = actor.actor.seating.slots["task_opponent"]
        assert actor.actor.seating.seat_slots == ("main", "task_opponent") and actor.opponent == name
        weights = seated.mode.forward.__self__.state_dict()["model"]  # the eval-mode policy's own weights
        assert all(torch.equal(weights[k], opponent["model"][k]) for k in weights)
        episodes = gathered["episodes"]
        assert episodes and all(e["outcome"] in (-1, 0, 1) and e["return"] == e["outcome"] for e in episodes)
        actor._gather({"unit": "sample", "n": 8, "opponent": None, "env_step": 10**6}, "t2")
        assert actor.actor.seating.seat_slots == ("main", "opponent") and actor.opponent is None
    finally:
        if actor is not None:
            actor.close()
        coordinator.stop()


def test_an_idle_actor_waits_as_long_as_the_coordinators_hint_asks(idle_actor, monkeypatch):
    """A "no task" answer's ``wait_s`` (live actors / idle_polls_per_s) stretches the idle actor's back-off: 1,000
    idle actors poll at idle_polls_per_s in all, not each every 0.5 s."""
    actor, coordinator, client, storage = idle_actor
    polls: List[float] = []
    record = coordinator.state.seen  # what an empty lease answer calls; the real method is still called
    monkeypatch.setattr(
        coordinator.state, "seen", lambda worker_id: (polls.append(time.monotonic()), record(worker_id))
    )
    time.sleep(2.0)
    own = len(polls)  # its own back-off: at most 0.5 s between polls
    coordinator.state.idle_wait_s = 2.0  # what 200 live actors at idle_polls_per_s = 100 would be told
    time.sleep(1.0)  # its next poll brings the hint
    before = len(polls)
    time.sleep(4.0)
    hinted = len(polls) - before
    assert own >= 3 and hinted <= 5, (own, hinted)  # 1-3 s between polls now (jittered), where 0.5 s made 8
    assert actor.tasks_done == LET_IN
