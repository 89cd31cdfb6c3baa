"""PFSP weightings against distributions computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from nervex.league.pfsp import PFSP_WEIGHTINGS, pfsp

WIN_RATES = [0.1, 0.5, 0.8, 1.0]


@pytest.mark.parametrize(
    "weighting, expected",
    [
        # x(1-x) = .09, .25, .16, 0 (sum .5)
        ("variance", [0.18, 0.5, 0.32, 0.0]),
        # 1-x = .9, .5, .2, 0 (sum 1.6)
        ("linear", [0.5625, 0.3125, 0.125, 0.0]),
        # min(.5, 1-x) = .5, .5, .2, 0 (sum 1.2)
        ("linear_capped", [5 / 12, 5 / 12, 1 / 6, 0.0]),
        # (1-x)^2 = .81, .25, .04, 0 (sum 1.1)
        ("squared", [81 / 110, 25 / 110, 4 / 110, 0.0]),
    ],
)
def test_each_weighting_gives_the_hand_computed_distribution(weighting, expected):
    probs = pfsp(WIN_RATES, weighting)
    np.testing.assert_allclose(probs, expected, rtol=0, atol=1e-12)
    assert probs.dtype == np.float64


def test_the_four_weightings_are_the_published_ones():
    assert sorted(PFSP_WEIGHTINGS) == ["linear", "linear_capped", "squared", "variance"]


@pytest.mark.parametrize(
    "win_rates, weighting",
    [
        ([1.0, 1.0, 1.0], "squared"),  # the learner beats everyone: every (1-x)^2 is 0
        ([0.0, 1.0], "variance"),  # x(1-x) vanishes at both ends
        ([1.0, 1.0], "linear_capped"),
    ],
)
def test_all_zero_weights_give_a_uniform_choice(win_rates, weighting):
    np.testing.assert_allclose(pfsp(win_rates, weighting), np.full(len(win_rates), 1.0 / len(win_rates)))


def test_one_candidate_is_certain():
    np.testing.assert_allclose(pfsp([0.3], "linear"), [1.0])


def test_bad_inputs_are_refused_with_what_is_wrong():
    with pytest.raises(ValueError, match="did you mean 'squared'"):
        pfsp([0.5], "squard")
    with pytest.raises(ValueError, match="non-empty"):
        pfsp([], "squared")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        pfsp([0.2, 1.2], "squared")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        pfsp([float("nan")], "variance")
