"""Gradient updates per second: nervex's learner step against Stable-Baselines3's, same networks, batch and data path.

Each row builds both libraries on the same env with the same network sizes and batch size, fills their replay buffer
(or collects one rollout) with real env steps, then times gradient updates only: for off-policy rows one update is
"sample a batch from the replay buffer, compute the losses, step the optimizers, move the targets" on both sides
(nervex: ``buffer.sample`` + ``learner.train`` + priority update if any; SB3: ``model.train(gradient_steps, ...)``);
for PPO one update is one minibatch step of a rollout's epochs (nervex: ``learner.train`` on minibatches of the
collated rollout; SB3: ``model.train()`` divided by its ``n_epochs x minibatches``). Both libraries are built in one
process with the same ``torch.set_num_threads`` and timed in alternating blocks (``--blocks`` per repeat); the
figures are the median rate over all blocks and the median ratio of back-to-back block pairs.

    python bench/update_speed.py                          # every row whose nervex policy exists, 2 threads
    python bench/update_speed.py --rows sac td3 --threads 2 --updates 500 --repeats 5
    python bench/update_speed.py --rows sac_halfcheetah td3_halfcheetah --device cuda   # HalfCheetah-size inputs
    python bench/update_speed.py --rows td3 --set policy.learn.fused_update=false         # nervex through autograd
    NERVEX_CPU_MATMUL=blas python bench/update_speed.py --rows td3     # nervex's products in torch's BLAS, as SB3's
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


@dataclass(frozen=True)
class Row:
    """One comparison.

    Args:
        name: The row's name (``--rows``).
        policy: nervex's registered policy name (a row whose policy is not registered is skipped).
        config: nervex's shipped config the row starts from.
        env_id: The gymnasium env both libraries step to fill their buffers.
        sb3_algo: SB3's class name.
        overrides: ``--set``-style overrides laid over nervex's config (network sizes, batch, warm-up).
        sb3_kwargs: SB3 constructor keywords giving the same networks and batch.
        requires: A module the row's env needs (``mujoco``); the row is skipped without it.
    """

    name: str
    policy: str
    config: str
    env_id: str
    sb3_algo: str
    overrides: Tuple[str, ...]
    sb3_kwargs: Dict[str, Any] = field(default_factory=dict)
    requires: Optional[str] = None

    @property
    def on_policy(self) -> bool:
        return self.policy in ("ppo", "a2c")


PENDULUM = "app_zoo/classic_control/pendulum/config"
CARTPOLE = "app_zoo/classic_control/cartpole/config"
WARMUP = 1000  # env steps in the buffer before timing (off-policy)
ROWS: Dict[str, Row] = {
    row.name: row
    for row in (
        Row(
            "sac",
            "sac",
            f"{PENDULUM}/pendulum_sac.yaml",
            "Pendulum-v1",
            "SAC",
            (
                "policy.model.hidden_sizes=[256,256]",
                "policy.learn.batch_size=256",
                f"policy.learn.learning_starts={WARMUP}",
            ),
            dict(batch_size=256, policy_kwargs=dict(net_arch=[256, 256]), learning_starts=WARMUP),
        ),
        Row(
            "td3",
            "td3",
            f"{PENDULUM}/pendulum_td3.yaml",
            "Pendulum-v1",
            "TD3",
            (
                "policy.model.hidden_sizes=[256,256]",
                "policy.learn.batch_size=256",
                f"policy.learn.learning_starts={WARMUP}",
            ),
            dict(batch_size=256, policy_kwargs=dict(net_arch=[256, 256]), learning_starts=WARMUP),
        ),
        *(
            Row(
                f"{algo.lower()}_halfcheetah",
                algo.lower(),
                config,
                "HalfCheetah-v5",  # 17 observations, 6 actions
                algo,
                (
                    "env.env_id=HalfCheetah-v5",
                    "policy.model.hidden_sizes=[256,256]",
                    "policy.learn.batch_size=256",
                    f"policy.learn.learning_starts={WARMUP}",
                ),
                dict(batch_size=256, policy_kwargs=dict(net_arch=[256, 256]), learning_starts=WARMUP),
                requires="mujoco",
            )
            for algo, config in (
                ("SAC", "app_zoo/mujoco/config/halfcheetah_sac.yaml"),
                ("TD3", "app_zoo/mujoco/config/inverted_pendulum_td3.yaml"),
            )
        ),
        Row(
            "dqn",
            "dqn",
            f"{CARTPOLE}/cartpole_dqn.yaml",
            "CartPole-v1",
            "DQN",
            (
                "policy.model.hidden_sizes=[256,256]",
                "policy.model.dueling=false",
                "policy.learn.batch_size=64",
                f"policy.learn.learning_starts={WARMUP}",
                "policy.priority=false",  # SB3's buffer is uniform: the same data path
            ),
            dict(batch_size=64, policy_kwargs=dict(net_arch=[256, 256]), learning_starts=WARMUP),
        ),
        Row(
            "ppo",
            "ppo",
            f"{CARTPOLE}/cartpole_ppo.yaml",
            "CartPole-v1",
            "PPO",
            ("policy.learn.batch_size=256", "policy.learn.epoch_per_collect=20", "policy.collect.rollout_len=32"),
            dict(n_steps=32, batch_size=256, n_epochs=20),
        ),
    )
}


DEFAULT_ROWS = ("sac", "td3", "dqn", "ppo")  # the HalfCheetah-size rows are for a GPU: ask for them with --rows


# ---- the two libraries, built once per repeat -----------------------------------------------------------------------
# A runner builds one library on the row (buffer filled, or a rollout collected, and a few updates run so allocator
# and kernel caches are warm) and returns ``(run, close)``: ``run(n)`` performs at least ``n`` gradient updates and
# returns how many it performed.
Runner = Tuple[Callable[[int], int], Callable[[], None]]


def nervex_runner(row: Row, device: str, seed: int, extra: Sequence[str] = ()) -> Runner:
    """nervex on ``row``: ``learner.train`` on buffer samples (off-policy) or on the collated rollout (on-policy).
    ``extra``: ``--set`` overrides laid over the row's."""
    import contextlib

    import torch

    from nervex.config import apply_overrides, read_config
    from nervex.entry import SerialTrainer
    from nervex.torch_utils import collate

    overrides = list(row.overrides) + [
        "evaluator.eval_freq=1000000000000",
        f"policy.use_cuda={device == 'cuda'}",
        # the trainer sets torch's intra-op threads from the config (default 1): give it the benchmark's count
        f"num_threads={torch.get_num_threads()}",
        *extra,
    ]
    cfg = apply_overrides(read_config(os.path.join(ROOT, row.config)), overrides)
    stack = contextlib.ExitStack()
    run_root = stack.enter_context(tempfile.TemporaryDirectory())
    trainer = stack.enter_context(SerialTrainer(cfg, seed=seed, exp_name=f"update_speed_{row.name}", run_root=run_root))
    trainer.logger.setLevel("WARNING")
    setting = trainer.policy.command_mode.get_setting_learn(trainer.command_info())
    if row.on_policy:
        batch = collate(trainer.actor.collect(trainer.contract.collect, {}))

        def one_update() -> None:
            trainer.learner.train(batch, trainer.env_step, setting)

    else:
        while trainer.env_step < WARMUP + 100:
            trainer.train()
        batch_size = trainer.contract.learn.batch_size

        def one_update() -> None:
            data = trainer.buffer.sample(batch_size, learner_iter=trainer.train_iter)
            info = trainer.learner.train(data, trainer.env_step, setting)
            if "priority" in info:
                trainer.buffer.update(info["priority"], unique_id=data["unique_id"])

    def run(n: int) -> int:
        for _ in range(n):
            one_update()
        sync(device)
        return n

    run(50)
    return run, stack.close


def sb3_runner(row: Row, device: str, seed: int, extra: Sequence[str] = ()) -> Runner:
    """SB3 on ``row``: ``model.train`` (off-policy: ``gradient_steps`` updates; on-policy: a rollout's epochs).
    ``extra`` is nervex's alone and not used."""
    import stable_baselines3 as sb3

    algo = getattr(sb3, row.sb3_algo)
    if row.on_policy:
        from stable_baselines3.common.env_util import make_vec_env

        env = make_vec_env(row.env_id, n_envs=8, seed=seed)
        model = algo("MlpPolicy", env, seed=seed, device=device, verbose=0, **row.sb3_kwargs)
        model.learn(total_timesteps=row.sb3_kwargs["n_steps"] * 8)  # one rollout collected (and trained on once)
        per_call = model.n_epochs * -(-model.n_steps * 8 // model.batch_size)

        def run(n: int) -> int:
            calls = max(1, -(-n // per_call))
            for _ in range(calls):
                model.train()
            sync(device)
            return calls * per_call

    else:
        model = algo("MlpPolicy", row.env_id, seed=seed, device=device, verbose=0, **row.sb3_kwargs)
        model.learn(total_timesteps=WARMUP + 100)  # fills the buffer (and sets up the logger train() writes to)

        def run(n: int) -> int:
            model.train(gradient_steps=n, batch_size=model.batch_size)
            sync(device)
            return n

    run(50)
    return run, lambda: model.get_env().close()


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# ---- driver ----------------------------------------------------------------------------------------------------------
def available(row: Row) -> bool:
    """Whether nervex has the row's policy and config and its env can run (rows of algorithms still to come, or
    whose env's package is missing, are skipped)."""
    import importlib.util

    import nervex.policy  # noqa: F401  (registers the built-in policies)
    from nervex.utils import POLICY_REGISTRY

    if row.requires and importlib.util.find_spec(row.requires) is None:
        return False
    return row.policy in POLICY_REGISTRY.names() and os.path.exists(os.path.join(ROOT, row.config))


RUNNERS: Dict[str, Callable[[Row, str, int, Sequence[str]], Runner]] = {"nervex": nervex_runner, "sb3": sb3_runner}


def measure(
    rows: Sequence[Row],
    libs: Sequence[str],
    updates: int,
    repeats: int,
    device: str,
    blocks: int = 10,
    nervex_overrides: Sequence[str] = (),
) -> Dict[str, Dict[str, List[float]]]:
    """``{row: {lib: [updates/s of each timed block]}}``.

    Each repeat builds every library once, then times ``updates`` updates per library in ``blocks`` blocks,
    alternating the libraries block by block (and which goes first). Block ``i`` of one library and block ``i`` of
    the other ran back to back, so load from other processes that comes and goes falls on both alike: their ratio is
    the robust figure (:func:`report`).
    """
    rates: Dict[str, Dict[str, List[float]]] = {}
    per_block = max(1, updates // blocks)
    for row in rows:
        rates[row.name] = {lib: [] for lib in libs}
        for rep in range(repeats):
            runners = {lib: RUNNERS[lib](row, device, rep, nervex_overrides) for lib in libs}
            try:
                for block in range(blocks):
                    for lib in libs if block % 2 == 0 else list(reversed(libs)):
                        start = time.perf_counter()
                        done = runners[lib][0](per_block)
                        rates[row.name][lib].append(done / (time.perf_counter() - start))
            finally:
                for _, close in runners.values():
                    close()
            summary = "  ".join(f"{lib} {statistics.median(rates[row.name][lib][-blocks:]):,.0f}/s" for lib in libs)
            print(f"  {row.name} repeat {rep}: median of its blocks {summary}", flush=True)
    return rates


def report(rates: Dict[str, Dict[str, List[float]]], threads: int, device: str) -> None:
    """Median updates/s per library over all blocks, and the quartiles of the per-block ratio nervex / SB3."""
    from nervex.torch_utils.cpu_matmul import backend

    # nervex's large float32 products on the CPU (NERVEX_CPU_MATMUL); SB3's always run in torch's BLAS
    products = f", nervex's CPU matmuls: {backend()}" if device == "cpu" else ""
    print(
        f"\nupdates/s, median over blocks ({device}, torch threads {threads}{products}); nervex / SB3 per block pair:"
    )
    print("| row | nervex | SB3 | nervex / SB3 (median) | ratio quartiles |")
    print("|---|---|---|---|---|")
    for name, by_lib in rates.items():
        med = {lib: statistics.median(v) for lib, v in by_lib.items() if v}
        cells = [f"{med[lib]:,.0f}" if lib in med else "" for lib in ("nervex", "sb3")]
        ratio = quartiles = ""
        if {"nervex", "sb3"} <= set(med):
            pairs = [a / b for a, b in zip(by_lib["nervex"], by_lib["sb3"])]
            q1, q2, q3 = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else (pairs[0],) * 3
            ratio, quartiles = f"{statistics.median(pairs):.3f}x", f"{q1:.2f}-{q3:.2f}"
        print(f"| {name} | {cells[0]} | {cells[1]} | {ratio} | {quartiles} |")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(DEFAULT_ROWS))
    parser.add_argument("--only", choices=("nervex", "sb3"), default=None)
    parser.add_argument("--updates", type=int, default=300, help="timed updates per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=10, help="alternating timed blocks per repeat")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads for both libraries")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override nervex's config in every row, e.g. --set policy.learn.fused_update=false (repeatable)",
    )
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    rows = []
    for name in args.rows:
        if available(ROWS[name]):
            rows.append(ROWS[name])
        else:
            print(
                f"skipping {name}: no '{ROWS[name].policy}' policy, no {ROWS[name].config} or no {ROWS[name].requires}"
            )
    libs = [args.only] if args.only else ["nervex", "sb3"]
    rates = measure(rows, libs, args.updates, args.repeats, args.device, args.blocks, args.set)
    report(rates, args.threads, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
