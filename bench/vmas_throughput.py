"""Collection throughput on VMAS: nervex's ``VmasEnvManager`` against VMAS's own batched loop, random actions.

Frames are env steps (one step of one env with all its agents): a batched step of N envs is N frames. Candidates,
each stepping ``simple_spread`` (3 agents, 100 steps, discrete actions) with N envs on one thread:

- ``vmas raw``: ``vmas.make_env(num_envs=N)`` stepped with per-agent ``(N, 1)`` action tensors drawn up front,
  the whole batch reset when it is done (every env ends at step 100 together): VMAS's ceiling;
- ``nervex manager``: ``VmasEnvManager`` driven as the actor drives an env manager, ``ready_obs`` then
  ``step({env_id: action})`` with per-env ``(3,)`` actions drawn up front (the per-env dict interface's cost);
- ``nervex actor``: ``SerialActor.collect(CollectSpec('sample', N * 20), random_action=True)`` with DQN's collect
  mode: per-env random legal actions, transitions, the n-step Adder (what a random warm-up costs).

Medians of ``--reps`` windows of ``--window`` seconds, candidates timed round-robin so a load spike lands on all;
``--clock cpu`` times the windows in this process's CPU seconds (for a machine shared with other jobs).

    OMP_NUM_THREADS=1 python bench/vmas_throughput.py --n 32,128 --reps 3 --window 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

ENV_CFG = dict(scenario="simple_spread", max_steps=100, scenario_kwargs=dict(n_agents=3, obs_agents=True))
ACTION_ROWS = 64


def raw_vmas(n: int) -> Callable[[], int]:
    import vmas

    env = vmas.make_env("simple_spread", num_envs=n, continuous_actions=False, max_steps=100, seed=0, n_agents=3)
    env.reset()
    table = torch.randint(0, 9, (ACTION_ROWS, 3, n, 1))
    k = [0]

    def step() -> int:
        actions = list(table[k[0] % ACTION_ROWS])
        k[0] += 1
        _, _, done, _ = env.step(actions)
        if done.all():
            env.reset()
        elif done.any():
            for i in torch.nonzero(done).flatten().tolist():
                env.reset_at(i)
        return n

    return step


def nervex_manager(n: int) -> Callable[[], int]:
    from nervex.envs.vmas_env import VmasEnv
    from nervex.worker.actor.env_manager import VmasEnvManager

    manager = VmasEnvManager(VmasEnv, ENV_CFG, env_num=n)
    manager.seed(0)
    manager.launch()
    table = np.random.default_rng(0).integers(0, 9, (ACTION_ROWS, n, 3))
    k = [0]

    def step() -> int:
        rows = table[k[0] % ACTION_ROWS]
        k[0] += 1
        obs = manager.ready_obs
        manager.step({env_id: rows[env_id] for env_id in obs})
        return n

    return step


def nervex_actor(n: int) -> Callable[[], int]:
    from nervex.config import read_config
    from nervex.entry.builder import compile_config, make_actor, make_env_managers, make_policy
    from nervex.policy import CollectSpec

    cfg = read_config(os.path.join(ROOT, "app_zoo", "multiagent", "vmas", "config", "vmas_simple_spread_qmix.yaml"))
    cfg["env"]["collector_env_num"] = n
    cfg["policy"] = dict(policy_type="dqn", model=dict(hidden_sizes=[64]))
    cfg.pop("replay_buffer", None)
    cfg = compile_config(cfg)
    manager, _, info = make_env_managers(cfg, 0, evaluator=False)
    actor = make_actor(cfg, manager, make_policy(cfg, info, enable_field=["collect"]), seed=0)
    spec = CollectSpec("sample", n * 20)

    def step() -> int:
        actor.collect(spec, random_action=True)
        return n * 20

    return step


CANDIDATES: Dict[str, Callable[[int], Callable[[], int]]] = {
    "vmas raw": raw_vmas,
    "nervex manager": nervex_manager,
    "nervex actor": nervex_actor,
}


def measure(n: int, reps: int, window: float, clock: Callable[[], float] = time.perf_counter) -> Dict[str, float]:
    steppers = {name: make(n) for name, make in CANDIDATES.items()}
    for step in steppers.values():  # warm-up
        step()
    rates: Dict[str, List[float]] = {name: [] for name in steppers}
    for _ in range(reps):
        for name, step in steppers.items():
            frames, start = 0, clock()
            while clock() - start < window:
                frames += step()
            rates[name].append(frames / (clock() - start))
    return {name: statistics.median(r) for name, r in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", default="32,128", help="comma-separated env counts")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--json", default="", help="write the figures there too")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: frames per CPU second of this process (on a "
        "machine shared with other jobs, where wall time measures the other jobs too)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = {}
    for n in [int(x) for x in args.n.split(",")]:
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        out[n] = figures = measure(n, args.reps, args.window, clock)
        raw = figures["vmas raw"]
        print(f"N={n}: " + ", ".join(f"{k} {v:,.0f} fps ({v / raw:.0%})" for k, v in figures.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
