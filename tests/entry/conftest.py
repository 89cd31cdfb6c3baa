import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE_DQN = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml")


def small_cfg(**overrides):
    """A CartPole DQN config that trains a few hundred steps in well under a second per iteration."""
    cfg = {
        "seed": 0,
        "max_env_step": 100000,
        "env": {"env_type": "cartpole", "manager_type": "base", "collector_env_num": 2, "evaluator_env_num": 2},
        "policy": {
            "policy_type": "dqn",
            "model": {"hidden_sizes": [32, 32]},
            "nstep": 1,
            "learn": {"batch_size": 16, "learning_starts": 64, "target_update_freq": 10, "update_per_collect": 4},
            "collect": {"n_sample": 8},
        },
        "replay_buffer": {"maxlen": 1000},
        "learner": {"hook": {"log_show_after_iter": 50}},
        "evaluator": {"n_episode": 2, "eval_freq": 200, "stop_val": 10000},
    }
    for key, value in overrides.items():
        node = cfg
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return cfg


@pytest.fixture
def run_root(tmp_path):
    return str(tmp_path / "runs")
