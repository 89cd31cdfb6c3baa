"""Epsilon schedules against values computed by hand."""

import math

import pytest

from nervex.rl_utils import epsilon_greedy


@pytest.mark.parametrize(
    "name, start, end, decay, type_, step, expected",
    [
        ("exp at 0", 1.0, 0.1, 100, "exp", 0, 1.0),
        ("exp at one time constant", 1.0, 0.1, 100, "exp", 100, 0.1 + 0.9 * math.exp(-1.0)),
        ("exp far out tends to end", 1.0, 0.1, 100, "exp", 10_000, 0.1 + 0.9 * math.exp(-100.0)),
        ("linear at 0", 1.0, 0.1, 100, "linear", 0, 1.0),
        ("linear halfway", 1.0, 0.1, 100, "linear", 50, 1.0 - 0.9 * 0.5),
        ("linear one step before the end", 1.0, 0.1, 100, "linear", 99, 1.0 - 0.9 * 0.99),
        ("linear reaches end at decay", 1.0, 0.1, 100, "linear", 100, 0.1),
        ("linear stays at end", 1.0, 0.1, 100, "linear", 250, 0.1),
        ("linear one step past decay", 1.0, 0.1, 100, "linear", 101, 0.1),
        ("linear increasing schedule", 0.0, 1.0, 10, "linear", 5, 0.5),
        ("linear increasing schedule stays", 0.0, 1.0, 10, "linear", 20, 1.0),
    ],
)
def test_schedule(name, start, end, decay, type_, step, expected):
    assert epsilon_greedy(start, end, decay, type_)(step) == pytest.approx(expected, abs=1e-12)


def test_default_type_is_exp():
    assert epsilon_greedy(0.5, 0.0, 10)(10) == pytest.approx(0.5 * math.exp(-1.0))


def test_unknown_type_lists_valid_types():
    with pytest.raises(ValueError, match=r"unknown type 'cosine'.*\['exp', 'linear'\]"):
        epsilon_greedy(1.0, 0.1, 100, "cosine")


@pytest.mark.parametrize("decay", [0, -5])
def test_non_positive_decay(decay):
    with pytest.raises(ValueError, match="decay must be positive"):
        epsilon_greedy(1.0, 0.1, decay, "linear")
