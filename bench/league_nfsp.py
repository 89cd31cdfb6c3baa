"""The peer of ``bench/league.py``: open_spiel's own PyTorch NFSP on Kuhn and Leduc poker, with its example settings.

Both NFSP agents train by self-play exactly as open_spiel's examples do (one ``rl_environment`` episode after another,
every agent stepped with the final time step); at each evaluation the **average policy** of both agents is scored by
its exact exploitability (``exploitability.exploitability(game, NFSPPolicies(..., AVERAGE_POLICY))``, as in
``nfsp_kuhn_pytorch.py``). One JSON record per seed: date, machine, the command, the settings (the example's flags and
every default of ``NFSP``/``DQN`` they leave in force) and the curve of ``{episodes, wall_secs, exploitability}``, where
``wall_secs`` is training time only (evaluation excluded); ``cpu_secs`` is this process's CPU time over the same
spans, the figure to read on a shared machine (the training is single-threaded by default).

    python bench/league_nfsp.py --game kuhn_poker --seeds 0 1 2 --seconds 600 --out DIR
    python bench/league_nfsp.py --game leduc_poker --seeds 0 --seconds 180 --eval-seconds 10
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch/numpy load, as in bench/marl.py

import argparse
import datetime
import inspect
import json
import random
import sys
import time
import traceback
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)

RESULTS_DIR = os.path.join(ROOT, "bench", "results", "league")
LIB = "open_spiel_nfsp"

# The example settings, open-spiel 2.0.2 (open_spiel/python/examples/nfsp_kuhn_pytorch.py and nfsp_leduc_pytorch.py,
# installed as open_spiel.python.examples.*; the pytorch examples of the older kuhn_nfsp.py / leduc_nfsp.py):
# - Kuhn: flags hidden_layers_sizes=[128], replay_buffer_capacity=2e5, reservoir_buffer_capacity=2e6,
#   anticipatory_param=0.1; main() passes epsilon_decay_duration=num_train_episodes (flag default 3e6),
#   epsilon_start=0.06, epsilon_end=0.001. Everything else is NFSP's / DQN's default (see resolved_settings):
#   batch_size=128, rl_learning_rate=sl_learning_rate=0.01, min_buffer_size_to_learn=1000, learn_every=64,
#   optimizer_str='sgd', loss_str='mse', update_target_network_every=1000, weight_update_coeff=0.995,
#   discount_factor=1.0, epsilon_decay_schedule_str='exp'.
# - Leduc: the same network, capacities and anticipatory parameter, every flag passed explicitly: batch_size=128,
#   learn_every=64, rl/sl learning rates 0.01, sgd, mse, min_buffer_size_to_learn=1000,
#   update_target_network_every=19200, discount_factor=1.0, epsilon 0.06 -> 0.001 over epsilon_decay_duration=20e6.
# The epsilon schedule counts the inner DQN's steps (open_spiel's code), whatever the examples' flag names say.
EXAMPLE_SETTINGS: Dict[str, Dict[str, Any]] = {
    "kuhn_poker": dict(
        hidden_layers_sizes=[128],
        reservoir_buffer_capacity=int(2e6),
        anticipatory_param=0.1,
        replay_buffer_capacity=int(2e5),
        epsilon_decay_duration=int(3e6),
        epsilon_start=0.06,
        epsilon_end=0.001,
    ),
    "leduc_poker": dict(
        hidden_layers_sizes=[128],
        reservoir_buffer_capacity=int(2e6),
        anticipatory_param=0.1,
        replay_buffer_capacity=int(2e5),
        min_buffer_size_to_learn=1000,
        batch_size=128,
        learn_every=64,
        rl_learning_rate=0.01,
        sl_learning_rate=0.01,
        optimizer_str="sgd",
        loss_str="mse",
        update_target_network_every=19200,
        discount_factor=1.0,
        epsilon_decay_duration=int(20e6),
        epsilon_start=0.06,
        epsilon_end=0.001,
    ),
}
EXAMPLE_FILES = {
    "kuhn_poker": "open_spiel/python/examples/nfsp_kuhn_pytorch.py",
    "leduc_poker": "open_spiel/python/examples/nfsp_leduc_pytorch.py",
}
EXAMPLE_EVAL_EVERY = 10_000  # both examples' --eval_every (episodes)
_NOT_SETTINGS = ("self", "player_id", "state_representation_size", "num_actions", "seed", "kwargs", "device")


def resolved_settings(game: str, overrides: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The example's settings for ``game`` over every default of ``NFSP`` and its inner ``DQN`` they leave in force.

    Raises:
        ValueError: ``game`` has no example, or an override names no argument of ``NFSP`` or ``DQN``.
    """
    from open_spiel.python.pytorch import dqn, nfsp

    if game not in EXAMPLE_SETTINGS:
        raise ValueError(f"no open_spiel NFSP example for game {game!r}; choose from {sorted(EXAMPLE_SETTINGS)}")
    defaults: Dict[str, Any] = {}
    for cls in (dqn.DQN, nfsp.NFSP):  # NFSP's names win: it renames DQN's learning_rate to rl_learning_rate
        for name, param in inspect.signature(cls.__init__).parameters.items():
            if name not in _NOT_SETTINGS and param.default is not inspect.Parameter.empty:
                defaults[name] = param.default
    for name in ("learning_rate", "replay_buffer_class"):  # set by NFSP itself (rl_learning_rate, its own buffer)
        defaults.pop(name, None)
    unknown = sorted(set(overrides or {}) - set(defaults) - set(EXAMPLE_SETTINGS[game]))
    if unknown:
        raise ValueError(f"unknown NFSP setting(s) {unknown} for {game}; known: {sorted(defaults)}")
    settings = {**defaults, **EXAMPLE_SETTINGS[game], **dict(overrides or {})}
    return {k: (v.value if hasattr(v, "value") else v) for k, v in sorted(settings.items())}


def make_policy(game: Any, agents: Sequence[Any]) -> Any:
    """The joint policy the examples evaluate (their ``NFSPPolicies``): each player's agent in average-policy mode.

    Written here rather than imported: the example modules define absl flags at import, and two of them in one process
    collide.
    """
    from open_spiel.python import policy, rl_environment
    from open_spiel.python.pytorch import nfsp

    class NFSPPolicies(policy.Policy):
        def __init__(self) -> None:
            super().__init__(game, [0, 1])
            self._obs: Dict[str, Any] = {"info_state": [None, None], "legal_actions": [None, None]}

        def action_probabilities(self, state: Any, player_id: Optional[int] = None) -> Dict[int, float]:
            player = state.current_player()
            legal = state.legal_actions(player)
            self._obs["current_player"] = player
            self._obs["info_state"][player] = state.information_state_tensor(player)
            self._obs["legal_actions"][player] = legal
            step = rl_environment.TimeStep(observations=self._obs, rewards=None, discounts=None, step_type=None)
            with agents[player].temp_mode_as(nfsp.MODE.AVERAGE_POLICY):
                probs = agents[player].step(step, is_evaluation=True).probs
            return {a: float(probs[a]) for a in legal}

    return NFSPPolicies()


def make_agents(game: str, seed: int, settings: Mapping[str, Any]) -> tuple:
    """The environment and the two NFSP agents, seeded.

    open_spiel seeds inside the constructors (``set_seed`` reseeds NumPy's and torch's global generators): the Q-networks
    always from 42 (``DQN``'s default; NFSP does not pass its seed on), the average network from ``seed + 1``. The
    global generators and the environment's chance sampler are seeded with ``seed`` after the agents are built.
    """
    import torch
    from open_spiel.python import rl_environment
    from open_spiel.python.pytorch import nfsp

    env = rl_environment.Environment(game, players=2)
    info_state_size = env.observation_spec()["info_state"][0]
    num_actions = env.action_spec()["num_actions"]
    kwargs = dict(settings)
    hidden = [int(s) for s in kwargs.pop("hidden_layers_sizes")]
    agents = [nfsp.NFSP(idx, info_state_size, num_actions, hidden, seed=seed, **kwargs) for idx in range(2)]
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    env.seed(seed)
    return env, agents


def play_episode(env: Any, agents: Sequence[Any]) -> None:
    """One self-play training episode, as the examples' main loop."""
    time_step = env.reset()
    while not time_step.last():
        player = time_step.observations["current_player"]
        time_step = env.step([agents[player].step(time_step).action])
    for agent in agents:  # every agent sees the final time step
        agent.step(time_step)


def evaluate(game: Any, joint_policy: Any) -> float:
    """Exact exploitability of the joint average policy; NumPy's generator is left as it was (the policy's ``step``
    draws an action from it), so the training run does not depend on when it is evaluated."""
    from open_spiel.python.algorithms import exploitability

    state = np.random.get_state()
    try:
        return float(exploitability.exploitability(game, joint_policy))
    finally:
        np.random.set_state(state)


def first_below(curve: Sequence[Mapping[str, float]], threshold: float) -> Optional[Dict[str, float]]:
    """The first curve point whose exploitability is below ``threshold`` (episodes, training seconds), or None."""
    for point in curve:
        if point["exploitability"] < threshold:
            return {k: point[k] for k in ("episodes", "wall_secs", "cpu_secs") if k in point}
    return None


def run_nfsp(
    game: str,
    seed: int,
    *,
    seconds: Optional[float],
    episodes: Optional[int],
    eval_every: Optional[int],
    eval_seconds: Optional[float],
    threads: int = 1,
    overrides: Optional[Mapping[str, Any]] = None,
    verbose: bool = False,
) -> Dict[str, Any]:
    """Train open_spiel's NFSP on ``game`` by self-play until ``episodes`` episodes or ``seconds`` of training time.

    Args:
        game: ``kuhn_poker`` or ``leduc_poker``.
        seed: seeds Python, NumPy, torch, the average networks and the environment's chance events.
        seconds: training-time budget (evaluation excluded), or None.
        episodes: episode budget, or None (one of the two budgets is required).
        eval_every: evaluate after every this many episodes (the examples: 10000), or None.
        eval_seconds: evaluate after every this many seconds of training time, or None. With neither, only the
            untrained policy and the end of the run are evaluated. A seconds-driven schedule makes the evaluation
            points, not the training, depend on the machine's speed.
        threads: ``torch.set_num_threads``.
        overrides: NFSP/DQN arguments laid over the example's settings (tests only; the bench uses none).
        verbose: print each evaluation.

    Returns:
        ``curve`` (a point at 0 episodes, one per evaluation and one at the end: ``episodes``, ``wall_secs``,
        ``cpu_secs``, ``exploitability``), ``episodes``, ``train_secs``, ``train_cpu_secs``, ``eval_secs``,
        ``episodes_per_sec``, ``episodes_per_cpu_sec``, ``first_below``
        (0.1 and 0.05) and the resolved ``settings``.

    Raises:
        ValueError: no budget, a budget or schedule that is not positive, or an unknown game or override.
    """
    import pyspiel
    import torch

    if seconds is None and episodes is None:
        raise ValueError("run_nfsp: give seconds or episodes (a budget); both are None")
    for name, value in dict(
        seconds=seconds, episodes=episodes, eval_every=eval_every, eval_seconds=eval_seconds
    ).items():
        if value is not None and not value > 0:
            raise ValueError(f"run_nfsp: {name}={value!r} must be positive (or None)")
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"run_nfsp: threads={threads!r} must be a positive integer")
    settings = resolved_settings(game, overrides)
    torch.set_num_threads(threads)
    env, agents = make_agents(game, seed, settings)
    spiel_game = pyspiel.load_game(game)
    joint_policy = make_policy(spiel_game, agents)

    curve: List[Dict[str, float]] = []
    eval_secs = train_secs = train_cpu_secs = 0.0

    def record_point(done: int) -> None:
        nonlocal eval_secs
        t0 = time.perf_counter()
        expl = evaluate(spiel_game, joint_policy)
        curve.append({"episodes": done, "wall_secs": train_secs, "cpu_secs": train_cpu_secs, "exploitability": expl})
        eval_secs += time.perf_counter() - t0
        if verbose:
            print(f"  {game} seed {seed}: {done} episodes, {train_secs:.1f} s ({train_cpu_secs:.1f} s CPU): {expl:.4f}")

    record_point(0)
    done, last_eval_secs = 0, 0.0
    while (episodes is None or done < episodes) and (seconds is None or train_secs < seconds):
        t0, c0 = time.perf_counter(), time.process_time()
        play_episode(env, agents)
        train_secs += time.perf_counter() - t0
        train_cpu_secs += time.process_time() - c0
        done += 1
        if (eval_every and done % eval_every == 0) or (eval_seconds and train_secs - last_eval_secs >= eval_seconds):
            record_point(done)
            last_eval_secs = train_secs
    if curve[-1]["episodes"] != done:
        record_point(done)
    return dict(
        episodes=done,
        train_secs=train_secs,
        train_cpu_secs=train_cpu_secs,
        eval_secs=eval_secs,
        episodes_per_sec=done / max(train_secs, 1e-9),
        episodes_per_cpu_sec=done / max(train_cpu_secs, 1e-9),
        curve=curve,
        first_below={str(t): first_below(curve, t) for t in (0.1, 0.05)},
        settings=settings,
    )


# ---- records and the command line ----------------------------------------------------------------------------------
def machine() -> Dict[str, Any]:
    """``bench/zoo.py``'s machine description with the versions this bench depends on."""
    from zoo import machine_info

    return machine_info(extra=("open_spiel",))


def command_line(argv: Optional[Sequence[str]] = None) -> str:
    """``bench/marl.py``'s recorded command (``--out`` and ``--verbose`` left out), for this script."""
    from marl import command_line as marl_command_line

    return marl_command_line(argv).replace("bench/marl.py", "bench/league_nfsp.py", 1)


def record_path(out: str, game: str, seed: int) -> str:
    return os.path.join(out, f"{game}__{LIB}__seed{seed}.json")


def run_record(game: str, seed: int, args: argparse.Namespace, argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    out = run_nfsp(
        game,
        seed,
        seconds=args.seconds,
        episodes=args.episodes,
        eval_every=args.eval_every,
        eval_seconds=args.eval_seconds,
        threads=args.threads,
        verbose=args.verbose,
    )
    return dict(
        game=game,
        lib=LIB,
        seed=seed,
        date=datetime.date.today().isoformat(),
        command=command_line(argv),
        machine=machine(),
        settings_source=f"{EXAMPLE_FILES[game]} (open-spiel {machine()['versions']['open_spiel']})",
        budget=dict(seconds=args.seconds, episodes=args.episodes, threads=args.threads),
        evaluation=dict(
            eval_every=args.eval_every,
            eval_seconds=args.eval_seconds,
            metric="exploitability of the joint average policy (exact, open_spiel), wall_secs excludes it",
        ),
        **out,
    )


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--game", choices=sorted(EXAMPLE_SETTINGS), required=True)
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--seconds", type=float, help="training-time budget per seed (evaluation excluded)")
    p.add_argument("--episodes", type=int, help="episode budget per seed")
    p.add_argument("--eval-every", type=int, help=f"episodes between evaluations (the examples: {EXAMPLE_EVAL_EVERY})")
    p.add_argument("--eval-seconds", type=float, help="training seconds between evaluations")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=RESULTS_DIR, help="where the records go (default: bench/results/league)")
    p.add_argument("--verbose", action="store_true", help="print each evaluation as it comes")
    args = p.parse_args(argv)
    if args.seconds is None and args.episodes is None:
        p.error("give --seconds or --episodes")
    if args.eval_every is None and args.eval_seconds is None:
        args.eval_every = EXAMPLE_EVAL_EVERY
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    ok = True
    for seed in args.seeds:
        try:
            rec = run_record(args.game, seed, args, argv)
        except Exception:  # a crashed seed is reported, the others still run
            traceback.print_exc()
            ok = False
            continue
        path = record_path(args.out, args.game, seed)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(rec, f, indent=1)
        below = ", ".join(f"< {t}: {v['episodes']} ep / {v['wall_secs']:.0f} s" if v else f"< {t}: never"
                          for t, v in rec["first_below"].items())  # fmt: skip
        print(f"{args.game} seed {seed}: {rec['episodes']} episodes in {rec['train_secs']:.0f} s "
              f"({rec['episodes_per_sec']:.0f}/s), final {rec['curve'][-1]['exploitability']:.4f}; {below} -> {path}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
