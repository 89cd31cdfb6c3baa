"""n-step Q-learning over sequences against targets computed by hand."""

import pytest
import torch

from nervex.rl_utils import q_nstep_sequence_td_data, q_nstep_sequence_td_error, value_transform


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float64, **kw)


GAMMA, NSTEP = 0.5, 2
# three sequences of T = 5 steps (columns), time first; the learn steps are t = 0, 1, 2
REWARD = t([[1.0, 1.0, 1.0], [2.0, 1.0, 1.0], [3.0, 1.0, 0.0], [4.0, 0.0, 0.0], [5.0, 0.0, 0.0]])
# 0: five real steps, no end; 1: terminated at step 2, then padding (its flags copied); 2: truncated at step 1
TERMINATED = t([[0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 1, 0], [0, 1, 0]])
MASK = t([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 0, 0]])
# v_s = target_q[s, target_action[s]]; sequence 2's v_2 is the value of the final observation (first padding step)
VALUE = t([[10.0, 10.0, 10.0], [20.0, 10.0, 20.0], [30.0, 10.0, 30.0], [40.0, 99.0, 40.0], [50.0, 99.0, 50.0]])
# by hand (gamma 0.5, nstep 2):
#   seq 0: t0 = 1 + .5*2 + .25*30 = 9.5;  t1 = 2 + .5*3 + .25*40 = 13.5;  t2 = 3 + .5*4 + .25*50 = 17.5
#   seq 1: t0 = 1 + .5*1 + .25*10 = 4.0;  t1 = 1 + .5*1 (terminated at 2: no bootstrap) = 1.5;  t2 = 1 (terminal)
#   seq 2: t0 = 1 + .5*1 + .25*v_2 = 9.0; t1 = 1 + .5*v_2 (one real step, then the final obs) = 16.0; t2: padding
TARGET = t([[9.5, 4.0, 9.0], [13.5, 1.5, 16.0], [17.5, 1.0, 0.0]])
LEARN_MASK = t([[1, 1, 1], [1, 1, 1], [1, 1, 0]])


def make(q_taken=None, weight=None, rescale=False):
    """q with the taken action (0) at ``q_taken``; target_q with the bootstrap action (1) at VALUE."""
    q_taken = torch.zeros(5, 3, dtype=torch.float64) if q_taken is None else q_taken
    q = torch.stack([q_taken, torch.full_like(q_taken, -7.0)], dim=-1).requires_grad_(True)
    value = value_transform(VALUE) if rescale else VALUE
    target_q = torch.stack([torch.full_like(value, 123.0), value], dim=-1).requires_grad_(True)
    action, target_action = torch.zeros(5, 3, dtype=torch.long), torch.ones(5, 3, dtype=torch.long)
    data = q_nstep_sequence_td_data(q, target_q, action, target_action, REWARD, TERMINATED, MASK, weight)
    return q, target_q, data


def test_targets_with_termination_truncation_and_padding():
    q, target_q, data = make()
    loss, td_error = q_nstep_sequence_td_error(data, GAMMA, NSTEP, value_rescale=False)
    torch.testing.assert_close(td_error, TARGET * LEARN_MASK)
    expected = (TARGET.square() * LEARN_MASK).sum() / 8  # mean over the 8 real learn steps
    assert loss.item() == pytest.approx(expected.item())
    loss.backward()
    assert target_q.grad is None or not target_q.grad.any()  # targets are detached
    # d loss / d q[t, b, 0] = 2 (q - G) / 8 at real learn steps, 0 at padding, the bootstrap-only steps, action 1
    expected_grad = torch.zeros(5, 3, dtype=torch.float64)
    expected_grad[:3] = -2 * TARGET * LEARN_MASK / 8
    torch.testing.assert_close(q.grad[..., 0], expected_grad)
    assert not q.grad[..., 1].any()


def test_importance_weights_weight_each_sequences_steps():
    weight = t([1.0, 2.0, 0.5])
    _, _, data = make(weight=weight)
    loss, _ = q_nstep_sequence_td_error(data, GAMMA, NSTEP, value_rescale=False)
    expected = (TARGET.square() * LEARN_MASK * weight).sum() / 8
    assert loss.item() == pytest.approx(expected.item())


def test_value_rescale_targets_are_h_of_the_raw_target():
    # the nets predict h(Q): h^-1 brings VALUE back, the raw target is TARGET, the regression target h(TARGET)
    q_taken = torch.zeros(5, 3, dtype=torch.float64)
    q_taken[:3] = value_transform(TARGET)
    q_taken[0, 0] -= 0.25  # one step off by a quarter
    _, _, data = make(q_taken=q_taken, rescale=True)
    loss, td_error = q_nstep_sequence_td_error(data, GAMMA, NSTEP, value_rescale=True)
    expected = torch.zeros(3, 3, dtype=torch.float64)
    expected[0, 0] = 0.25
    torch.testing.assert_close(td_error, expected)
    assert loss.item() == pytest.approx(0.25**2 / 8)


def test_one_step_rescale_by_hand():
    # raw target = -1 + 0.5 * h^-1(h(8)) = 3; h(3) = sqrt(4) - 1 + 0.003 = 1.003; q = 1
    q = t([[[1.0, 0.0]], [[0.0, 0.0]]], requires_grad=True)
    target_q = value_transform(t([[[0.0, 0.0]], [[0.0, 8.0]]]))
    ones = torch.ones(2, 1)
    data = q_nstep_sequence_td_data(
        q, target_q, torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.long), t([[-1.0], [5.0]]),
        torch.zeros(2, 1), ones, None,
    )  # fmt: skip
    loss, td_error = q_nstep_sequence_td_error(data, 0.5, 1)
    torch.testing.assert_close(td_error, t([[0.003]]))
    assert loss.item() == pytest.approx(0.003**2)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"q": torch.zeros(5, 3)}, r"q has shape \(5, 3\), expected \(T, B, A\)"),
        ({"reward": torch.zeros(3, 5)}, r"reward has shape \(3, 5\), expected \(T, B\) = \(5, 3\)"),
        ({"mask": torch.zeros(5, 2)}, r"mask has shape \(5, 2\)"),
        ({"weight": torch.ones(5)}, r"weight has shape \(5,\), expected \(3,\)"),
    ],
)
def test_shape_errors(change, message):
    _, _, data = make()
    with pytest.raises(ValueError, match=message):
        q_nstep_sequence_td_error(data._replace(**change), GAMMA, NSTEP)


def test_sequence_must_be_longer_than_nstep():
    _, _, data = make()
    with pytest.raises(ValueError, match="T=5 steps has no learn step for nstep=5"):
        q_nstep_sequence_td_error(data, GAMMA, 5)
