"""Gradient updates per second: nervex's learner step against Stable-Baselines3's, same networks, batch and data path.

Each row builds both libraries on the same env with the same network sizes and batch size, fills their replay buffer
(or collects one rollout) with real env steps, then times gradient updates only: for off-policy rows one update is
"sample a batch from the replay buffer, compute the losses, step the optimizers, move the targets" on both sides
(nervex: ``buffer.sample`` + ``learner.train`` + priority update if any; SB3: ``model.train(gradient_steps, ...)``);
for PPO one update is one minibatch step of a rollout's epochs (nervex: ``learner.train`` on minibatches of the
collated rollout; SB3: ``model.train()`` divided by its ``n_epochs x minibatches``). The libraries alternate repeat by
repeat in one process, with the same ``torch.set_num_threads``; the figure is the median of the repeats.

    python bench/update_speed.py                          # every row whose nervex policy exists, 2 threads
    python bench/update_speed.py --rows sac td3 --threads 2 --updates 500 --repeats 5
    python bench/update_speed.py --rows sac --device cuda --obs-dim 17 --action-dim 6   # HalfCheetah-size inputs
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
    """

    name: str
    policy: str
    config: str
    env_id: str
    sb3_algo: str
    overrides: Tuple[str, ...]
    sb3_kwargs: Dict[str, Any] = field(default_factory=dict)

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


# ---- nervex ----------------------------------------------------------------------------------------------------------
def nervex_rate(row: Row, updates: int, device: str, seed: int) -> float:
    """nervex gradient updates per second on ``row`` (after a real warm-up fills the buffer or a rollout)."""
    import torch

    from nervex.config import apply_overrides, read_config
    from nervex.entry import SerialTrainer
    from nervex.torch_utils import collate

    overrides = list(row.overrides) + [
        "evaluator.eval_freq=1000000000000",
        f"policy.use_cuda={device == 'cuda'}",
        # the trainer sets torch's intra-op threads from the config (default 1): give it the benchmark's count
        f"num_threads={torch.get_num_threads()}",
    ]
    cfg = apply_overrides(read_config(os.path.join(ROOT, row.config)), overrides)
    with tempfile.TemporaryDirectory() as run_root:
        with SerialTrainer(cfg, seed=seed, exp_name=f"update_speed_{row.name}", run_root=run_root) as trainer:
            trainer.logger.setLevel("WARNING")
            setting = trainer.policy.command_mode.get_setting_learn(trainer.command_info())
            if row.on_policy:
                samples = trainer.actor.collect(trainer.contract.collect, {})
                batch = collate(samples)

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

            for _ in range(min(50, updates)):  # allocator and kernel caches warm
                one_update()
            sync(device)
            start = time.perf_counter()
            for _ in range(updates):
                one_update()
            sync(device)
            return updates / (time.perf_counter() - start)


# ---- Stable-Baselines3 -----------------------------------------------------------------------------------------------
def sb3_rate(row: Row, updates: int, device: str, seed: int) -> float:
    """SB3 gradient updates per second on ``row`` with the same networks and batch."""
    import stable_baselines3 as sb3

    algo = getattr(sb3, row.sb3_algo)
    if row.on_policy:
        from stable_baselines3.common.env_util import make_vec_env

        env = make_vec_env(row.env_id, n_envs=8, seed=seed)
        model = algo("MlpPolicy", env, seed=seed, device=device, verbose=0, **row.sb3_kwargs)
        model.learn(total_timesteps=row.sb3_kwargs["n_steps"] * 8)  # one rollout collected (and trained on once)
        per_call = model.n_epochs * -(-model.n_steps * 8 // model.batch_size)
        calls = max(1, updates // per_call)
        model.train()
        sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            model.train()
        sync(device)
        env.close()
        return calls * per_call / (time.perf_counter() - start)
    model = algo("MlpPolicy", row.env_id, seed=seed, device=device, verbose=0, **row.sb3_kwargs)
    model.learn(total_timesteps=WARMUP + 100)  # fills the buffer (and sets up the logger train() writes to)
    model.train(gradient_steps=min(50, updates), batch_size=model.batch_size)
    sync(device)
    start = time.perf_counter()
    model.train(gradient_steps=updates, batch_size=model.batch_size)
    sync(device)
    model.get_env().close()
    return updates / (time.perf_counter() - start)


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# ---- driver ----------------------------------------------------------------------------------------------------------
def available(row: Row) -> bool:
    """Whether nervex has the row's policy and config (rows of algorithms still to come are skipped)."""
    import nervex.policy  # noqa: F401  (registers the built-in policies)
    from nervex.utils import POLICY_REGISTRY

    return row.policy in POLICY_REGISTRY.names() and os.path.exists(os.path.join(ROOT, row.config))


def measure(
    rows: Sequence[Row], libs: Sequence[str], updates: int, repeats: int, device: str
) -> Dict[str, Dict[str, List[float]]]:
    """``{row: {lib: [updates/s per repeat]}}``, the libraries alternating within each repeat."""
    runners: Dict[str, Callable[[Row, int, str, int], float]] = {"nervex": nervex_rate, "sb3": sb3_rate}
    rates: Dict[str, Dict[str, List[float]]] = {}
    for row in rows:
        rates[row.name] = {lib: [] for lib in libs}
        for rep in range(repeats):
            for lib in libs:
                rate = runners[lib](row, updates, device, rep)
                rates[row.name][lib].append(rate)
                print(f"  {row.name} repeat {rep}: {lib:6s} {rate:8,.0f} updates/s", flush=True)
    return rates


def report(rates: Dict[str, Dict[str, List[float]]], threads: int, device: str) -> None:
    print(f"\nupdates/s, median of repeats ({device}, torch threads {threads}):")
    print("| row | nervex | SB3 | nervex / SB3 |")
    print("|---|---|---|---|")
    for name, by_lib in rates.items():
        med = {lib: statistics.median(v) for lib, v in by_lib.items() if v}
        ratio = f"{med['nervex'] / med['sb3']:.2f}x" if {"nervex", "sb3"} <= set(med) else ""
        cells = [f"{med[lib]:,.0f}" if lib in med else "" for lib in ("nervex", "sb3")]
        print(f"| {name} | {cells[0]} | {cells[1]} | {ratio} |")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--only", choices=("nervex", "sb3"), default=None)
    parser.add_argument("--updates", type=int, default=300, help="timed updates per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads for both libraries")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    rows = []
    for name in args.rows:
        if available(ROWS[name]):
            rows.append(ROWS[name])
        else:
            print(f"skipping {name}: nervex has no '{ROWS[name].policy}' policy or no {ROWS[name].config} yet")
    libs = [args.only] if args.only else ["nervex", "sb3"]
    report(measure(rows, libs, args.updates, args.repeats, args.device), args.threads, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
