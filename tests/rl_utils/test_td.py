"""TD targets and losses against values computed by hand."""

import math

import pytest
import torch

from nervex.rl_utils import (
    categorical_projection,
    dist_nstep_td_data,
    dist_nstep_td_error,
    generalized_lambda_returns,
    q_1step_td_data,
    q_1step_td_error,
    q_nstep_td_data,
    q_nstep_td_error,
    q_nstep_td_error_with_rescale,
    td_lambda_data,
    td_lambda_error,
    v_1step_td_data,
    v_1step_td_error,
    v_nstep_td_data,
    v_nstep_td_error,
    value_inv_transform,
    value_transform,
)


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float64, **kw)


class TestQ1Step:
    def make(self, weight=None):
        q = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
        next_q = t([[1.0, 1.0, 4.0], [2.0, 7.0, 0.0]], requires_grad=True)
        act, next_act = torch.tensor([0, 2]), torch.tensor([2, 1])
        reward, done = t([1.0, -1.0]), torch.tensor([False, True])
        return q, next_q, q_1step_td_data(q, next_q, act, next_act, reward, done, weight)

    def test_loss_value(self):
        _, _, data = self.make()
        # target_0 = 1 + 0.9 * 4 = 4.6 vs q = 1; target_1 = -1 (terminated) vs q = 6
        expected = ((1.0 - (1.0 + 0.9 * 4.0)) ** 2 + (6.0 - (-1.0)) ** 2) / 2
        assert q_1step_td_error(data, 0.9).item() == pytest.approx(expected)

    def test_weight_scales_loss_and_gradient_only_into_q(self):
        q, next_q, data = self.make(weight=t([1.0, 0.5]))
        loss = q_1step_td_error(data, 0.9)
        assert loss.item() == pytest.approx((1.0 * (1.0 - 4.6) ** 2 + 0.5 * (6.0 + 1.0) ** 2) / 2)
        loss.backward()
        expected_grad = torch.zeros(2, 3, dtype=torch.float64)
        expected_grad[0, 0] = 2 * 1.0 * (1.0 - 4.6) / 2  # d/dq of mean(w * (q - target)^2)
        expected_grad[1, 2] = 2 * 0.5 * (6.0 + 1.0) / 2
        torch.testing.assert_close(q.grad, expected_grad)
        assert next_q.grad is None


# One batch, nstep=3, gamma=0.9, bootstrap Q = 10 for all three samples.
NSTEP_CASES = [
    # name, rewards (window), done, value_gamma, q_sa, target
    ("full window", [1.0, 2.0, 3.0], 0.0, 0.9**3, 12.0, 1.0 + 0.9 * 2.0 + 0.81 * 3.0 + 0.729 * 10.0),
    ("terminated inside window", [1.0, 2.0, 0.0], 1.0, 0.9**2, 3.0, 1.0 + 0.9 * 2.0 + 0.81 * 0.0),
    ("truncated inside window", [1.0, 2.0, 0.0], 0.0, 0.9**2, 10.0, 1.0 + 0.9 * 2.0 + 0.81 * 10.0),
]


def make_q_nstep(weight=None):
    q = t([[case[4], -5.0] for case in NSTEP_CASES], requires_grad=True)
    next_n_q = t([[-1.0, 10.0]] * len(NSTEP_CASES), requires_grad=True)
    reward = t([case[1] for case in NSTEP_CASES]).T  # (nstep, B)
    done = t([case[2] for case in NSTEP_CASES])
    action, next_action = torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.long)
    return q, next_n_q, q_nstep_td_data(q, next_n_q, action, next_action, reward, done, weight)


class TestQNStep:
    def test_td_error_per_sample_with_value_gamma(self):
        _, _, data = make_q_nstep()
        value_gamma = t([case[3] for case in NSTEP_CASES])
        loss, td_error = q_nstep_td_error(data, 0.9, nstep=3, value_gamma=value_gamma, return_td_error=True)
        expected = [abs(case[5] - case[4]) for case in NSTEP_CASES]  # 0.52, 0.2, 0.9
        torch.testing.assert_close(td_error, t(expected))
        assert loss.item() == pytest.approx(sum(e**2 for e in expected) / 3)

    def test_without_value_gamma_bootstraps_with_gamma_pow_nstep(self):
        _, _, data = make_q_nstep()
        _, td_error = q_nstep_td_error(data, 0.9, nstep=3, return_td_error=True)
        # the truncated sample now (wrongly for truncation, but as asked) uses 0.9 ** 3
        assert td_error[2].item() == pytest.approx(abs(1.0 + 0.9 * 2.0 + 0.729 * 10.0 - 10.0))

    def test_weight_scales_loss_and_gradient_only_into_q(self):
        q, next_n_q, data = make_q_nstep(weight=t([1.0, 2.0, 0.5]))
        value_gamma = t([case[3] for case in NSTEP_CASES])
        loss, td_error = q_nstep_td_error(data, 0.9, nstep=3, value_gamma=value_gamma, return_td_error=True)
        assert loss.item() == pytest.approx((1.0 * 0.52**2 + 2.0 * 0.2**2 + 0.5 * 0.9**2) / 3)
        loss.backward()
        # d/dq_sa = 2 * w * (q_sa - target) / B
        expected = [2 * 1.0 * (12.0 - 12.52) / 3, 2 * 2.0 * (3.0 - 2.8) / 3, 2 * 0.5 * (10.0 - 10.9) / 3]
        torch.testing.assert_close(q.grad[:, 0], t(expected))
        torch.testing.assert_close(q.grad[:, 1], torch.zeros(3, dtype=torch.float64))
        assert next_n_q.grad is None
        assert not td_error.requires_grad

    def test_nstep_1_matches_1step(self):
        q = t([[1.0, 2.0], [3.0, 4.0]])
        next_q = t([[5.0, 0.0], [0.0, 6.0]])
        act, next_act, reward, done = torch.tensor([1, 0]), torch.tensor([0, 1]), t([1.0, 2.0]), t([0.0, 1.0])
        one = q_1step_td_error(q_1step_td_data(q, next_q, act, next_act, reward, done, None), 0.5)
        nstep = q_nstep_td_error(q_nstep_td_data(q, next_q, act, next_act, reward[None], done, None), 0.5)
        # (2 - (1 + 0.5 * 5))^2 = 2.25 and (3 - 2)^2 = 1
        assert one.item() == pytest.approx((2.25 + 1.0) / 2)
        assert nstep.item() == pytest.approx(one.item())

    @pytest.mark.parametrize(
        "reward_shape, match",
        [((4, 3), r"\(4, 3\).*\(nstep, B\) = \(3, 4\).*transpose"), ((2, 4), r"\(2, 4\).*nstep=3"), ((3,), r"\(3,\)")],
    )
    def test_reward_shape_mismatch_names_shapes(self, reward_shape, match):
        data = q_nstep_td_data(
            torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long),
            torch.zeros(reward_shape), torch.zeros(4), None,
        )  # fmt: skip
        with pytest.raises(ValueError, match=match):
            q_nstep_td_error(data, 0.9, nstep=3)


class TestV:
    def test_v_1step(self):
        v, next_v = t([1.0, 3.0], requires_grad=True), t([3.0, 4.0], requires_grad=True)
        data = v_1step_td_data(v, next_v, t([0.5, 1.0]), t([0.0, 1.0]), None)
        loss = v_1step_td_error(data, 0.5)
        # targets: 0.5 + 0.5 * 3 = 2.0 and 1.0 (terminated)
        assert loss.item() == pytest.approx(((1.0 - 2.0) ** 2 + (3.0 - 1.0) ** 2) / 2)
        loss.backward()
        torch.testing.assert_close(v.grad, t([2 * (1.0 - 2.0) / 2, 2 * (3.0 - 1.0) / 2]))
        assert next_v.grad is None

    def test_v_nstep_with_termination_and_truncation(self):
        v = t([0.0, 0.0, 1.0])
        next_n_v = t([4.0, 100.0, 8.0])
        reward = t([[1.0, 1.0, 1.0], [2.0, 0.0, 0.0]])  # (nstep=2, B=3)
        done = t([0.0, 1.0, 0.0])
        value_gamma = t([0.25, 0.5, 0.5])  # sample 2: truncated after one step
        weight = t([1.0, 1.0, 2.0])
        loss, td_error = v_nstep_td_error(v_nstep_td_data(v, next_n_v, reward, done, weight), 0.5, 2, value_gamma)
        targets = [1.0 + 0.5 * 2.0 + 0.25 * 4.0, 1.0 + 0.5 * 0.0, 1.0 + 0.5 * 8.0]
        errors = [targets[0] - 0.0, targets[1] - 0.0, targets[2] - 1.0]
        torch.testing.assert_close(td_error, t(errors))
        assert loss.item() == pytest.approx((errors[0] ** 2 + errors[1] ** 2 + 2.0 * errors[2] ** 2) / 3)


class TestValueRescale:
    def test_transform_by_hand(self):
        x = t([-3.0, 0.0, 3.0, 8.0])
        expected = [-(2.0 - 1.0 + 0.003), 0.0, 2.0 - 1.0 + 0.003, 3.0 - 1.0 + 0.008]
        torch.testing.assert_close(value_transform(x), t(expected))

    def test_inverse_by_hand_and_round_trip(self):
        # h^-1(1.003): sqrt(1 + 0.004 * (1.003 + 1 + 0.001)) = sqrt(1.008016) = 1.004; ((1.004 - 1) / 0.002)^2 - 1 = 3
        torch.testing.assert_close(value_inv_transform(t([1.003, -1.003])), t([3.0, -3.0]))
        x = torch.linspace(-500, 500, 101, dtype=torch.float64)
        torch.testing.assert_close(value_inv_transform(value_transform(x)), x)

    def test_q_nstep_with_rescale(self):
        q = t([[1.0, 0.0]], requires_grad=True)
        next_n_q = value_transform(t([[0.0, 8.0]]))  # the net predicts h(Q); h^-1 brings back 8
        data = q_nstep_td_data(q, next_n_q, torch.tensor([0]), torch.tensor([1]), t([[-1.0]]), t([0.0]), None)
        loss, td_error = q_nstep_td_error_with_rescale(data, 0.5, nstep=1)
        # raw target = -1 + 0.5 * 8 = 3, rescaled h(3) = 1.003
        torch.testing.assert_close(td_error, t([1.003 - 1.0]))
        assert loss.item() == pytest.approx(0.003**2)


class TestLambdaReturns:
    VALUES = [[1.0], [2.0], [3.0], [4.0]]  # V(s_0) .. V(s_3)
    REWARDS = [[1.0], [1.0], [1.0]]

    @pytest.mark.parametrize(
        "name, lambda_, done, expected",
        [
            (
                "lambda 0.8",
                0.8,
                [0, 0, 0],
                [
                    1.0 + 0.9 * (0.2 * 2.0 + 0.8 * (1.0 + 0.9 * (0.2 * 3.0 + 0.8 * (1.0 + 0.9 * 4.0)))),
                    1.0 + 0.9 * (0.2 * 3.0 + 0.8 * (1.0 + 0.9 * 4.0)),
                    1.0 + 0.9 * 4.0,
                ],
            ),
            ("lambda 0 is one-step TD", 0.0, [0, 0, 0], [1.0 + 0.9 * 2.0, 1.0 + 0.9 * 3.0, 1.0 + 0.9 * 4.0]),
            (
                "lambda 1 is Monte-Carlo",
                1.0,
                [0, 0, 0],
                [1.0 + 0.9 * (1.0 + 0.9 * (1.0 + 0.9 * 4.0)), 1.0 + 0.9 * (1.0 + 0.9 * 4.0), 1.0 + 0.9 * 4.0],
            ),
            ("terminated at t=1", 0.8, [0, 1, 0], [1.0 + 0.9 * (0.2 * 2.0 + 0.8 * 1.0), 1.0, 1.0 + 0.9 * 4.0]),
        ],
    )
    def test_generalized_lambda_returns(self, name, lambda_, done, expected):
        gammas = 0.9 * (1.0 - t(done)[:, None])
        returns = generalized_lambda_returns(t(self.VALUES), t(self.REWARDS), gammas, lambda_)
        torch.testing.assert_close(returns, t(expected)[:, None])

    def test_float_gamma_and_lambda_follow_the_tensors_device(self):
        # meta tensors refuse any mix with a CPU tensor: a float turned into a CPU tensor would raise here
        values, rewards = torch.zeros(4, 2, device="meta"), torch.zeros(3, 2, device="meta")
        assert generalized_lambda_returns(values, rewards, 0.9, 0.8).device.type == "meta"

    def test_shape_mismatch(self):
        with pytest.raises(ValueError, match=r"bootstrap_values has shape \(3, 1\).*\(T \+ 1, B\) = \(4"):
            generalized_lambda_returns(t(self.VALUES[:3]), t(self.REWARDS), 0.9, 0.8)

    def test_td_lambda_error_value_and_gradient(self):
        value = t(self.VALUES, requires_grad=True)
        loss = td_lambda_error(td_lambda_data(value, t(self.REWARDS), None, None), gamma=0.9, lambda_=0.8)
        g2 = 1.0 + 0.9 * 4.0
        g1 = 1.0 + 0.9 * (0.2 * 3.0 + 0.8 * g2)
        g0 = 1.0 + 0.9 * (0.2 * 2.0 + 0.8 * g1)
        assert loss.item() == pytest.approx(0.5 * ((g0 - 1.0) ** 2 + (g1 - 2.0) ** 2 + (g2 - 3.0) ** 2) / 3)
        loss.backward()
        # returns are detached: only the predictions V(s_0..s_2) get gradient, V(s_3) none
        expected = [-(g0 - 1.0) / 3, -(g1 - 2.0) / 3, -(g2 - 3.0) / 3, 0.0]
        torch.testing.assert_close(value.grad, t(expected)[:, None])


class TestDist:
    SUPPORT_ARGS = dict(v_min=-1.0, v_max=1.0)  # 3 atoms: -1, 0, 1; delta = 1
    NEXT = [0.2, 0.3, 0.5]

    @pytest.mark.parametrize(
        "name, ret, bootstrap_gamma, expected",
        [
            # Tz = 0.5 + 0.5 * [-1, 0, 1] = [0, 0.5, 1]: 0.2 -> atom 0 exactly, 0.3 splits, 0.5 -> atom 1 exactly
            ("shift with exact hits", 0.5, 0.5, [0.0, 0.2 + 0.3 * 0.5, 0.3 * 0.5 + 0.5]),
            ("terminated collapses to the reward", 0.5, 0.0, [0.0, 0.5, 0.5]),
            ("clipped above v_max", 2.0, 0.5, [0.0, 0.0, 1.0]),
            # Tz = [-0.75, -0.25, 0.25]; b = [0.25, 0.75, 1.25]
            (
                "all atoms split",
                -0.25,
                0.5,
                [0.2 * 0.75 + 0.3 * 0.25, 0.2 * 0.25 + 0.3 * 0.75 + 0.5 * 0.75, 0.5 * 0.25],
            ),
        ],
    )
    def test_categorical_projection(self, name, ret, bootstrap_gamma, expected):
        out = categorical_projection(t([self.NEXT]), t([ret]), t([bootstrap_gamma]), **self.SUPPORT_ARGS)
        torch.testing.assert_close(out, t([expected]))
        assert out.sum().item() == pytest.approx(1.0)

    def test_dist_nstep_td_error(self):
        # two actions; the bootstrap uses action 1, the online estimate action 0
        dist = t([[self.NEXT, [1.0, 0.0, 0.0]]] * 3, requires_grad=True)
        next_n_dist = t([[[1.0, 0.0, 0.0], self.NEXT]] * 3, requires_grad=True)
        reward = t([[0.5, 0.5, 0.5], [0.5, 0.0, 0.0]])  # (nstep=2, B=3)
        done = t([0.0, 1.0, 0.0])
        value_gamma = t([0.25, 0.5, 0.5])  # sample 2: truncated after one step
        weight = t([1.0, 1.0, 2.0])
        act, next_act = torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.long)
        data = dist_nstep_td_data(dist, next_n_dist, act, next_act, reward, done, weight)
        loss, ce = dist_nstep_td_error(data, 0.5, -1.0, 1.0, 3, nstep=2, value_gamma=value_gamma)
        # sample 0: Tz = 0.75 + 0.25 * [-1, 0, 1] = [0.5, 0.75, 1]; b = [1.5, 1.75, 2]
        target0 = [0.0, 0.2 * 0.5 + 0.3 * 0.25, 0.2 * 0.5 + 0.3 * 0.75 + 0.5]
        target1 = [0.0, 0.5, 0.5]  # terminated: all mass at r = 0.5
        target2 = [0.0, 0.2 + 0.3 * 0.5, 0.3 * 0.5 + 0.5]  # truncated after 1 step: r = 0.5, gamma 0.5
        logp = [math.log(p) for p in self.NEXT]
        expected = [-sum(p * lp for p, lp in zip(target, logp)) for target in (target0, target1, target2)]
        torch.testing.assert_close(ce, t(expected))
        assert loss.item() == pytest.approx((expected[0] + expected[1] + 2.0 * expected[2]) / 3)
        loss.backward()
        assert next_n_dist.grad is None
        assert dist.grad[:, 1].abs().sum().item() == 0.0 and dist.grad[:, 0].abs().sum().item() > 0.0

    def test_wrong_atom_count(self):
        data = dist_nstep_td_data(
            torch.ones(2, 2, 5) / 5, torch.ones(2, 2, 5) / 5, torch.zeros(2, dtype=torch.long),
            torch.zeros(2, dtype=torch.long), torch.zeros(1, 2), torch.zeros(2), None,
        )  # fmt: skip
        with pytest.raises(ValueError, match=r"\(2, 2, 5\).*n_atom=51"):
            dist_nstep_td_error(data, 0.9, -10.0, 10.0, 51)


def test_masked_argmax_picks_the_best_legal_action():
    from nervex.rl_utils import masked_argmax

    q = torch.tensor([[1.0, 5.0, 3.0], [2.0, 0.0, -1.0], [-4.0, 9.0, -2.0]])
    mask = torch.tensor([[1, 0, 1], [0, 1, 1], [0, 0, 0]], dtype=torch.int8)
    # row 0: the illegal action 1 has the largest value; row 2: no legal action (a finished game) -> unmasked argmax
    assert masked_argmax(q, mask).tolist() == [2, 1, 1]
    assert masked_argmax(q, None).tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match=r"action_mask shape \(3, 2\) differs from q \(3, 3\)"):
        masked_argmax(q, mask[:, :2])
