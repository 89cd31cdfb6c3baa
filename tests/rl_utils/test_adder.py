"""Adder: tables of named cases (Acme style) with hand-computed expectations."""

from collections import deque

import numpy as np
import pytest

from nervex.rl_utils import Adder, TrajectoryAdder

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


# ---- streaming: add_first / add / flush -------------------------------------------------------------------------
def stream(adder, transitions, env_id=0):
    """Feed transitions one by one; return (samples per add, all samples)."""
    adder.add_first(env_id)
    per_add, samples = [], []
    for transition in transitions:
        out = adder.add(env_id, transition)
        per_add.append(len(out))
        samples.extend(out)
    return per_add, samples


# name, rewards, end, nstep, samples emitted by each add, transitions still held after the last add
NSTEP_STREAM_CASES = [
    ("episode shorter than n", [1.0, 2.0], "terminated", 3, [0, 2], 0),
    ("windows emitted as they complete", [1.0, 2.0, 3.0, 4.0, 5.0], None, 3, [0, 0, 1, 1, 1], 2),
    ("truncated at step 3 empties the buffer", [1.0, 2.0, 3.0], "truncated", 3, [0, 0, 3], 0),
    ("nstep 1 emits every step", [1.0, 2.0, 3.0], None, 1, [1, 1, 1], 0),
]


@pytest.mark.parametrize(
    "name, rewards, end, nstep, per_add, held", NSTEP_STREAM_CASES, ids=[c[0] for c in NSTEP_STREAM_CASES]
)
def test_nstep_stream(name, rewards, end, nstep, per_add, held):
    data = make_traj(rewards, end)
    before = snapshot(data)
    adder = Adder(kind="nstep", nstep=nstep, gamma=GAMMA)
    got, samples = stream(adder, data)
    assert got == per_add and adder.pending(0) == held
    # the same samples as the functional API gives for the whole trajectory
    expected = Adder().get_nstep_return_data(data, nstep, gamma=GAMMA)
    assert len(samples) == len(expected)
    for sample, want in zip(samples, expected):
        assert sample["obs"] is want["obs"] and sample["next_obs"] is want["next_obs"]
        np.testing.assert_array_equal(sample["reward"], want["reward"])
        assert sample["value_gamma"] == want["value_gamma"] and sample["done"] == want["done"]
    assert adder.flush(0) == []  # n-step windows wait for more steps
    assert_not_mutated(data, before)


# name, episode length, end, (unroll_len, burnin, lookahead), per add: emitted samples, expected samples as
# (burnin, obs per step, mask); obs past the episode's end is the final next_obs (length, here)
SEQUENCE_CASES = [
    (
        "episode shorter than a sequence",
        2,
        "terminated",
        (2, 1, 1),
        [0, 1],
        [(0, [0, 1, 2, 2], [1, 1, 0, 0])],
    ),
    (
        "overlapping sequences, burn-in from the previous window",
        5,
        "terminated",
        (2, 1, 1),
        [0, 0, 1, 0, 2],
        [(0, [0, 1, 2, 3], [1, 1, 1, 0]), (1, [1, 2, 3, 4], [1, 1, 1, 1]), (1, [3, 4, 5, 5], [1, 1, 0, 0])],
    ),
    (
        "cut mid-episode keeps incomplete windows",
        5,
        None,
        (2, 1, 1),
        [0, 0, 1, 0, 1],
        [(0, [0, 1, 2, 3], [1, 1, 1, 0]), (1, [1, 2, 3, 4], [1, 1, 1, 1])],
    ),
    (
        "truncated inside the next window's burn-in: no window without learning steps",
        2,
        "truncated",
        (2, 2, 0),
        [0, 1],
        [(0, [0, 1, 2, 2], [1, 1, 0, 0])],
    ),
    (
        "truncated after one step of a window: its bootstrap obs follows it",
        3,
        "truncated",
        (2, 2, 1),
        [0, 0, 2],
        [(0, [0, 1, 2, 3, 3], [1, 1, 1, 0, 0]), (2, [0, 1, 2, 3, 3], [1, 1, 1, 0, 0])],
    ),
    (
        "IMPALA layout: unroll + 1 bootstrap step, no burn-in",
        4,
        "terminated",
        (2, 0, 1),
        [0, 0, 1, 1],
        [(0, [0, 1, 2], [1, 1, 1]), (0, [2, 3, 4], [1, 1, 0])],
    ),
]


@pytest.mark.parametrize(
    "name, length, end, dims, per_add, expected", SEQUENCE_CASES, ids=[c[0] for c in SEQUENCE_CASES]
)
def test_sequence_stream(name, length, end, dims, per_add, expected):
    unroll_len, burnin, lookahead = dims
    data = make_traj([float(i) for i in range(length)], end, prev_state=[np.full(2, 10.0 * i) for i in range(length)])
    before = snapshot(data)
    adder = Adder(unroll_len=unroll_len, kind="sequence", burnin=burnin, lookahead=lookahead)
    got, samples = stream(adder, data)
    assert got == per_add
    assert [int(s["burnin"]) for s in samples] == [e[0] for e in expected]
    for sample, (_, obs, mask) in zip(samples, expected):
        assert sample["obs"].shape == (adder.sequence_len, 1) and sample["obs"].dtype == np.float32
        assert sample["obs"][:, 0].tolist() == obs
        assert sample["mask"].tolist() == mask and sample["mask"].dtype == np.float32
        assert "next_obs" not in sample
        # the recurrent state stored is the one the actor had at the sequence's first step
        np.testing.assert_array_equal(sample["prev_state"], np.full(2, 10.0 * obs[0]))
        real = int(sum(mask))
        assert sample["reward"][real:].tolist() == [0.0] * (len(mask) - real)  # padding earns nothing
        if end is not None and obs[-1] == length:  # padded after the episode's end: its flags
            assert bool(sample["done"][-1]) and bool(sample[end][-1])
    assert_not_mutated(data, before)


# name, episode length, end, unroll_len (longest episode), per add: emitted samples, expected (obs per step, mask)
EPISODE_CASES = [
    ("terminated episode shorter than the limit", 2, "terminated", 3, [0, 1], ([0, 1, 2, 2], [1, 1, 0, 0])),
    ("truncated at the limit: the final obs follows", 3, "truncated", 3, [0, 0, 1], ([0, 1, 2, 3], [1, 1, 1, 0])),
    ("cut mid-episode emits nothing", 2, None, 3, [0, 0], None),
]


@pytest.mark.parametrize(
    "name, length, end, limit, per_add, expected", EPISODE_CASES, ids=[c[0] for c in EPISODE_CASES]
)
def test_episode_stream(name, length, end, limit, per_add, expected):
    data = make_traj([1.0 + i for i in range(length)], end)
    before = snapshot(data)
    adder = Adder(unroll_len=limit, kind="episode")
    got, samples = stream(adder, data)
    assert got == per_add and adder.flush(0) == []
    if expected is None:
        assert samples == [] and adder.pending(0) == length
        return
    (sample,) = samples
    obs, mask = expected
    assert sample["obs"][:, 0].tolist() == obs and sample["mask"].tolist() == mask
    assert sample["reward"].tolist() == [1.0 + i for i in range(length)] + [0.0] * (limit + 1 - length)
    assert bool(sample[end][length - 1]) and not bool(sample["done"][: length - 1].any())
    assert adder.pending(0) == 0
    assert_not_mutated(data, before)


def test_episode_longer_than_the_limit_is_an_error_naming_the_key():
    adder = Adder(unroll_len=2, kind="episode")
    with pytest.raises(ValueError, match="ran past unroll_len=2 steps.*max_episode_len"):
        stream(adder, make_traj([0.0, 0.0, 0.0], "terminated"))
    with pytest.raises(ValueError, match="no burnin or lookahead"):
        Adder(unroll_len=2, kind="episode", burnin=1)


def test_sequence_stream_holds_only_what_later_samples_need():
    adder = Adder(unroll_len=4, kind="sequence", burnin=2, lookahead=1)
    stream(adder, make_traj([0.0] * 50))
    # the next window learns from step 48: its sample starts 2 burn-in steps earlier
    assert adder.pending(0) == 50 - 46


def test_envs_do_not_mix_and_a_crash_drops_the_partial_episode():
    adder = Adder(kind="nstep", nstep=2, gamma=GAMMA)
    a, b = make_traj([1.0, 2.0, 3.0]), make_traj([7.0, 8.0], start=100)
    assert adder.add(0, a[0]) == [] and adder.add(1, b[0]) == []
    (sample,) = adder.add(0, a[1])
    assert sample["reward"].tolist() == [1.0, 2.0]
    adder.add_first(1)  # env 1 crashed and restarted: its half episode is gone
    assert adder.pending(1) == 0 and adder.add(1, b[1]) == []
    (sample,) = adder.add(0, a[2])
    assert sample["reward"].tolist() == [2.0, 3.0] and sample["obs"][0] == 1.0


def test_gae_stream_emits_at_an_episode_end_and_on_flush():
    adder = Adder(kind="gae", gamma=0.5, gae_lambda=0.5, keep=("obs", "adv", "return"))
    episode = make_traj([1.0, 1.0, 1.0], "terminated", value=[np.float32(v) for v in (1.0, 2.0, 3.0)])
    got, samples = stream(adder, episode)
    assert got == [0, 0, 3] and set(samples[0]) == {"obs", "adv", "return"}
    expected = Adder().get_gae(episode, 0.0, gamma=0.5, gae_lambda=0.5)
    np.testing.assert_allclose([s["adv"] for s in samples], [e["adv"] for e in expected])
    cut = make_traj([1.0, 1.0], value=[np.float32(1.0), np.float32(2.0)])
    stream(adder, cut)
    with pytest.raises(RuntimeError, match="ends mid-episode without 'next_value'"):
        adder.flush(0)
    cut[-1]["next_value"] = 10.0  # the actor's bootstrap
    stream(adder, cut)
    flushed = adder.flush(0)
    # delta1 = 1 + 0.5 * 10 - 2 = 4 = adv1; delta0 = 1 + 0.5 * 2 - 1 = 1, adv0 = 1 + 0.25 * 4 = 2; return = adv + value
    assert [float(s["return"]) for s in flushed] == pytest.approx([3.0, 6.0])
    assert adder.pending(0) == 0 and adder.flush(0) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kind="nsteps"), "unknown kind 'nsteps'; valid: nstep, gae, sequence"),
        (dict(kind="gae", gamma=0.9), r"kind='gae'\) needs gamma and gae_lambda"),
        (dict(kind="sequence", burnin=-1), "burnin and lookahead must be >= 0"),
        (dict(kind="nstep", nstep=0), "nstep must be >= 1, got 0"),
    ],
)
def test_bad_streaming_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Adder(**kwargs)


def test_functional_only_adder_refuses_to_stream():
    with pytest.raises(RuntimeError, match=r"Adder.add needs an Adder built with kind="):
        Adder().add(0, make_traj([1.0])[0])


def test_trajectory_adder_hands_the_cache_over_at_traj_len_and_episode_end():
    calls = []

    def get_train_sample(cache):
        calls.append(len(cache))
        return Adder().get_nstep_return_data(Adder().get_traj(cache, 3, return_num=1), 2, gamma=GAMMA)

    adder = TrajectoryAdder(get_train_sample, traj_len=3)
    got, samples = stream(adder, make_traj([1.0, 2.0, 3.0, 4.0, 5.0], "terminated"))
    assert calls == [3, 3] and got == [0, 0, 2, 0, 3]
    assert [s["obs"][0] for s in samples] == [0.0, 1.0, 2.0, 3.0, 4.0] and adder.pending(0) == 0
