"""V-trace targets and losses against values computed by hand and against the paper's sum formula."""

import math

import pytest
import torch
import torch.nn.functional as F

from nervex.rl_utils import (
    generalized_lambda_returns,
    vtrace_advantages,
    vtrace_data,
    vtrace_error,
    vtrace_nstep_return,
)

INF = float("inf")


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float64, **kw)


def logps_for(rho, behaviour=-1.0):
    """``(target_logp, behaviour_logp)`` whose ratio ``pi / mu`` is ``rho``."""
    rho = t(rho)
    behaviour_logp = torch.full_like(rho, behaviour)
    return behaviour_logp + rho.log(), behaviour_logp


def sum_formula_targets(rhos, cs, reward, values, gammas, lambda_):
    """The paper's definition on Python floats, independent of the recursion:
    ``v_s = V_s + sum_{k >= s} (prod_{i=s}^{k-1} gamma_i * lambda * c_i) * rho_k * (r_k + gamma_k V_{k+1} - V_k)``."""
    steps, batch = len(reward), len(reward[0])
    out = [[0.0] * batch for _ in range(steps)]
    for b in range(batch):
        for s in range(steps):
            total = values[s][b]
            for k in range(s, steps):
                trace = math.prod(gammas[i][b] * lambda_ * cs[i][b] for i in range(s, k))
                delta = rhos[k][b] * (reward[k][b] + gammas[k][b] * values[k + 1][b] - values[k][b])
                total += trace * delta
            out[s][b] = total
    return out


def sum_formula_advantages(pg_rhos, reward, values, gammas, targets):
    """``rho_pg_s * (r_s + gamma_s * v_{s+1} - V_s)`` with ``v_T = V_T``, on Python floats."""
    steps, batch = len(reward), len(reward[0])
    next_v = [[targets[s + 1][b] if s + 1 < steps else values[steps][b] for b in range(batch)] for s in range(steps)]
    return [
        [pg_rhos[s][b] * (reward[s][b] + gammas[s][b] * next_v[s][b] - values[s][b]) for b in range(batch)]
        for s in range(steps)
    ]


class TestOnPolicy:
    # gamma = 0.5, T = 3, B = 2
    # column 0: r = [1, 2, 4], V = [0, 1, 2 | 8]: G_2 = 4 + 0.5 * 8 = 8, G_1 = 2 + 0.5 * 8 = 6, G_0 = 1 + 0.5 * 6 = 4
    # column 1: r = [0, 0, 2], V = [3, 3, 3 | -4]: G_2 = 2 - 2 = 0, G_1 = 0, G_0 = 0
    REWARD = [[1.0, 0.0], [2.0, 0.0], [4.0, 2.0]]
    VALUE = [[0.0, 3.0], [1.0, 3.0], [2.0, 3.0], [8.0, -4.0]]
    RETURNS = [[4.0, 0.0], [6.0, 0.0], [8.0, 0.0]]

    @staticmethod
    def nstep_returns_loop(reward, value, gamma):
        """Bootstrapped n-step returns by a plain loop: G_t = r_t + gamma * G_{t+1}, G_T = V_T."""
        running, out = list(value[-1]), []
        for row in reversed(reward):
            running = [r + gamma * g for r, g in zip(row, running)]
            out.insert(0, running)
        return out

    def test_targets_are_nstep_bootstrapped_returns(self):
        assert self.nstep_returns_loop(self.REWARD, self.VALUE, 0.5) == self.RETURNS
        ones = torch.ones(3, 2, dtype=torch.float64)
        vs = vtrace_nstep_return(ones, ones, t(self.REWARD), t(self.VALUE), gammas=0.5, lambda_=1.0)
        torch.testing.assert_close(vs, t(self.RETURNS))

    def test_error_on_policy(self):
        target_logp, behaviour_logp = logps_for([[1.0, 1.0]] * 3, behaviour=math.log(0.5))
        data = vtrace_data(target_logp, behaviour_logp, None, t(self.VALUE), t(self.REWARD), None, None)
        loss = vtrace_error(data, gamma=0.5, lambda_=1.0)
        # (V - G)^2: column 0 16, 25, 36; column 1 9, 9, 9
        assert loss.value_loss.item() == pytest.approx((16 + 25 + 36 + 9 + 9 + 9) / 6)
        # on-policy, lambda = 1: adv_s = r_s + gamma * G_{s+1} - V_s = G_s - V_s = [4, 5, 6] and [-3, -3, -3]
        assert loss.policy_loss.item() == pytest.approx(-math.log(0.5) * (4 + 5 + 6 - 9) / 6)
        assert loss.entropy_loss.item() == 0.0


# one column, gamma = 0.5, lambda = 1: V = [1, 2, 0 | 4], r = [1, 0, 2], pi / mu = [2, 0.5, 4]
# rho_bar = 1.5: rho = [1.5, 0.5, 1.5]; c_bar = 1: c = [1, 0.5, 1]; rho_pg_bar = 1: rho_pg = [1, 0.5, 1]
# TD errors r + 0.5 V' - V = [1, -2, 4]; delta = rho * TD = [1.5, -1, 6]
# v_2 = 0 + 6 = 6
# v_1 = 2 + (-1) + 0.5 * 0.5 * (v_2 - V_2 = 6) = 2.5
# v_0 = 1 + 1.5 + 0.5 * 1 * (v_1 - V_1 = 0.5) = 2.75
#     (sum formula: 1 + 1.5 + 0.5 * 1 * (-1) + 0.25 * 1 * 0.5 * 6 = 2.75)
# adv = rho_pg * (r + 0.5 * v_next - V) with v_next = [v_1, v_2, V_3] = [2.5, 6, 4]:
#     [1 * (1 + 1.25 - 1), 0.5 * (0 + 3 - 2), 1 * (2 + 2 - 0)] = [1.25, 0.5, 4]
OFF_VALUE, OFF_REWARD, OFF_RATIO = [[1.0], [2.0], [0.0], [4.0]], [[1.0], [0.0], [2.0]], [[2.0], [0.5], [4.0]]


class TestOffPolicy:
    def test_hand_computed_clipped_targets_and_advantages(self):
        rhos, cs, pg_rhos = t([[1.5], [0.5], [1.5]]), t([[1.0], [0.5], [1.0]]), t([[1.0], [0.5], [1.0]])
        vs = vtrace_nstep_return(rhos, cs, t(OFF_REWARD), t(OFF_VALUE), gammas=0.5, lambda_=1.0)
        torch.testing.assert_close(vs, t([[2.75], [2.5], [6.0]]))
        adv = vtrace_advantages(pg_rhos, t(OFF_REWARD), vs, t(OFF_VALUE), gammas=0.5)
        torch.testing.assert_close(adv, t([[1.25], [0.5], [4.0]]))

    def test_hand_computed_through_vtrace_error(self):
        target_logp, behaviour_logp = logps_for(OFF_RATIO)
        target_logp.requires_grad_(True)
        value = t(OFF_VALUE, requires_grad=True)
        data = vtrace_data(target_logp, behaviour_logp, None, value, t(OFF_REWARD), None, None)
        loss = vtrace_error(data, gamma=0.5, lambda_=1.0, rho_clip_ratio=1.5, c_clip_ratio=1.0, rho_pg_clip_ratio=1.0)
        # (V - v)^2 = (1 - 2.75)^2, (2 - 2.5)^2, (0 - 6)^2
        assert loss.value_loss.item() == pytest.approx((1.75**2 + 0.5**2 + 6.0**2) / 3)
        (loss.policy_loss + loss.value_loss).backward()
        torch.testing.assert_close(target_logp.grad, -t([[1.25], [0.5], [4.0]]) / 3)
        torch.testing.assert_close(value.grad, t([[2 * (1 - 2.75)], [2 * (2 - 2.5)], [2 * (0 - 6.0)], [0.0]]) / 3)

    def test_hand_computed_with_lambda_half(self):
        # c = lambda * min(c_bar, pi / mu) = [0.5, 0.25, 0.5]
        # v_2 = 6; v_1 = 2 - 1 + 0.5 * 0.25 * 6 = 1.75; v_0 = 1 + 1.5 + 0.5 * 0.5 * (1.75 - 2) = 2.4375
        rhos, cs = t([[1.5], [0.5], [1.5]]), t([[1.0], [0.5], [1.0]])
        vs = vtrace_nstep_return(rhos, cs, t(OFF_REWARD), t(OFF_VALUE), gammas=0.5, lambda_=0.5)
        torch.testing.assert_close(vs, t([[2.4375], [1.75], [6.0]]))

    @pytest.mark.parametrize(
        "rho_bar, c_bar, rho_pg_bar, lambda_",
        [(1.0, 1.0, 1.0, 1.0), (1.5, 1.0, 1.2, 1.0), (2.0, 0.8, 1.0, 0.7), (INF, INF, INF, 1.0)],
    )
    def test_matches_the_sum_formula(self, rho_bar, c_bar, rho_pg_bar, lambda_):
        """Ratios above and below every clip, terminations inside, five columns at once."""
        gen = torch.Generator().manual_seed(0)
        steps, batch, gamma = 6, 5, 0.9
        log_rho = torch.randn(steps, batch, generator=gen, dtype=torch.float64)
        reward = torch.randn(steps, batch, generator=gen, dtype=torch.float64)
        value = torch.randn(steps + 1, batch, generator=gen, dtype=torch.float64, requires_grad=True)
        terminated = torch.rand(steps, batch, generator=gen) < 0.2
        behaviour_logp = -torch.rand(steps, batch, generator=gen, dtype=torch.float64)
        target_logp = (behaviour_logp + log_rho).requires_grad_(True)
        assert (log_rho.exp() > 2.0).any() and (log_rho.exp() < 0.8).any() and terminated.any()

        ratio = log_rho.exp().tolist()
        rhos = [[min(rho_bar, x) for x in row] for row in ratio]
        cs = [[min(c_bar, x) for x in row] for row in ratio]
        pg_rhos = [[min(rho_pg_bar, x) for x in row] for row in ratio]
        gammas = [[0.0 if d else gamma for d in row] for row in terminated.tolist()]
        values, rewards = value.tolist(), reward.tolist()
        targets = sum_formula_targets(rhos, cs, rewards, values, gammas, lambda_)
        advantages = sum_formula_advantages(pg_rhos, rewards, values, gammas, targets)

        vs = vtrace_nstep_return(t(rhos), t(cs), reward, value.detach(), t(gammas), lambda_)
        torch.testing.assert_close(vs, t(targets))
        data = vtrace_data(target_logp, behaviour_logp, None, value, reward, terminated, None)
        loss = vtrace_error(data, gamma, lambda_, rho_bar, c_bar, rho_pg_bar)
        assert loss.value_loss.item() == pytest.approx(((value[:-1] - t(targets)) ** 2).mean().item())
        (loss.policy_loss + loss.value_loss).backward()
        torch.testing.assert_close(target_logp.grad, -t(advantages) / (steps * batch))
        expected_value_grad = torch.cat([2 * (value[:-1] - t(targets)), torch.zeros(1, batch, dtype=torch.float64)])
        torch.testing.assert_close(value.grad, expected_value_grad / (steps * batch))


class TestLambda:
    def test_on_policy_with_lambda_is_the_td_lambda_return(self):
        # gamma = 0.5, lambda = 0.5, V = [1, 2, 0 | 4], r = [1, 0, 2]: TD errors [1, -2, 4], c = lambda = 0.5
        # v_2 = 0 + 4 = 4; v_1 = 2 - 2 + 0.25 * (4 - 0) = 1; v_0 = 1 + 1 + 0.25 * (1 - 2) = 1.75
        # the lambda-return: G_1 = 0 + 0.5 * (0.5 * 0 + 0.5 * 4) = 1, G_0 = 1 + 0.5 * (0.5 * 2 + 0.5 * 1) = 1.75
        ones = torch.ones(3, 1, dtype=torch.float64)
        vs = vtrace_nstep_return(ones, ones, t(OFF_REWARD), t(OFF_VALUE), gammas=0.5, lambda_=0.5)
        torch.testing.assert_close(vs, t([[1.75], [1.0], [4.0]]))
        torch.testing.assert_close(vs, generalized_lambda_returns(t(OFF_VALUE), t(OFF_REWARD), 0.5, 0.5))

    def test_lambda_zero_is_the_one_step_target_scaled_by_rho(self):
        # no trace: v_s = V_s + rho_s * (r_s + gamma V_{s+1} - V_s) = [1 + 1.5, 2 - 1, 0 + 6]
        rhos, cs = t([[1.5], [0.5], [1.5]]), t([[1.0], [0.5], [1.0]])
        vs = vtrace_nstep_return(rhos, cs, t(OFF_REWARD), t(OFF_VALUE), gammas=0.5, lambda_=0.0)
        torch.testing.assert_close(vs, t([[2.5], [1.0], [6.0]]))


class TestEpisodeEnds:
    # gamma = 0.5, on-policy, lambda = 1, r = 1 everywhere, one column per case:
    # V = [1, 2, 3 | 4]; the last row is the bootstrap value the caller gives (V(final obs) for a truncation)
    # "no end":                   G_2 = 1 + 0.5 * 4 = 3, G_1 = 1 + 0.5 * 3 = 2.5, G_0 = 1 + 0.5 * 2.5 = 2.25
    # "terminated at t=1":        G_2 = 3 (the next episode, bootstraps), G_1 = 1, G_0 = 1 + 0.5 * 1 = 1.5
    # "terminated at the end":    G_2 = 1, G_1 = 1 + 0.5 * 1 = 1.5, G_0 = 1 + 0.5 * 1.5 = 1.75
    # "truncated at the end":     terminated stays False and the bootstrap row is V(final obs) = 10:
    #                             G_2 = 1 + 5 = 6, G_1 = 1 + 3 = 4, G_0 = 1 + 2 = 3
    TERMINATED = [[False, False, False, False], [False, True, False, False], [False, False, True, False]]
    VALUE = [[1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0], [3.0, 3.0, 3.0, 3.0], [4.0, 4.0, 4.0, 10.0]]
    RETURNS = [[2.25, 1.5, 1.75, 3.0], [2.5, 1.0, 1.5, 4.0], [3.0, 3.0, 1.0, 6.0]]

    def test_terminated_and_truncated_mixed(self):
        reward, value = torch.ones(3, 4, dtype=torch.float64), t(self.VALUE, requires_grad=True)
        target_logp, behaviour_logp = logps_for([[1.0] * 4] * 3)
        data = vtrace_data(target_logp, behaviour_logp, None, value, reward, torch.tensor(self.TERMINATED), None)
        vtrace_error(data, gamma=0.5, lambda_=1.0).value_loss.backward()
        # value.grad = 2 * (V - G) / (T * B): read the targets back
        torch.testing.assert_close(value[:-1].detach() - value.grad[:-1] * 12 / 2, t(self.RETURNS))

    def test_terminal_mid_unroll_stops_bootstrapping_across_it(self):
        # off-policy, terminated at t=1, clips at 1: pi / mu = [0.5, 2, 1] -> rho = c = [0.5, 1, 1]
        # v_1 = V_1 + 1 * (r_1 + 0 - V_1) = 1; v_0 = 1 + 0.5 * (1 + 0.5 * 2 - 1) + 0.5 * 0.5 * (v_1 - V_1) = 1.25
        # V_2 belongs to the next episode and must not move v_0 or v_1
        rhos = t([[0.5], [1.0], [1.0]])
        gammas = t([[0.5], [0.0], [0.5]])
        reward = t([[1.0], [1.0], [1.0]])
        for v2 in (3.0, 1000.0):
            vs = vtrace_nstep_return(rhos, rhos, reward, t([[1.0], [2.0], [v2], [4.0]]), gammas, 1.0)
            torch.testing.assert_close(vs[:2], t([[1.25], [1.0]]))
            torch.testing.assert_close(vs[2], t([1.0 + 0.5 * 4.0]))

    def test_padding_after_a_terminal_is_masked_and_does_not_leak(self):
        # column 0 ends (terminated) at t=1, the last step is padding with weight 0
        def losses(pad_reward, pad_value):
            reward = t([[1.0, 1.0], [2.0, 1.0], [pad_reward, 1.0]])
            value = t([[0.5, 1.0], [1.0, 2.0], [pad_value, 3.0], [pad_value, 4.0]])
            terminated = torch.tensor([[False, False], [True, False], [False, False]])
            weight = t([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0]])
            target_logp, behaviour_logp = logps_for([[1.5, 0.5], [0.8, 1.2], [3.0, 1.0]])
            data = vtrace_data(target_logp, behaviour_logp, None, value, reward, terminated, weight)
            return torch.stack(list(vtrace_error(data, gamma=0.5, lambda_=1.0)))

        torch.testing.assert_close(losses(0.0, 0.0), losses(-50.0, 70.0))


class TestGradients:
    def make(self):
        gen = torch.Generator().manual_seed(1)
        steps, batch, actions = 4, 3, 5
        target_logit = torch.randn(steps, batch, actions, generator=gen, requires_grad=True)
        behaviour_logit = torch.randn(steps, batch, actions, generator=gen, requires_grad=True)
        value = torch.randn(steps + 1, batch, generator=gen, requires_grad=True)
        action = torch.randint(actions, (steps, batch), generator=gen)
        target_logp = F.log_softmax(target_logit, -1).gather(-1, action[..., None]).squeeze(-1)
        behaviour_logp = F.log_softmax(behaviour_logit, -1).gather(-1, action[..., None]).squeeze(-1)
        entropy = -(F.softmax(target_logit, -1) * F.log_softmax(target_logit, -1)).sum(-1)
        reward = torch.randn(steps, batch, generator=gen)
        data = vtrace_data(target_logp, behaviour_logp, entropy, value, reward, None, None)
        return target_logit, behaviour_logit, value, data

    def test_value_loss_reaches_only_value_and_its_targets_are_detached(self):
        target_logit, behaviour_logit, value, data = self.make()
        loss = vtrace_error(data)
        loss.value_loss.backward()
        assert target_logit.grad is None and behaviour_logit.grad is None
        # a target with gradient would put some on the bootstrap row and change the others
        assert value.grad[-1].abs().sum().item() == 0.0
        with torch.no_grad():
            vs = value[:-1] - value.grad[:-1] * value[:-1].numel() / 2  # from grad = 2 (V - v) / N
            log_rho = data.target_logp - data.behaviour_logp
            rho = log_rho.exp().clamp(max=1.0)
            expected = vtrace_nstep_return(rho, rho, data.reward, value, 0.99, 0.95)
        torch.testing.assert_close(vs, expected)

    def test_policy_and_entropy_losses_reach_only_the_target_logits(self):
        target_logit, behaviour_logit, value, data = self.make()
        loss = vtrace_error(data)
        (loss.policy_loss + loss.entropy_loss).backward()
        assert value.grad is None and behaviour_logit.grad is None
        assert target_logit.grad.abs().sum().item() > 0.0
        assert loss.entropy_loss.item() == pytest.approx(-data.entropy.mean().item())

    def test_importance_weights_in_log_space_do_not_overflow(self):
        # pi / mu = e^200 overflows float32; clipped in log space it is exactly rho_bar
        target_logp = torch.tensor([[0.0], [0.0]], requires_grad=True)
        behaviour_logp = torch.tensor([[-200.0], [-1e-3]])
        value, reward = torch.tensor([[0.0], [0.0], [1.0]]), torch.tensor([[1.0], [1.0]])
        data = vtrace_data(target_logp, behaviour_logp, None, value, reward, None, None)
        loss = vtrace_error(data, gamma=0.5, lambda_=1.0)
        assert loss.policy_loss.dtype == torch.float32 and torch.isfinite(loss.policy_loss)
        # rho = c = [1, 1]: v_1 = 1 + 0.5 * 1 = 1.5, v_0 = 1 + 0.5 * 1.5 = 1.75
        assert loss.value_loss.item() == pytest.approx((1.75**2 + 1.5**2) / 2)


def bad(**fields):
    base = dict(
        target_logp=torch.zeros(3, 2),
        behaviour_logp=torch.zeros(3, 2),
        entropy=None,
        value=torch.zeros(4, 2),
        reward=torch.zeros(3, 2),
        terminated=None,
        weight=None,
    )
    base.update(fields)
    return vtrace_data(**base)


@pytest.mark.parametrize(
    "data, match",
    [
        (bad(value=torch.zeros(3, 2)), r"vtrace_error: value has shape \(3, 2\).*\(T \+ 1, B\) = \(4, 2\).*append"),
        (bad(value=torch.zeros(4, 2, 1)), r"vtrace_error: value has shape \(4, 2, 1\).*squeeze"),
        (bad(target_logp=torch.zeros(3, 2, 6)), r"vtrace_error: target_logp has shape \(3, 2, 6\).*logits"),
        (bad(behaviour_logp=torch.zeros(2, 3)), r"vtrace_error: behaviour_logp has shape \(2, 3\).*\(3, 2\)"),
        (bad(weight=torch.zeros(2)), r"vtrace_error: weight has shape \(2,\)"),
        (bad(terminated=torch.zeros(3, 2, 1)), r"vtrace_error: terminated has shape \(3, 2, 1\).*squeeze"),
    ],
)
def test_vtrace_error_shape_errors_name_the_argument(data, match):
    with pytest.raises(ValueError, match=match):
        vtrace_error(data)


def test_low_level_shape_errors_name_the_function_and_argument():
    ones = torch.ones(3, 2)
    with pytest.raises(ValueError, match=r"vtrace_nstep_return: bootstrap_values has shape \(3, 2\)"):
        vtrace_nstep_return(ones, ones, ones, torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"vtrace_nstep_return: clipped_cs has shape \(2, 3\)"):
        vtrace_nstep_return(ones, torch.ones(2, 3), ones, torch.zeros(4, 2))
    with pytest.raises(ValueError, match=r"vtrace_nstep_return: gammas has shape \(3,\)"):
        vtrace_nstep_return(ones, ones, ones, torch.zeros(4, 2), gammas=torch.ones(3))
    with pytest.raises(ValueError, match=r"vtrace_advantages: vtrace_returns has shape \(4, 2\)"):
        vtrace_advantages(ones, ones, torch.zeros(4, 2), torch.zeros(4, 2))


def test_clip_ratio_must_be_positive():
    with pytest.raises(ValueError, match=r"vtrace_error: c_clip_ratio must be > 0.*got 0"):
        vtrace_error(bad(), c_clip_ratio=0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_runs_on_the_gpu_like_on_the_cpu():
    gen = torch.Generator().manual_seed(2)
    fields = [torch.randn(5, 4, generator=gen) for _ in range(3)] + [torch.randn(6, 4, generator=gen)]
    target_logp, behaviour_logp, reward, value = fields
    terminated = torch.rand(5, 4, generator=gen) < 0.3
    cpu = vtrace_error(vtrace_data(target_logp, behaviour_logp, None, value, reward, terminated, None))
    cuda = vtrace_error(
        vtrace_data(*(x.cuda() for x in (target_logp, behaviour_logp)), None, value.cuda(), reward.cuda(),
                    terminated.cuda(), None)
    )  # fmt: skip
    for a, b in zip(cpu, cuda):
        assert b.device.type == "cuda"
        torch.testing.assert_close(a, b.cpu())


def test_device_agnostic_on_the_meta_device():
    """Meta tensors fail on any mix with a CPU tensor: a CPU check that no tensor is created on the default device."""
    meta = dict(device="meta")
    terminated = torch.zeros(5, 4, dtype=torch.bool, **meta)
    logp, value = torch.zeros(5, 4, **meta), torch.zeros(6, 4, **meta)
    losses = vtrace_error(vtrace_data(logp, logp, logp, value, logp, terminated, logp))
    assert all(loss.device.type == "meta" for loss in losses)
