"""DDPG / TD3 / SAC targets and losses against values computed by hand, terminated and truncated samples mixed."""

import math

import pytest
import torch

from nervex.rl_utils import (
    bootstrap_target,
    critic_loss,
    critic_min,
    ddpg_critic_target,
    deterministic_actor_loss,
    sac_actor_loss,
    sac_alpha_loss,
    sac_critic_target,
    target_policy_smoothing,
    td3_critic_target,
)
from nervex.torch_utils import TanhGaussianDist


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float64, **kw)


# A batch of three 2-step windows, gamma 0.5:
#   sample 0: a full window, not terminal           -> r0 + 0.5 r1 + 0.25 * V
#   sample 1: terminated after its first step        -> r0 only (the padded second reward is 0)
#   sample 2: truncated (time limit) after one step  -> r0 + 0.5 * V: still bootstraps, with gamma ** 1
REWARD = t([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])  # (nstep, B)
TERMINATED = t([0.0, 1.0, 0.0])
VALUE_GAMMA = t([0.25, 0.5, 0.5])


def test_bootstrap_target_terminal_and_truncated_in_one_batch():
    next_value = t([10.0, 20.0, 30.0])
    target = bootstrap_target(next_value, REWARD, TERMINATED, 0.5, nstep=2, value_gamma=VALUE_GAMMA)
    # 1 + 0.5*4 + 0.25*10 = 5.5;  2 (terminal: no bootstrap);  3 + 0.5*30 = 18
    torch.testing.assert_close(target, t([5.5, 2.0, 18.0]))
    # without value_gamma every window bootstraps with gamma ** nstep = 0.25
    target = bootstrap_target(next_value, REWARD, TERMINATED, 0.5, nstep=2)
    torch.testing.assert_close(target, t([5.5, 2.0, 10.5]))


def test_bootstrap_target_rejects_a_batch_first_reward():
    with pytest.raises(ValueError, match=r"reward has shape \(3, 2\).*transpose"):
        bootstrap_target(t([1.0, 2.0, 3.0]), REWARD.t(), TERMINATED, 0.5, nstep=2)


def test_ddpg_target_uses_its_one_critic():
    target = ddpg_critic_target(t([[10.0, 20.0, 30.0]]), REWARD, TERMINATED, 0.5, 2, VALUE_GAMMA)
    torch.testing.assert_close(target, t([5.5, 2.0, 18.0]))
    with pytest.raises(ValueError, match="DDPG has one"):
        ddpg_critic_target(t([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]), REWARD, TERMINATED, 0.5, 2)


def test_td3_target_takes_the_smaller_critic_per_sample():
    target_q = t([[10.0, 25.0, 30.0], [12.0, 20.0, 28.0]])
    assert critic_min(target_q).tolist() == [10.0, 20.0, 28.0]
    target = td3_critic_target(target_q, REWARD, TERMINATED, 0.5, 2, VALUE_GAMMA)
    torch.testing.assert_close(target, t([1 + 2 + 0.25 * 10, 2.0, 3 + 0.5 * 28]))


def test_sac_target_subtracts_the_entropy_term_from_the_min():
    target_q = t([[10.0, 25.0, 30.0], [12.0, 20.0, 28.0]])
    next_log_prob = t([-1.0, 2.0, 4.0])
    target = sac_critic_target(target_q, next_log_prob, 0.5, REWARD, TERMINATED, 0.5, 2, VALUE_GAMMA)
    # bootstrap values: 10 + 0.5 = 10.5;  (terminal);  28 - 0.5 * 4 = 26
    torch.testing.assert_close(target, t([1 + 2 + 0.25 * 10.5, 2.0, 3 + 0.5 * 26]))
    alpha = t(0.5, requires_grad=True)
    target = sac_critic_target(target_q, next_log_prob, alpha, REWARD, TERMINATED, 0.5, 2, VALUE_GAMMA)
    assert not target.requires_grad


def test_critic_loss_sums_the_critics_halved_mse_and_weights_samples():
    q = t([[1.0, 2.0], [3.0, 0.0]], requires_grad=True)
    target = t([2.0, 2.0])
    loss, td_error = critic_loss(q, target)
    # per sample 0.5 * ((2-1)^2 + (2-3)^2) = 1 and 0.5 * (0 + 4) = 2; mean 1.5
    assert loss.item() == pytest.approx(1.5)
    assert td_error.tolist() == [1.0, 1.0]  # mean |error| over critics: (1 + 1) / 2, (0 + 2) / 2
    loss, _ = critic_loss(q, target, weight=t([2.0, 0.0]))
    assert loss.item() == pytest.approx((2 * 1 + 0 * 2) / 2)
    loss.backward()
    torch.testing.assert_close(q.grad, t([[-1.0, 0.0], [1.0, 0.0]]))  # d/dq 0.5 * w (q - y)^2 / B


def test_target_policy_smoothing_clips_the_noise_then_the_action():
    action = t([[0.0, 0.4], [2.5, -0.9]])
    noise = t([[0.9, -0.1], [0.3, -0.3]])
    low, high = t([-1.0, -1.0]), t([3.0, 0.5])
    out = target_policy_smoothing(action, noise, t([0.5, 0.2]), low, high)
    # noise clipped to [[0.5, -0.1], [0.3, -0.2]]; then [[0.5, 0.3], [2.8, -1.1 -> -1.0]]
    torch.testing.assert_close(out, t([[0.5, 0.3], [2.8, -1.0]]))
    out = target_policy_smoothing(t([[2.9, 0.45]]), t([[0.4, 0.4]]), 0.5, low, high)
    torch.testing.assert_close(out, t([[3.0, 0.5]]))  # clipped to the upper bound after the noise


def test_actor_losses():
    q = t([[1.0, 3.0], [-2.0, 5.0]])
    assert deterministic_actor_loss(q).item() == pytest.approx(-2.0)  # the first critic only
    log_prob = t([0.5, -1.0])
    # min over critics: [-2, 3]; 0.2 * [0.5, -1] - [-2, 3] = [2.1, -3.2]; mean -0.55
    assert sac_actor_loss(q, log_prob, 0.2).item() == pytest.approx(-0.55)
    assert sac_actor_loss(q, log_prob, t(0.2), weight=t([1.0, 0.0])).item() == pytest.approx(2.1 / 2)


@pytest.mark.parametrize("log_prob, sign", [([1.0, 1.4], -1), ([-2.0, -3.0], +1)], ids=["entropy_low", "entropy_high"])
def test_alpha_gradient_raises_alpha_when_entropy_is_below_target(log_prob, sign):
    target_entropy = -1.0  # -|A| for one action dimension
    log_alpha = torch.zeros((), dtype=torch.float64, requires_grad=True)
    loss = sac_alpha_loss(log_alpha, t(log_prob), target_entropy)
    loss.backward()
    # d/dlog_alpha = -mean(log_prob + target_entropy): entropy -1.2 < -1 gives -0.2; entropy 2.5 > -1 gives 3.5
    expected = -(sum(log_prob) / 2 + target_entropy)
    assert log_alpha.grad.item() == pytest.approx(expected)
    assert math.copysign(1, log_alpha.grad.item()) == sign
    log_alpha_after = log_alpha.detach() - 0.1 * log_alpha.grad  # one gradient-descent step
    assert (log_alpha_after.item() > 0) == (sign < 0)  # entropy below target -> alpha goes up


def test_tanh_log_prob_correction_matches_change_of_variables():
    """log p(a) of the squashed Gaussian equals log N(u) - log|da/du| with da/du from finite differences, for
    asymmetric bounds, and the density integrates to 1 over [low, high]."""
    mu, sigma, low, high = 0.3, 0.8, -1.0, 3.0
    dist = TanhGaussianDist(t([[mu]]), t([[sigma]]), [low], [high])
    torch.manual_seed(0)
    action, log_prob = dist.rsample_with_log_prob()
    a = action.item()
    loc, scale = (high + low) / 2, (high - low) / 2
    u = math.atanh((a - loc) / scale)
    h = 1e-6
    da_du = (loc + scale * math.tanh(u + h) - (loc + scale * math.tanh(u - h))) / (2 * h)
    log_normal = -0.5 * ((u - mu) / sigma) ** 2 - math.log(sigma) - 0.5 * math.log(2 * math.pi)
    assert log_prob.item() == pytest.approx(log_normal - math.log(da_du), abs=1e-6)
    grid = torch.linspace(low + 1e-4, high - 1e-4, 20001, dtype=torch.float64).unsqueeze(-1)
    density = TanhGaussianDist(t([mu]).expand(20001, 1), t([sigma]).expand(20001, 1), [low], [high])
    total = torch.trapezoid(density.log_prob(grid).exp(), grid.squeeze(-1)).item()
    assert total == pytest.approx(1.0, abs=1e-3)
