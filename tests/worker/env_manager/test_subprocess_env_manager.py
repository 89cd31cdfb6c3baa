"""SubprocessEnvManager: process hygiene, envs per worker, fault recovery (exceptions, crashes, hangs), async."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest

from nervex.envs import BaseEnv, BaseEnvInfo, BaseEnvTimestep, GymEnv
from nervex.worker.actor.env_manager import EnvError, SubprocessEnvManager
from nervex.worker.actor.env_manager.worker_pool import split_envs

from .fault_envs import CountingEnv, ImageEnv


def assert_all_dead(pids):
    alive = {p.pid for p in mp.active_children()}
    assert not alive & set(pids), f"still children: {alive & set(pids)}"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def manager(cfgs, env_num=None, **options):
    options.setdefault("retry_delay", 0.0)
    env_num = env_num or (len(cfgs) if isinstance(cfgs, list) else 2)
    return SubprocessEnvManager(CountingEnv, cfgs, env_num, **options)


@pytest.mark.parametrize(
    "env_num, worker_num, blocks",
    [(4, 2, [(0, 1), (2, 3)]), (5, 2, [(0, 1, 2), (3, 4)]), (3, 3, [(0,), (1,), (2,)]), (1, 1, [(0,)])],
)
def test_split_envs(env_num, worker_num, blocks):
    assert split_envs(env_num, worker_num) == blocks


def test_envs_share_workers_and_close_leaves_no_process():
    with manager({}, env_num=5, worker_num=2) as m:
        m.launch()
        pids = m.worker_pids
        assert len(pids) == 2 and m.worker_num == 2
        for _ in range(4):
            m.step({i: 0 for i in m.ready_obs})
    assert_all_dead(pids)


def test_exception_in_the_parent_still_closes_workers():
    with pytest.raises(ZeroDivisionError):
        with manager({}, env_num=2) as m:
            m.launch()
            pids = m.worker_pids
            raise ZeroDivisionError("the parent fails inside the with block")
    assert_all_dead(pids)


def test_garbage_collected_manager_kills_its_workers():
    m = manager({}, env_num=2)
    m.launch()
    pids = m.worker_pids
    del m
    gc.collect()
    assert_all_dead(pids)


def test_close_kills_a_hung_worker():
    m = manager([dict(fault="hang", fault_step=1), {}], worker_num=2, step_timeout=None)
    m.launch()
    pids = m.worker_pids
    m._send(m._workers[0], "step", ({0: 0}, ()))  # env 0 hangs in step; close must not wait for it
    start = time.monotonic()
    m.close()
    assert time.monotonic() - start < 5.0
    assert_all_dead(pids)


def step_all(m, steps):
    """Step every ready env ``steps`` times; return the timesteps per env."""
    seen = {i: [] for i in range(m.env_num)}
    for _ in range(steps):
        for env_id, ts in m.step({i: 0 for i in m.ready_obs}).items():
            seen[env_id].append(ts)
    return seen


def abnormal(timesteps):
    return [ts for ts in timesteps if ts.info.get("abnormal", False)]


def test_random_exceptions_restart_only_that_env():
    cfgs = [{"episode_len": 5}, dict(fault="raise_prob", fault_prob=0.1, episode_len=5), {"episode_len": 5}, {}]
    with manager(cfgs, worker_num=2, max_retry=5) as m:
        m.launch()
        pids = m.worker_pids
        seen = step_all(m, 200)
        failures = abnormal(seen[1])
        stats = m.stats
        assert len(failures) >= 5  # p=0.1 over ~200 steps
        assert stats["exceptions"] == stats["restarts"] == stats["dropped_episodes"] == len(failures)
        assert {ts.info["reason"] for ts in failures} == {"exception"}
        assert all("ValueError: boom" in ts.info["error"] and "_misbehave" in ts.info["traceback"] for ts in failures)
        assert all(ts.done and ts.reward == 0.0 and "episode_return" not in ts.info for ts in failures)
        for env_id in (0, 2, 3):
            assert len(seen[env_id]) == 200 and not abnormal(seen[env_id])
        assert m.worker_pids == pids  # an exception rebuilds the env, not its process
        # the episode after a failure starts fresh: never stitched to the dropped one
        for prev, nxt in zip(seen[1], seen[1][1:]):
            if prev.info.get("abnormal"):
                assert nxt.info.get("abnormal") or nxt.obs[1] == 1.0


@pytest.mark.parametrize(
    "fault, reason, trace_fragment",
    [
        pytest.param("exit", "crash", "", id="os_exit"),
        pytest.param("segv", "crash", "Segmentation fault", id="sigsegv"),
    ],
)
def test_dead_worker_is_restarted(fault, reason, trace_fragment):
    """Env 1 shares worker 0 with env 0: both lose their episode; envs 2, 3 (worker 1) step on untouched."""
    cfgs = [
        {"episode_len": 50},
        dict(fault=fault, fault_step=3, episode_len=50),
        {"episode_len": 50},
        {"episode_len": 50},
    ]
    with manager(cfgs, worker_num=2) as m:
        m.launch()
        old_pid = m.worker_pids[0]
        seen = step_all(m, 5)
        assert [ts.info.get("abnormal", False) for ts in seen[0]] == [False, False, True, False, False]
        assert [ts.info.get("abnormal", False) for ts in seen[1]] == [False, False, True, False, False]
        for ts in (seen[0][2], seen[1][2]):
            assert ts.info["reason"] == reason and trace_fragment in ts.info["traceback"]
        assert [ts.obs[1] for ts in seen[1][3:]] == [1.0, 2.0]  # a fresh episode after the restart
        assert [ts.obs[1] for ts in seen[2]] == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert m.stats["crashes"] == 1 and m.stats["restarts"] == 2 and m.stats["dropped_episodes"] == 2
        assert m.worker_pids[0] != old_pid and m.worker_pids[1] is not None
        assert_all_dead([old_pid])
        pids = m.worker_pids
    assert_all_dead(pids)


def test_hung_step_times_out_and_the_worker_is_restarted():
    cfgs = [dict(fault="hang", fault_step=2, episode_len=50), {"episode_len": 50}]
    # a step is timed against step_timeout alone; reset_timeout only covers resets (see the PhaseSlot tests below)
    with manager(cfgs, worker_num=2, step_timeout=0.5, reset_timeout=1.5) as m:
        m.launch()
        old_pid = m.worker_pids[0]
        start = time.monotonic()
        seen = step_all(m, 3)
        assert time.monotonic() - start < 3.0
        timed_out = seen[0][1]
        assert timed_out.info["abnormal"] and timed_out.info["reason"] == "timeout"
        assert re.search(
            r"did not answer 'step': stepping for 0\.\d s, over step_timeout=0.5 s", timed_out.info["error"]
        )
        assert "time.sleep" not in timed_out.info["error"]
        assert "_misbehave" in timed_out.info["traceback"]  # where it hung, dumped by the child's faulthandler
        assert [ts.obs[1] for ts in seen[1]] == [1.0, 2.0, 3.0]
        assert m.stats["timeouts"] == 1 and m.stats["restarts"] == 1
        assert_all_dead([old_pid])


class SleepyEnv(BaseEnv):
    """obs ``[env_tag, t]`` (float32), reward 1 per step, ``episode_len`` steps per episode. Slow on purpose:

    - every ``reset`` sleeps ``reset_s`` (launch, restarts and the auto-reset at the end of an episode);
    - ``step`` sleeps ``hang_s`` at step ``hang_step`` of an instance's life (counting from 1; 0: never);
    - ``reset`` number ``hang_reset`` of an instance (counting from 1; 0: never) sleeps ``hang_s``.

    A restarted env is a new instance, so it does not hang again at once.
    """

    config = dict(env_tag=0.0, episode_len=50, reset_s=0.0, hang_step=0, hang_reset=0, hang_s=60.0)

    def __init__(self, cfg=None) -> None:
        super().__init__(dict(self.config, **(cfg or {})))
        self._t = 0
        self._steps = 0
        self._resets = 0

    def seed(self, seed: int) -> None:
        pass

    def reset(self) -> np.ndarray:
        self._resets += 1
        time.sleep(self._cfg["hang_s"] if self._resets == self._cfg["hang_reset"] else self._cfg["reset_s"])
        self._t = 0
        return self._obs()

    def _obs(self) -> np.ndarray:
        return np.array([self._cfg["env_tag"], self._t], dtype=np.float32)

    def step(self, action) -> BaseEnvTimestep:
        self._t += 1
        self._steps += 1
        if self._steps == self._cfg["hang_step"]:
            time.sleep(self._cfg["hang_s"])
        done = self._t >= self._cfg["episode_len"]
        info = {"terminated": done, "truncated": False}
        if done:
            info.update(episode_return=float(self._t), episode_len=self._t)
        return BaseEnvTimestep(self._obs(), 1.0, done, info)

    def info(self) -> BaseEnvInfo:
        return BaseEnvInfo(1, gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), gym.spaces.Discrete(2), None, None)

    def close(self) -> None:
        pass


def timed_step(m, actions):
    start = time.monotonic()
    timesteps = m.step(actions)
    return timesteps, time.monotonic() - start


def test_hung_step_is_caught_after_step_timeout_not_step_plus_reset_timeout():
    """Before the workers wrote their phase, a step got step_timeout + reset_timeout (31 s here) to answer."""
    cfgs = [dict(hang_step=3), dict(env_tag=1.0)]
    with SubprocessEnvManager(SleepyEnv, cfgs, 2, worker_num=2, step_timeout=1, reset_timeout=30, retry_delay=0) as m:
        m.launch()
        old_pid = m.worker_pids[0]
        for _ in range(2):
            m.step({0: 0, 1: 0})
        timesteps, elapsed = timed_step(m, {0: 0, 1: 0})
        assert 1.0 <= elapsed < 3.0  # step_timeout + the traceback dump, kill and restart
        assert timesteps[0].info["reason"] == "timeout" and "over step_timeout=1 s" in timesteps[0].info["error"]
        assert re.search(r'test_subprocess_env_manager\.py", line \d+ in step', timesteps[0].info["traceback"])
        assert timesteps[1].obs.tolist() == [1.0, 3.0] and not timesteps[1].info.get("abnormal", False)
        assert {k: m.stats[k] for k in ("timeouts", "restarts", "crashes", "dropped_episodes")} == {
            "timeouts": 1,
            "restarts": 1,
            "crashes": 0,
            "dropped_episodes": 1,
        }
        assert m.worker_pids[0] != old_pid
        assert_all_dead([old_pid])
        timesteps = m.step({0: 0, 1: 0})  # a fresh episode in the restarted worker
        assert {i: ts.obs.tolist() for i, ts in timesteps.items()} == {0: [0.0, 1.0], 1: [1.0, 4.0]}


def test_slow_auto_reset_inside_a_step_is_not_a_timeout():
    """Env 0's auto-resets take 1.5 s (> step_timeout) inside a step; env 1, in the same worker, steps after them."""
    cfgs = [dict(episode_len=2, reset_s=1.5), dict(env_tag=1.0)]
    with SubprocessEnvManager(SleepyEnv, cfgs, 2, worker_num=1, step_timeout=1, reset_timeout=10, retry_delay=0) as m:
        m.launch()  # a slow first reset: timed against reset_timeout
        seen = [m.step({0: 0, 1: 0})]
        timesteps, elapsed = timed_step(m, {0: 0, 1: 0})
        seen.append(timesteps)
        assert elapsed >= 1.5  # the auto-reset happened inside this step
        assert timesteps[0].done and timesteps[0].info["episode_return"] == 2.0
        assert m.ready_obs[0].tolist() == [0.0, 0.0]  # the next episode's first observation
        seen.append(m.step({0: 0, 1: 0}))
        assert [{i: ts.obs.tolist() for i, ts in step.items()} for step in seen] == [
            {0: [0.0, 1.0], 1: [1.0, 1.0]},
            {0: [0.0, 2.0], 1: [1.0, 2.0]},
            {0: [0.0, 1.0], 1: [1.0, 3.0]},
        ]
        assert not any(ts.info.get("abnormal", False) for step in seen for ts in step.values())
        assert m.stats == dict(restarts=0, dropped_episodes=0, timeouts=0, crashes=0, exceptions=0, reset_requests=0)


def test_hung_auto_reset_is_caught_after_reset_timeout_from_its_start():
    cfgs = [dict(episode_len=2, hang_reset=2), dict(env_tag=1.0)]
    with SubprocessEnvManager(
        SleepyEnv, cfgs, 2, worker_num=1, step_timeout=0.5, reset_timeout=1.5, retry_delay=0
    ) as m:
        m.launch()
        m.step({0: 0, 1: 0})
        timesteps, elapsed = timed_step(m, {0: 0, 1: 0})  # env 0's episode ends; its auto-reset hangs
        assert 1.5 <= elapsed < 3.5
        assert timesteps[0].info["reason"] == "timeout" and timesteps[1].info["reason"] == "timeout"
        assert "did not answer 'step': resetting for 1." in timesteps[0].info["error"]
        assert "over reset_timeout=1.5 s" in timesteps[0].info["error"]
        assert m.stats["timeouts"] == 1 and m.stats["restarts"] == 2


def test_worker_killed_from_outside_is_restarted():
    with manager([{"episode_len": 50}] * 4, worker_num=2) as m:
        m.launch()
        m.step({i: 0 for i in range(4)})
        victim = m.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        timesteps = m.step({i: 0 for i in range(4)})
        assert [timesteps[i].info.get("abnormal", False) for i in range(4)] == [False, False, True, True]
        assert "SIGKILL" in timesteps[2].info["error"]
        assert m.stats["crashes"] == 1
        timesteps = m.step({i: 0 for i in m.ready_obs})
        assert {i: ts.obs[1] for i, ts in timesteps.items()} == {0: 3.0, 1: 3.0, 2: 1.0, 3: 1.0}
        assert_all_dead([victim])


@pytest.mark.parametrize(
    "cfg, phase, fragment",
    [
        pytest.param(dict(fault="raise", fault_step=1), "step", "ValueError: boom at t=1", id="raise"),
        pytest.param(dict(fault="exit", fault_step=1), "step", "exited with code 3", id="exit"),
    ],
)
def test_retries_exhausted_raise_with_env_id_and_child_traceback(cfg, phase, fragment):
    with manager([{}, cfg], worker_num=2, max_retry=2) as m:
        m.launch()
        pids = m.worker_pids
        with pytest.raises(EnvError) as info:
            for _ in range(10):
                m.step({i: 0 for i in m.ready_obs})
        message = str(info.value)
        assert info.value.env_id == 1 and "env 1 failed 3 time(s) in a row (max_retry=2)" in message
        assert fragment in message and phase in message
        if cfg["fault"] != "exit":
            assert "fault_envs.py" in info.value.child_traceback
        pids += m.worker_pids
    assert_all_dead(pids)


def test_env_that_never_resets_fails_the_launch():
    m = manager([{}, dict(fault="reset_raise", fault_step=0)], worker_num=2, max_retry=1)
    with pytest.raises(EnvError) as info:
        m.launch()
    assert "env 1 failed 2 time(s) in a row (max_retry=1)" in str(info.value)
    assert "RuntimeError: reset failed on purpose (in reset)" in str(info.value)
    assert "fault_envs.py" in info.value.child_traceback
    assert not m.launched and not mp.active_children()  # a failed launch closes what it started


def test_async_mode_returns_early():
    cfgs = [dict(delay_s=0.3, episode_len=50), {"episode_len": 50}]
    with manager(cfgs, worker_num=2, wait_num=1) as m:
        m.launch()
        first = m.step({0: 0, 1: 0})
        assert list(first) == [1] and list(m.ready_obs) == [1]  # env 0 is still stepping
        with pytest.raises(KeyError, match="still stepping"):
            m.step({0: 0})
        deadline = time.monotonic() + 5.0
        steps_of_0 = []
        while not steps_of_0 and time.monotonic() < deadline:
            timesteps = m.step({i: 0 for i in m.ready_obs})
            steps_of_0 = [ts for i, ts in timesteps.items() if i == 0]
        assert steps_of_0 and steps_of_0[0].obs[1] == 1.0


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_other_start_methods_give_the_same_rollout(context):
    def trace(**options):
        with SubprocessEnvManager(GymEnv, {"env_id": "CartPole-v1"}, 2, episode_num=2, **options) as m:
            m.seed(3)
            m.launch()
            out = []
            while not m.done:
                out.append({i: ts.obs.tolist() for i, ts in m.step({i: 1 for i in m.ready_obs}).items()})
            # a restarted worker reseeds its envs (seed + id + env_num): say so, rather than only "the rollouts differ"
            assert m.stats["restarts"] == 0, f"{options}: {m.stats}"
            return out

    assert trace(context=context) == trace(context="fork")


def test_unpicklable_env_fn_with_spawn_names_the_fix():
    m = SubprocessEnvManager(lambda cfg: CountingEnv(cfg), {}, 1, context="spawn")
    with pytest.raises(TypeError, match="not a lambda or a local function"):
        m.launch()
    assert not m.launched


def test_non_box_observations_go_through_the_pipe():
    with SubprocessEnvManager(GymEnv, {"env_id": "FrozenLake-v1"}, 2, worker_num=1) as m:
        m.seed(0)
        m.launch()
        assert m._obs_buf is None
        timesteps = m.step({0: 1, 1: 2})
        assert all(isinstance(ts.obs, np.ndarray) and ts.obs.dtype == np.int64 for ts in timesteps.values())


PARENT_SCRIPT = """
import json, os, sys
from nervex.envs import GymEnv
from nervex.worker.actor.env_manager import SubprocessEnvManager
m = SubprocessEnvManager(GymEnv, {{"env_id": "CartPole-v1"}}, 2, worker_num=2)
m.launch()
print(json.dumps(m.worker_pids), flush=True)
{ending}
"""


def process_gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaped yet (it runs no code)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc to tell zombies from live processes")
@pytest.mark.parametrize(
    "ending",
    [
        pytest.param("raise RuntimeError('the parent fails')", id="uncaught_exception"),
        pytest.param("os._exit(1)", id="hard_exit_without_cleanup"),
    ],
)
def test_workers_do_not_outlive_their_parent(ending):
    script = PARENT_SCRIPT.format(ending=ending)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    pids = json.loads(done.stdout.strip().splitlines()[0])
    deadline = time.monotonic() + 10.0  # a hard-exited parent's workers notice within PARENT_CHECK_S
    while not all(process_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftover = [pid for pid in pids if not process_gone(pid)]
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"workers outlived their parent: {leftover}"


@pytest.mark.parametrize("shared_memory", [True, False])
def test_image_observations(shared_memory):
    cfgs = [dict(env_tag=250.0, episode_len=10), dict(env_tag=7.0, episode_len=10)]
    with SubprocessEnvManager(ImageEnv, cfgs, 2, worker_num=2, shared_memory=shared_memory) as m:
        m.launch()
        assert (m._obs_buf is not None) == shared_memory
        firsts = m.ready_obs
        for _ in range(7):
            timesteps = m.step({0: 0, 1: 0})
        assert {i: (ts.obs.dtype, ts.obs.shape) for i, ts in timesteps.items()} == {
            0: (np.uint8, (4, 84, 84)),
            1: (np.uint8, (4, 84, 84)),
        }
        assert {i: set(np.unique(ts.obs).tolist()) for i, ts in timesteps.items()} == {0: {1}, 1: {14}}  # (tag+7)%256
        assert {i: set(np.unique(o).tolist()) for i, o in firsts.items()} == {0: {250}, 1: {7}}  # not overwritten


def test_async_mode_survives_a_crash():
    cfgs = [dict(delay_s=0.02, episode_len=50), dict(fault="exit", fault_step=2, episode_len=50)]
    with manager(cfgs, worker_num=2, wait_num=1) as m:
        m.launch()
        seen = {0: [], 1: []}
        for _ in range(200):
            if min(len(seen[0]), len(seen[1])) >= 4:
                break
            for env_id, ts in m.step({i: 0 for i in m.ready_obs}).items():
                seen[env_id].append(ts)
        reasons = [ts.info.get("reason") for ts in seen[1]]
        assert reasons[:3] == [None, "crash", None] and not abnormal(seen[0])
        assert [ts.obs[1] for ts in seen[0][:4]] == [1.0, 2.0, 3.0, 4.0]
        assert m.stats["crashes"] >= 1
