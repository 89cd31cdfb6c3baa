"""How many actors one coordinator serves: tasks/s and request latency at 50, 200 and 1,000 simulated actors, with 1k
and 100k tasks in the table, and nothing lost or counted twice.

The coordinator is the real one (``python -m nervex.system.coordinator_start``, a process of its own, WAL SQLite on
this disk, signed HTTP on loopback) with ``cartpole_dqn_dist.yaml``'s settings: 10 s leases, 512-step collect tasks,
heartbeats every ``lease_s / 3``. What is simulated is the actors' collection: a simulated actor does what
``ActorRole`` does on the wire (register; lease; collect for ``--task-s`` seconds; write a samples file to the run's
storage; report it and lease the next task in one round trip; heartbeat its leases) without stepping an env. Actors
are grouped into nodes of ``--per-node`` (a manager's node): each node talks to the coordinator from its own loopback
address (127.0.1.N: the per-peer connection cap applies per node, as on a cluster) over at most ``--node-connections``
keep-alive connections (a manager relays with 4 threads), and its heartbeats go either

* ``per-actor``: every actor sends its own ``/v1/heartbeat`` every ``heartbeat_s`` (an actor that talks to the
  coordinator directly), or
* ``batched``: the node sends one ``/v1/heartbeats`` for all its actors every ``heartbeat_s`` (what the manager's relay
  does).

A simulated learner polls the accepted results (``/v1/data/poll``), checks that their seqs come once each and in order,
and deletes their files, so no back-pressure holds the actors (``samples_per_insert: null``, the queue caps raised).
With ``--learner-samples-per-s`` it also reports that sampling rate (``/v1/learner/progress``) and the config's rate
limiter (``samples_per_insert: 32``) decides how many tasks exist: the actors wait idle most of the time, as in a real
off-policy run with many actors.

For each table size the bench opens a fresh run dir, fills the table with that many done tasks (through
``TaskTable``, the coordinator's own class, before the coordinator starts), starts the coordinator, and runs each actor
count for ``--window`` seconds, starting ``--warmup`` seconds after every actor registered and leased once. Reported
per window: accepted tasks/s, env steps/s, p50/p99 of each route's latency as the client sees it (send to whole
answer), the coordinator's CPU seconds per request (``/proc/<pid>/stat``), and at the end the check: every task done at most once, the coordinator's accepted env steps
equal to the sum of the accepted results the actors reported plus the prefill, every seq delivered once.

    python bench/coordinator_load.py                        # 1k and 100k tasks x 50/200/1000 actors, ~10 minutes
    python bench/coordinator_load.py --tables 1000 --actors 50 --window 5 --warmup 2     # a smoke run
    python bench/coordinator_load.py --task-s 0             # saturation: actors report as fast as they are answered
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nervex.system.comm.auth import load_or_create_token, sign_request  # noqa: E402
from nervex.system.comm.storage import Storage  # noqa: E402
from nervex.system.coordinator.run_state import RunState  # noqa: E402
from nervex.system.coordinator.service import STATE_FILE, TABLE_FILE  # noqa: E402
from nervex.system.coordinator.task_table import TaskTable  # noqa: E402
from nervex.system.protocol import (  # noqa: E402
    DATA_POLL_PATH,
    HEARTBEAT_PATH,
    HEARTBEATS_PATH,
    LEARNER_PROGRESS_PATH,
    MAX_POLL_LIMIT,
    PROTOCOL_VERSION,
    REGISTER_PATH,
    TASK_COMPLETE_PATH,
    TASK_LEASE_PATH,
)

DIST_CONFIG = os.path.join(ROOT, "app_zoo/classic_control/cartpole/dist/cartpole_dqn_dist.yaml")
TASK_STEPS = 512  # the config's system.coordinator.n_sample
SAMPLES_PER_INSERT = 32  # the config's system.coordinator.samples_per_insert
OVERRIDES = [
    "system.coordinator.samples_per_insert=null",  # no learner trains: the rate limiter would hold every actor
    "system.coordinator.max_queued_results=1000000",
    "system.coordinator.max_pending_collect=2048",  # one waiting task per actor and more (see docs/parallel.md)
    "system.coordinator.max_connections_per_peer=64",  # per simulated node (its own loopback address)
    "max_env_step=100000000000",
]
P99_TARGET_MS = 100.0


# ---- a minimal keep-alive HTTP/1.1 client for asyncio (thousands of requests a second from one core) -------------
class Connection:
    def __init__(self, host: str, port: int, local: str) -> None:
        self.host, self.port, self.local = host, port, local
        self.reader: Optional[asyncio.StreamReader] = None
        self.writer: Optional[asyncio.StreamWriter] = None

    async def post(self, token: bytes, path: str, body_obj: Any) -> Tuple[int, Any]:
        body = json.dumps(body_obj, separators=(",", ":")).encode()
        head = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}", "Content-Type: application/json"]
        head.append(f"Content-Length: {len(body)}")
        head += [f"{k}: {v}" for k, v in sign_request(token, "POST", path, body).items()]
        for attempt in range(2):  # a keep-alive connection the server closed (idle timeout) is opened again once
            try:
                if self.writer is None:
                    self.reader, self.writer = await asyncio.open_connection(
                        self.host, self.port, local_addr=(self.local, 0)
                    )
                self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
                status_line = await self.reader.readline()
                if not status_line:
                    raise ConnectionError("closed")
                status, length = int(status_line.split()[1]), 0
                while True:
                    line = await self.reader.readline()
                    if line in (b"\r\n", b""):
                        break
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                payload = await self.reader.readexactly(length)
                return status, json.loads(payload) if payload else {}
            except (ConnectionError, asyncio.IncompleteReadError, OSError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Pool:
    """A node's connections: at most ``size`` requests in flight at once (a manager's relay threads)."""

    def __init__(self, host: str, port: int, local: str, size: int) -> None:
        self.free: asyncio.Queue = asyncio.Queue()
        for _ in range(size):
            self.free.put_nowait(Connection(host, port, local))

    async def post(self, token: bytes, path: str, body: Any) -> Tuple[int, Any]:
        connection = await self.free.get()
        try:
            return await connection.post(token, path, body)
        finally:
            self.free.put_nowait(connection)

    def close(self) -> None:
        while not self.free.empty():
            self.free.get_nowait().close()


# ---- the load ---------------------------------------------------------------------------------------------------
@dataclass
class Tally:
    latencies: Dict[str, List[float]] = field(default_factory=dict)
    statuses: Dict[str, int] = field(default_factory=dict)
    accepted_tasks: int = 0
    accepted_env_steps: int = 0
    requests: int = 0
    measuring: bool = False
    done_tasks: List[str] = field(default_factory=list)  # every accepted task id (all windows)
    env_steps_all: int = 0

    def note(self, route: str, seconds: float, status: int) -> None:
        self.requests += self.measuring
        if self.measuring:
            self.latencies.setdefault(route, []).append(seconds)
        if status != 200:
            key = f"{route} {status}"
            self.statuses[key] = self.statuses.get(key, 0) + 1


class Load:
    def __init__(self, url: str, token: bytes, storage: Storage, args: argparse.Namespace, tag: str) -> None:
        host, port = url.split("//")[1].split(":")
        self.host, self.port = host, int(port)
        self.token, self.storage, self.args, self.tag = token, storage, args, tag
        self.tally = Tally()
        self.stop = asyncio.Event()
        self.held: Dict[str, Dict[str, str]] = {}  # actor id -> {lease id: task id}
        self.heartbeat_s = 10.0 / 3
        self.sampled_base = 0  # the learner's samples before the bench (what the prefilled results allowed)
        self.started = 0  # actors registered and past their first lease

    async def call(self, pool: Pool, route: str, body: Dict[str, Any]) -> Tuple[int, Any]:
        start = time.perf_counter()
        status, answer = await pool.post(self.token, route, body)
        self.tally.note(route, time.perf_counter() - start, status)
        return status, answer

    async def actor(self, pool: Pool, actor_id: str) -> None:
        status, answer = await self.call(pool, REGISTER_PATH, self._register(actor_id, "actor"))
        assert status == 200, answer
        self.heartbeat_s = float(answer["heartbeat_s"])
        held = self.held.setdefault(actor_id, {})
        task, wait = await self._lease(pool, actor_id)
        self.started += 1
        while not self.stop.is_set():
            if task is None:  # what ActorRole does: its own back-off, or the coordinator's longer wait_s, jittered
                await asyncio.sleep(max(0.05, wait * random.uniform(0.5, 1.5)))
                task, wait = await self._lease(pool, actor_id)
                continue
            held[task["lease_id"]] = task["task_id"]
            await asyncio.sleep(self.args.task_s)  # collecting
            data = f"{self.tag} {task['task_id']} {task['lease_id']}".encode()
            name = await asyncio.to_thread(self.storage.put, data, "samples")
            result = {"data": name, "n_samples": TASK_STEPS, "env_steps": TASK_STEPS, "episodes": [], "policy_iter": 0}
            body = dict(worker_id=actor_id, task_id=task["task_id"], lease_id=task["lease_id"], result=result)
            body.update(lease_next="collect", request_id=os.urandom(8).hex())
            status, answer = await self.call(pool, TASK_COMPLETE_PATH, body)
            while status in (429, 503, 507):
                await asyncio.sleep(0.1)
                status, answer = await self.call(pool, TASK_COMPLETE_PATH, body)
            assert status == 200, (status, answer)
            held.pop(task["lease_id"], None)
            if answer["accepted"]:
                self.tally.done_tasks.append(task["task_id"])
                self.tally.env_steps_all += TASK_STEPS
                if self.tally.measuring:
                    self.tally.accepted_tasks += 1
                    self.tally.accepted_env_steps += TASK_STEPS
            task, wait = answer["next"]["task"], float(answer["next"].get("wait_s") or 0.0)

    async def _lease(self, pool: Pool, actor_id: str) -> Tuple[Optional[Dict[str, Any]], float]:
        body = {"worker_id": actor_id, "kind": "collect", "request_id": os.urandom(8).hex()}
        status, answer = await self.call(pool, TASK_LEASE_PATH, body)
        if status != 200:
            return None, 1.0
        return answer.get("task"), float(answer.get("wait_s") or 0.0)

    def _register(self, worker_id: str, role: str) -> Dict[str, Any]:
        return {"worker_id": worker_id, "role": role, "protocol": PROTOCOL_VERSION, "config_hash": self.config_hash}

    async def heartbeats(self, pool: Pool, node_id: str, actors: Sequence[str]) -> None:
        """The node's heartbeats: one batched call, or one call per actor, every heartbeat_s."""
        if self.args.heartbeats == "batched":
            status, answer = await self.call(pool, REGISTER_PATH, self._register(node_id, "manager"))
            assert status == 200, answer
        await asyncio.sleep(self.heartbeat_s * (hash(node_id) % 1000) / 1000)  # nodes out of phase
        while not self.stop.is_set():
            if self.args.heartbeats == "batched":
                beats = [{"worker_id": a, "lease_ids": list(self.held.get(a, {}))} for a in actors]
                await self.call(pool, HEARTBEATS_PATH, {"worker_id": node_id, "beats": beats})
            else:
                await asyncio.gather(
                    *(
                        self.call(pool, HEARTBEAT_PATH, {"worker_id": a, "lease_ids": list(self.held.get(a, {}))})
                        for a in actors
                        if a in self.held
                    )
                )
            await asyncio.sleep(self.heartbeat_s)

    async def learner(self, pool: Pool, since_seq: int, seen: List[int]) -> None:
        learner_id = f"{self.tag}-learner"
        status, answer = await self.call(pool, REGISTER_PATH, self._register(learner_id, "learner"))
        assert status == 200, answer
        started = time.monotonic()
        while True:
            if self.args.learner_samples_per_s:  # a learner sampling at this rate: the rate limiter's input
                sampled = self.sampled_base + int((time.monotonic() - started) * self.args.learner_samples_per_s)
                progress = dict(worker_id=learner_id, train_iter=sampled // 64, env_step=0, sampled=sampled)
                await self.call(pool, LEARNER_PROGRESS_PATH, dict(progress, policy_iter=sampled // 64))
            status, answer = await self.call(
                pool, DATA_POLL_PATH, {"worker_id": learner_id, "since_seq": since_seq, "limit": MAX_POLL_LIMIT}
            )
            items = answer.get("items", []) if status == 200 else []
            for item in items:
                seen.append(item["seq"])
                since_seq = item["seq"]
            if items:
                names = [item["result"]["data"] for item in items]
                await asyncio.to_thread(lambda names=names: [self.storage.delete(n) for n in names])
            elif self.stop.is_set():
                return
            await asyncio.sleep(0.2)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: List[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else float("nan")


# ---- one table size ---------------------------------------------------------------------------------------------
def prefill(run_dir: str, tasks: int) -> int:
    """``tasks`` done collect tasks in a fresh task table (what a long run leaves behind); returns the last seq."""
    table = TaskTable(os.path.join(run_dir, TABLE_FILE), lease_s=10.0, max_attempts=3)
    table.db.connection().execute("PRAGMA synchronous=OFF")  # filling, not measuring
    table.register("prefill-actor", "actor", {})
    payload = {"unit": "sample", "n": TASK_STEPS, "restart_envs": False, "snapshot": None, "policy_iter": 0}
    for index in range(tasks):
        table.add_task("collect", dict(payload, task_index=index), task_id=f"collect-{index:08d}")
        leased = table.lease("prefill-actor", "collect")
        result = {"data": f"samples/{index:064x}.safetensors", "n_samples": TASK_STEPS, "env_steps": TASK_STEPS}
        table.complete(leased["task_id"], leased["lease_id"], dict(result, episodes=[], policy_iter=0))
    last_seq = int(table.db.one("SELECT COALESCE(MAX(seq), 0) FROM tasks"))
    table.close()
    state = RunState(os.path.join(run_dir, STATE_FILE))
    state.put("next_task_index", tasks)
    state.put("delivered_seq", last_seq)
    state.close()
    return last_seq


def start_coordinator(run_dir: str, rate_limited: bool = False) -> subprocess.Popen:
    command = [sys.executable, "-m", "nervex.system.coordinator_start", "--config", DIST_CONFIG, "--run-dir", run_dir]
    overrides = OVERRIDES[1:] if rate_limited else OVERRIDES  # the config's samples_per_insert (32) or none
    command += ["--port", "0"] + [arg for item in overrides for arg in ("--set", item)]
    with open(os.path.join(run_dir, "coordinator.out"), "wb") as out:  # waitress's queue-depth warnings go here
        process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    url_file = os.path.join(run_dir, "coordinator.url")
    deadline = time.monotonic() + 300
    while not os.path.exists(url_file):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the coordinator did not start (status {process.poll()}); see {run_dir}/logs")
        time.sleep(0.2)
    return process


async def run_table(args: argparse.Namespace, table_tasks: int, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    run_dir = tempfile.mkdtemp(prefix="nervex_coord_load_")
    try:
        started = time.monotonic()
        last_seq = prefill(run_dir, table_tasks)
        print(f"[table {table_tasks}] prefilled in {time.monotonic() - started:.0f} s", flush=True)
        process = start_coordinator(run_dir, rate_limited=bool(args.learner_samples_per_s))
        try:
            with open(os.path.join(run_dir, "coordinator.url")) as f:
                url = f.read().strip()
            token = load_or_create_token(run_dir)
            storage = Storage(os.path.join(run_dir, "storage"), min_free_bytes=0)
            check = await measure_windows(args, url, token, storage, process.pid, table_tasks, last_seq, rows)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        check.update(verify(run_dir, table_tasks, check))
        return check
    finally:
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)


async def measure_windows(
    args: argparse.Namespace,
    url: str,
    token: bytes,
    storage: Storage,
    pid: int,
    table_tasks: int,
    last_seq: int,
    rows: List[Dict[str, Any]],
) -> Dict[str, Any]:
    seen: List[int] = []
    learner_load = Load(url, token, storage, args, "learner")
    learner_load.config_hash = config_hash_of(url, token)
    learner_load.sampled_base = table_tasks * TASK_STEPS * SAMPLES_PER_INSERT
    learner_pool = Pool(learner_load.host, learner_load.port, "127.0.0.2", 1)
    learner_task = asyncio.create_task(learner_load.learner(learner_pool, last_seq, seen))
    done_tasks: List[str] = []
    env_steps = 0
    for n_actors in args.actors:
        load = Load(url, token, storage, args, f"a{n_actors}")
        load.config_hash = learner_load.config_hash
        nodes = [list(range(i, min(i + args.per_node, n_actors))) for i in range(0, n_actors, args.per_node)]
        jobs, pools = [], []
        for n, members in enumerate(nodes):
            pool = Pool(load.host, load.port, f"127.0.1.{n + 1}", args.node_connections)
            pools.append(pool)
            actor_ids = [f"{load.tag}-n{n}-a{i}" for i in members]
            jobs += [asyncio.create_task(load.actor(pool, a)) for a in actor_ids]
            jobs.append(asyncio.create_task(load.heartbeats(pool, f"{load.tag}-node{n}", actor_ids)))
        # the window starts --warmup s after every actor registered and asked for its first task (1,000 actors
        # starting at once queue their registrations for seconds; a real cluster starts them over minutes)
        while load.started < n_actors:
            await asyncio.sleep(0.1)
        await asyncio.sleep(args.warmup)
        load.tally.measuring = True
        cpu0, wall0 = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(args.window)
        load.tally.measuring = False
        cpu, wall = cpu_seconds(pid) - cpu0, time.monotonic() - wall0
        load.stop.set()
        await asyncio.gather(*jobs, return_exceptions=False)
        for pool in pools:
            pool.close()
        done_tasks += load.tally.done_tasks
        env_steps += load.tally.env_steps_all
        row = summarize(args, table_tasks, n_actors, load.tally, cpu, wall)
        rows.append(row)
        print(format_row(row), flush=True)
    learner_load.stop.set()
    await learner_task
    learner_pool.close()
    return {"done_tasks": done_tasks, "env_steps": env_steps, "seen": seen, "last_seq": last_seq}


def config_hash_of(url: str, token: bytes) -> str:
    import requests

    body = b"{}"
    headers = sign_request(token, "POST", "/v1/status", body)
    answer = requests.post(url + "/v1/status", data=body, headers=dict(headers, **{"Content-Type": "application/json"}))
    answer.raise_for_status()
    return answer.json()["config_hash"]


def summarize(
    args: argparse.Namespace, table_tasks: int, n_actors: int, tally: Tally, cpu: float, wall: float
) -> Dict[str, Any]:
    routes = {}
    for route, values in sorted(tally.latencies.items()):
        routes[route] = {
            "n": len(values),
            "p50_ms": 1e3 * percentile(values, 0.5),
            "p99_ms": 1e3 * percentile(values, 0.99),
        }
    every = [v for values in tally.latencies.values() for v in values]
    return {
        "table_tasks": table_tasks,
        "actors": n_actors,
        "heartbeats": args.heartbeats,
        "task_s": args.task_s,
        "learner_samples_per_s": args.learner_samples_per_s,
        "tasks_per_s": tally.accepted_tasks / wall,
        "env_steps_per_s": tally.accepted_env_steps / wall,
        "requests_per_s": tally.requests / wall,
        "p50_ms": 1e3 * percentile(every, 0.5),
        "p99_ms": 1e3 * percentile(every, 0.99),
        "coordinator_cpu_per_s": cpu / wall,
        "coordinator_ms_per_request": 1e3 * cpu / max(tally.requests, 1),
        "refusals": tally.statuses,
        "routes": routes,
    }


def format_row(row: Dict[str, Any]) -> str:
    complete = row["routes"].get(TASK_COMPLETE_PATH, {})
    return (
        f"table {row['table_tasks']:>6} | actors {row['actors']:>4} | {row['tasks_per_s']:7.1f} tasks/s | "
        f"{row['requests_per_s']:7.1f} req/s | p50 {row['p50_ms']:6.1f} ms p99 {row['p99_ms']:7.1f} ms | complete "
        f"p99 {complete.get('p99_ms', float('nan')):7.1f} ms | coordinator {row['coordinator_cpu_per_s']:.2f} cores, "
        f"{row['coordinator_ms_per_request']:.2f} ms/request | refusals {row['refusals'] or '-'}"
    )


def verify(run_dir: str, table_tasks: int, check: Dict[str, Any]) -> Dict[str, Any]:
    """Nothing lost or counted twice: each accepted task once, env steps summed right, every seq delivered once."""
    done = check["done_tasks"]
    table = TaskTable(os.path.join(run_dir, TABLE_FILE), lease_s=10.0, max_attempts=3)
    try:
        done_in_table = table.count(state="done", kind="collect") - table_tasks
        seqs = [row[0] for row in table.db.query("SELECT seq FROM tasks WHERE seq > ? ORDER BY seq", (table_tasks,))]
    finally:
        table.close()
    state = RunState(os.path.join(run_dir, STATE_FILE))
    try:
        accepted_steps = state.env_steps
    finally:
        state.close()
    seen = check["seen"]
    problems = []
    if len(set(done)) != len(done):
        problems.append(f"{len(done) - len(set(done))} task(s) accepted twice")
    if done_in_table != len(done):
        problems.append(f"the table holds {done_in_table} new done tasks, the actors saw {len(done)} accepted")
    if accepted_steps != table_tasks * TASK_STEPS + check["env_steps"]:
        problems.append(
            f"accepted env steps {accepted_steps} != prefill {table_tasks * TASK_STEPS} + reported {check['env_steps']}"
        )
    if seen != seqs:
        problems.append(f"the learner saw {len(seen)} seqs ({len(set(seen))} distinct), the table has {len(seqs)}")
    return {"accepted": len(done), "problems": problems}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, nargs="+", default=[1000, 100000], help="done tasks in the table")
    parser.add_argument("--actors", type=int, nargs="+", default=[50, 200, 1000])
    parser.add_argument("--task-s", type=float, default=1.0, help="seconds a simulated actor collects one task")
    parser.add_argument("--heartbeats", choices=["batched", "per-actor"], default="batched")
    parser.add_argument(
        "--learner-samples-per-s",
        type=float,
        default=None,
        help="a learner sampling this many transitions a second, with the config's rate limiter (samples_per_insert "
        "32): actors collect only what it allows and wait idle otherwise; default: no rate limiter",
    )
    parser.add_argument("--per-node", type=int, default=16, help="actors per node (one manager each)")
    parser.add_argument("--node-connections", type=int, default=4, help="a node's connections to the coordinator")
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--keep", action="store_true", help="keep the run dirs")
    args = parser.parse_args(argv)
    print(
        f"coordinator_load: {platform.node()}, {os.cpu_count()} cores, python {platform.python_version()}; "
        f"task_s {args.task_s}, {args.per_node} actors per node, heartbeats {args.heartbeats}, learner samples/s "
        f"{args.learner_samples_per_s or 'unlimited'}",
        flush=True,
    )
    rows: List[Dict[str, Any]] = []
    failed = False
    for table_tasks in args.tables:
        check = asyncio.run(run_table(args, table_tasks, rows))
        print(f"[table {table_tasks}] {check['accepted']} tasks accepted; check: {check['problems'] or 'ok'}")
        failed |= bool(check["problems"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
