"""COMA's rl_utils against values computed by hand: the epsilon-floor policy, the counterfactual advantage, and the
critic's TD(lambda) targets over padded episodes (terminated, truncated and padding in one batch)."""

import math

import pytest
import torch

from nervex.rl_utils import coma_advantage, coma_lambda_return, coma_policy_probs
from nervex.rl_utils.coma import masked_mean


# ---- the acting distribution ---------------------------------------------------------------------------------------
def test_policy_probs_floor_over_legal_actions_and_zero_on_illegal():
    logit = torch.tensor([[0.0, 5.0, math.log(3.0)], [1.0, 2.0, 3.0]])
    mask = torch.tensor([[1, 0, 1], [0, 0, 0]])
    pi = coma_policy_probs(logit, mask, eps=0.2)
    # row 0: softmax over the legal (0, ln 3) = (1/4, 3/4); 0.8 * that + 0.2 * (1/2, 1/2) = (0.3, 0.7), illegal 0
    assert pi[0].tolist() == pytest.approx([0.3, 0.0, 0.7])
    # row 1 has no legal action (padding): treated as all legal so pi stays finite
    soft = torch.softmax(logit[1], -1)
    assert pi[1].tolist() == pytest.approx((0.8 * soft + 0.2 / 3).tolist())
    assert coma_policy_probs(logit, None, 1.0)[0].tolist() == pytest.approx([1 / 3] * 3)
    with pytest.raises(ValueError, match="eps must be in"):
        coma_policy_probs(logit, mask, eps=1.5)
    with pytest.raises(ValueError, match="action_mask shape"):
        coma_policy_probs(logit, mask[:, :2], eps=0.1)


# ---- the counterfactual advantage ----------------------------------------------------------------------------------
def test_advantage_is_q_taken_minus_the_policy_weighted_baseline():
    # one step, three agents, three actions
    q = torch.tensor([[[1.0, 2.0, 4.0], [1.0, 100.0, 3.0], [5.0, 6.0, 7.0]]])
    pi = torch.tensor([[[0.5, 0.25, 0.25], [0.5, 0.0, 0.5], [0.2, 0.3, 0.5]]])  # agent 1's action 1 is illegal
    action = torch.tensor([[2, 0, 1]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # agent 2 is dead
    out = coma_advantage(q, pi, action, mask)
    # agent 0: 4 - (0.5 + 0.5 + 1) = 2; agent 1: 1 - (0.5 + 1.5) = -1 (the illegal 100 adds nothing); agent 2: masked
    assert out.advantage.tolist() == [[2.0, -1.0, 0.0]]
    assert out.q_taken.tolist() == [[4.0, 1.0, 0.0]]
    assert out.baseline.tolist() == [[2.0, 2.0, 0.0]]
    assert coma_advantage(q, pi, action).advantage[0, 2].item() == pytest.approx(6.0 - 6.3)


# ---- TD(lambda) targets --------------------------------------------------------------------------------------------
def _batch():
    """Three episodes, T = 3 learn steps, time-major (T, B):

    - 0: three steps, terminated at t=2; V = 10, 20, 30, 40;
    - 1: two steps, truncated at t=1 (V[2] = 12 is the target at the final observation), then one padding step
      (flags copied from the last step, reward 0);
    - 2: three steps, truncated at t=2 (V[3] = 4 is the bootstrap).
    Target values carry a second agent whose values are twice the first's.
    """
    reward = torch.tensor([[1.0, 1.0, 0.0], [2.0, 1.0, 0.0], [3.0, 0.0, 2.0]])
    value = torch.tensor([[10.0, 4.0, 1.0], [20.0, 8.0, 2.0], [30.0, 12.0, 3.0], [40.0, 99.0, 4.0]])
    value = torch.stack([value, 2 * value], dim=-1)  # (T + 1, B, N = 2)
    terminated = torch.tensor([[0, 0, 0], [0, 0, 0], [1, 0, 0]])
    truncated = torch.tensor([[0, 0, 0], [0, 1, 0], [0, 1, 1]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    return reward, value, terminated, truncated, mask


def test_lambda_return_terminated_truncated_and_padding_by_hand():
    reward, value, terminated, truncated, mask = _batch()
    got = coma_lambda_return(reward, value, terminated, truncated, mask, gamma=0.5, lambda_=0.5)
    assert got.shape == (3, 3, 2)
    # episode 0 (terminated): G2 = 3; G1 = 2 + 0.5 (0.5 * 30 + 0.5 * 3) = 10.25; G0 = 1 + 0.5 (0.5 * 20 + 0.5 * 10.25)
    assert got[:, 0, 0].tolist() == pytest.approx([8.5625, 10.25, 3.0])
    # episode 1 (truncated at t=1): G1 = 1 + 0.5 * 12 = 7; G0 = 1 + 0.5 (0.5 * 8 + 0.5 * 7) = 4.75; padding 0
    assert got[:, 1, 0].tolist() == pytest.approx([4.75, 7.0, 0.0])
    # episode 2 (truncated at t=2): G2 = 2 + 0.5 * 4 = 4; G1 = 0.5 (0.5 * 3 + 0.5 * 4) = 1.75; G0 = 0.5 (1 + 0.875)
    assert got[:, 2, 0].tolist() == pytest.approx([0.9375, 1.75, 4.0])
    # agent 1: the same recursion on doubled values (rewards are the team's, not doubled)
    assert got[:, 0, 1].tolist() == pytest.approx(
        [1 + 0.5 * (20 + 0.5 * (2 + 0.5 * (30 + 1.5))), 2 + 0.5 * (30 + 1.5), 3]
    )
    assert got[:, 1, 1].tolist() == pytest.approx([1 + 0.5 * (8 + 0.5 * 13), 13.0, 0.0])


def test_lambda_return_extremes_are_one_step_and_monte_carlo():
    reward, value, terminated, truncated, mask = _batch()
    one_step = coma_lambda_return(reward, value, terminated, truncated, mask, gamma=0.5, lambda_=0.0)
    # r_t + gamma * V_{t+1}, nothing after a termination
    assert one_step[:, 0, 0].tolist() == pytest.approx([1 + 10.0, 2 + 15.0, 3.0])
    assert one_step[:, 2, 0].tolist() == pytest.approx([0 + 1.0, 0 + 1.5, 2 + 2.0])
    monte_carlo = coma_lambda_return(reward, value, terminated, truncated, mask, gamma=0.5, lambda_=1.0)
    # discounted rewards to the end; a truncation still bootstraps from its final observation
    assert monte_carlo[:, 0, 0].tolist() == pytest.approx([2.75, 3.5, 3.0])
    assert monte_carlo[:, 1, 0].tolist() == pytest.approx([1 + 0.5 * 7, 7.0, 0.0])


def test_lambda_return_needs_the_final_observation_row():
    reward, value, terminated, truncated, mask = _batch()
    with pytest.raises(ValueError, match=r"must be \(T \+ 1, B, ...\)"):
        coma_lambda_return(reward, value[:3], terminated, truncated, mask, 0.5, 0.5)


def test_masked_mean_ignores_masked_entries():
    x = torch.tensor([[1.0, 100.0], [3.0, 5.0]])
    assert masked_mean(x, torch.tensor([[1.0, 0.0], [1.0, 1.0]])).item() == pytest.approx(3.0)
    assert masked_mean(x, torch.zeros(2, 2)).item() == 0.0
