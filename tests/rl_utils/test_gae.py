"""GAE against values computed by hand, with terminated and truncated steps in the same array."""

import pytest
import torch

from nervex.rl_utils import gae, gae_data

GAMMA, LAMBDA = 0.5, 0.5  # gamma * lambda = 0.25


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def test_terminated_and_truncated_mixed():
    # column 0: truncated at t=2 (bootstraps from V(final obs) = 10), new episode at t=3 cut by the array's end
    # column 1: terminated at t=1 (no bootstrap), new episode at t=2, truncated at t=3 (bootstraps from 5)
    value = t([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]])
    next_value = t([[2.0, 2.0], [3.0, 3.0], [10.0, 9.0], [5.0, 5.0]])
    reward = t([[1.0, 1.0]] * 4)
    terminated = torch.tensor([[False, False], [False, True], [False, False], [False, False]])
    truncated = torch.tensor([[False, False], [False, False], [True, False], [False, True]])
    adv = gae(gae_data(value, next_value, reward, terminated, truncated), GAMMA, LAMBDA)

    a3 = 1.0 + 0.5 * 5.0 - 4.0  # -0.5, the array ends: bootstrap next_value
    a2 = 1.0 + 0.5 * 10.0 - 3.0  # 3.0, truncated: bootstraps but does not carry a3
    a1 = (1.0 + 0.5 * 3.0 - 2.0) + 0.25 * a2  # 1.25
    a0 = (1.0 + 0.5 * 2.0 - 1.0) + 0.25 * a1  # 1.3125
    b3 = 1.0 + 0.5 * 5.0 - 4.0  # truncated at the end: bootstraps from 5
    b2 = (1.0 + 0.5 * 9.0 - 3.0) + 0.25 * b3  # 2.375
    b1 = 1.0 + 0.5 * 0.0 - 2.0  # terminated: -1, no bootstrap, no carry
    b0 = (1.0 + 0.5 * 2.0 - 1.0) + 0.25 * b1  # 0.75
    torch.testing.assert_close(adv, t([[a0, b0], [a1, b1], [a2, b2], [a3, b3]]))


def test_lambda_one_is_monte_carlo_return_minus_value():
    value = t([0.5, 0.0, 0.0])
    next_value = t([0.0, 0.0, 4.0])
    reward = t([1.0, 2.0, 3.0])
    no = torch.zeros(3, dtype=torch.bool)
    adv = gae(gae_data(value, next_value, reward, no, no), gamma=0.5, lambda_=1.0)
    assert adv[0].item() == pytest.approx(1.0 + 0.5 * 2.0 + 0.25 * 3.0 + 0.125 * 4.0 - 0.5)


def test_lambda_zero_is_one_step_td_error():
    value, next_value, reward = t([1.0, 2.0]), t([2.0, 7.0]), t([1.0, 1.0])
    no = torch.zeros(2, dtype=torch.bool)
    adv = gae(gae_data(value, next_value, reward, no, no), gamma=0.9, lambda_=0.0)
    torch.testing.assert_close(adv, t([1.0 + 0.9 * 2.0 - 1.0, 1.0 + 0.9 * 7.0 - 2.0]))


def test_shape_mismatch():
    z = torch.zeros(3, 2)
    with pytest.raises(ValueError, match=r"same \(T, B\) shape.*'reward': \(2, 3\)"):
        gae(gae_data(z, z, torch.zeros(2, 3), z, z))


def test_numpy_gae_equals_the_torch_one():
    """The actor computes GAE on NumPy arrays; the same function on tensors is the oracle."""
    import numpy as np

    rng = np.random.default_rng(0)
    value, next_value, reward = (rng.normal(size=(12, 3)).astype(np.float32) for _ in range(3))
    terminated = rng.random((12, 3)) < 0.2
    truncated = (rng.random((12, 3)) < 0.2) & ~terminated
    expected = gae(
        gae_data(*(torch.from_numpy(np.asarray(a)) for a in (value, next_value, reward, terminated, truncated))),
        0.9,
        0.8,
    ).numpy()
    got = gae(gae_data(value, next_value, reward, terminated, truncated), 0.9, 0.8)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
