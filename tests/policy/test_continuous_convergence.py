"""Real learning on Pendulum-v1: a short SAC run in the default suite, the shipped configs to -200 (slow)."""

import os

import pytest

from nervex.config import read_config
from nervex.entry import SerialTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PENDULUM = os.path.join(ROOT, "app_zoo/classic_control/pendulum/config/pendulum_{}.yaml")


@pytest.mark.slow  # a convergence run (19 s); bench/zoo.py and the slow suite run it
def test_sac_pendulum_reaches_minus_400_quickly(tmp_path, one_thread):
    """The shipped SAC config ([64, 64] nets) with batch 64 and tau 0.02: -400 within 5000 env steps (seed 0 gets there
    at ~4000; ~25 s on one busy core)."""
    cfg = read_config(PENDULUM.format("sac"))
    cfg.max_env_step = 5000
    cfg.policy.learn.update(batch_size=64, target_theta=0.02)
    cfg.evaluator.update(n_episode=5, eval_freq=500, stop_val=-400)
    with SerialTrainer(cfg, seed=0, exp_name="sac_short", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
    assert trainer.evaluator.best_reward >= -400, (
        f"best evaluation {trainer.evaluator.best_reward} after {trainer.env_step} steps"
    )
    assert "stop_val" in trainer.stop_reason


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3", "ddpg"])
def test_shipped_pendulum_config_reaches_minus_200(tmp_path, algo, one_thread):
    cfg = read_config(PENDULUM.format(algo))
    with SerialTrainer(cfg, seed=0, exp_name=f"{algo}_converge", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
    assert trainer.evaluator.best_reward >= -200, (
        f"best evaluation {trainer.evaluator.best_reward} after {trainer.env_step} steps"
    )
