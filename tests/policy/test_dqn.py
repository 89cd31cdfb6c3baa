"""DQN behaviour: truncation is not termination, the learn step, registry errors, and real convergence."""

import os

import gymnasium as gym
import numpy as np
import pytest
import torch

from nervex.config import read_config
from nervex.entry import SerialTrainer, compile_config
from nervex.envs import BaseEnv, BaseEnvInfo, BaseEnvTimestep
from nervex.policy import DQNPolicy, create_policy
from nervex.utils import ENV_REGISTRY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE_DQN = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml")


class ConstantRewardEnv(BaseEnv):
    """One observation, reward 1 every step, never terminates, truncated after ``time_limit`` steps.

    The true value of the state is 1 / (1 - gamma). Treating the time limit as terminal would instead pull it
    towards the finite-horizon average (about 5.3 for gamma = 0.9 and a limit of 10).
    """

    config = dict(time_limit=10)

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self._limit = int((cfg or {}).get("time_limit", 10))
        self._t = 0
        self._obs = np.ones(2, dtype=np.float32)

    def reset(self):
        self._t = 0
        return self._obs.copy()

    def step(self, action):
        self._t += 1
        truncated = self._t >= self._limit
        info = {"terminated": False, "truncated": truncated}
        if truncated:
            info.update(episode_return=float(self._t), episode_len=self._t)
        return BaseEnvTimestep(self._obs.copy(), 1.0, truncated, info)

    def seed(self, seed):
        pass

    def close(self):
        pass

    def info(self):
        box = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        return BaseEnvInfo(1, box, gym.spaces.Discrete(2), None, self._limit)


ENV_REGISTRY.register("test_constant_reward", ConstantRewardEnv, force=True)


@pytest.mark.parametrize("nstep", [1, 3])
def test_time_limit_truncation_bootstraps(tmp_path, nstep):
    gamma = 0.9
    cfg = {
        "max_env_step": 4000,
        "env": {
            "env_type": "test_constant_reward",
            "manager_type": "base",
            "collector_env_num": 2,
            "evaluator_env_num": 1,
            "time_limit": 10,
        },
        "policy": {
            "policy_type": "dqn",
            "model": {"hidden_sizes": [16]},
            "discount_factor": gamma,
            "nstep": nstep,
            "priority": False,
            "learn": {"batch_size": 32, "learning_rate": 0.01, "learning_starts": 100, "target_update_freq": 20},
            "collect": {"n_sample": 8},
        },
        "replay_buffer": {"maxlen": 2000},
        "evaluator": {"n_episode": 1, "eval_freq": 100000, "stop_val": 1e9},
    }
    with SerialTrainer(cfg, seed=0, exp_name="trunc", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
        with torch.no_grad():
            q = trainer.policy.model(torch.ones(1, 2))["logit"]
    expected = 1.0 / (1.0 - gamma)  # 10; a terminal-at-time-limit bug gives about 5.3
    assert q.max().item() == pytest.approx(expected, abs=1.0)


def test_learn_step_priority_is_abs_td_error():
    cfg = compile_config(read_config(CARTPOLE_DQN))
    cfg.policy.model.update(obs_dim=4, action_dim=2)
    torch.manual_seed(0)
    policy = create_policy(cfg.policy)
    assert isinstance(policy, DQNPolicy)
    batch = {
        "obs": torch.randn(8, 4),
        "next_obs": torch.randn(8, 4),
        "action": torch.randint(0, 2, (8,)),
        "reward": torch.ones(8, 1),
        "terminated": torch.tensor([True] * 4 + [False] * 4),
        "weight": torch.ones(8),
    }
    model = policy.model
    with torch.no_grad():
        q_sa = model(batch["obs"])["logit"].gather(1, batch["action"][:, None]).squeeze(1)
        next_a = model(batch["next_obs"])["logit"].argmax(1)  # double DQN: online net picks
        next_q = model(batch["next_obs"])["logit"].gather(1, next_a[:, None]).squeeze(1)  # target == online at start
        target = 1.0 + 0.99 * (1 - batch["terminated"].float()) * next_q
    info = policy.learn_mode.forward(batch)
    np.testing.assert_allclose(info["priority"], (target - q_sa).abs().numpy(), rtol=1e-5, atol=1e-6)
    assert info["total_loss"] == pytest.approx(((target - q_sa) ** 2).mean().item(), rel=1e-5)


def test_unknown_policy_type_error():
    with pytest.raises(KeyError, match="unknown policy 'dqnn'.*did you mean 'dqn'"):
        create_policy({"policy_type": "dqnn"})


def test_dqn_reaches_195_on_cartpole(tmp_path):
    """The shipped config solves CartPole-v1 (evaluation mean >= 195) within a fixed env-step budget."""
    cfg = read_config(CARTPOLE_DQN)
    cfg.max_env_step = 30000
    with SerialTrainer(cfg, seed=0, exp_name="converge", run_root=str(tmp_path)) as trainer:
        result = trainer.run(progress=False)
    assert trainer.evaluator.best_reward >= 195, (
        f"best evaluation {trainer.evaluator.best_reward} after {trainer.env_step} steps"
    )
    assert "stop_val" in trainer.stop_reason
    assert result["env_step"] <= 30000
