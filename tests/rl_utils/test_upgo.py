"""UPGO returns and loss against values computed by hand."""

import math

import pytest
import torch

from nervex.rl_utils import upgo_loss, upgo_returns


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float64, **kw)


# gamma = 1 (AlphaStar), T = 4, one column: V = [1, 2, 3, 1 | 5], r = [1, 1, 0, 2]
# Q_t = r_t + V_{t+1}: Q_0 = 3 >= V_0 = 1, Q_1 = 4 >= V_1 = 2, Q_2 = 1 < V_2 = 3, Q_3 = 7 >= V_3 = 1
# G_3 = r_3 + V_4                              = 2 + 5 = 7
# G_2 = r_2 + (G_3 since Q_3 >= V_3)           = 0 + 7 = 7   follows the rewards
# G_1 = r_1 + (V_2 since Q_2 < V_2)            = 1 + 3 = 4   bootstraps: step 2's action looked worse than V_2
# G_0 = r_0 + (G_1 since Q_1 >= V_1)           = 1 + 4 = 5   follows the rewards again
# advantages G - V = [4, 2, 4, 6]
VALUE, REWARD, RETURNS = [[1.0], [2.0], [3.0], [1.0], [5.0]], [[1.0], [1.0], [0.0], [2.0]], [[5.0], [4.0], [7.0], [7.0]]


def test_returns_switch_between_rewards_and_values():
    torch.testing.assert_close(upgo_returns(t(REWARD), t(VALUE), gammas=1.0), t(RETURNS))


def test_returns_with_a_terminal_step():
    # gamma = 0.5, terminated at t=1: gammas = [0.5, 0, 0.5], r = [1, 1, 2]
    # column 0: V = [1, 2, 3 | 4]: Q_1 = r_1 + 0 * V_2 = 1 < V_1 = 2, so G_0 = 1 + 0.5 * V_1 = 2
    # column 1: V = [1, 0.5, 3 | 4]: Q_1 = 1 >= V_1 = 0.5, so G_0 = 1 + 0.5 * G_1 = 1.5
    # both: G_1 = r_1 = 1 (terminal, no bootstrap); G_2 = 2 + 0.5 * 4 = 4 (the next episode)
    reward = t([[1.0, 1.0], [1.0, 1.0], [2.0, 2.0]])
    gammas = t([[0.5, 0.5], [0.0, 0.0], [0.5, 0.5]])
    expected = t([[2.0, 1.5], [1.0, 1.0], [4.0, 4.0]])
    for v2 in (3.0, 1000.0):  # V_2 is the next episode's first state: it must not reach G_0 or G_1
        value = t([[1.0, 1.0], [2.0, 0.5], [v2, v2], [4.0, 4.0]])
        returns = upgo_returns(reward, value, gammas)
        torch.testing.assert_close(returns[:2], expected[:2])
    torch.testing.assert_close(returns[2], t([2.0 + 0.5 * 4.0] * 2))


def test_last_step_always_bootstraps_unless_terminated():
    # T = 1: G_0 = r_0 + gamma * V_1 whatever the comparison
    assert upgo_returns(t([[1.0]]), t([[100.0], [2.0]]), 0.5).item() == 2.0
    # a truncated last step bootstraps from the caller's V(final obs); a terminated one does not
    loss_args = dict(reward=t([[1.0]]), bootstrap_values=t([[0.0], [2.0]]), gamma=0.5)
    logp = t([[math.log(0.5)]], requires_grad=True)
    truncated = upgo_loss(logp, logp.detach(), **loss_args, terminated=torch.tensor([[False]]))
    terminated = upgo_loss(logp, logp.detach(), **loss_args, terminated=torch.tensor([[True]]))
    assert truncated.item() == pytest.approx(-(1.0 + 0.5 * 2.0) * math.log(0.5))
    assert terminated.item() == pytest.approx(-1.0 * math.log(0.5))


class TestLoss:
    # pi / mu = [2, 0.5, 1, 1] -> rho = min(1, .) = [1, 0.5, 1, 1]; adv = rho * (G - V) = [4, 1, 4, 6]
    RATIO = [[2.0], [0.5], [1.0], [1.0]]
    TARGET_LOGP = [[-1.0], [-2.0], [-0.5], [-1.0]]

    def make(self):
        target_logp = t(self.TARGET_LOGP, requires_grad=True)
        behaviour_logp = (t(self.TARGET_LOGP) - t(self.RATIO).log()).requires_grad_(True)
        value = t(VALUE, requires_grad=True)
        return target_logp, behaviour_logp, value

    def test_value_and_gradient_only_into_the_policy(self):
        target_logp, behaviour_logp, value = self.make()
        loss = upgo_loss(target_logp, behaviour_logp, t(REWARD), value, gamma=1.0)
        # -mean(adv * logp) = -(4 * -1 + 1 * -2 + 4 * -0.5 + 6 * -1) / 4 = 3.5
        assert loss.item() == pytest.approx(3.5)
        loss.backward()
        torch.testing.assert_close(target_logp.grad, -t([[4.0], [1.0], [4.0], [6.0]]) / 4)
        assert value.grad is None and behaviour_logp.grad is None

    def test_weight_masks_steps(self):
        target_logp, behaviour_logp, value = self.make()
        weight = t([[1.0], [1.0], [0.0], [1.0]])
        loss = upgo_loss(target_logp, behaviour_logp, t(REWARD), value, weight=weight, gamma=1.0)
        assert loss.item() == pytest.approx((4.0 + 2.0 + 6.0) / 4)

    def test_rho_clip_ratio(self):
        target_logp, behaviour_logp, value = self.make()
        # rho_bar = 1.5: rho = [1.5, 0.5, 1, 1]; adv = [6, 1, 4, 6]
        loss = upgo_loss(target_logp, behaviour_logp, t(REWARD), value, gamma=1.0, rho_clip_ratio=1.5)
        assert loss.item() == pytest.approx((6.0 + 2.0 + 2.0 + 6.0) / 4)

    def test_float32_in_float32_out_without_overflow(self):
        target_logp = torch.zeros(4, 1, requires_grad=True)
        behaviour_logp = torch.full((4, 1), -200.0)  # pi / mu = e^200 overflows float32; clipped in log space: 1
        loss = upgo_loss(target_logp, behaviour_logp, t(REWARD).float(), t(VALUE).float(), gamma=1.0)
        loss.backward()
        assert loss.dtype == torch.float32
        torch.testing.assert_close(target_logp.grad, -torch.tensor([[4.0], [2.0], [4.0], [6.0]]) / 4)


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: upgo_returns(torch.zeros(4, 2), torch.zeros(4, 2)),
            r"upgo_returns: bootstrap_values has shape \(4, 2\).*\(5, 2\)",
        ),
        (
            lambda: upgo_returns(torch.zeros(4, 2), torch.zeros(5, 2), torch.ones(4)),
            r"upgo_returns: gammas has shape \(4,\)",
        ),
        (
            lambda: upgo_loss(torch.zeros(4, 2, 3), torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(5, 2)),
            r"upgo_loss: target_logp has shape \(4, 2, 3\).*logits",
        ),
        (
            lambda: upgo_loss(torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(5, 2, 1)),
            r"upgo_loss: bootstrap_values has shape \(5, 2, 1\).*squeeze",
        ),
        (
            lambda: upgo_loss(
                torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(5, 2), weight=torch.zeros(2, 4)
            ),
            r"upgo_loss: weight has shape \(2, 4\)",
        ),
        (
            lambda: upgo_loss(
                torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(5, 2), rho_clip_ratio=-1.0
            ),
            r"upgo_loss: rho_clip_ratio must be > 0",
        ),
    ],
)
def test_errors_name_the_function_and_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_runs_on_the_gpu_like_on_the_cpu():
    gen = torch.Generator().manual_seed(3)
    target_logp, behaviour_logp, reward = (torch.randn(5, 4, generator=gen) for _ in range(3))
    value = torch.randn(6, 4, generator=gen)
    terminated = torch.rand(5, 4, generator=gen) < 0.3
    cpu = upgo_loss(target_logp, behaviour_logp, reward, value, terminated)
    cuda = upgo_loss(*(x.cuda() for x in (target_logp, behaviour_logp, reward, value, terminated)))
    assert cuda.device.type == "cuda"
    torch.testing.assert_close(cpu, cuda.cpu())
    torch.testing.assert_close(upgo_returns(reward, value), upgo_returns(reward.cuda(), value.cuda()).cpu())


def test_device_agnostic_on_the_meta_device():
    """Meta tensors fail on any mix with a CPU tensor: a CPU check that no tensor is created on the default device."""
    meta = dict(device="meta")
    terminated = torch.zeros(5, 4, dtype=torch.bool, **meta)
    logp, value = torch.zeros(5, 4, **meta), torch.zeros(6, 4, **meta)
    assert upgo_loss(logp, logp, logp, value, terminated, logp).device.type == "meta"
    assert upgo_returns(logp, value).device.type == "meta"
