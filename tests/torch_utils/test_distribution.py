"""Action distributions against closed forms computed by hand with ``math`` and a finite-difference Jacobian."""

import math

import pytest
import torch

from nervex.torch_utils import CategoricalDist, GaussianDist, TanhGaussianDist, squash_bounds


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float64, **kw)


class TestCategorical:
    def test_log_prob_entropy_probs_mode_2x3(self):
        # row 0: probs 1/6, 2/6, 3/6 (a constant added to every logit changes nothing); row 1: uniform
        logit = t([[1.0 + math.log(1.0), 1.0 + math.log(2.0), 1.0 + math.log(3.0)], [0.0, 0.0, 0.0]])
        dist = CategoricalDist(logit)
        torch.testing.assert_close(dist.probs, t([[1 / 6, 2 / 6, 3 / 6], [1 / 3, 1 / 3, 1 / 3]]))
        torch.testing.assert_close(dist.log_prob(torch.tensor([2, 0])), t([math.log(0.5), math.log(1 / 3)]))
        entropy0 = -(1 / 6 * math.log(1 / 6) + 1 / 3 * math.log(1 / 3) + 1 / 2 * math.log(1 / 2))  # 1.0114
        torch.testing.assert_close(dist.entropy(), t([entropy0, math.log(3.0)]))
        assert dist.mode().tolist() == [2, 0]

    def test_mask_gives_finite_entropy_over_legal_actions_only(self):
        logit = t([[1.0, 5.0, 3.0], [0.0, 2.0, 9.0]], requires_grad=True)
        mask = torch.tensor([[1, 0, 1], [0, 1, 0]])
        dist = CategoricalDist(logit, mask)
        p0, p2 = math.e / (math.e + math.e**3), math.e**3 / (math.e + math.e**3)  # 0.1192, 0.8808
        torch.testing.assert_close(dist.probs, t([[p0, 0.0, p2], [0.0, 1.0, 0.0]]))
        entropy = dist.entropy()
        # row 0: entropy of (p0, p2) only; row 1: a single legal action, entropy 0 (not nan from 0 * -inf)
        torch.testing.assert_close(entropy, t([-(p0 * math.log(p0) + p2 * math.log(p2)), 0.0]))
        entropy.sum().backward()
        assert torch.isfinite(logit.grad).all()
        assert logit.grad[0, 1].item() == 0.0 and logit.grad[1].abs().max().item() == 0.0
        assert dist.mode().tolist() == [2, 1]  # the masked logit 5 (and 9) is not the mode
        log_prob = dist.log_prob(torch.tensor([1, 1]))
        assert log_prob[0].item() == -math.inf and log_prob[1].item() == 0.0

    def test_sample_frequencies_and_masked_actions_never_sampled(self):
        torch.manual_seed(0)
        logit = torch.log(torch.tensor([[1.0, 2.0, 3.0, 10.0]])).expand(20000, 4)
        mask = torch.tensor([[True, True, True, False]]).expand(20000, 4)
        actions = CategoricalDist(logit, mask).sample()
        assert actions.dtype == torch.int64 and actions.shape == (20000,)
        freq = torch.bincount(actions, minlength=4).double() / 20000
        torch.testing.assert_close(freq, t([1 / 6, 2 / 6, 3 / 6, 0.0]), atol=0.015, rtol=0)

    def test_leading_dims(self):
        dist = CategoricalDist(torch.zeros(5, 2, 4))
        assert dist.sample().shape == (5, 2) and dist.entropy().shape == (5, 2)
        torch.testing.assert_close(dist.log_prob(torch.zeros(5, 2, dtype=torch.long)), torch.full((5, 2), -math.log(4)))

    def test_row_without_legal_action_raises(self):
        with pytest.raises(ValueError, match=r"row \(1,\) has no legal action"):
            CategoricalDist(torch.zeros(2, 3), torch.tensor([[1, 0, 0], [0, 0, 0]]))

    def test_bad_shapes_raise(self):
        with pytest.raises(ValueError, match=r"mask has shape \(2, 2\); expected the logit shape \(2, 3\)"):
            CategoricalDist(torch.zeros(2, 3), torch.ones(2, 2))
        with pytest.raises(ValueError, match=r"action has shape \(2, 1\); expected \(2,\)"):
            CategoricalDist(torch.zeros(2, 3)).log_prob(torch.zeros(2, 1, dtype=torch.long))


class TestGaussian:
    def test_log_prob_and_entropy_closed_forms(self):
        mu, sigma = t([0.5, -1.0]), t([2.0, 0.5])
        dist = GaussianDist(mu, sigma)
        # z = (1.5 - 0.5) / 2 = 0.5 and (-1.25 + 1) / 0.5 = -0.5; log 2 + log 0.5 = 0
        expected = -0.5 * 0.25 - math.log(2.0) - 0.5 * math.log(2 * math.pi)
        expected += -0.5 * 0.25 - math.log(0.5) - 0.5 * math.log(2 * math.pi)
        assert dist.log_prob(t([1.5, -1.25])).item() == pytest.approx(expected)
        assert expected == pytest.approx(-0.25 - math.log(2 * math.pi))
        assert dist.entropy().item() == pytest.approx(1.0 + math.log(2 * math.pi))
        torch.testing.assert_close(dist.mode(), mu)

    def test_state_independent_sigma_broadcasts(self):
        mu = t([[0.0, 0.0], [1.0, 2.0], [3.0, 3.0]])
        dist = GaussianDist(mu, t([1.0, math.e]))
        entropy = 2 * (0.5 + 0.5 * math.log(2 * math.pi)) + 1.0  # log 1 + log e = 1
        torch.testing.assert_close(dist.entropy(), t([entropy] * 3))
        assert dist.log_prob(mu).shape == (3,)

    def test_rsample_is_mu_plus_sigma_noise_with_gradient(self):
        mu, sigma = t([0.5, -1.0], requires_grad=True), t([2.0, 0.5], requires_grad=True)
        torch.manual_seed(3)
        noise = torch.randn(2, dtype=torch.float64)
        torch.manual_seed(3)
        action = GaussianDist(mu, sigma).rsample()
        torch.testing.assert_close(action, mu.detach() + sigma.detach() * noise)
        action.sum().backward()
        torch.testing.assert_close(mu.grad, t([1.0, 1.0]))
        torch.testing.assert_close(sigma.grad, noise)
        assert not GaussianDist(mu, sigma).sample().requires_grad

    @pytest.mark.parametrize("bad", [0.0, -1.0, math.nan])
    def test_non_positive_sigma_raises(self, bad):
        with pytest.raises(ValueError, match="sigma must be > 0"):
            GaussianDist(t([0.0, 0.0]), t([1.0, bad]))
        GaussianDist(t([0.0, 0.0]), t([1.0, bad]), validate_args=False)  # opt-out: no check

    def test_sigma_shape_mismatch_raises(self):
        with pytest.raises(ValueError, match=r"sigma has shape \(3,\), which does not broadcast to mu's \(2, 2\)"):
            GaussianDist(torch.zeros(2, 2), torch.ones(3))


def squash(u, low, high):
    """The squashing map in plain floats: tanh, then the affine map [-1, 1] -> [low, high]."""
    return [lo + (hi - lo) * (math.tanh(x) + 1) / 2 for x, lo, hi in zip(u, low, high)]


def log_abs_det_jacobian_fd(u, low, high, h=1e-6):
    """log |det d squash / du| from a central finite-difference Jacobian (2x2)."""
    jac = [[0.0, 0.0], [0.0, 0.0]]
    for j in range(2):
        plus, minus = list(u), list(u)
        plus[j] += h
        minus[j] -= h
        f_plus, f_minus = squash(plus, low, high), squash(minus, low, high)
        for i in range(2):
            jac[i][j] = (f_plus[i] - f_minus[i]) / (2 * h)
    return math.log(abs(jac[0][0] * jac[1][1] - jac[0][1] * jac[1][0]))


def gaussian_log_density(u, mu, sigma):
    return sum(-0.5 * ((x - m) / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi) for x, m, s in zip(u, mu, sigma))


BOUND_CASES = [
    # name, low, high (as passed), low, high (per dimension, for the reference)
    ("no bounds", None, None, [-1.0, -1.0], [1.0, 1.0]),
    ("scalar symmetric bounds", -2.0, 2.0, [-2.0, -2.0], [2.0, 2.0]),
    ("asymmetric per-dimension bounds", [-1.0, 0.0], [3.0, 2.0], [-1.0, 0.0], [3.0, 2.0]),
]


class TestTanhGaussian:
    MU, SIGMA = [0.3, -0.7], [0.8, 1.5]

    @pytest.mark.parametrize("name, low, high, low_ref, high_ref", BOUND_CASES, ids=[c[0] for c in BOUND_CASES])
    def test_log_prob_matches_change_of_variables(self, name, low, high, low_ref, high_ref):
        mu, sigma = t(self.MU, requires_grad=True), t(self.SIGMA)
        dist = TanhGaussianDist(mu, sigma, low, high)
        for seed in range(5):
            torch.manual_seed(seed)
            u = [m + s * e for m, s, e in zip(self.MU, self.SIGMA, torch.randn(2, dtype=torch.float64).tolist())]
            torch.manual_seed(seed)
            action, log_prob = dist.rsample_with_log_prob()
            torch.testing.assert_close(action, t(squash(u, low_ref, high_ref)))
            expected = gaussian_log_density(u, self.MU, self.SIGMA) - log_abs_det_jacobian_fd(u, low_ref, high_ref)
            assert log_prob.item() == pytest.approx(expected, rel=1e-7, abs=1e-7)
            # the log-prob of the given action, through atanh, agrees away from the bounds
            assert dist.log_prob(action.detach()).item() == pytest.approx(expected, rel=1e-6, abs=1e-6)

    def test_stable_at_saturation_in_float32(self):
        # tanh(12) rounds to 1 in float32: log(1 - tanh(u)^2) would be -inf; 2 (log 2 - u - softplus(-2u)) is not
        dist = TanhGaussianDist(torch.tensor([12.0]), torch.tensor([1e-3]))
        torch.manual_seed(0)
        u = 12.0 + 1e-3 * torch.randn(1).item()
        torch.manual_seed(0)
        action, log_prob = dist.sample_with_log_prob()
        assert action.item() == 1.0
        log_det = math.log(4.0) - 2 * u - 2 * math.log1p(math.exp(-2 * u))  # log(1 - tanh(u)^2), exact
        expected = gaussian_log_density([u], [12.0], [1e-3]) - log_det
        assert log_prob.item() == pytest.approx(expected, rel=1e-5)

    def test_samples_lie_inside_asymmetric_bounds(self):
        torch.manual_seed(0)
        mu = torch.tensor([[3.0, -3.0]]).expand(5000, 2)
        dist = TanhGaussianDist(mu, torch.full((5000, 2), 5.0), [-1.0, 0.0], [3.0, 2.0])
        action, log_prob = dist.sample_with_log_prob()
        assert action.shape == (5000, 2) and log_prob.shape == (5000,)
        assert (action[:, 0] >= -1.0).all() and (action[:, 0] <= 3.0).all()
        assert (action[:, 1] >= 0.0).all() and (action[:, 1] <= 2.0).all()
        assert torch.isfinite(log_prob).all()

    def test_mode_is_squashed_mean(self):
        mu = t([0.0, math.atanh(0.5)])
        # tanh = (0, 0.5) -> -1 + 4 * (0 + 1) / 2 = 1 and 0 + 2 * (0.5 + 1) / 2 = 1.5
        torch.testing.assert_close(TanhGaussianDist(mu, t([1.0, 1.0]), [-1.0, 0.0], [3.0, 2.0]).mode(), t([1.0, 1.5]))
        torch.testing.assert_close(TanhGaussianDist(mu, t([1.0, 1.0])).mode(), t([0.0, 0.5]))

    def test_gradient_flows_through_rsample(self):
        mu, sigma = t(self.MU, requires_grad=True), t(self.SIGMA, requires_grad=True)
        torch.manual_seed(1)
        noise = torch.randn(2, dtype=torch.float64)
        torch.manual_seed(1)
        action, log_prob = TanhGaussianDist(mu, sigma, [-1.0, 0.0], [3.0, 2.0]).rsample_with_log_prob()
        action.sum().backward()
        u = [m + s * e for m, s, e in zip(self.MU, self.SIGMA, noise.tolist())]
        scale = [2.0, 1.0]
        # d a / d mu = scale (1 - tanh(u)^2); d a / d sigma = that times the noise
        expected = [s * (1 - math.tanh(x) ** 2) for s, x in zip(scale, u)]
        torch.testing.assert_close(mu.grad, t(expected))
        torch.testing.assert_close(sigma.grad, t(expected) * noise)
        assert log_prob.requires_grad

    def test_entropy_raises(self):
        with pytest.raises(NotImplementedError, match="-log_prob of a sample"):
            TanhGaussianDist(torch.zeros(2), torch.ones(2)).entropy()

    @pytest.mark.parametrize(
        "low, high, match",
        [
            (-1.0, None, "both low and high"),
            ([0.0, 1.0], [1.0, 1.0], "low < high"),
            ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], r"low has shape \(3,\); expected a scalar or \(2,\)"),
            (torch.tensor([0.0, 2.0]), torch.tensor([1.0, 1.0]), "low < high"),
        ],
    )
    def test_bad_bounds_raise(self, low, high, match):
        with pytest.raises(ValueError, match=match):
            TanhGaussianDist(torch.zeros(2), torch.ones(2), low, high)


def test_categorical_sample_frequencies_follow_the_probabilities_and_skip_masked_actions():
    torch.manual_seed(0)
    logit = torch.log(torch.tensor([[0.1, 0.0, 0.6, 0.3]]).clamp_min(1e-30)).expand(200_000, 4)
    mask = torch.tensor([[True, False, True, True]]).expand(200_000, 4)
    sample = CategoricalDist(logit, mask).sample()
    counts = torch.bincount(sample, minlength=4).double() / 200_000
    assert counts[1] == 0  # never a masked action
    torch.testing.assert_close(counts, torch.tensor([0.1, 0.0, 0.6, 0.3], dtype=torch.float64), atol=0.004, rtol=0)
    assert sample.dtype == torch.int64 and sample.shape == (200_000,)


def test_precomputed_bounds_and_log_sigma_give_the_same_samples_and_log_probs():
    mu = torch.tensor([[0.3, -0.7], [1.2, 0.1]])
    log_sigma = torch.tensor([[-0.2, 0.4], [0.0, -1.0]])
    plain = TanhGaussianDist(mu, log_sigma.exp(), [-1.0, 0.0], [3.0, 2.0])
    bounds = squash_bounds([-1.0, 0.0], [3.0, 2.0], 2)
    lean = TanhGaussianDist(mu, log_sigma.exp(), bounds, log_sigma=log_sigma)
    torch.manual_seed(3)
    a1, lp1 = plain.rsample_with_log_prob()
    torch.manual_seed(3)
    a2, lp2 = lean.rsample_with_log_prob()
    torch.testing.assert_close(a1, a2)
    torch.testing.assert_close(lp1, lp2)
    torch.testing.assert_close(bounds.loc, torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(bounds.log_scale_sum, torch.tensor(math.log(2.0 * 1.0)))
    with pytest.raises(ValueError, match="need low < high"):
        squash_bounds([1.0, 0.0], [0.0, 1.0], 2)
    with pytest.raises(ValueError, match=r"low has shape \(3,\); expected a scalar or \(2,\)"):
        squash_bounds([0.0, 0.0, 0.0], 1.0, 2)
    with pytest.raises(ValueError, match="leave high None"):
        TanhGaussianDist(mu, log_sigma.exp(), bounds, 1.0)
