"""Adder: tables of named cases (Acme style) with hand-computed expectations."""

from collections import deque

import numpy as np
import pytest

from nervex.rl_utils import Adder

GAMMA = 0.9


def make_traj(rewards, end=None, start=0, **extra):
    """Transitions with obs i / next_obs i+1; ``end`` ('terminated' | 'truncated' | None) sets the last one's flags."""
    traj = []
    for k, reward in enumerate(rewards):
        i = start + k
        last = k == len(rewards) - 1
        terminated, truncated = last and end == "terminated", last and end == "truncated"
        transition = {
            "obs": np.array([i], dtype=np.float32),
            "next_obs": np.array([i + 1], dtype=np.float32),
            "action": i % 2,
            "reward": float(reward),
            "terminated": terminated,
            "truncated": truncated,
            "done": terminated or truncated,
        }
        transition.update({key: values[k] for key, values in extra.items()})
        traj.append(transition)
    return traj


def snapshot(data):
    return [dict(d) for d in data]


def assert_not_mutated(data, before):
    assert len(data) == len(before)
    for d, b in zip(data, before):
        assert d.keys() == b.keys() and all(d[k] is b[k] for k in b)


# name, rewards, end, nstep, expected samples: (reward window, index of the transition giving next_obs/flags,
# value_gamma)
NSTEP_CASES = [
    (
        "episode shorter than n",
        [1.0, 2.0],
        "terminated",
        3,
        [([1.0, 2.0, 0.0], 1, GAMMA**2), ([2.0, 0.0, 0.0], 1, GAMMA**1)],
    ),
    (
        "terminated at step 3",
        [1.0, 2.0, 3.0],
        "terminated",
        3,
        [([1.0, 2.0, 3.0], 2, GAMMA**3), ([2.0, 3.0, 0.0], 2, GAMMA**2), ([3.0, 0.0, 0.0], 2, GAMMA**1)],
    ),
    (
        "truncated at step 3",
        [1.0, 2.0, 3.0],
        "truncated",
        3,
        [([1.0, 2.0, 3.0], 2, GAMMA**3), ([2.0, 3.0, 0.0], 2, GAMMA**2), ([3.0, 0.0, 0.0], 2, GAMMA**1)],
    ),
    (
        "longer episode ending in termination",
        [1.0, 2.0, 3.0, 4.0, 5.0],
        "terminated",
        3,
        [
            ([1.0, 2.0, 3.0], 2, GAMMA**3),
            ([2.0, 3.0, 4.0], 3, GAMMA**3),
            ([3.0, 4.0, 5.0], 4, GAMMA**3),
            ([4.0, 5.0, 0.0], 4, GAMMA**2),
            ([5.0, 0.0, 0.0], 4, GAMMA**1),
        ],
    ),
    (
        "trajectory cut mid-episode returns complete windows only",
        [1.0, 2.0, 3.0, 4.0, 5.0],
        None,
        3,
        [([1.0, 2.0, 3.0], 2, GAMMA**3), ([2.0, 3.0, 4.0], 3, GAMMA**3), ([3.0, 4.0, 5.0], 4, GAMMA**3)],
    ),
    ("cut trajectory shorter than n gives nothing", [1.0, 2.0], None, 3, []),
    ("nstep 1 still makes a (1,) reward", [1.0, 2.0], None, 1, [([1.0], 0, GAMMA), ([2.0], 1, GAMMA)]),
    ("empty data", [], None, 3, []),
]


@pytest.mark.parametrize("name, rewards, end, nstep, expected", NSTEP_CASES, ids=[c[0] for c in NSTEP_CASES])
def test_get_nstep_return_data(name, rewards, end, nstep, expected):
    data = make_traj(rewards, end)
    before = snapshot(data)
    samples = Adder().get_nstep_return_data(data, nstep, gamma=GAMMA)
    assert len(samples) == len(expected)
    for i, (sample, (reward, last, value_gamma)) in enumerate(zip(samples, expected)):
        assert sample is not data[i]
        assert sample["obs"] is data[i]["obs"] and sample["action"] == data[i]["action"]
        assert sample["reward"].dtype == np.float32
        np.testing.assert_array_equal(sample["reward"], np.array(reward, dtype=np.float32))
        assert sample["next_obs"] is data[last]["next_obs"]
        for key in ("terminated", "truncated", "done"):
            assert sample[key] == data[last][key], key
        assert isinstance(sample["value_gamma"], np.float32)
        assert sample["value_gamma"] == pytest.approx(value_gamma, rel=1e-6)
    assert_not_mutated(data, before)


def test_nstep_window_stops_at_a_done_inside_the_data():
    # defensive: the actor clears the cache at an episode's end, but a window must never cross one anyway
    data = make_traj([1.0, 2.0], "terminated") + make_traj([3.0, 4.0], None, start=2)
    samples = Adder().get_nstep_return_data(data, 3, gamma=GAMMA)
    assert len(samples) == 4 - (3 - 1)  # data[-1] is not done: complete windows only
    np.testing.assert_array_equal(samples[0]["reward"], np.array([1.0, 2.0, 0.0], dtype=np.float32))
    np.testing.assert_array_equal(samples[1]["reward"], np.array([2.0, 0.0, 0.0], dtype=np.float32))
    assert samples[0]["next_obs"] is data[1]["next_obs"] and samples[1]["next_obs"] is data[1]["next_obs"]
    assert samples[0]["value_gamma"] == pytest.approx(GAMMA**2) and samples[0]["terminated"]


def test_nstep_without_gamma_has_no_value_gamma():
    samples = Adder().get_nstep_return_data(make_traj([1.0, 2.0], "terminated"), 2)
    assert all("value_gamma" not in s for s in samples)


def test_nstep_array_reward_is_zero_padded_per_agent():
    data = make_traj([0.0, 0.0], "terminated")
    data[0]["reward"], data[1]["reward"] = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    samples = Adder().get_nstep_return_data(data, 3)
    np.testing.assert_array_equal(samples[1]["reward"], np.array([[3.0, 4.0], [0.0, 0.0], [0.0, 0.0]], np.float32))


# name, cache size, traj_len, return_num, expected taken indices, expected cache indices after
GET_TRAJ_CASES = [
    ("takes traj_len from the left", 7, 3, 0, [0, 1, 2], [3, 4, 5, 6]),
    ("overlap with return_num", 7, 3, 2, [0, 1, 2], [1, 2, 3, 4, 5, 6]),
    ("short cache is taken whole, overlap capped", 2, 5, 4, [0, 1], [0, 1]),
    ("infinite traj_len takes all", 4, float("inf"), 1, [0, 1, 2, 3], [3]),
]


@pytest.mark.parametrize(
    "name, size, traj_len, return_num, taken, left", GET_TRAJ_CASES, ids=[c[0] for c in GET_TRAJ_CASES]
)
def test_get_traj(name, size, traj_len, return_num, taken, left):
    transitions = make_traj([0.0] * size)
    cache = deque(transitions)
    traj = Adder().get_traj(cache, traj_len, return_num)
    assert [id(x) for x in traj] == [id(transitions[i]) for i in taken]
    assert [id(x) for x in cache] == [id(transitions[i]) for i in left]


@pytest.mark.parametrize("traj_len, return_num", [(3, 3), (3, 5), (3, -1)])
def test_get_traj_rejects_return_num_that_never_shrinks_the_cache(traj_len, return_num):
    with pytest.raises(ValueError, match=f"return_num={return_num}.*traj_len={traj_len}"):
        Adder().get_traj(deque(make_traj([0.0] * 5)), traj_len, return_num)


def test_trajectory_cut_mid_episode_keeps_nstep_minus_1_for_next_time():
    # The actor's loop: cache fills to traj_len=4, then the episode ends after 6 steps. nstep=3.
    adder, nstep = Adder(), 3
    episode = make_traj([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "terminated")
    before = snapshot(episode)
    cache = deque(episode[:4])
    first = adder.get_nstep_return_data(adder.get_traj(cache, 4, nstep - 1), nstep, gamma=GAMMA)
    assert [id(x) for x in cache] == [id(episode[2]), id(episode[3])]
    cache.extend(episode[4:])
    second = adder.get_nstep_return_data(adder.get_traj(cache, 4, nstep - 1), nstep, gamma=GAMMA)
    samples = first + second
    # every transition becomes exactly one sample
    assert [s["obs"][0] for s in samples] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    expected_rewards = [[1, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 6], [5, 6, 0], [6, 0, 0]]
    for sample, reward in zip(samples, expected_rewards):
        np.testing.assert_array_equal(sample["reward"], np.array(reward, dtype=np.float32))
    assert [s["next_obs"][0] for s in samples] == [3.0, 4.0, 5.0, 6.0, 6.0, 6.0]
    assert [s["done"] for s in samples] == [False, False, False, True, True, True]
    assert_not_mutated(episode, before)


def test_get_train_sample_unroll_1_returns_samples_as_they_are():
    data = make_traj([1.0, 2.0, 3.0])
    out = Adder(unroll_len=1).get_train_sample(deque(data))
    assert [id(x) for x in out] == [id(x) for x in data]


def test_get_train_sample_unroll_chunks_with_padding_mask():
    data = make_traj([0.0, 1.0, 2.0, 3.0, 4.0], "terminated", prev_state=[None] * 5)
    before = snapshot(data)
    out = Adder(unroll_len=3).get_train_sample(data)
    assert len(out) == 2
    first, second = out
    np.testing.assert_array_equal(first["obs"], np.array([[0.0], [1.0], [2.0]], dtype=np.float32))
    np.testing.assert_array_equal(second["obs"], np.array([[3.0], [4.0], [4.0]], dtype=np.float32))  # padded
    assert first["reward"].dtype == np.float32 and first["reward"].tolist() == [0.0, 1.0, 2.0]
    assert second["reward"].tolist() == [3.0, 4.0, 4.0]
    assert second["action"].tolist() == [1, 0, 0] and second["action"].dtype == np.int64
    assert second["done"].tolist() == [False, True, True]
    assert first["prev_state"] is None
    for sequence, mask in zip(out, ([1.0, 1.0, 1.0], [1.0, 1.0, 0.0])):
        assert sequence["mask"].dtype == np.float32
        np.testing.assert_array_equal(sequence["mask"], np.array(mask, dtype=np.float32))
    assert_not_mutated(data, before)


def test_unroll_len_must_be_positive():
    with pytest.raises(ValueError, match="unroll_len must be >= 1, got 0"):
        Adder(unroll_len=0)


# gamma = lambda = 0.5 (gamma * lambda = 0.25), rewards all 1
GAE_CASES = [
    (
        "terminated end ignores last_value",
        dict(values=[1.0, 2.0, 3.0], end="terminated", last_value=100.0),
        # a2 = 1 - 3; a1 = (1 + 0.5 * 3 - 2) + 0.25 * a2; a0 = (1 + 0.5 * 2 - 1) + 0.25 * a1
        [1.0 + 0.25 * (0.5 + 0.25 * -2.0), 0.5 + 0.25 * -2.0, 1.0 - 3.0],
    ),
    (
        "truncated end bootstraps from last_value",
        dict(values=[1.0, 2.0, 3.0], end="truncated", last_value=10.0),
        [1.0 + 0.25 * (0.5 + 0.25 * 3.0), 0.5 + 0.25 * 3.0, 1.0 + 0.5 * 10.0 - 3.0],
    ),
    (
        "cut mid-episode bootstraps from last_value",
        dict(values=[1.0, 2.0, 3.0], end=None, last_value=10.0),
        [1.0 + 0.25 * (0.5 + 0.25 * 3.0), 0.5 + 0.25 * 3.0, 1.0 + 0.5 * 10.0 - 3.0],
    ),
    (
        "truncation in the middle uses next_value and stops the recursion",
        dict(values=[1.0, 2.0, 3.0, 4.0], end="terminated", last_value=0.0, truncated_at=1, next_value=6.0),
        # a3 = 1 - 4; a2 = (1 + 0.5 * 4 - 3) + 0.25 * a3; a1 = 1 + 0.5 * 6 - 2 (no carry); a0 = 1 + 0.5*2 - 1 + 0.25 a1
        [1.0 + 0.25 * 2.0, 1.0 + 0.5 * 6.0 - 2.0, 0.0 + 0.25 * -3.0, -3.0],
    ),
]


@pytest.mark.parametrize("name, spec, expected_adv", GAE_CASES, ids=[c[0] for c in GAE_CASES])
def test_get_gae(name, spec, expected_adv):
    values = spec["values"]
    data = make_traj([1.0] * len(values), spec["end"], value=[np.float32(v) for v in values])
    if "truncated_at" in spec:
        k = spec["truncated_at"]
        data[k].update(truncated=True, done=True, next_value=spec["next_value"])
    before = snapshot(data)
    samples = Adder().get_gae(data, spec["last_value"], gamma=0.5, gae_lambda=0.5)
    np.testing.assert_allclose([s["adv"] for s in samples], expected_adv, rtol=1e-6)
    np.testing.assert_allclose([s["return"] for s in samples], np.add(expected_adv, values), rtol=1e-6)
    assert all(s["adv"].dtype == np.float32 for s in samples)
    assert all(s["obs"] is d["obs"] for s, d in zip(samples, data))
    assert_not_mutated(data, before)


def test_get_gae_truncation_in_the_middle_needs_next_value():
    data = make_traj([1.0, 1.0, 1.0], value=[1.0, 2.0, 3.0])
    data[1].update(truncated=True, done=True)
    with pytest.raises(ValueError, match="transition 1 of 3 is truncated.*'next_value'"):
        Adder().get_gae(data, 0.0, gamma=0.5, gae_lambda=0.5)


def test_get_gae_vector_value_per_agent():
    data = make_traj([1.0, 1.0], "terminated", value=[np.array([1.0, 2.0]), np.array([3.0, 4.0])])
    samples = Adder().get_gae(data, 0.0, gamma=0.5, gae_lambda=0.5)
    # agent 0: a1 = 1 - 3, a0 = (1 + 0.5 * 3 - 1) + 0.25 * a1; agent 1: a1 = 1 - 4, a0 = (1 + 0.5 * 4 - 2) + 0.25 * a1
    np.testing.assert_allclose(samples[0]["adv"], [1.5 + 0.25 * -2.0, 1.0 + 0.25 * -3.0])
    np.testing.assert_allclose(samples[1]["adv"], [-2.0, -3.0])
    np.testing.assert_allclose(samples[1]["return"], [-2.0 + 3.0, -3.0 + 4.0])
