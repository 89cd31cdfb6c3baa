"""QMIX / VDN targets over padded sequences against values computed by hand: terminated and truncated episodes and
one that goes on in the same batch, padding, TD(lambda), double-Q under action masks, dead agents."""

import pytest
import torch

from nervex.rl_utils import bootstrap_agent_q, chosen_agent_q, qmix_td_data, qmix_td_error, qmix_td_target


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float64, **kw)


GAMMA = 0.5
# three sequences of T = 4 steps (columns), time first
# 0: terminated at step 1, then padding (its flags copied); 1: truncated at step 1, then padding whose first step
# holds the final observation; 2: four real steps, the episode goes on
REWARD = t([[1.0, 1.0, 4.0], [2.0, 2.0, 2.0], [0.0, 0.0, 6.0], [0.0, 0.0, 0.0]])
TERMINATED = t([[0, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0]])
MASK = t([[1, 1, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1]])
# the target mixer's value of the bootstrap joint action at each step (sequence 1's step 2: the final observation)
VALUE = t([[10.0, 10.0, 10.0], [20.0, 20.0, 20.0], [30.0, 30.0, 30.0], [40.0, 40.0, 40.0]])

# k-step returns by hand (gamma 0.5), learn steps t = 0, 1:
#   seq 0: G1(0) = 1 + .5*20 = 11     G2(0) = 1 + .5*2 (terminated at 1: no bootstrap) = 2
#          G1(1) = 2 (terminal)       G2(1) = 2 (the episode ended: no more reward, no bootstrap)
#   seq 1: G1(0) = 1 + .5*20 = 11     G2(0) = 1 + .5*2 + .25*30 (final obs) = 9.5
#          G1(1) = 2 + .5*30 = 17     G2(1) = 2 + .5*30 (one real step, then the final obs) = 17
#   seq 2: G1(0) = 4 + .5*20 = 14     G2(0) = 4 + .5*2 + .25*30 = 12.5
#          G1(1) = 2 + .5*30 = 17     G2(1) = 2 + .5*6 + .25*40 = 15
NSTEP2 = t([[2.0, 9.5, 12.5], [2.0, 17.0, 15.0]])
LAMBDA_HALF = t([[6.5, 10.25, 13.25], [2.0, 17.0, 16.0]])  # .5 G1 + .5 G2
# 1-step, learn steps t = 0, 1, 2: seq 0's and 1's step 2 is padding (its target is never used)
ONESTEP = t([[11.0, 11.0, 14.0], [2.0, 17.0, 17.0]])


def test_nstep_targets_with_termination_truncation_and_padding():
    target = qmix_td_target(VALUE, REWARD, TERMINATED, MASK, GAMMA, nstep=2)
    assert torch.allclose(target, NSTEP2)


def test_lambda_targets_mix_the_k_step_returns():
    target = qmix_td_target(VALUE, REWARD, TERMINATED, MASK, GAMMA, nstep=2, td_lambda=0.5)
    assert torch.allclose(target, LAMBDA_HALF)
    # lambda 0 is the 1-step return, whatever nstep
    one = qmix_td_target(VALUE, REWARD, TERMINATED, MASK, GAMMA, nstep=2, td_lambda=0.0)
    assert torch.allclose(one, ONESTEP)


def test_one_step_targets():
    target = qmix_td_target(VALUE, REWARD, TERMINATED, MASK, GAMMA, nstep=1)
    assert target.shape == (3, 3)
    assert torch.allclose(target[:2], ONESTEP)
    assert target[2, 2] == 6.0 + 0.5 * 40.0


def test_loss_is_the_mean_over_real_learn_steps_and_padding_gives_no_error():
    q_tot = torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)
    weight = t([1.0, 2.0, 1.0])
    loss, td_error = qmix_td_error(qmix_td_data(q_tot, VALUE, REWARD, TERMINATED, MASK, weight), GAMMA, nstep=1)
    # real learn steps: all of steps 0, 1 and sequence 2's step 2 (seqs 0 and 1 are padding there)
    expected_td = t([[11.0, 11.0, 14.0], [2.0, 17.0, 17.0], [0.0, 0.0, 26.0]])
    assert torch.allclose(td_error, expected_td)
    weighted = t([[11.0**2, 2 * 11.0**2, 14.0**2], [2.0**2, 2 * 17.0**2, 17.0**2], [0.0, 0.0, 26.0**2]])
    assert torch.allclose(loss, weighted.sum() / 7)
    loss.backward()
    assert q_tot.grad[2, 0] == 0 and q_tot.grad[2, 1] == 0  # padding learn steps give no gradient
    assert q_tot.grad[3].abs().sum() == 0  # the lookahead step only bootstraps
    assert q_tot.grad[0, 1] == pytest.approx(2 * 2 * (0.0 - 11.0) / 7)


def test_dead_agents_contribute_nothing():
    q = t([[[1.0, 5.0, 2.0], [3.0, 4.0, 9.0]]])  # (B=1, N=2, A=3)
    action = torch.tensor([[1, 2]])
    assert torch.equal(chosen_agent_q(q, action), t([[5.0, 9.0]]))
    assert torch.equal(chosen_agent_q(q, action, alive=torch.tensor([[1, 0]])), t([[5.0, 0.0]]))


def test_double_q_bootstrap_takes_the_online_argmax_under_the_mask_and_the_target_value():
    online = t([[[1.0, 5.0, 2.0], [3.0, 4.0, 9.0]]])
    target = t([[[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]]])
    mask = torch.tensor([[[1, 0, 1], [1, 1, 0]]])  # agent 0's best (1) and agent 1's best (2) are illegal
    value, action = bootstrap_agent_q(target, online, mask)
    assert action.tolist() == [[2, 1]]  # the online net's best legal actions
    assert torch.equal(value, t([[30.0, 50.0]]))  # valued by the target net
    value, action = bootstrap_agent_q(target, None, mask, alive=torch.tensor([[1, 0]]))
    assert action.tolist() == [[2, 1]] and torch.equal(value, t([[30.0, 0.0]]))  # plain max; the dead agent: 0


def test_shape_errors_name_the_tensor():
    q_tot = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"reward has shape \(4, 2\), expected \(T, B\) = \(4, 3\)"):
        qmix_td_error(qmix_td_data(q_tot, VALUE, REWARD[:, :2], TERMINATED, MASK, None), GAMMA, nstep=1)
    with pytest.raises(ValueError, match="T must exceed nstep"):
        qmix_td_error(qmix_td_data(q_tot, VALUE, REWARD, TERMINATED, MASK, None), GAMMA, nstep=4)
    with pytest.raises(ValueError, match="td_lambda must be in"):
        qmix_td_target(VALUE, REWARD, TERMINATED, MASK, GAMMA, nstep=2, td_lambda=1.5)
    with pytest.raises(ValueError, match=r"alive has shape"):
        chosen_agent_q(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 2))
