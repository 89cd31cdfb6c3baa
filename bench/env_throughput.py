"""Env stepping throughput: nervex's env managers against gymnasium, Stable-Baselines3 and Tianshou vector envs.

Every candidate steps N copies of one env with random actions (drawn up front from one table, the same for all),
resetting finished envs the way its library does. Figures are env steps (transitions) per second: the median of
``--reps`` timed windows of ``--window`` seconds each. The candidates of one (env, N) cell are all built first, then
timed round-robin (rep 1 of every candidate, rep 2 of every candidate...), so a load spike from elsewhere on the
machine lands on all of them rather than on one.

Candidates:

- ``plain loop``: one ``gymnasium.make`` env stepped in a bare Python loop (the ceiling of one process; for Pong
  it has the same AtariPreprocessing + FrameStackObservation stack as the peers);
- ``nervex base`` / ``nervex subproc``: ``BaseEnvManager`` / ``SubprocessEnvManager`` over ``GymEnv`` (Pong:
  ``AtariEnv``), driven as the serial actor drives them: ``obs = m.ready_obs; m.step({env_id: action ...})``;
  at N=8 also ``SubprocessEnvManager`` with ``worker_num`` 1 and 2 and, on the burn env, async mode (``wait_num``);
- ``gym sync`` / ``gym async``: ``gymnasium.vector.SyncVectorEnv`` / ``AsyncVectorEnv`` (shared memory, fork,
  autoreset in the same step, as nervex does);
- ``sb3 dummy`` / ``sb3 subproc``: ``DummyVecEnv`` / ``SubprocVecEnv`` (fork);
- ``ts dummy`` / ``ts subproc`` / ``ts shmem``: Tianshou ``DummyVectorEnv`` / ``SubprocVectorEnv`` /
  ``ShmemVectorEnv``; finished envs are reset with ``reset(env_id)`` as Tianshou's collector does.

Envs: ``cartpole`` (CartPole-v1), ``pendulum`` (Pendulum-v1), ``pong`` (PongNoFrameskip-v4 via ale-py; peers get
gymnasium's ``AtariPreprocessing`` (noop 30, frame skip 4, 84x84 grey) + ``FrameStackObservation(4)``, nervex gets
``AtariEnv`` with the same settings: no episodic life, no FIRE reset) and ``burn`` (a 100-step episode env whose
``step`` burns ``--burn-ms`` of CPU time in a busy loop: the case where parallel processes pay off).

A missing peer library is skipped with a message. Processes are started with ``fork`` everywhere.

    python bench/env_throughput.py                                  # everything: about 4 minutes on 2 cores
    python bench/env_throughput.py --envs cartpole,burn --n 8 --reps 3
    python bench/env_throughput.py --envs cartpole --libs nervex,gym --window 1.0 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import gymnasium as gym
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BURN_ID = "NervexBench/Burn-v0"
GYM_IDS = {"cartpole": "CartPole-v1", "pendulum": "Pendulum-v1", "pong": "PongNoFrameskip-v4", "burn": BURN_ID}
ALL_LIBS = ("nervex", "gym", "sb3", "tianshou")
ACTION_ROWS = 4096  # random actions drawn up front, cycled through (a power of two: the index wraps with a mask)
MASK = ACTION_ROWS - 1
WARMUP_S = 0.2
INPROC_PEERS = ("gym sync", "sb3 dummy", "ts dummy")
SUBPROC_PEERS = ("gym async", "sb3 subproc", "ts subproc", "ts shmem")
COL = 21  # table column width

Runner = Callable[[float], Tuple[int, float]]  # run(window_s) -> (env steps, seconds)


# ---- the synthetic CPU-bound env ----------------------------------------------------------------------------------
class BurnEnv(gym.Env):
    """4 float32 observations, 2 actions, reward 1, episodes of ``episode_len`` steps; each ``step`` busy-loops
    until this thread has used ``burn_ms`` of CPU time (CPU time, not wall time: a descheduled process does not
    get its work done for free, so more processes than cores cannot look faster than the cores allow)."""

    metadata: Dict[str, Any] = {"render_modes": []}

    def __init__(self, burn_ms: float = 1.0, episode_len: int = 100) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._burn_s = burn_ms / 1000.0
        self._episode_len = episode_len
        self._t = 0

    def reset(self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None) -> Tuple[Any, Dict]:
        super().reset(seed=seed)
        self._t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action: Any) -> Tuple[Any, float, bool, bool, Dict]:
        deadline = time.thread_time() + self._burn_s
        while time.thread_time() < deadline:
            pass
        self._t += 1
        obs = np.full(4, self._t / self._episode_len, np.float32)
        return obs, 1.0, self._t >= self._episode_len, False, {}


def register_burn_env(burn_ms: float) -> None:
    """Register :class:`BurnEnv` with gymnasium (forked children inherit the registry)."""
    gym.register(BURN_ID, entry_point=BurnEnv, kwargs={"burn_ms": burn_ms}, disable_env_checker=True)


# ---- env factories (module level: picklable by reference) --------------------------------------------------------
class GymFactory:
    """``gym.make`` of one env id, with the standard Atari preprocessing for ALE ids."""

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id

    def __call__(self) -> gym.Env:
        if "NoFrameskip" in self.env_id or self.env_id.startswith("ALE/"):
            import ale_py
            from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

            gym.register_envs(ale_py)
            env = AtariPreprocessing(gym.make(self.env_id), noop_max=30, frame_skip=4, screen_size=84)
            return FrameStackObservation(env, 4)
        return gym.make(self.env_id)


def nervex_env(name: str) -> Tuple[Any, Dict[str, Any]]:
    """``(env_fn, env_cfg)`` of the nervex env for a bench env name."""
    if name == "pong":
        from app_zoo.atari.envs import AtariEnv

        # the peers' preprocessing: gymnasium's AtariPreprocessing has no episodic life and no FIRE reset
        return AtariEnv, dict(env_id=GYM_IDS[name], episodic_life=False, fire_reset=False)
    from nervex.envs import GymEnv

    return GymEnv, dict(env_id=GYM_IDS[name])


# ---- actions -------------------------------------------------------------------------------------------------------
def action_table(space: gym.Space, n: int, seed: int = 0) -> np.ndarray:
    """``ACTION_ROWS`` rows of ``n`` random actions: ``(rows, n)`` ints or ``(rows, n, *shape)`` floats."""
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.n, size=(ACTION_ROWS, n)).astype(np.int64)
    low, high = space.low, space.high
    return rng.uniform(low, high, size=(ACTION_ROWS, n, *space.shape)).astype(space.dtype)


# ---- runners: one inline loop per API, timed with perf_counter every step -----------------------------------------
def plain_runner(factory: GymFactory, table: np.ndarray) -> Tuple[Runner, Callable[[], None]]:
    env = factory()
    env.reset(seed=0)
    actions = table[:, 0].tolist() if table.ndim == 2 else list(table[:, 0])
    state = {"k": 0, "env": env}

    def run(window: float) -> Tuple[int, float]:
        step, reset, acts, k, steps = env.step, env.reset, actions, state["k"], 0
        start = time.perf_counter()
        end = start + window
        while True:
            _, _, terminated, truncated, _ = step(acts[k])
            k = (k + 1) & MASK
            steps += 1
            if terminated or truncated:
                reset()
            now = time.perf_counter()
            if now >= end:
                break
        state["k"] = k
        return steps, now - start

    return run, env.close


def nervex_runner(manager: Any, table: np.ndarray) -> Tuple[Runner, Callable[[], None]]:
    manager.seed(0)
    manager.launch()
    rows = table.tolist() if table.ndim == 2 else [list(row) for row in table]  # Python ints / small arrays
    state = {"k": 0}

    def run(window: float) -> Tuple[int, float]:
        m, k, steps = manager, state["k"], 0
        start = time.perf_counter()
        end = start + window
        while True:
            row = rows[k]
            k = (k + 1) & MASK
            obs = m.ready_obs  # the serial actor's loop: ready observations -> {env_id: action} -> timesteps
            steps += len(m.step({i: row[i] for i in obs}))
            now = time.perf_counter()
            if now >= end:
                break
        state["k"] = k
        return steps, now - start

    return run, manager.close


def autoreset_runner(venv: Any, table: np.ndarray, n: int) -> Tuple[Runner, Callable[[], None]]:
    """gymnasium vector envs and SB3 VecEnvs: ``step(actions)`` resets finished envs itself."""
    if hasattr(venv, "single_action_space"):
        venv.reset(seed=0)
    else:
        venv.seed(0)
        venv.reset()
    state = {"k": 0}

    def run(window: float) -> Tuple[int, float]:
        step, rows, k, steps = venv.step, table, state["k"], 0
        start = time.perf_counter()
        end = start + window
        while True:
            step(rows[k])
            k = (k + 1) & MASK
            steps += n
            now = time.perf_counter()
            if now >= end:
                break
        state["k"] = k
        return steps, now - start

    return run, venv.close


def tianshou_runner(venv: Any, table: np.ndarray, n: int) -> Tuple[Runner, Callable[[], None]]:
    """Tianshou vector envs do not reset finished envs: reset them by id, as its collector does."""
    venv.reset()
    state = {"k": 0}

    def run(window: float) -> Tuple[int, float]:
        step, reset, rows, k, steps = venv.step, venv.reset, table, state["k"], 0
        start = time.perf_counter()
        end = start + window
        while True:
            _, _, terminated, truncated, _ = step(rows[k])
            k = (k + 1) & MASK
            steps += n
            done = np.logical_or(terminated, truncated)
            if done.any():
                reset(np.flatnonzero(done))
            now = time.perf_counter()
            if now >= end:
                break
        state["k"] = k
        return steps, now - start

    return run, venv.close


# ---- candidates ----------------------------------------------------------------------------------------------------
@dataclass
class Candidate:
    name: str
    lib: str
    build: Callable[[], Tuple[Runner, Callable[[], None]]]
    rates: List[float] = field(default_factory=list)


def candidates(env_name: str, n: int, libs: List[str], table: np.ndarray, with_plain: bool) -> List[Candidate]:
    factory = GymFactory(GYM_IDS[env_name])
    fns = [factory] * n
    out: List[Candidate] = []
    if with_plain:
        out.append(Candidate("plain loop (1 env)", "gym", lambda: plain_runner(factory, table)))
    if "nervex" in libs:
        from nervex.worker.actor.env_manager import BaseEnvManager, SubprocessEnvManager

        env_fn, env_cfg = nervex_env(env_name)

        def sub(**kw: Any) -> Callable[[], Tuple[Runner, Callable[[], None]]]:
            return lambda: nervex_runner(SubprocessEnvManager(env_fn, env_cfg, n, context="fork", **kw), table)

        default_workers = min(n, os.cpu_count() or 1)
        out.append(Candidate("nervex base", "nervex", lambda: nervex_runner(BaseEnvManager(env_fn, env_cfg, n), table)))
        out.append(Candidate(f"nervex subproc (w={default_workers}, default)", "nervex", sub()))
        if n == 8:
            for workers in (1, 2):
                if workers != default_workers:
                    out.append(Candidate(f"nervex subproc (w={workers})", "nervex", sub(worker_num=workers)))
            if env_name == "burn":
                out.append(Candidate("nervex subproc async (w=2, wait_num=4)", "nervex", sub(worker_num=2, wait_num=4)))
                out.append(Candidate("nervex subproc async (w=8, wait_num=4)", "nervex", sub(worker_num=8, wait_num=4)))
    if "gym" in libs:
        from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

        same_step = AutoresetMode.SAME_STEP  # reset inside the step that ended the episode, as nervex does
        out.append(
            Candidate(
                "gym sync", "gym", lambda: autoreset_runner(SyncVectorEnv(fns, autoreset_mode=same_step), table, n)
            )
        )
        out.append(
            Candidate(
                "gym async",
                "gym",
                lambda: autoreset_runner(AsyncVectorEnv(fns, context="fork", autoreset_mode=same_step), table, n),
            )
        )
    if "sb3" in libs:
        from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

        out.append(Candidate("sb3 dummy", "sb3", lambda: autoreset_runner(DummyVecEnv(fns), table, n)))
        out.append(
            Candidate("sb3 subproc", "sb3", lambda: autoreset_runner(SubprocVecEnv(fns, start_method="fork"), table, n))
        )
    if "tianshou" in libs:
        from tianshou.env import DummyVectorEnv, ShmemVectorEnv, SubprocVectorEnv

        out.append(Candidate("ts dummy", "tianshou", lambda: tianshou_runner(DummyVectorEnv(fns), table, n)))
        out.append(
            Candidate(
                "ts subproc", "tianshou", lambda: tianshou_runner(SubprocVectorEnv(fns, context="fork"), table, n)
            )
        )
        out.append(Candidate("ts shmem", "tianshou", lambda: tianshou_runner(ShmemVectorEnv(fns), table, n)))
    return out


def available_libs(wanted: List[str]) -> List[str]:
    modules = {"nervex": "nervex", "gym": "gymnasium.vector", "sb3": "stable_baselines3", "tianshou": "tianshou"}
    out = []
    for lib in wanted:
        try:
            __import__(modules[lib])
            out.append(lib)
        except ImportError as e:
            print(f"skipping {lib}: {e} (pip install -e .[bench])", flush=True)
    return out


def measure_cell(env_name: str, n: int, libs: List[str], reps: int, window: float, with_plain: bool) -> List[Candidate]:
    """Build every candidate of one (env, N), warm each up, then time them round-robin ``reps`` times."""
    probe = GymFactory(GYM_IDS[env_name])()
    space = probe.action_space
    probe.close()
    table = action_table(space, n)
    built: List[Tuple[Candidate, Runner, Callable[[], None]]] = []
    try:
        for cand in candidates(env_name, n, libs, table, with_plain):
            try:
                run, close = cand.build()
            except Exception as e:  # noqa: BLE001 - one broken peer must not stop the others
                print(f"  {cand.name}: could not build ({type(e).__name__}: {e}); skipped", flush=True)
                continue
            built.append((cand, run, close))
            run(WARMUP_S)
        for _ in range(reps):
            for cand, run, _ in built:
                steps, seconds = run(window)
                cand.rates.append(steps / seconds)
    finally:
        for _, _, close in built:
            try:
                close()
            except Exception as e:  # noqa: BLE001
                print(f"  close failed: {type(e).__name__}: {e}", flush=True)
        gc.collect()
    return [cand for cand, _, _ in built]


# ---- report --------------------------------------------------------------------------------------------------------
def median(rates: List[float]) -> float:
    return statistics.median(rates) if rates else float("nan")


def best(results: Dict[str, float], names: Tuple[str, ...]) -> Tuple[Optional[str], float]:
    found = [(results[k], k) for k in names if k in results]
    if not found:
        return None, float("nan")
    rate, name = max(found)
    return name, rate


def print_env_table(env_name: str, ns: List[int], table: Dict[int, Dict[str, List[float]]]) -> None:
    names: List[str] = []
    for n in ns:
        for name in table.get(n, {}):
            if name not in names:
                names.append(name)
    width = max(len(x) for x in names) + 2
    print(f"\n{env_name} ({GYM_IDS[env_name]}): env steps/s, median of reps (spread: (max-min)/median)")
    print("".ljust(width) + "".join(f"{'N=' + str(n):>{COL}}" for n in ns))
    for name in names:
        cells = []
        for n in ns:
            rates = table.get(n, {}).get(name)
            if not rates:
                cells.append(f"{'-':>{COL}}")
            else:
                m = median(rates)
                spread = (max(rates) - min(rates)) / m if m else 0.0
                cells.append(f"{m:>{COL - 7},.0f} ({spread:>4.0%})")
        print(name.ljust(width) + "".join(cells))
    print_ratio_table(ns, table, names, width)


def plain_rate(res: Dict[str, float]) -> float:
    return next((v for k, v in res.items() if k.startswith("plain")), float("nan"))


def print_ratio_table(ns: List[int], table: Dict[int, Dict[str, List[float]]], names: List[str], width: int) -> None:
    """Each nervex manager over the best in-process peer, the best subprocess peer and the plain loop."""
    medians = {n: {k: median(v) for k, v in table.get(n, {}).items()} for n in ns}
    peers = {n: (best(medians[n], INPROC_PEERS), best(medians[n], SUBPROC_PEERS)) for n in ns}
    print("ratios: nervex / best in-process peer | / best subprocess peer | / plain loop")
    for name in (x for x in names if x.startswith("nervex")):
        cells = []
        for n in ns:
            rate = medians[n].get(name)
            (_, inproc), (_, subproc) = peers[n]
            if rate is None:
                cells.append(f"{'-':>{COL}}")
            else:
                cells.append(
                    f"{rate / inproc:>{COL - 12}.2f} |{rate / subproc:>5.2f} |{rate / plain_rate(medians[n]):>5.2f}"
                )
        print(name.ljust(width) + "".join(cells))
    for i, kind in enumerate(("in-process", "subprocess")):
        print(f"best {kind} peer: " + ", ".join(f"N={n} {peers[n][i][0]}" for n in ns if peers[n][i][0]))


def best_named(res: Dict[str, float], prefix: str) -> Tuple[str, float]:
    """The fastest candidate whose name starts with ``prefix``: ``(name, rate)``."""
    found = [(v, k) for k, v in res.items() if k.startswith(prefix)]
    rate, name = max(found, default=(float("nan"), "-"))
    return name, rate


def print_targets(results: Dict[str, Dict[int, Dict[str, List[float]]]]) -> None:
    print("\nTargets (N=8, medians):")

    def cell(env_name: str) -> Dict[str, float]:
        return {k: median(v) for k, v in results.get(env_name, {}).get(8, {}).items()}

    def line(label: str, value: float, target: float) -> None:
        verdict = "n/a" if value != value else ("met" if value >= target else "MISSED")
        print(f"  {label:<78} {value:6.2f}  (target >= {target:g}: {verdict})")

    cp = cell("cartpole")
    if cp:
        base = cp.get("nervex base", float("nan"))
        (inproc_name, inproc), (subproc_name, subproc) = best(cp, INPROC_PEERS), best(cp, SUBPROC_PEERS)
        sub_name, sub = best_named(cp, "nervex subproc")
        line(f"CartPole: nervex base / best in-process peer ({inproc_name})", base / inproc, 1.0)
        line("CartPole: nervex base / plain single-env loop", base / plain_rate(cp), 0.8)
        line(f"CartPole: {sub_name} / best subprocess peer ({subproc_name})", sub / subproc, 2.0)
    burn = cell("burn")
    if burn:
        plain = plain_rate(burn)
        for prefix in ("nervex subproc (", "nervex subproc async"):
            name, rate = best_named(burn, prefix)
            line(f"burn 1 ms: {name} / one process (plain loop)", rate / plain, 1.8)


def load_average() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default="cartpole,pendulum,pong,burn", help="comma list of: " + ",".join(GYM_IDS))
    parser.add_argument("--n", default="1,4,8", help="comma list of env counts")
    parser.add_argument("--reps", type=int, default=3, help="timed windows per candidate (the median is reported)")
    parser.add_argument("--window", type=float, default=0.5, help="seconds per timed window")
    parser.add_argument("--libs", default=",".join(ALL_LIBS), help="comma list of: " + ",".join(ALL_LIBS))
    parser.add_argument("--burn-ms", type=float, default=1.0, help="CPU milliseconds per step of the burn env")
    parser.add_argument("--json", default="", help="also write the raw rates here")
    args = parser.parse_args(argv)
    env_names = [e for e in args.envs.split(",") if e]
    unknown = [e for e in env_names if e not in GYM_IDS]
    if unknown:
        parser.error(f"unknown env(s) {unknown}; choose from {list(GYM_IDS)}")
    ns = sorted({int(x) for x in args.n.split(",") if x})
    libs = available_libs([lib for lib in args.libs.split(",") if lib])
    register_burn_env(args.burn_ms)
    if "pong" in env_names:
        try:
            import ale_py

            gym.register_envs(ale_py)
        except ImportError as e:
            print(f"skipping pong: {e} (pip install -e .[atari])", flush=True)
            env_names.remove("pong")

    print(
        f"python {platform.python_version()}, {os.cpu_count()} cpus, gymnasium {gym.__version__}; "
        f"window {args.window}s x {args.reps} reps; libs: {', '.join(libs)}; load average {load_average()}",
        flush=True,
    )
    start = time.perf_counter()
    results: Dict[str, Dict[int, Dict[str, List[float]]]] = {}
    for env_name in env_names:
        for i, n in enumerate(ns):
            t0 = time.perf_counter()
            cands = measure_cell(env_name, n, libs, args.reps, args.window, with_plain=i == 0)
            results.setdefault(env_name, {})[n] = {c.name: c.rates for c in cands}
            print(f"  {env_name} N={n}: {len(cands)} candidates in {time.perf_counter() - t0:.0f}s", flush=True)
        # the plain loop is measured once per env; show it in every column
        first = results[env_name][ns[0]]
        plain = {k: v for k, v in first.items() if k.startswith("plain")}
        for n in ns[1:]:
            results[env_name][n] = {**plain, **results[env_name][n]}
    for env_name in env_names:
        print_env_table(env_name, ns, results[env_name])
    print_targets(results)
    leftovers = mp.active_children()
    print(
        f"\ntotal {time.perf_counter() - start:.0f}s; load average {load_average()} (other work on the machine skews "
        f"the figures); child processes left: {len(leftovers)}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "cpus": os.cpu_count(), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
