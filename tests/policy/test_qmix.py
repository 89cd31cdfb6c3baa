"""QMIX and VDN: the two-step game's payoffs (8 and 7) through the real trainer, masked actions never taken, burn-in
and padding give no gradient, save/load, errors that name what is wrong."""

import os

import numpy as np
import pytest
import torch

from nervex.config import apply_overrides, read_config
from nervex.entry import SerialTrainer
from nervex.envs.two_step import TwoStepGameEnv
from nervex.policy import QMIXPolicy, create_policy
from nervex.utils.registry import ENV_REGISTRY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "app_zoo/multiagent/two_step/config")


def greedy_episode(policy):
    """The greedy joint policy's return on the two-step game and its actions."""
    env, mode = TwoStepGameEnv(), policy.eval_mode
    mode.reset(None)
    obs, total, actions = env.reset(), 0.0, []
    for _ in range(2):
        action = mode.forward([0], {0: obs})[0]["action"]
        actions.append(np.asarray(action).tolist())
        timestep = env.step(action)
        obs, total = timestep.obs, total + float(timestep.reward.mean())
    return total, actions


def joint_q_2b(policy):
    """``Q_tot`` of the four joint actions in state 2B, and the mixer with the agents' Q-values of 2B."""
    model = policy.model
    obs = torch.zeros(1, 2, 3)
    obs[..., 2] = 1.0  # state 2B's one-hot
    with torch.no_grad():
        q = model({"obs": obs, "last_action": torch.zeros(1, 2, 2)})["logit"][0]
        agent_q = torch.stack([torch.stack([q[0, a], q[1, b]]) for a in (0, 1) for b in (0, 1)])
        return model({"agent_q": agent_q, "global_state": obs[0, :1].expand(4, 3)}, mode="mix")["q_tot"], agent_q


def train_two_step(name, tmp_path):
    cfg = read_config(os.path.join(CONFIGS, f"two_step_{name}.yaml"))
    # a fixed budget (no early stop), evaluated at the end: what the greedy policy settles on, not a passing 8
    cfg = apply_overrides(cfg, ["max_env_step=2000", "evaluator.stop_val=100", "evaluator.eval_freq=2000"])
    with SerialTrainer(cfg, seed=0, exp_name=f"two_step_{name}", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
    return trainer


def test_qmix_earns_8_and_vdn_7_on_the_two_step_game(tmp_path, one_thread):
    """The QMIX paper's section 6.1 with uniform exploration: QMIX represents 2B's payoff [[0, 1], [1, 8]] and its greedy
    joint policy earns 8; VDN's sum cannot (it fits (1, 1) at about 6.5) and settles on 2A's 7. ~15 s for both."""
    qmix = train_two_step("qmix", tmp_path)
    total, actions = greedy_episode(qmix.policy)
    assert total == 8.0 and actions[0][0] == 1 and actions[1] == [1, 1]  # branch 2B, then the joint action (1, 1)
    q_tot, agent_q = joint_q_2b(qmix.policy)
    assert q_tot.numpy() == pytest.approx([0.0, 1.0, 1.0, 8.0], abs=0.5)  # the paper's Table 1b, QMIX
    # the trained mixer reads the state: the same agent Qs mix differently in 2A
    with torch.no_grad():
        state_2a = torch.tensor([[0.0, 1.0, 0.0]]).expand(4, 3)
        q_tot_2a = qmix.policy.model({"agent_q": agent_q, "global_state": state_2a}, mode="mix")["q_tot"]
    assert (q_tot_2a - q_tot).abs().max() > 1.0

    vdn = train_two_step("vdn", tmp_path)
    total, actions = greedy_episode(vdn.policy)
    assert total == 7.0 and actions[0][0] == 0  # agent 1 picks branch 2A
    q_tot, _ = joint_q_2b(vdn.policy)
    assert q_tot[3].item() == pytest.approx(6.5, abs=0.6)  # the least-squares sum fit of (1, 1), below 7


# ---- masks ---------------------------------------------------------------------------------------------------------
class MaskedTwoStepEnv(TwoStepGameEnv):
    """The two-step game where agent 2 may never take action 1 (its mask says so) and an illegal action is an error."""

    def _obs(self):
        obs = super()._obs()
        obs["action_mask"][1, 1] = 0
        return obs

    def step(self, action):
        if int(np.asarray(action).reshape(-1)[1]) == 1:
            raise AssertionError(f"masked_two_step: agent 2 took its illegal action 1 ({action})")
        return super().step(action)


if "masked_two_step" not in ENV_REGISTRY:
    ENV_REGISTRY.register("masked_two_step", MaskedTwoStepEnv)


def test_masked_actions_are_never_taken_in_warmup_collection_and_evaluation(tmp_path, one_thread):
    """The recurrent default model (GRU, last action, burn-in) through the real trainer on a masked env: random
    warm-up, epsilon-greedy collection (eps 1 then decaying) and greedy evaluation never take the masked action."""
    cfg = read_config(os.path.join(CONFIGS, "two_step_qmix.yaml"))
    over = ["env.env_type=masked_two_step", "max_env_step=320", "evaluator.stop_val=100", "evaluator.eval_freq=160"]
    over += ["policy.model.agent.rnn=gru", "policy.model.last_action=true", "policy.burnin_step=1", "policy.nstep=2"]
    over += ["policy.learn.random_warmup=true", "policy.learn.learning_starts=64", "policy.priority=true"]
    over += ["policy.command.eps.start=1.0", "policy.command.eps.end=0.0", "policy.command.eps.decay=250"]
    with SerialTrainer(apply_overrides(cfg, over), seed=0, run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
    assert trainer.env_step >= 320 and trainer.evaluator.best_reward == 7.0  # 2B pays at most 1 under the mask


def masked_obs(n_env):
    obs = TwoStepGameEnv().reset()
    mask = np.array([[0, 1], [1, 0]], dtype=np.int8)  # agent 1 may only take 1, agent 2 only 0
    return {i: {**obs, "action_mask": mask} for i in range(n_env)}


def make_policy(enable_field=("learn", "collect", "eval"), **overrides):
    cfg = {
        "policy_type": "qmix",
        "team_reward": "mean",
        "model": dict(obs_dim=3, action_dim=2, agent_num=2, state_dim=3, agent=dict(hidden_sizes=[8], hidden_size=8)),
        "burnin_step": 1,
        "unroll_len": 2,
        "nstep": 1,
        **overrides,
    }
    return create_policy(cfg, enable_field=list(enable_field))


def test_collect_and_eval_forwards_take_only_legal_actions():
    torch.manual_seed(0)
    policy = make_policy()
    obs = masked_obs(6)
    for eps in (1.0, 0.5, 0.0):
        for _ in range(10):
            out = policy.collect_mode.forward(list(obs), obs, eps=eps)
            assert all(np.asarray(o["action"]).tolist() == [1, 0] for o in out.values())
    for _ in range(3):
        out = policy.eval_mode.forward(list(obs), obs)
        assert all(np.asarray(o["action"]).tolist() == [1, 0] for o in out.values())


# ---- learning on sequences ------------------------------------------------------------------------------------------
B, T, N, A, H = 3, 4, 2, 2, 8  # burn-in 1 + unroll 2 + nstep 1


def make_batch(seed=0):
    """A replay batch (batch axis first) as the sequence adder gives it: sample 2's episode ended after step 2."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T)
    mask[2, 3:] = 0.0
    return {
        "obs": {
            "obs": torch.rand(B, T, N, 3, generator=g),
            "global_state": torch.rand(B, T, 3, generator=g),
            "action_mask": torch.ones(B, T, N, A, dtype=torch.int8),
        },
        "action": torch.randint(0, A, (B, T, N), generator=g),
        "reward": torch.randn(B, T, N, generator=g),
        "terminated": torch.zeros(B, T, dtype=torch.bool),
        "truncated": torch.zeros(B, T, dtype=torch.bool),
        "done": torch.zeros(B, T, dtype=torch.bool),
        "mask": mask,
        "burnin": torch.tensor([0, 1, 1]),
        "prev_state": {"h": torch.randn(B, N, H, generator=g)},
        "prev_action": torch.zeros(B, N, A),
        "weight": None,
    }


def test_burn_in_and_padding_steps_give_no_gradient():
    torch.manual_seed(0)
    policy = make_policy(enable_field=("learn",))
    batch = make_batch()
    batch["obs"]["obs"].requires_grad_(True)
    policy._sequence_loss(batch)["loss"].backward()
    grad = batch["obs"]["obs"].grad.abs().sum((-1, -2))  # (B, T)
    assert grad[1, 0] == 0 and grad[2, 0] == 0  # the burn-in step of samples 1 and 2
    assert grad[0, 0] > 0 and grad[1, 1] > 0 and grad[0, 1] > 0  # learn steps
    assert grad[2, 3] == 0  # sample 2's padding step only bootstraps


def test_a_dead_agent_contributes_nothing():
    """Agent 1 of sample 0 is dead throughout: its observations reach neither Q_tot nor the gradient."""
    torch.manual_seed(0)
    policy = make_policy(enable_field=("learn",))
    batch = make_batch()
    alive = torch.ones(B, T, N, dtype=torch.int8)
    alive[0, :, 1] = 0
    batch["obs"]["alive"] = alive
    batch["obs"]["obs"].requires_grad_(True)
    policy._sequence_loss(batch)["loss"].backward()
    grad = batch["obs"]["obs"].grad.abs().sum(-1)  # (B, T, N)
    assert grad[0, :, 1].sum() == 0
    assert grad[0, 1:, 0].sum() > 0 and grad[1, 1:, 1].sum() > 0  # the living agents' do


def test_learn_logs_and_lowers_the_loss():
    torch.manual_seed(0)
    policy = make_policy(enable_field=("learn",), learn=dict(learning_rate=0.01, target_update_freq=1000))
    first = policy.learn_mode.forward(make_batch())
    assert {"cur_lr", "total_loss", "q_value", "td_error"} <= set(first)
    for _ in range(30):
        last = policy.learn_mode.forward(make_batch())
    assert last["total_loss"] < first["total_loss"]


def test_save_then_load_gives_identical_actions():
    torch.manual_seed(0)
    trained = make_policy()
    for _ in range(3):
        trained.learn_mode.forward(make_batch())
    torch.manual_seed(1)
    fresh = make_policy(enable_field=("eval",))
    rng = np.random.default_rng(0)
    steps = [{i: {**TwoStepGameEnv().reset(), "obs": rng.random((2, 3), dtype=np.float32)} for i in range(4)}]
    steps += [{i: {**o, "obs": rng.random((2, 3), dtype=np.float32)} for i, o in steps[0].items()} for _ in range(3)]

    def actions(policy):
        policy.eval_mode.reset(None)
        return [np.stack([policy.eval_mode.forward(list(o), o)[i]["action"] for i in o]).tolist() for o in steps]

    assert actions(fresh) != actions(trained)  # different weights act differently (the test can fail)
    fresh.load_state_dict(trained.state_dict())
    assert actions(fresh) == actions(trained)


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="team_reward is 'env' but no env resolved it"):
        make_policy(team_reward="env")
    with pytest.raises(ValueError, match="needs a QMix-like model"):
        create_policy(
            {
                "policy_type": "qmix",
                "team_reward": "sum",
                "model_type": "agent_net",
                "model": dict(obs_dim=3, action_dim=2, agent_num=2),
            }
        )
    policy = make_policy(enable_field=("eval",))
    bad = {0: {**TwoStepGameEnv().reset(), "obs": np.zeros((2, 4), np.float32)}}
    with pytest.raises(ValueError, match=r"QMix expects obs of shape \(B, 2, 3\)"):
        policy.eval_mode.forward([0], bad)
    assert issubclass(
        type(
            create_policy(
                {"policy_type": "vdn", "team_reward": "sum", "model": dict(obs_dim=3, action_dim=2, agent_num=2)}
            )
        ),
        QMIXPolicy,
    )
