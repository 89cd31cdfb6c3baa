"""Real learning with Rainbow on CartPole-v1: a short run in the default suite, the shipped config to 475 (slow)."""

import os

import pytest

from nervex.config import read_config
from nervex.entry import SerialTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE_RAINBOW = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_rainbow.yaml")


def test_rainbow_reaches_195_on_cartpole(tmp_path, one_thread):
    """The shipped config reaches an evaluation mean of 195 within 8000 env steps (~7 s on one core)."""
    cfg = read_config(CARTPOLE_RAINBOW)
    cfg.max_env_step = 8000
    cfg.evaluator.update(n_episode=5, eval_freq=500, stop_val=195)
    with SerialTrainer(cfg, seed=0, exp_name="rainbow_short", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
    assert trainer.evaluator.best_reward >= 195, (
        f"best evaluation {trainer.evaluator.best_reward} after {trainer.env_step} steps"
    )
    assert "stop_val" in trainer.stop_reason


@pytest.mark.slow
def test_shipped_rainbow_config_reaches_475_within_20k_steps(tmp_path, one_thread):
    cfg = read_config(CARTPOLE_RAINBOW)
    cfg.max_env_step = 20000
    with SerialTrainer(cfg, seed=0, exp_name="rainbow_converge", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
    assert trainer.evaluator.best_reward >= 475, (
        f"best evaluation {trainer.evaluator.best_reward} after {trainer.env_step} steps"
    )
