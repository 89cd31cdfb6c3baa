"""Real learning with IMPALA: CartPole-v1 to 195 in the default suite; the shipped configs to their targets (slow)."""

import os

import pytest

from nervex.config import read_config
from nervex.entry import SerialTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG_DIR = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config")
CARTPOLE_IMPALA = os.path.join(CONFIG_DIR, "cartpole_impala.yaml")
NO_VEL_IMPALA = os.path.join(CONFIG_DIR, "cartpole_no_vel_impala.yaml")


def test_impala_reaches_195_on_cartpole(tmp_path, one_thread):
    """The shipped config (V-trace, policy lag 4, replayed sequences) reaches 195 within 30k env steps (~10 s)."""
    cfg = read_config(CARTPOLE_IMPALA)
    cfg.max_env_step = 30000
    cfg.evaluator.update(n_episode=5, eval_freq=2000, stop_val=195)
    with SerialTrainer(cfg, seed=0, exp_name="impala_short", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
    assert trainer.evaluator.best_reward >= 195, (
        f"best evaluation {trainer.evaluator.best_reward} after {trainer.env_step} steps"
    )
    assert "stop_val" in trainer.stop_reason


@pytest.mark.slow
def test_shipped_impala_config_reaches_450_within_200k_steps(tmp_path, one_thread):
    cfg = read_config(CARTPOLE_IMPALA)
    cfg.evaluator.stop_val = 450
    with SerialTrainer(cfg, seed=0, exp_name="impala_converge", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
    assert trainer.evaluator.best_reward >= 450, (
        f"best evaluation {trainer.evaluator.best_reward} after {trainer.env_step} steps"
    )


@pytest.mark.slow
def test_lstm_impala_reaches_350_on_velocity_masked_cartpole(tmp_path, one_thread):
    cfg = read_config(NO_VEL_IMPALA)
    cfg.evaluator.stop_val = 350
    with SerialTrainer(cfg, seed=0, exp_name="impala_no_vel", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
    assert trainer.evaluator.best_reward >= 350, (
        f"best evaluation {trainer.evaluator.best_reward} after {trainer.env_step} steps"
    )
