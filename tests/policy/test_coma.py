"""COMA: learning the two-step game through serial_pipeline, masks in collect and eval, the critic's counterfactual
input and baseline, a learn step's masks, save/load."""

import copy
import os

import numpy as np
import pytest
import torch

from nervex.config import ConfigError, read_config
from nervex.entry import serial_pipeline
from nervex.entry.callbacks import DefaultCallbacks
from nervex.envs.two_step import TwoStepGameEnv
from nervex.model import COMACritic
from nervex.policy import create_policy
from nervex.rl_utils import Adder, coma_advantage
from nervex.torch_utils import collate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TWO_STEP_COMA = os.path.join(ROOT, "app_zoo/multiagent/two_step/config/two_step_coma.yaml")
N, OBS, A, S = 3, 4, 3, 5


class ReturnLog(DefaultCallbacks):
    """Serial-trainer callbacks keeping every collected episode's team return."""

    def __init__(self):
        self.returns = []

    def on_episode_end(self, trainer, env_id, episode_return, episode_len):
        self.returns.append(float(episode_return))


def greedy_return(policy):
    """One greedy episode of the two-step game played by the policy's eval mode."""
    env = TwoStepGameEnv()
    obs, total, done = env.reset(), 0.0, False
    policy.eval_mode.reset([0])
    while not done:
        action = policy.eval_mode.forward([0], {0: obs})[0]["action"]
        timestep = env.step(action)
        obs, done = timestep.obs, timestep.done
        total += float(timestep.reward.mean())
    return total


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The shipped two-step config for 1600 env steps, no early stop: a convergence test of 6-13 s on one thread
    (up to ~20 s on the shared machine under load)."""
    torch.set_num_threads(1)
    cfg = read_config(TWO_STEP_COMA)
    cfg.max_env_step = 1600
    cfg.evaluator.update(stop_val=100, eval_freq=100000)
    log = ReturnLog()
    policy = serial_pipeline(cfg, seed=0, run_root=str(tmp_path_factory.mktemp("coma")), callbacks=log, progress=False)
    return policy, log.returns


def test_coma_learns_the_two_step_game(trained):
    """Sampled returns rise from the near-random start (about 4.75) to the safe branch's 7, and the greedy joint
    policy earns at least 7 (on seed 0 COMA settles on branch 2A, the paper's finding; seeds whose first greedy policy
    already picks 2B keep 8)."""
    policy, returns = trained
    assert len(returns) == 800
    first, last = np.mean(returns[:64]), np.mean(returns[-64:])
    assert first < 6.0, f"the first episodes already earn {first}"
    assert last >= 6.5, f"the last 64 collected episodes earn {last} (first 64: {first})"
    assert greedy_return(policy) >= 7.0


def _policy(**learn):
    cfg = dict(
        policy_type="coma",
        team_reward="sum",
        max_episode_len=3,
        discount_factor=0.5,
        td_lambda=0.5,
        model=dict(obs_dim=OBS, action_dim=A, agent_num=N, state_dim=S),
        learn=dict(learn),
    )
    return create_policy(cfg)


def _masked_obs(batch, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(batch, N, A, generator=gen) < 0.5).to(torch.int8)
    mask[..., 0] = torch.where(mask.sum(-1) == 0, 1, mask[..., 0]).to(torch.int8)  # at least one legal action
    return {
        "obs": torch.randn(batch, N, OBS, generator=gen),
        "global_state": torch.randn(batch, S, generator=gen),
        "action_mask": mask,
    }


def test_masked_actions_are_never_taken_in_collect_or_eval():
    policy = _policy()
    ids = list(range(16))
    for eps in (1.0, 0.5, 0.0):
        for step in range(20):
            obs = _masked_obs(len(ids), seed=step)
            action = policy._forward_collect(ids, obs, eps=eps)["action"]
            assert action.shape == (16, N)
            legal = obs["action_mask"].gather(-1, action.unsqueeze(-1)).squeeze(-1)
            assert bool((legal == 1).all()), f"an illegal action was sampled with eps={eps}"
    obs = _masked_obs(len(ids), seed=99)
    # the unmasked greedy action is made illegal wherever another action is legal: eval must avoid it
    logit = policy._model({"obs": obs["obs"], "prev_state": None})["logit"]
    unmasked = logit.argmax(-1, keepdim=True)
    obs["action_mask"] = torch.ones_like(obs["action_mask"]).scatter(-1, unmasked, 0)
    policy._reset_eval(ids)
    action = policy._forward_eval(ids, obs)["action"]
    assert bool((action != unmasked.squeeze(-1)).all())
    assert bool((obs["action_mask"].gather(-1, action.unsqueeze(-1)) == 1).all())


def test_critic_input_zeroes_the_agents_own_action_by_hand():
    critic = COMACritic(obs_dim=1, action_dim=2, agent_num=2, state_dim=1, hidden_sizes=(4,), last_action=True)
    data = {
        "global_state": torch.tensor([[9.0]]),
        "obs": torch.tensor([[[1.0], [2.0]]]),
        "action": torch.tensor([[1, 0]]),
        "last_action": torch.tensor([[-1, 1]]),
    }
    rows = critic._inputs(data)[0].tolist()
    # state | own obs | joint action one-hot (own zeroed) | last actions (agent 0 had none) | agent id
    assert rows[0] == [9.0, 1.0] + [0.0, 0.0, 1.0, 0.0] + [0.0, 0.0, 0.0, 1.0] + [1.0, 0.0]
    assert rows[1] == [9.0, 2.0] + [0.0, 1.0, 0.0, 0.0] + [0.0, 0.0, 0.0, 1.0] + [0.0, 1.0]


def test_one_pass_baseline_equals_the_counterfactual_sum_over_joint_actions():
    torch.manual_seed(0)
    critic = COMACritic(obs_dim=OBS, action_dim=A, agent_num=N, state_dim=S)
    data = {
        "global_state": torch.randn(2, S),
        "obs": torch.randn(2, N, OBS),
        "action": torch.tensor([[0, 2, 1], [1, 1, 0]]),
    }
    pi = torch.softmax(torch.randn(2, N, A), -1)
    q = critic(data)["q"]
    got = coma_advantage(q, pi, data["action"])
    for b in range(2):
        for a in range(N):
            # sum_u' pi_a(u') Q(s, (u_-a, u')): change agent a's action in the joint action, read a's value of it
            hand = 0.0
            for u in range(A):
                joint = data["action"].clone()
                joint[b, a] = u
                hand += pi[b, a, u].item() * critic({**data, "action": joint})["q"][b, a, u].item()
            assert got.baseline[b, a].item() == pytest.approx(hand, rel=1e-5)
            assert got.advantage[b, a].item() == pytest.approx(q[b, a, data["action"][b, a]].item() - hand, rel=1e-5)


def _episode_batch(policy, dead_agent):
    """Two episodes through the policy's own Adder: one terminated after 2 steps, one truncated at the limit (3)."""
    adder = Adder(unroll_len=3, kind="episode")
    samples = []
    for env_id, (length, end) in enumerate(((2, "terminated"), (3, "truncated"))):
        adder.add_first(env_id)
        for t in range(length):
            obs, next_obs = _masked_obs(1, seed=10 * env_id + t), _masked_obs(1, seed=10 * env_id + t + 1)
            for o in (obs, next_obs):
                o["alive"] = torch.tensor([[1, 1, 0 if dead_agent else 1]], dtype=torch.int8)
            row = {k: v[0].numpy() for k, v in obs.items()}
            action = policy._forward_collect([env_id], obs, eps=0.3)["action"][0].numpy()
            last = t == length - 1
            samples += adder.add(
                env_id,
                {
                    "obs": row,
                    "next_obs": {k: v[0].numpy() for k, v in next_obs.items()},
                    "action": action,
                    "reward": np.full(N, 1.0, np.float32),
                    "terminated": last and end == "terminated",
                    "truncated": last and end == "truncated",
                    "done": last,
                },
            )
    return collate(samples)


def test_a_learn_step_logs_its_figures_and_a_dead_agent_gets_no_actor_gradient():
    policy = _policy(target_update_freq=1)
    batch = _episode_batch(policy, dead_agent=True)
    assert batch["obs"]["obs"].shape == (2, 4, N, OBS) and batch["mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]
    info = policy._forward_learn(copy.deepcopy(batch), eps=0.3)
    for key in ("actor_loss", "critic_loss", "entropy", "advantage_mean", "total_loss"):
        assert np.isfinite(info[key]), key
    assert info["eps"] == 0.3
    assert all(bool(torch.isfinite(p).all()) for p in policy._model.parameters())  # illegal actions' pi = 0
    # the dead agent's inputs (its observations) do not reach the actor loss; a live agent's do
    obs = batch["obs"]["obs"].clone().requires_grad_(True)
    ep = policy._episodes({**batch, "obs": {**batch["obs"], "obs": obs}})
    logit = policy._model.actor({"obs": ep.obs, "prev_state": None}, sequence=True)["logit"]
    pi_taken = torch.softmax(logit, -1)[:3].gather(-1, ep.action[:3].unsqueeze(-1)).squeeze(-1)
    (pi_taken.clamp(min=1e-6).log() * ep.agent_mask).sum().backward()
    assert obs.grad[:, :, 2].abs().sum().item() == 0.0 and obs.grad[:, :, 0].abs().sum().item() > 0
    # the target critic was copied (target_update_freq 1)
    target = policy._critic_agent.target_model.state_dict()
    assert all(torch.equal(v, policy._model.critic.state_dict()[k]) for k, v in target.items())


def test_save_then_load_gives_identical_actions(trained, tmp_path):
    policy, _ = trained
    path = tmp_path / "coma.pt"
    torch.save(policy.state_dict(), path)
    loaded = create_policy(policy.cfg, enable_field=["learn", "collect", "eval"])
    loaded.load_state_dict(torch.load(path, weights_only=True))
    ids = [0, 1, 2]
    envs = {i: TwoStepGameEnv() for i in ids}
    for p in (policy, loaded):
        p.eval_mode.reset(ids)
    obs = {i: env.reset() for i, env in envs.items()}
    for _ in range(2):
        a = policy.eval_mode.forward(ids, obs)
        b = loaded.eval_mode.forward(ids, obs)
        assert all(np.array_equal(a[i]["action"], b[i]["action"]) for i in ids)
        obs = {i: envs[i].step(a[i]["action"]).obs for i in ids}
    batch = collate([TwoStepGameEnv().reset() for _ in range(8)])
    actions = []
    for p in (policy, loaded):
        p._reset_collect()
        torch.manual_seed(5)
        actions.append(p._forward_collect(list(range(8)), batch, eps=0.2)["action"])
    assert torch.equal(*actions)
    target = loaded._critic_agent.target_model.state_dict()
    assert all(torch.equal(v, policy._critic_agent.target_model.state_dict()[k]) for k, v in target.items())


def test_whole_episodes_are_required():
    with pytest.raises(ConfigError, match="n_episode.*whole episodes"):
        create_policy(
            dict(policy_type="coma", team_reward="sum", collect=dict(n_episode=None), model=dict(obs_dim=1)),
        )
