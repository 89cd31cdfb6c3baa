"""One rank of the data-parallel learner tests (``test_distributed.py`` starts it as a subprocess).

The rank and the rendezvous come from torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``) through ``dist_info_from_env``; none of them set means a single process. The result goes to the JSON
or torch file ``--out`` names, so the test reads it whatever the process's exit.

Scenarios:
    train: ``--steps`` DQN learn steps on this rank's share of a fixed batch of CartPole transitions; saves the
        policy's state, the per-step losses and their mean over the ranks.
    train_sac: the same with SAC on Pendulum transitions: its temperature ``log_alpha`` lives outside the model and
        must be averaged too (``optimized_tensors``), or the ranks drift apart.
    broadcast: rank 0 steps once, rank 1 twice, each on its own data (different weights, targets, optimizer
        moments and counts), then ``broadcast_policy``; saves the states before and after. A first
        ``broadcast_policy``, while only rank 0 has stepped, must fail on both ranks (the layouts differ).
    hooks: ranks with different models fail to attach; a small model's gradients, accumulated over two backward
        passes, equal the gradient of the mean over the ranks; ``broadcast_parameters`` gives rank 0's weights.
    fail: rank 1 dies (``kill``) or stalls (``stall``) after joining; rank 0 then runs a learn step with the
        gradient all-reduce and records the error it raises and how long it took.
    alone: rank 0 of 2 whose peer never starts; records the error of ``init_process_group``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script: nervex from this checkout
    sys.path.insert(0, str(REPO_ROOT))

from nervex.system.distributed import (  # noqa: E402
    DistInfo,
    all_reduce_mean,
    attach_gradient_allreduce,
    broadcast_parameters,
    broadcast_policy,
    destroy_process_group,
    dist_info_from_env,
    init_process_group,
    optimized_tensors,
)

CARTPOLE_DQN = REPO_ROOT / "app_zoo" / "classic_control" / "cartpole" / "config" / "cartpole_dqn.yaml"
PENDULUM_SAC = REPO_ROOT / "app_zoo" / "classic_control" / "pendulum" / "config" / "pendulum_sac.yaml"
BATCH = 64
TARGET_UPDATE_FREQ = 2  # a target copy within the test's 3 steps
GRAD_CLIP = 1.0  # clipping acts on the averaged gradient: part of what is compared


def make_dqn_policy(seed: int) -> Any:
    """The DQN policy of ``cartpole_dqn.yaml`` (learn mode), seeded, with a short target period and clipping."""
    from nervex.config import read_config
    from nervex.entry import compile_config
    from nervex.entry.builder import make_env_managers, make_policy
    from nervex.policy.base_policy import set_seed

    raw = read_config(CARTPOLE_DQN)
    raw.policy.learn.target_update_freq = TARGET_UPDATE_FREQ
    raw.policy.learn.grad_clip = GRAD_CLIP
    cfg = compile_config(raw)
    _, _, env_info = make_env_managers(cfg, seed, evaluator=False, collector=False)
    set_seed(seed)
    return make_policy(cfg, env_info, enable_field=["learn"])


def cartpole_batch(n: int, seed: int) -> Dict[str, torch.Tensor]:
    """``n`` real CartPole-v1 transitions under random actions, with importance weights in [0.5, 1]."""
    import gymnasium as gym

    rng = np.random.default_rng(seed)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    rows: Dict[str, List[Any]] = {k: [] for k in ("obs", "next_obs", "action", "reward", "terminated")}
    while len(rows["obs"]) < n:
        action = int(rng.integers(2))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in zip(rows, (obs, next_obs, action, reward, terminated)):
            rows[key].append(value)
        obs = env.reset()[0] if terminated or truncated else next_obs
    env.close()
    batch = {
        "obs": torch.as_tensor(np.stack(rows["obs"]), dtype=torch.float32),
        "next_obs": torch.as_tensor(np.stack(rows["next_obs"]), dtype=torch.float32),
        "action": torch.as_tensor(rows["action"], dtype=torch.int64),
        "reward": torch.as_tensor(rows["reward"], dtype=torch.float32),
        "terminated": torch.as_tensor(rows["terminated"], dtype=torch.bool),
        "weight": torch.as_tensor(rng.uniform(0.5, 1.0, n), dtype=torch.float32),
    }
    assert bool(batch["terminated"].any()), "the batch should hold a termination"
    return batch


def make_sac_policy(seed: int) -> Any:
    """The SAC policy of ``pendulum_sac.yaml`` (learn mode, automatic temperature), seeded."""
    from nervex.config import read_config
    from nervex.entry import compile_config
    from nervex.entry.builder import make_env_managers, make_policy
    from nervex.policy.base_policy import set_seed

    cfg = compile_config(read_config(PENDULUM_SAC))
    _, _, env_info = make_env_managers(cfg, seed, evaluator=False, collector=False)
    set_seed(seed)
    return make_policy(cfg, env_info, enable_field=["learn"])


def pendulum_batch(n: int, seed: int) -> Dict[str, torch.Tensor]:
    """``n`` real Pendulum-v1 transitions under random actions."""
    import gymnasium as gym

    env = gym.make("Pendulum-v1")
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    rows: Dict[str, List[Any]] = {k: [] for k in ("obs", "next_obs", "action", "reward", "terminated")}
    for _ in range(n):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in zip(rows, (obs, next_obs, action, reward, terminated)):
            rows[key].append(value)
        obs = env.reset()[0] if terminated or truncated else next_obs
    env.close()
    return {
        "obs": torch.as_tensor(np.stack(rows["obs"]), dtype=torch.float32),
        "next_obs": torch.as_tensor(np.stack(rows["next_obs"]), dtype=torch.float32),
        "action": torch.as_tensor(np.stack(rows["action"]), dtype=torch.float32),
        "reward": torch.as_tensor(rows["reward"], dtype=torch.float32),
        "terminated": torch.as_tensor(rows["terminated"], dtype=torch.bool),
    }


def rank_share(batch: Dict[str, torch.Tensor], info: DistInfo) -> Dict[str, torch.Tensor]:
    """This rank's contiguous share of the rows (the whole batch for a single process)."""
    size = BATCH // info.world_size
    return {k: v[info.rank * size : (info.rank + 1) * size].clone() for k, v in batch.items()}


def run_train(info: DistInfo, args: argparse.Namespace) -> None:
    # a different seed per rank: only broadcast_policy makes the ranks start equal
    policy = make_dqn_policy(seed=args.seed + 1000 * info.rank)
    broadcast_policy(policy)
    handle = attach_gradient_allreduce([policy.model], info.world_size)
    share = rank_share(cartpole_batch(BATCH, args.seed), info)
    losses, mean_losses = [], []
    for _ in range(args.steps):
        out = policy.learn_mode.forward(dict(share))
        losses.append(out["total_loss"])
        mean_losses.append(all_reduce_mean(out["total_loss"]))
    reductions = handle.reductions
    handle.remove()
    torch.save(dict(state=policy.state_dict(), losses=losses, mean_losses=mean_losses, reductions=reductions), args.out)


def run_train_sac(info: DistInfo, args: argparse.Namespace) -> None:
    policy = make_sac_policy(seed=args.seed + 1000 * info.rank)
    broadcast_policy(policy)
    start = policy.state_dict()["learn"]["log_alpha"].clone()
    handle = attach_gradient_allreduce([policy.model], info.world_size, optimized_tensors(policy))
    share = rank_share(pendulum_batch(BATCH, args.seed), info)
    for _ in range(args.steps):
        policy.learn_mode.forward(dict(share))
    reductions = handle.reductions
    handle.remove()
    torch.save(dict(state=policy.state_dict(), start_log_alpha=start, reductions=reductions), args.out)


def run_broadcast(info: DistInfo, args: argparse.Namespace) -> None:
    policy = make_dqn_policy(seed=args.seed + 1000 * info.rank)
    share = rank_share(cartpole_batch(BATCH, args.seed + info.rank), info)
    if info.rank == 0:
        policy.learn_mode.forward(dict(share))
    mismatch = ""
    try:  # rank 0's optimizer has moments, rank 1's none yet: an error on both ranks
        broadcast_policy(policy)
    except RuntimeError as e:
        mismatch = str(e)
    for _ in range(2 if info.rank == 1 else 0):  # now rank 1 has stepped twice: other counts, same layout
        policy.learn_mode.forward(dict(share))
    before = policy.state_dict()
    torch.save(dict(before=before), args.out + ".before")
    broadcast_policy(policy)
    torch.save(dict(state=policy.state_dict(), mismatch=mismatch), args.out)


def run_hooks(info: DistInfo, args: argparse.Namespace) -> None:
    result: Dict[str, Any] = {}
    try:  # ranks whose models differ: an error on every rank, not a hang or a silent mix
        attach_gradient_allreduce([torch.nn.Linear(3, 2 + info.rank)], info.world_size)
    except RuntimeError as e:
        result["mismatch"] = str(e)
    torch.manual_seed(info.rank)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    broadcast_parameters([model])
    torch.manual_seed(0)
    rank0_init = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    result["broadcast_equal"] = all(torch.equal(a, b) for a, b in zip(model.parameters(), rank0_init.parameters()))
    reference = copy.deepcopy(model)  # before any hook: a plain model
    handle = attach_gradient_allreduce([model], info.world_size)
    data = torch.randn(2, info.world_size, 5, 3, generator=torch.Generator().manual_seed(1))  # (pass, rank, row, x)
    for k in range(2):  # two backward passes accumulate before a step would be taken
        model(data[k, info.rank]).pow(2).mean().backward()
    # the gradient of the mean over ranks of each pass's loss, summed over the passes, from all the data at once
    sum(reference(data[k, r]).pow(2).mean() for k in range(2) for r in range(info.world_size)).div(
        info.world_size
    ).backward()
    result["max_grad_diff"] = max(
        (p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), reference.parameters())
    )
    result["reductions"] = handle.reductions
    handle.remove()
    model(data[0, info.rank]).sum().backward()  # no longer averaged
    result["reductions_after_remove"] = handle.reductions
    Path(args.out).write_text(json.dumps(result))


def run_fail(info: DistInfo, args: argparse.Namespace) -> None:
    policy = make_dqn_policy(seed=args.seed)
    handle = attach_gradient_allreduce([policy.model], info.world_size)  # a collective: both ranks are in
    if info.rank == 1:
        if args.mode == "kill":
            time.sleep(0.5)  # rank 0 has surely read this rank's share of the last collective
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)  # stalls; the test kills it
        return
    share = rank_share(cartpole_batch(BATCH, args.seed), info)
    time.sleep(1.5)  # rank 1 is gone (or asleep) by now
    start = time.monotonic()
    try:
        policy.learn_mode.forward(share)
        result = dict(error=None)
    except RuntimeError as e:
        result = dict(error=type(e).__name__, message=str(e))
    result["elapsed_s"] = time.monotonic() - start
    result["reductions"] = handle.reductions
    Path(args.out).write_text(json.dumps(result))
    if result["error"]:
        # the group is broken: tearing it down beside a stalled peer can abort in gloo ("terminate called without an
        # active exception", SIGABRT) after the error was raised and recorded; leave as a failed learner does
        os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=("train", "train_sac", "broadcast", "hooks", "fail", "alone"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=20.0)
    parser.add_argument("--mode", choices=("kill", "stall"), default="kill")
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = dist_info_from_env()
    start = time.monotonic()
    try:
        init_process_group(info, "cpu", timeout_s=args.timeout_s)
    except RuntimeError as e:
        if args.scenario != "alone":
            raise
        result = dict(error=type(e).__name__, message=str(e), elapsed_s=time.monotonic() - start)
        Path(args.out).write_text(json.dumps(result))
        return
    try:
        dict(train=run_train, train_sac=run_train_sac, broadcast=run_broadcast, hooks=run_hooks, fail=run_fail)[
            args.scenario
        ](info, args)
    finally:
        destroy_process_group()


if __name__ == "__main__":
    main()
