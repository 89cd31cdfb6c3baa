"""Real learning with R2D2 on velocity-masked CartPole: a short run in the default suite, the shipped config (slow)."""

import os

import pytest

from nervex.config import read_config
from nervex.entry import SerialTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE_R2D2 = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_r2d2.yaml")


@pytest.mark.slow  # a convergence run (27 s): bench/zoo.py and the slow suite run it
def test_r2d2_reaches_150_on_masked_cartpole(tmp_path, one_thread):
    """The shipped config, without the velocities, reaches an evaluation mean of 150 within 16k env steps (~25 s)."""
    cfg = read_config(CARTPOLE_R2D2)
    assert cfg.env.env_type == "cartpole_no_vel"
    cfg.max_env_step = 16000
    cfg.evaluator.update(n_episode=5, eval_freq=1000, stop_val=150)
    with SerialTrainer(cfg, seed=0, exp_name="r2d2_short", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
    assert trainer.evaluator.best_reward >= 150, (
        f"best evaluation {trainer.evaluator.best_reward} after {trainer.env_step} steps"
    )
    assert "stop_val" in trainer.stop_reason


@pytest.mark.slow
def test_shipped_r2d2_config_reaches_475_on_masked_cartpole(tmp_path, one_thread):
    cfg = read_config(CARTPOLE_R2D2)
    with SerialTrainer(cfg, seed=0, exp_name="r2d2_converge", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
    assert trainer.evaluator.best_reward >= 475, (
        f"best evaluation {trainer.evaluator.best_reward} after {trainer.env_step} steps"
    )
