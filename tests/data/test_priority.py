"""sequence_priority against values computed by hand."""

import pytest
import torch

from nervex.data import sequence_priority

# two sequences of three steps, time first: |td| is 1, 3, 2 (max 3, mean 2) and 2, 0.5, 0.5 (max 2, mean 1)
TD = torch.tensor([[1.0, -2.0], [3.0, 0.5], [-2.0, 0.5]])


def test_eta_mixes_max_and_mean_of_abs_td():
    torch.testing.assert_close(sequence_priority(TD, eta=0.9), torch.tensor([0.9 * 3 + 0.1 * 2, 0.9 * 2 + 0.1 * 1]))
    torch.testing.assert_close(sequence_priority(TD, eta=0.0), torch.tensor([2.0, 1.0]))  # the mean
    torch.testing.assert_close(sequence_priority(TD, eta=1.0), torch.tensor([3.0, 2.0]))  # the max


def test_masked_steps_count_in_neither_max_nor_mean():
    # a burn-in step first, and a second sequence that ends (padding) after its first counted step
    mask = torch.tensor([[False, False], [True, True], [True, False]])
    # |td| counted: 3, 2 (max 3, mean 2.5) and 0.5 (max 0.5, mean 0.5)
    expected = torch.tensor([0.9 * 3 + 0.1 * 2.5, 0.5])
    torch.testing.assert_close(sequence_priority(TD, eta=0.9, mask=mask), expected)
    nothing = torch.zeros_like(mask)
    torch.testing.assert_close(sequence_priority(TD, mask=nothing), torch.zeros(2))


def test_priorities_are_not_differentiated_through():
    td = TD.clone().requires_grad_(True)
    assert not sequence_priority(td).requires_grad


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match=r"eta must be in \[0, 1\] \(R2D2 uses 0.9\), got 1.5"):
        sequence_priority(TD, eta=1.5)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 2\), td_error \(3, 2\)"):
        sequence_priority(TD, mask=torch.ones(2, 2, dtype=torch.bool))
