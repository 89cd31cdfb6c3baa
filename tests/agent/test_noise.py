"""Exploration noise plugins: scaled to the bounds and clipped into them, OU per-env state, seeded repeatability."""

import pytest
import torch
import torch.nn as nn

from nervex.agent import Agent, OUNoisePlugin, create_plugin

LOW, HIGH = torch.tensor([-1.0, 0.0]), torch.tensor([3.0, 0.5])


class ConstantActor(nn.Module):
    """Outputs the same action for every row."""

    def __init__(self, action):
        super().__init__()
        self.action = torch.tensor(action)

    def forward(self, x):
        return {"action": self.action.expand(x.shape[0], -1).clone()}


def agent_with(plugin, action=(1.0, 0.25), **kwargs):
    agent = Agent(ConstantActor(list(action)))
    agent.add_plugin("main", plugin, low=LOW, high=HIGH, **kwargs)
    return agent


def test_gaussian_noise_is_scaled_by_the_half_range_and_repeats_with_a_seed():
    agent = agent_with("gaussian_noise", sigma=0.1)
    torch.manual_seed(3)
    action = agent.forward(torch.zeros(4, 1))["action"]
    torch.manual_seed(3)
    unit = torch.randn(4, 2)
    # half ranges: [2, 0.25]
    torch.testing.assert_close(action, torch.tensor([1.0, 0.25]) + 0.1 * torch.tensor([2.0, 0.25]) * unit)
    torch.manual_seed(3)
    assert torch.equal(agent.forward(torch.zeros(4, 1))["action"], action)


def test_gaussian_noise_clips_into_an_asymmetric_box():
    agent = agent_with("gaussian_noise", action=(2.9, 0.45), sigma=5.0)
    torch.manual_seed(0)
    action = agent.forward(torch.zeros(2000, 1))["action"]
    assert action[:, 0].min() == -1.0 and action[:, 0].max() == 3.0  # both bounds reached, never passed
    assert action[:, 1].min() == 0.0 and action[:, 1].max() == 0.5
    assert agent_with("gaussian_noise", sigma=0.0).forward(torch.zeros(2, 1))["action"].tolist() == [[1.0, 0.25]] * 2


def test_ou_noise_reverts_to_its_mean_and_keeps_one_process_per_env():
    # sigma 0: x_n = mu * (1 - (1 - theta dt)^n); theta dt = 0.5 gives 0.5 mu, 0.75 mu, 0.875 mu
    agent = agent_with("ou_noise", action=(0.0, 0.0), sigma=0.0, theta=0.5, dt=1.0, mu=0.2)
    plugin = agent.plugin("main", "ou_noise")
    for expected in (0.1, 0.15, 0.175):
        agent.forward(torch.zeros(1, 1), state_id=[4])
        torch.testing.assert_close(plugin.states[4], torch.tensor([expected, expected]))
    out = agent.forward(torch.zeros(2, 1), state_id=[4, 7])["action"]
    # env 4 continues (0.1875), env 7 starts fresh (0.1); actions are 0 + half_range * x, clipped at 0 from below
    torch.testing.assert_close(out, torch.tensor([[2 * 0.1875, 0.25 * 0.1875], [2 * 0.1, 0.25 * 0.1]]))
    agent.reset([4])
    assert set(plugin.states) == {7}
    agent.forward(torch.zeros(1, 1), state_id=[4])
    torch.testing.assert_close(plugin.states[4], torch.tensor([0.1, 0.1]))  # restarted from 0
    agent.reset()
    assert plugin.states == {}


def test_ou_noise_is_correlated_in_time_and_seeded():
    def run(seed):
        torch.manual_seed(seed)
        agent = agent_with("ou_noise", action=(1.0, 0.25), sigma=0.3, theta=0.15, dt=0.01)
        return torch.stack([agent.forward(torch.zeros(1, 1), state_id=[0])["action"][0] for _ in range(50)])

    a, b = run(1), run(1)
    assert torch.equal(a, b) and not torch.equal(a, run(2))
    steps = (a[1:, 0] - a[:-1, 0]).abs()
    # one step moves the process by about sigma * sqrt(dt) = 0.03 (scaled by 2): far less than white noise of 0.3
    assert steps.mean() < 0.15


def test_noise_plugins_check_their_arguments():
    with pytest.raises(ValueError, match="sigma must be a non-negative number"):
        create_plugin("gaussian_noise", sigma=-0.1, low=LOW, high=HIGH)
    with pytest.raises(ValueError, match="low is required"):
        create_plugin("gaussian_noise", sigma=0.1, low=None, high=HIGH)
    with pytest.raises(ValueError, match="need low < high"):
        create_plugin("ou_noise", sigma=0.1, low=HIGH, high=LOW)
    with pytest.raises(ValueError, match="got 1 state ids for a batch of 2"):
        agent_with("ou_noise", sigma=0.1).forward(torch.zeros(2, 1), state_id=[0])
    assert isinstance(create_plugin("ou_noise", sigma=0.1, low=-1.0, high=1.0), OUNoisePlugin)
