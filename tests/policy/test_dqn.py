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


@pytest.mark.slow  # a convergence run (20 s); the tutorial policy and the parallel DQN still reach 195 by default
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


# ---- action masks ------------------------------------------------------------------------------------------------
def _masked_policy(double: bool, obs_dim: int = 3, action_dim: int = 4):
    cfg = compile_config(read_config(CARTPOLE_DQN))
    cfg.policy.model.update(obs_dim=obs_dim, action_dim=action_dim)
    cfg.policy.learn.double = double
    torch.manual_seed(0)
    return create_policy(cfg.policy)


@pytest.mark.parametrize("double", [True, False])
def test_learn_target_maxes_over_legal_next_actions(double):
    policy = _masked_policy(double)
    torch.manual_seed(1)
    obs, next_obs = torch.randn(6, 3), torch.randn(6, 3)
    action = torch.tensor([0, 1, 2, 3, 0, 1])
    terminated = torch.tensor([False, False, False, False, True, True])
    with torch.no_grad():
        q_sa = policy.model(obs)["logit"].gather(1, action[:, None]).squeeze(1)
        next_q = policy.model(next_obs)["logit"]  # online == target before the first step
    mask = torch.ones(6, 4, dtype=torch.int8)
    mask[torch.arange(6), next_q.argmax(1)] = 0  # in every row the largest next Q is an illegal action
    mask[5] = 0  # a finished game: no legal action at all (terminated, so its value is cut)
    legal_best = next_q.masked_fill(mask == 0, float("-inf")).max(1).values
    legal_best[5] = 0.0
    target = 1.0 + 0.99 * (1 - terminated.float()) * legal_best
    unmasked_target = 1.0 + 0.99 * (1 - terminated.float()) * next_q.max(1).values
    to_play = torch.zeros(6, dtype=torch.int64)
    batch = {
        "obs": {"obs": obs, "action_mask": torch.ones(6, 4, dtype=torch.int8), "to_play": to_play},
        "next_obs": {"obs": next_obs, "action_mask": mask, "to_play": to_play},
        "action": action,
        "reward": torch.ones(6, 1),
        "terminated": terminated,
        "weight": torch.ones(6),
    }
    info = policy.learn_mode.forward(batch)
    np.testing.assert_allclose(info["priority"], (target - q_sa).abs().numpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(info["priority"][:4], (unmasked_target - q_sa).abs().numpy()[:4])


def _board_obs(rng: np.random.Generator, mask) -> dict:
    return {
        "obs": rng.standard_normal(3).astype(np.float32),
        "action_mask": np.asarray(mask, np.int8),
        "to_play": np.int64(0),
    }


def test_collect_and_eval_take_legal_actions_only():
    policy = _masked_policy(double=True)
    rng = np.random.default_rng(0)
    obs = {i: _board_obs(rng, [1, 1, 1, 1]) for i in range(8)}
    with torch.no_grad():
        greedy = {i: int(policy.model(torch.as_tensor(o["obs"][None]))["logit"].argmax()) for i, o in obs.items()}
    for i, o in obs.items():  # forbid each env's greedy action, and one more
        o["action_mask"][greedy[i]] = 0
        o["action_mask"][(greedy[i] + 1) % 4] = 0
    eval_out = policy.eval_mode.forward(list(obs), obs)
    for i, out in eval_out.items():
        assert obs[i]["action_mask"][int(out["action"])] == 1
    torch.manual_seed(0)
    for eps in (0.0, 1.0):
        for _ in range(20):
            out = policy.collect_mode.forward(list(obs), obs, eps=eps)
            assert all(obs[i]["action_mask"][int(o["action"])] == 1 for i, o in out.items())


def test_dict_observations_go_through_the_prioritized_buffer_into_a_learn_step():
    from nervex.data import PrioritizedBuffer
    from nervex.rl_utils import Adder

    policy = _masked_policy(double=True)
    rng = np.random.default_rng(0)
    adder = Adder(kind="nstep", nstep=1, gamma=0.99)
    samples = []
    adder.add_first(0)
    obs = _board_obs(rng, [1, 1, 1, 1])
    for t in range(12):
        next_obs = _board_obs(rng, [1, 0, 1, 1] if t % 2 else [0, 1, 1, 0])
        done = t == 11
        info = {"terminated": done, "truncated": False}
        timestep = BaseEnvTimestep(next_obs, 0.5, done, info)
        transition = policy.collect_mode.process_transition(obs, {"action": np.int64(t % 4)}, timestep)
        samples += adder.add(0, transition)
        obs = next_obs
    buffer = PrioritizedBuffer(maxlen=64, seed=0)
    buffer.extend(samples)
    batch = buffer.sample(5)
    assert batch["obs"]["obs"].shape == (5, 3) and batch["obs"]["obs"].dtype == torch.float32
    assert batch["next_obs"]["action_mask"].shape == (5, 4) and batch["next_obs"]["action_mask"].dtype == torch.int8
    assert batch["next_obs"]["to_play"].shape == (5,)
    info = policy.learn_mode.forward(batch)
    assert np.isfinite(info["total_loss"]) and np.isfinite(info["priority"]).all()
    buffer.update(info["priority"], batch["unique_id"])
