"""Correlated exploration noise for a squashed-Gaussian actor: unit-variance AR(1) and pink processes, per-env state
reset one env at a time, seeded repeatability, and white noise making the draws ``gaussian_sample`` makes."""

import math

import pytest
import torch
import torch.nn as nn

from nervex.agent import Agent, AR1Noise, PinkNoise, make_noise_process, powerlaw_noise

LOW, HIGH = torch.tensor([-1.0, 0.0]), torch.tensor([3.0, 0.5])


class FixedGaussianActor(nn.Module):
    """The same pre-squash mean and standard deviation for every row."""

    def __init__(self, mu=(0.3, -0.2), sigma=(0.8, 1.5)):
        super().__init__()
        self.mu, self.sigma = torch.tensor(mu), torch.tensor(sigma)

    def forward(self, x):
        batch = x.shape[0]
        return {"mu": self.mu.expand(batch, -1).clone(), "sigma": self.sigma.expand(batch, -1).clone()}


def colored_agent(**kwargs):
    agent = Agent(FixedGaussianActor())
    agent.add_plugin("main", "colored_gaussian_sample", low=LOW, high=HIGH, **kwargs)
    return agent


def lag1_correlation(x):
    """Lag-1 autocorrelation of a zero-mean, unit-variance ``(T, N)`` sample, pooled over the N columns."""
    return (x[1:] * x[:-1]).mean().item() / x.pow(2).mean().item()


# ---- the processes -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rho", [0.0, 0.8, 0.95])
def test_ar1_has_unit_stationary_variance_and_lag1_correlation_rho(rho):
    torch.manual_seed(0)
    process = AR1Noise(rho)
    # 256 independent dimensions x 400 steps; a (re)started process is stationary from its first draw
    x = torch.stack([process.sample([0], 256)[0] for _ in range(400)])
    assert x.var().item() == pytest.approx(1.0, abs=0.06)
    assert x[0].var().item() == pytest.approx(1.0, abs=0.25)  # the first draw already has the stationary variance
    assert lag1_correlation(x) == pytest.approx(rho, abs=0.02)
    assert (x[2:] * x[:-2]).mean().item() == pytest.approx(rho**2, abs=0.03)  # lag 2: rho^2


def test_powerlaw_noise_has_unit_variance_at_every_step_and_a_one_over_f_spectrum():
    torch.manual_seed(0)
    y = powerlaw_noise(1.0, 256, (3000,))  # (3000, 256): 3000 independent pink sequences
    assert y.shape == (3000, 256) and y.dtype == torch.float32
    variance_per_step = y.var(dim=0)
    assert variance_per_step.mean().item() == pytest.approx(1.0, abs=0.03)
    assert (variance_per_step - 1).abs().max().item() < 0.15  # stationary: the same at the start, middle and end
    power = torch.fft.rfft(y.double(), dim=-1).abs().pow(2).mean(dim=0)
    k = torch.arange(1, 128, dtype=torch.float64)  # leave out the zero and the Nyquist frequencies
    slope = (
        torch.linalg.lstsq(torch.stack([k.log(), torch.ones_like(k)], dim=1), power[1:128].log().unsqueeze(1))
        .solution[0]
        .item()
    )
    assert slope == pytest.approx(-1.0, abs=0.05)
    assert power[1:5].mean() > 20 * power[64:128].mean()  # the low frequencies dominate
    assert lag1_correlation(y.t()) > 0.6


@pytest.mark.parametrize("seq_len", [255, 256])
def test_powerlaw_noise_with_beta_0_is_white(seq_len):
    torch.manual_seed(1)
    y = powerlaw_noise(0.0, seq_len, (2000,))
    assert y.var(dim=0).mean().item() == pytest.approx(1.0, abs=0.03)
    assert abs(lag1_correlation(y.t())) < 0.01


def test_pink_process_reads_its_sequence_then_draws_a_new_one():
    torch.manual_seed(2)
    expected = powerlaw_noise(1.0, 4, (2,)).t()  # what the process generates first: (seq_len, dim)
    torch.manual_seed(2)
    process = PinkNoise(beta=1.0, seq_len=4)
    drawn = torch.cat([process.sample([5], 2) for _ in range(4)])
    torch.testing.assert_close(drawn, expected)
    rng = torch.get_rng_state()
    fifth = process.sample([5], 2)[0]
    torch.set_rng_state(rng)
    torch.testing.assert_close(fifth, powerlaw_noise(1.0, 4, (2,)).t()[0])  # a new sequence, from the RNG's next draws


def test_processes_keep_one_state_per_env_and_reset_only_the_listed_ones():
    rho = 0.5
    process = AR1Noise(rho)
    torch.manual_seed(3)
    first = process.sample([0, 7], 2)
    state_7 = process.states[7]
    process.reset([0])  # env 0's episode ended
    assert sorted(process.states) == [7] and torch.equal(process.states[7], state_7)
    torch.manual_seed(4)
    second = process.sample([7, 0], 2)
    torch.manual_seed(4)
    xi = torch.randn(2, 2)
    torch.testing.assert_close(second[0], rho * first[1] + math.sqrt(1 - rho**2) * xi[0])  # env 7 continues
    torch.testing.assert_close(second[1], xi[1])  # env 0 restarts from a fresh stationary draw
    process.reset()
    assert process.states == {}

    pink = PinkNoise(1.0, 16)
    pink.sample([1, 2], 3)
    pink.sample([1, 2], 3)
    sequence_2, t_2 = pink.states[2]
    pink.reset([1])
    assert sorted(pink.states) == [2] and pink.states[2][1] == t_2 == 2
    pink.sample([2], 3)
    assert torch.equal(pink.states[2][0], sequence_2) and pink.states[2][1] == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(noise="pinkk"), "unknown type 'pinkk'; valid: white, ar1, pink"),
        (dict(noise="ar1", rho=1.0), r"ar1 needs rho in \[0, 1\), got 1.0"),
        (dict(noise="pink", beta=-1.0), r"pink needs beta in \[0, 4\], got -1.0"),
        (dict(noise="pink", seq_len=1), "pink needs an int seq_len >= 2, got 1"),
    ],
)
def test_bad_process_arguments_raise_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_noise_process(**kwargs)


# ---- the sampling plugin -------------------------------------------------------------------------------------------
def test_white_noise_draws_what_gaussian_sample_draws():
    reference = Agent(FixedGaussianActor())
    reference.add_plugin("main", "gaussian_sample", squash=True, low=LOW, high=HIGH)
    colored = colored_agent(noise="white")
    torch.manual_seed(5)
    expected = torch.cat([reference.forward(torch.zeros(3, 1))["action"] for _ in range(4)])
    torch.manual_seed(5)
    got = torch.cat([colored.forward(torch.zeros(3, 1), state_id=[0, 1, 2])["action"] for _ in range(4)])
    # the same draws: another draw would differ by O(1), a change of arithmetic only by a rounding error
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_actions_are_the_squashed_gaussian_of_the_processs_draws_in_the_bounds():
    agent = colored_agent(noise="ar1", rho=0.9)
    torch.manual_seed(6)
    action = agent.forward(torch.zeros(2, 1), state_id=[4, 1])["action"]
    torch.manual_seed(6)
    eps = torch.randn(2, 2)  # a fresh AR(1) process starts with one standard-normal draw
    u = torch.tensor([0.3, -0.2]) + torch.tensor([0.8, 1.5]) * eps
    # bounds [-1, 3] x [0, 0.5]: centre [1, 0.25], half range [2, 0.25]
    torch.testing.assert_close(action, torch.tensor([1.0, 0.25]) + torch.tensor([2.0, 0.25]) * torch.tanh(u))
    assert "logp" not in agent.forward(torch.zeros(2, 1), state_id=[4, 1])


@pytest.mark.parametrize("noise", ["white", "ar1", "pink"])
def test_same_seed_same_actions(noise):
    def run(seed):
        torch.manual_seed(seed)
        agent = colored_agent(noise=noise, seq_len=8)
        out = [agent.forward(torch.zeros(2, 1), state_id=[0, 1])["action"] for _ in range(10)]
        agent.reset([1])
        out += [agent.forward(torch.zeros(2, 1), state_id=[0, 1])["action"] for _ in range(10)]
        return torch.stack(out)

    a = run(0)
    assert torch.equal(a, run(0)) and not torch.equal(a, run(1))


def test_correlated_actions_move_less_per_step_than_white_ones():
    def mean_step(noise):
        torch.manual_seed(7)
        agent = colored_agent(noise=noise, rho=0.95)
        a = torch.stack([agent.forward(torch.zeros(1, 1), state_id=[0])["action"][0, 0] for _ in range(500)])
        return (a[1:] - a[:-1]).abs().mean().item()

    assert mean_step("ar1") < 0.5 * mean_step("white")


def test_plugin_checks_its_ids_and_arguments():
    agent = colored_agent(noise="ar1")
    with pytest.raises(ValueError, match="got 1 state ids for a batch of 2 actions"):
        agent.forward(torch.zeros(2, 1), state_id=[0])
    with pytest.raises(ValueError, match="ar1 needs rho"):
        colored_agent(noise="ar1", rho=-0.1)
