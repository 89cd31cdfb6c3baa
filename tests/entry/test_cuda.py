"""The CUDA path (``policy.use_cuda: true``): training on the GPU, checkpoints that load on a CPU-only machine, the
prefetching loader's pinned batches. Marked ``gpu``: deselected by default, run with ``pytest -m gpu`` on a machine
with a CUDA device (skipped without one)."""

import csv
import os

import numpy as np
import pytest
import torch

from nervex.entry import SerialTrainer, serial_pipeline
from nervex.torch_utils import load_checkpoint

from .conftest import CARTPOLE_DQN, small_cfg

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from _tensors(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _tensors(value)


def test_training_runs_on_the_gpu_and_checkpoints_load_on_cpu(run_root):
    rng = np.random.default_rng(0)
    observations = rng.normal(size=(16, 4)).astype(np.float32)
    with SerialTrainer(small_cfg(**{"policy.use_cuda": True}), seed=0, exp_name="gpu", run_root=run_root) as trainer:
        assert all(p.device.type == "cuda" for p in trainer.policy.model.parameters())
        before = [p.detach().clone() for p in trainer.policy.model.parameters()]
        for _ in range(30):
            trainer.train()
        assert trainer.train_iter > 50
        after = list(trainer.policy.model.parameters())
        assert any(not torch.equal(a, b) for a, b in zip(before, after))  # the GPU optimizer stepped
        assert all(torch.isfinite(p).all() for p in after)
        path = trainer.save_checkpoint()
        actions = [int(trainer.compute_single_action(o)) for o in observations]
    state = load_checkpoint(path)  # map_location='cpu' by default: a CPU-only machine can read it
    tensors = list(_tensors(state["policy"]))
    assert len(tensors) > 4 and all(t.device.type == "cpu" for t in tensors)
    # the GPU-trained weights act the same in a CPU run
    with SerialTrainer(small_cfg(), seed=1, exp_name="cpu", run_root=run_root) as cpu:
        cpu.load_checkpoint(path)
        assert [int(cpu.compute_single_action(o)) for o in observations] == actions


def test_prefetching_loader_delivers_pinned_batches(run_root):
    cfg = small_cfg(**{"policy.use_cuda": True, "learner.prefetch": 2})
    with SerialTrainer(cfg, seed=0, exp_name="gpu_prefetch", run_root=run_root) as trainer:
        for _ in range(20):
            trainer.train()
        assert trainer.loop.loader is not None and trainer.loop.loader.delivered >= trainer.train_iter > 0
        batch = next(trainer.loop.loader)  # what the learner gets next: pinned, so its copy to the GPU is asynchronous
        assert batch["obs"].is_pinned() and batch["weight"].is_pinned()


def test_async_loader_pins_buffer_batches():
    from nervex.data import AsyncDataLoader, PrioritizedBuffer

    buf = PrioritizedBuffer(100, seed=0)
    buf.extend_batch({"obs": np.zeros((50, 4), np.float32), "reward": np.ones(50, np.float32)})
    with AsyncDataLoader(buf, batch_size=8, pin_memory=True, max_batches=3) as loader:
        batches = list(loader)
    assert len(batches) == 3 and all(b["obs"].is_pinned() for b in batches)
    on_gpu = batches[0]["reward"].to("cuda", non_blocking=True)
    assert float(on_gpu.sum()) == 8.0


@pytest.mark.slow
def test_cartpole_dqn_reaches_195_on_the_gpu(run_root):
    from nervex.config import read_config

    cfg = read_config(CARTPOLE_DQN)
    cfg["policy"]["use_cuda"] = True
    policy = serial_pipeline(cfg, seed=0, exp_name="gpu_195", run_root=run_root)
    assert next(policy.model.parameters()).device.type == "cuda"
    with open(os.path.join(run_root, "gpu_195", "eval.csv")) as f:
        best = max(float(row["mean_reward"]) for row in csv.DictReader(f))
    assert best >= 195


@pytest.mark.parametrize("continuous", [False, True])
def test_ppo_trains_on_the_gpu_and_its_snapshot_acts_the_same_on_cpu(run_root, continuous):
    """The on-policy path on a GPU: rollouts batched onto the device, the fused MLP's torch tanh there, the
    observation normalizer's statistics moved with the state; a CPU eval-only policy then acts identically."""
    from nervex.entry import load_policy

    env = {"env_type": "pendulum", "manager_type": "base", "collector_env_num": 2, "evaluator_env_num": 1}
    if not continuous:
        env = {"env_type": "cartpole", "manager_type": "base", "collector_env_num": 2, "evaluator_env_num": 1}
    cfg = {
        "env": env,
        "policy": {
            "policy_type": "ppo",
            "use_cuda": True,
            "normalize": {"obs": True, "reward": True},
            "collect": {"rollout_len": 32},
            "learn": {"batch_size": 16, "epoch_per_collect": 2},
        },
        "evaluator": {"n_episode": 1, "eval_freq": 100000, "stop_val": 1e9},
    }
    with SerialTrainer(cfg, seed=0, exp_name=f"gpu_ppo_{continuous}", run_root=run_root) as trainer:
        assert all(p.device.type == "cuda" for p in trainer.policy.model.parameters())
        for _ in range(5):
            trainer.train()
        assert trainer.train_iter == 5 * 2 * 4
        path = trainer.save_checkpoint()
        obs = np.random.default_rng(0).normal(size=(8, 3 if continuous else 4)).astype(np.float32)
        expected = trainer.policy.eval_mode.forward(list(range(8)), dict(enumerate(obs)))
    policy = load_policy(path, cfg=dict(cfg, policy=dict(cfg["policy"], use_cuda=False)))
    got = policy.eval_mode.forward(list(range(8)), dict(enumerate(obs)))
    for i in range(8):
        np.testing.assert_allclose(got[i]["action"], expected[i]["action"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algo", ["ddpg", "td3", "sac"])
def test_continuous_off_policy_trains_on_the_gpu_and_acts_the_same_on_cpu(run_root, algo):
    """DDPG / TD3 / SAC on a GPU: the QAC bounds, the noise plugins' bounds, SAC's log_alpha and its optimizer on
    the device; a CPU eval-only policy loaded from the checkpoint acts identically."""
    from nervex.entry import load_policy

    cfg = {
        "env": {"env_type": "pendulum", "manager_type": "base", "collector_env_num": 2, "evaluator_env_num": 1},
        "policy": {
            "policy_type": algo,
            "use_cuda": True,
            "model": {"hidden_sizes": [32, 32]},
            "learn": {"batch_size": 16, "learning_starts": 32},
        },
        "replay_buffer": {"maxlen": 1000},
        "evaluator": {"n_episode": 1, "eval_freq": 100000, "stop_val": 1e9},
    }
    with SerialTrainer(cfg, seed=0, exp_name=f"gpu_{algo}", run_root=run_root) as trainer:
        assert all(p.device.type == "cuda" for p in trainer.policy.model.parameters())
        assert trainer.policy.model.action_high.device.type == "cuda"
        for _ in range(10):
            trainer.train()
        assert trainer.train_iter > 0
        path = trainer.save_checkpoint()
        obs = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
        expected = trainer.policy.eval_mode.forward(list(range(8)), dict(enumerate(obs)))
    policy = load_policy(path, cfg=dict(cfg, policy=dict(cfg["policy"], use_cuda=False)))
    got = policy.eval_mode.forward(list(range(8)), dict(enumerate(obs)))
    for i in range(8):
        np.testing.assert_allclose(got[i]["action"], expected[i]["action"], rtol=1e-5, atol=1e-5)
