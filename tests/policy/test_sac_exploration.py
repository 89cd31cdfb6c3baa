"""SAC's correlated exploration (``policy.collect.noise``): declared defaults, errors naming the key, white noise as
before, one process per env restarted only at that env's episode end, deterministic eval; and (slow) the shipped
MountainCarContinuous config reaching 90 within 50k env steps."""

import os

import numpy as np
import pytest
import torch

from nervex.config import ConfigError, read_config
from nervex.entry import SerialTrainer
from nervex.policy import SACPolicy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MOUNTAIN_CAR = os.path.join(ROOT, "app_zoo/classic_control/mountain_car/config/mountain_car_continuous_sac.yaml")
LOW, HIGH = [-1.0, 0.0], [3.0, 0.5]
MODEL = {"obs_dim": 3, "action_dim": 2, "action_low": LOW, "action_high": HIGH, "hidden_sizes": [32, 32]}
OBS = {env_id: np.full(3, 0.1 * env_id, dtype=np.float32) for env_id in range(4)}


def make(noise=None, seed=0):
    torch.manual_seed(seed)
    return SACPolicy({"policy_type": "sac", "model": dict(MODEL), "collect": {"noise": noise or {}}})


def collect(policy, env_ids):
    out = policy.collect_mode.forward(list(env_ids), {i: OBS[i] for i in env_ids})
    return np.stack([out[i]["action"] for i in env_ids])


def process(policy):
    return policy._collect_agent.plugin("main", "colored_gaussian_sample").process


def test_noise_defaults_are_white_and_declared_once():
    noise = SACPolicy.compile_section({"policy_type": "sac"}).collect.noise
    assert dict(noise) == {"type": "white", "rho": 0.9, "beta": 1.0, "seq_len": 1000}


@pytest.mark.parametrize(
    "noise, message",
    [
        ({"type": "ou"}, r"key 'policy.collect.noise.type' must be one of 'white', 'ar1', 'pink', got 'ou'"),
        ({"type": "ar1", "rho": 1.0}, r"key 'policy.collect.noise.rho' must be >= 0 and < 1, got 1.0"),
        ({"beta": -0.5}, r"key 'policy.collect.noise.beta' must be >= 0 and <= 4"),
        ({"seq_len": 1}, r"key 'policy.collect.noise.seq_len' must be >= 2"),
        ({"sigma": 0.1}, r"unknown key 'policy.collect.noise.sigma'"),
        ({"rh": 0.5}, r"unknown key 'policy.collect.noise.rh'; did you mean 'policy.collect.noise.rho'"),
    ],
)
def test_a_bad_noise_value_raises_naming_the_key(noise, message):
    with pytest.raises(ConfigError, match=message):
        SACPolicy.compile_section({"policy_type": "sac", "collect": {"noise": noise}})


def test_white_noise_collects_what_the_gaussian_sample_plugin_collects():
    """Today's behaviour: the default draws the same actions as ``gaussian_sample`` under the same seed."""
    policy = make()
    torch.manual_seed(3)
    got = collect(policy, [0, 1, 2])
    agent = policy._collect_agent
    reference = type(agent)(agent.model)
    reference.add_plugin(
        "main", "gaussian_sample", squash=True, low=agent.model.action_low, high=agent.model.action_high
    )
    reference.add_plugin("main", "grad", enable_grad=False)
    torch.manual_seed(3)
    obs = torch.as_tensor(np.stack([OBS[i] for i in (0, 1, 2)]))
    expected = reference.forward(obs, mode="compute_actor")["action"].numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)  # the same draws (another would differ by O(1))


def test_each_env_keeps_its_process_and_only_the_ended_env_restarts():
    policy = make({"type": "ar1", "rho": 0.5})
    collect(policy, [0, 3])
    collect(policy, [3])
    states = process(policy).states
    assert sorted(states) == [0, 3]
    policy.collect_mode.reset([3])  # what the actor calls when env 3's episode ends
    assert sorted(process(policy).states) == [0] and torch.equal(process(policy).states[0], states[0])
    policy.collect_mode.reset()
    assert process(policy).states == {}


@pytest.mark.parametrize("kind", ["white", "ar1", "pink"])
def test_same_seed_same_collected_actions_and_eval_is_the_squashed_mean(kind):
    def run(seed):
        policy = make({"type": kind}, seed=0)
        torch.manual_seed(seed)
        actions = [collect(policy, [0, 1]) for _ in range(5)]
        policy.collect_mode.reset([1])
        actions += [collect(policy, [0, 1]) for _ in range(5)]
        return np.stack(actions), policy

    a, policy = run(4)
    b, _ = run(4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, run(5)[0])
    eval_out = policy.eval_mode.forward([0, 1], {0: OBS[0], 1: OBS[1]})
    again = policy.eval_mode.forward([0, 1], {0: OBS[0], 1: OBS[1]})
    np.testing.assert_array_equal(eval_out[1]["action"], again[1]["action"])
    model_out = policy.model(torch.as_tensor(OBS[1]).unsqueeze(0), mode="compute_actor")
    centre, half = (np.array(HIGH) + np.array(LOW)) / 2, (np.array(HIGH) - np.array(LOW)) / 2
    squashed_mean = centre + half * np.tanh(model_out["mu"][0].detach().numpy())
    np.testing.assert_allclose(eval_out[1]["action"], squashed_mean, rtol=1e-6, atol=1e-6)


def test_ar1_collected_actions_are_correlated_in_time():
    def lag1(kind):
        policy = make({"type": kind, "rho": 0.95})
        torch.manual_seed(6)
        a = np.stack([collect(policy, [0])[0] for _ in range(400)])
        a = (a - a.mean(0)) / a.std(0)
        return float((a[1:] * a[:-1]).mean())

    assert lag1("ar1") > 0.8 and abs(lag1("white")) < 0.15


@pytest.mark.slow
def test_shipped_mountain_car_continuous_config_reaches_90_within_50k_steps(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = read_config(MOUNTAIN_CAR)
        with SerialTrainer(cfg, seed=0, exp_name="mcc_sac", run_root=str(tmp_path)) as trainer:
            trainer.run(progress=False)
    finally:
        torch.set_num_threads(threads)
    assert trainer.env_step <= 50_000 and trainer.evaluator.best_reward >= 90, (
        f"best evaluation {trainer.evaluator.best_reward} after {trainer.env_step} steps"
    )
