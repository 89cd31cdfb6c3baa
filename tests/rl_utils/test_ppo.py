"""PPO's clipped losses against values computed by hand."""

import math

import pytest
import torch

from nervex.rl_utils import ppo_data, ppo_error


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float64, **kw)


# clip_ratio = 0.2, dual_clip = 3. The objective is min(r A, clip(r, 0.8, 1.2) A); d objective / d logp_new is
# r A where the unclipped term is the min, 0 where the clipped one is (the ratio moved past the range in the
# direction the advantage pushes it).
POLICY_CASES = [
    # name, logp_old, ratio, adv, objective, objective with dual clip, d objective / d logp_new (no dual clip)
    ("ratio above range, adv > 0: clipped", -1.0, 1.5, 1.0, 1.2, 1.2, 0.0),
    ("ratio below range, adv > 0: not clipped", -2.0, 0.5, 2.0, 1.0, 1.0, 1.0),
    ("ratio above range, adv < 0: not clipped", -0.5, 1.5, -1.0, -1.5, -1.5, -1.5),
    ("ratio below range, adv < 0: clipped", -1.5, 0.5, -2.0, -1.6, -1.6, 0.0),
    ("ratio inside range", -3.0, 1.1, 3.0, 3.3, 3.3, 3.3),
    ("large ratio, adv < 0: dual clip bounds it at 3 * adv", -0.2, 4.0, -1.0, -4.0, -3.0, -4.0),
]
N = len(POLICY_CASES)


def column(i):
    return t([case[i] for case in POLICY_CASES])


def make(entropy=None, weight=None, value_new=None, value_old=None, return_=None):
    logp_old = column(1)
    logp_new = (logp_old + torch.log(column(2))).requires_grad_(True)
    value_new = torch.zeros(N, dtype=torch.float64) if value_new is None else value_new
    return_ = torch.zeros(N, dtype=torch.float64) if return_ is None else return_
    data = ppo_data(logp_new, logp_old, entropy, value_new, value_old, column(3), return_, weight)
    return logp_new, data


class TestPolicyLoss:
    def test_policy_loss_and_gradient_per_sample(self):
        logp_new, data = make()
        loss, _ = ppo_error(data, clip_ratio=0.2)
        expected = -(1.2 + 1.0 - 1.5 - 1.6 + 3.3 - 4.0) / N
        assert loss.policy_loss.item() == pytest.approx(expected)
        assert sum(case[4] for case in POLICY_CASES) == pytest.approx(-1.6)
        loss.policy_loss.backward()
        # zero exactly where the ratio is clipped in the direction of the advantage
        torch.testing.assert_close(logp_new.grad, -column(6) / N)
        assert logp_new.grad[0].item() == 0.0 and logp_new.grad[3].item() == 0.0

    def test_dual_clip(self):
        logp_new, data = make()
        loss, _ = ppo_error(data, clip_ratio=0.2, dual_clip=3.0)
        assert loss.policy_loss.item() == pytest.approx(-(1.2 + 1.0 - 1.5 - 1.6 + 3.3 - 3.0) / N)
        torch.testing.assert_close(loss.policy_loss, -column(5).mean())
        loss.policy_loss.backward()
        assert logp_new.grad[5].item() == 0.0  # the dual-clipped sample is a constant 3 * adv
        assert logp_new.grad[2].item() == pytest.approx(1.5 / N)  # adv < 0 but not past the dual bound

    def test_weights(self):
        weight = t([1.0, 0.0, 2.0, 1.0, 0.5, 1.0])
        _, data = make(weight=weight)
        loss, _ = ppo_error(data, clip_ratio=0.2)
        assert loss.policy_loss.item() == pytest.approx(-(1.2 + 0.0 - 3.0 - 1.6 + 1.65 - 4.0) / N)

    def test_approx_kl_and_clip_fraction(self):
        _, data = make()
        _, info = ppo_error(data, clip_ratio=0.2)
        ratios = [case[2] for case in POLICY_CASES]
        expected_kl = sum((r - 1) - math.log(r) for r in ratios) / N  # every term >= 0
        assert info.approx_kl.item() == pytest.approx(expected_kl)
        assert info.clip_fraction.item() == pytest.approx(5 / 6)  # all but the ratio of 1.1
        for value in info:
            assert isinstance(value, torch.Tensor) and value.dim() == 0 and not value.requires_grad

    def test_time_major_shape_gives_the_same_loss(self):
        _, flat = make()
        _, data = make()
        data = ppo_data(*(None if x is None else x.detach().reshape(2, 3) for x in data))
        loss, info = ppo_error(data)
        assert loss.policy_loss.item() == pytest.approx(ppo_error(flat)[0].policy_loss.item())
        assert info.clip_fraction.item() == pytest.approx(5 / 6)


class TestValueLoss:
    # value_clip_ratio 0.5: v_clip = v_old + clamp(v_new - v_old, -0.5, 0.5)
    VALUE_CASES = [
        # name, v_old, v_new, return, unclipped loss, clipped (max) loss, clip active
        ("update inside the clip range", 1.0, 1.2, 2.0, 0.64, 0.64, False),
        ("clipped value further from return: max picks it", 1.0, 2.5, 3.0, 0.25, 2.25, True),
        ("clipped value closer to return: max keeps unclipped", 1.0, 2.5, 0.0, 6.25, 6.25, False),
        ("negative update past the range", 0.0, -1.0, 1.0, 4.0, 4.0, False),
    ]

    def make(self, weight=None):
        cases = self.VALUE_CASES
        value_old, return_ = t([c[1] for c in cases]), t([c[3] for c in cases])
        value_new = t([c[2] for c in cases], requires_grad=True)
        zeros = torch.zeros(len(cases), dtype=torch.float64)
        data = ppo_data(zeros, zeros, None, value_new, value_old, zeros, return_, weight)
        return value_new, data

    def test_without_value_clip(self):
        _, data = self.make()
        loss, _ = ppo_error(data)
        assert loss.value_loss.item() == pytest.approx((0.64 + 0.25 + 6.25 + 4.0) / 4)

    def test_with_value_clip_and_gradient(self):
        value_new, data = self.make()
        loss, _ = ppo_error(data, value_clip_ratio=0.5)
        assert loss.value_loss.item() == pytest.approx((0.64 + 2.25 + 6.25 + 4.0) / 4)
        loss.value_loss.backward()
        # 2 (v_new - R) / B where the unclipped error is the max; 0 where the clamped one is
        torch.testing.assert_close(value_new.grad, t([2 * (1.2 - 2.0) / 4, 0.0, 2 * 2.5 / 4, 2 * (-2.0) / 4]))

    def test_weighted_value_loss(self):
        _, data = self.make(weight=t([2.0, 1.0, 0.0, 0.5]))
        loss, _ = ppo_error(data, value_clip_ratio=0.5)
        assert loss.value_loss.item() == pytest.approx((2 * 0.64 + 2.25 + 0.0 + 0.5 * 4.0) / 4)

    def test_value_clip_needs_value_old(self):
        _, data = self.make()
        with pytest.raises(ValueError, match="value_old is None"):
            ppo_error(data._replace(value_old=None), value_clip_ratio=0.5)


class TestEntropyLoss:
    def test_entropy_term_sign_and_weight(self):
        entropy = t([0.5, 1.0, 1.5, 2.0, 0.0, 1.0], requires_grad=True)
        _, data = make(entropy=entropy)
        loss, _ = ppo_error(data)
        assert loss.entropy_loss.item() == pytest.approx(-6.0 / 6)
        loss.entropy_loss.backward()
        torch.testing.assert_close(entropy.grad, torch.full((6,), -1.0 / 6, dtype=torch.float64))
        _, data = make(entropy=entropy.detach(), weight=t([2.0, 0.0, 0.0, 0.0, 0.0, 0.0]))
        assert ppo_error(data)[0].entropy_loss.item() == pytest.approx(-1.0 / 6)

    def test_no_entropy_is_zero(self):
        _, data = make()
        entropy_loss = ppo_error(data)[0].entropy_loss
        assert entropy_loss.dim() == 0 and entropy_loss.item() == 0.0 and entropy_loss.dtype == torch.float64


class TestErrors:
    def test_value_with_trailing_dim_is_named(self):
        _, data = make(value_new=torch.zeros(N, 1, dtype=torch.float64))
        with pytest.raises(ValueError, match=r"value_new has shape \(6, 1\) but logp_new has shape \(6,\).*squeeze"):
            ppo_error(data)

    def test_adv_shape_is_named(self):
        _, data = make()
        with pytest.raises(ValueError, match=r"adv has shape \(5,\).*must be \(6,\)"):
            ppo_error(data._replace(adv=torch.zeros(5)))

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            (dict(clip_ratio=-0.1), "clip_ratio must be >= 0"),
            (dict(value_clip_ratio=-0.1), "value_clip_ratio must be > 0"),
            (dict(dual_clip=1.0), "dual_clip must be > 1"),
        ],
    )
    def test_bad_hyperparameters(self, kwargs, match):
        _, data = make()
        with pytest.raises(ValueError, match=match):
            ppo_error(data, **kwargs)


def test_clip_ratio_zero_at_the_end_of_a_linear_schedule_clips_the_ratio_at_one():
    logp_new = torch.tensor([0.2, -0.2], requires_grad=True)
    logp_old = torch.zeros(2)
    adv = torch.tensor([1.0, -1.0])
    zeros = torch.zeros(2)
    loss, info = ppo_error(ppo_data(logp_new, logp_old, None, zeros, zeros, adv, zeros, None), clip_ratio=0.0)
    # min(r * A, 1 * A): r0 = e^0.2 > 1 with A > 0 -> 1; r1 = e^-0.2 < 1 with A < 0 -> 1 * -1; mean(-[1, -1]) = 0
    assert loss.policy_loss.item() == pytest.approx(0.0)
    assert info.clip_fraction.item() == 1.0
