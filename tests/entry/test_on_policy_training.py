"""On-policy training through SerialTrainer: schedule, freshness of rollouts, convergence, snapshots."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from nervex.config import read_config
from nervex.entry import DefaultCallbacks, SerialTrainer, load_policy, serial_eval
from nervex.torch_utils import load_checkpoint

from .conftest import ROOT

CARTPOLE_PPO = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_ppo.yaml")
CARTPOLE_A2C = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_a2c.yaml")


def ppo_cfg(**overrides):
    cfg = {
        "seed": 0,
        "max_env_step": 1000,
        "env": {"env_type": "cartpole", "manager_type": "base", "collector_env_num": 2, "evaluator_env_num": 2},
        "policy": {
            "policy_type": "ppo",
            "model": {"hidden_sizes": [16, 16]},
            "learn": {"epoch_per_collect": 3, "batch_size": 10, "learning_rate": 0.01, "lr_schedule": "linear"},
            "collect": {"rollout_len": 16},
        },
        "learner": {"hook": {"log_show_after_iter": 0}},
        "evaluator": {"n_episode": 2, "eval_freq": 10000, "stop_val": 10000},
    }
    cfg.update(overrides)
    return cfg


class FreshnessCheck(DefaultCallbacks):
    """At the end of each collection, recompute every sample's log-prob with the current policy: the rollout must
    have been collected by exactly this policy (no sample left from an earlier one)."""

    def __init__(self):
        self.max_gap = []
        self.n_samples = []

    def on_sample_end(self, trainer, samples):
        obs = torch.as_tensor(np.stack([s["obs"] for s in samples]))
        action = torch.as_tensor(np.stack([s["action"] for s in samples]))
        with torch.no_grad():
            logit = trainer.policy.model(obs)["logit"]
        logp = torch.log_softmax(logit, -1).gather(1, action[:, None]).squeeze(1).numpy()
        self.max_gap.append(float(np.abs(logp - np.stack([s["logp"] for s in samples])).max()))
        self.n_samples.append(len(samples))


def test_each_rollout_is_fresh_and_train_iter_counts_minibatch_steps(tmp_path):
    check = FreshnessCheck()
    with SerialTrainer(ppo_cfg(), seed=0, run_root=str(tmp_path), callbacks=check) as trainer:
        results = [trainer.train() for _ in range(4)]
    assert check.n_samples == [32] * 4  # 2 envs x 16 steps, exactly
    assert max(check.max_gap) < 1e-5  # collected by the very parameters that were current
    # 3 epochs x ceil(32 / 10) = 4 minibatches per iteration: train_iter counts gradient steps
    assert [r["train_iter"] for r in results] == [12, 24, 36, 48]
    assert [r["env_step"] for r in results] == [32, 64, 96, 128]
    # the linear schedule's lr for iteration k is 0.01 * (1 - env_step / 1000), env_step read after collecting
    assert [r["train/cur_lr"] for r in results] == pytest.approx([0.01 * (1 - s / 1000) for s in (32, 64, 96, 128)])
    for key in (
        "approx_kl",
        "clip_fraction",
        "entropy_loss",
        "value_loss",
        "policy_gradient_loss",
        "explained_variance",
    ):
        assert f"train/{key}" in results[-1]  # SB3's names


def test_ppo_cartpole_reaches_195(tmp_path):
    cfg = read_config(CARTPOLE_PPO)
    cfg.evaluator.stop_val = 195
    cfg.max_env_step = 30000  # the config's linear schedules stay as shipped (100k) via policy keys below
    cfg.policy.learn.lr_schedule = "constant"
    cfg.policy.learn.clip_schedule = "constant"
    with SerialTrainer(cfg, seed=0, run_root=str(tmp_path)) as trainer:
        trainer.logger.setLevel("WARNING")
        result = trainer.run(progress=False)
    assert trainer.stopped and trainer.evaluator.best_reward >= 195, trainer.stop_reason
    assert result["env_step"] <= 30000


def test_best_checkpoint_loads_into_an_eval_only_policy_and_a_later_evaluation(tmp_path):
    cfg = ppo_cfg(max_env_step=2000)
    cfg["evaluator"] = {"n_episode": 2, "eval_freq": 500, "stop_val": 10000}
    with SerialTrainer(cfg, seed=1, exp_name="run", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
        best = os.path.join(trainer.run_dir, "ckpt", "best.pt")
        obs = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
        trainer.learner.load_checkpoint(best)  # the trainer's own policy at its best evaluation
        expected = [int(trainer.compute_single_action(o)) for o in obs]
    policy = load_policy(best)  # eval mode only, config read from the run directory
    assert "learn" not in policy.state_dict()
    got = policy.eval_mode.forward(list(range(20)), dict(enumerate(obs)))
    assert [int(got[i]["action"]) for i in range(20)] == expected
    result = serial_eval(best, n_episode=3)
    assert result["eval/n_episode"] >= 3 and result["eval/mean_reward"] >= 8  # a CartPole episode lasts >= 8 steps
    out = subprocess.run(
        [sys.executable, "-m", "nervex", "-m", "eval", "--ckpt", best, "--episodes", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0 and "eval: mean_reward=" in out.stdout and "episodes=2" in out.stdout, out.stderr


def test_a_corrupted_checkpoint_is_one_line_naming_the_file(tmp_path):
    with SerialTrainer(ppo_cfg(), seed=0, exp_name="c", run_root=str(tmp_path)) as trainer:
        trainer.train()
        path = trainer.save_checkpoint()
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:1000])
    out = subprocess.run(
        [sys.executable, "-m", "nervex", "-m", "eval", "--ckpt", path],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 2
    assert (
        out.stderr.count("\n") == 1 and "truncated or corrupted" in out.stderr and os.path.basename(path) in out.stderr
    )


def test_a2c_cartpole_learns(tmp_path):
    cfg = read_config(CARTPOLE_A2C)
    cfg.evaluator.stop_val = 150
    cfg.max_env_step = 40000
    with SerialTrainer(cfg, seed=0, run_root=str(tmp_path)) as trainer:
        trainer.logger.setLevel("WARNING")
        trainer.run(progress=False)
        state = load_checkpoint(os.path.join(trainer.run_dir, "ckpt", "best.pt"))
    assert trainer.evaluator.best_reward >= 150, trainer.stop_reason
    assert set(state["policy"]["learn"]["optimizers"]) == {"optimizer"}
    assert "RMSprop" in type(trainer.policy._optimizer).__name__


def test_batch_constants_are_computed_once_per_batch_and_match_their_definitions():
    from nervex.policy import create_policy

    policy = create_policy(ppo_cfg()["policy"] | {"model": {"obs_dim": 4, "action_dim": 2, "hidden_sizes": [8]}})
    gen = torch.Generator().manual_seed(0)
    batch = {k: torch.randn(32, generator=gen) for k in ("adv", "value", "return")}
    adv, ev = policy._batch_constants(batch)
    expected_adv = (batch["adv"] - batch["adv"].mean()) / (batch["adv"].std() + 1e-8)
    torch.testing.assert_close(adv, expected_adv)
    ret, val = batch["return"].numpy(), batch["value"].numpy()
    assert ev == pytest.approx(1 - np.var(ret - val) / np.var(ret), rel=1e-5)
    assert policy._batch_constants(batch)[0] is adv  # the same batch again (the next epoch): not recomputed
    other = dict(batch, adv=batch["adv"] * 2 + 1)  # a new minibatch: recomputed
    torch.testing.assert_close(policy._batch_constants(other)[0], expected_adv)
    assert policy._batch_constants(other)[0] is not adv
