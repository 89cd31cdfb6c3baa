"""PrioritizedBuffer / ReplayBuffer: storage rules, sampling statistics, weights, eviction, updates, rate limit."""

import inspect
import threading

import numpy as np
import pytest
import torch

from nervex.config import ConfigError, plain_defaults, validate_merge
from nervex.data import PrioritizedBuffer, ReplayBuffer
from nervex.data.tree import numba_available


def transition(i: int, obs_dim: int = 3) -> dict:
    return {
        "obs": np.full(obs_dim, i, dtype=np.float32),
        "action": i % 2,
        "reward": float(i),
        "done": bool(i % 2),
    }


def fill(buffer, n: int, start: int = 0, learner_iter: int = 0) -> None:
    buffer.extend([transition(i) for i in range(start, start + n)], learner_iter=learner_iter)


def drawn_ids(buffer, batches: int = 100, batch_size: int = 2, learner_iter: int = 0) -> list:
    """The sorted set of unique ids seen over many small batches."""
    ids = set()
    for _ in range(batches):
        ids.update(buffer.sample(batch_size, learner_iter=learner_iter)["unique_id"].tolist())
    return sorted(ids)


@pytest.mark.parametrize("cls", [PrioritizedBuffer, ReplayBuffer])
def test_config_is_the_constructor_signature_declared_once(cls):
    params = inspect.signature(cls.__init__).parameters
    defaults = plain_defaults(cls.config)
    assert list(defaults) == [p for p in params if p != "self"]
    assert all(
        defaults[k] == (list(params[k].default) if isinstance(params[k].default, tuple) else params[k].default)
        for k in defaults
    )
    with pytest.raises(ConfigError, match=r"key 'replay_buffer.maxlen' must be >= 1, got 0"):
        validate_merge(cls.config, {"maxlen": 0}, "replay_buffer")


def test_types_and_nested_fields_are_stored_by_the_rules(backend):
    buffer = PrioritizedBuffer(maxlen=8, seed=0)
    sample = {
        "obs": np.arange(6, dtype=np.float64).reshape(2, 3),  # float64 -> float32
        "frame": np.ones((2, 2), dtype=np.uint8),  # kept
        "reward": 1.5,  # float -> float32
        "action": 3,  # int -> int64
        "done": True,  # bool
        "info": {"step": np.int32(7), "extra": {"value": 0.25}},
    }
    buffer.extend([sample] * 4)
    batch = buffer.sample(4)
    assert batch["obs"].dtype == torch.float32 and batch["obs"].shape == (4, 2, 3)
    assert batch["frame"].dtype == torch.uint8
    assert batch["reward"].dtype == torch.float32 and batch["reward"].shape == (4,)
    assert batch["action"].dtype == torch.int64 and batch["done"].dtype == torch.bool
    assert batch["info"]["step"].dtype == torch.int32 and batch["info"]["extra"]["value"].tolist() == [0.25] * 4
    assert batch["weight"].dtype == torch.float32 and batch["weight"].shape == (4,)
    assert batch["index"].dtype == torch.int64 and batch["unique_id"].dtype == torch.int64
    np.testing.assert_array_equal(batch["obs"][0].numpy(), sample["obs"].astype(np.float32))


def test_sample_values_come_from_the_stored_slots(backend):
    buffer = PrioritizedBuffer(maxlen=16, seed=1)
    fill(buffer, 10)
    batch = buffer.sample(6)
    uid = batch["unique_id"].numpy()
    np.testing.assert_array_equal(batch["reward"].numpy(), uid.astype(np.float32))  # transition i has reward i
    np.testing.assert_array_equal(batch["obs"][:, 0].numpy(), uid.astype(np.float32))
    np.testing.assert_array_equal(batch["index"].numpy(), uid % 16)


@pytest.mark.parametrize("nested", [False, True])
def test_every_field_width_is_copied_exactly(backend, nested):
    # fields of 8, 4, 2 and 1 bytes, scalars and vectors, packed into one record (plus, when nested, a large column
    # stored on its own): what a batch holds must be exactly what was stored at its slots
    rng = np.random.default_rng(3)
    n = 500
    data = {
        "f64": rng.normal(size=(n, 3)),
        "i64": rng.integers(-(2**62), 2**62, n),
        "f32": rng.normal(size=n).astype(np.float32),
        "i32v": rng.integers(-(2**31), 2**31 - 1, (n, 3)).astype(np.int32),
        "u16": rng.integers(0, 2**16, (n, 2)).astype(np.uint16),
        "u8v": rng.integers(0, 256, (n, 5)).astype(np.uint8),
        "flag": rng.random(n) < 0.5,
    }
    if nested:
        data = {"inner": {"f64": data.pop("f64"), "flag": data.pop("flag")}, "big": rng.random((n, 40)), **data}
    buffer = PrioritizedBuffer(maxlen=n, seed=2)
    buffer.extend_batch(data)
    buffer.update(rng.uniform(0.1, 3.0, n), unique_id=np.arange(n))

    def check(stored, got, slots):
        for key, value in stored.items():
            if isinstance(value, dict):
                check(value, got[key], slots)
            else:
                expected = value[slots].astype(np.float32 if value.dtype == np.float64 else value.dtype)
                assert got[key].is_contiguous()
                np.testing.assert_array_equal(got[key].numpy(), expected, err_msg=key)

    for _ in range(20):
        batch = buffer.sample(64)
        check(data, batch, batch["index"].numpy())


@pytest.mark.parametrize(
    "bad,match",
    [
        (
            {"obs": np.zeros(4), "action": 0, "reward": 0.0, "done": False},
            r"field 'obs'( of sample 1)? has shape \(4,\).*\(3,\)",
        ),
        ({"obs": np.zeros(3), "action": 0, "reward": 0.0}, r"missing \['done'\]"),
        ({"obs": np.zeros(3), "action": 0, "reward": 0.0, "done": False, "x": 1}, r"unexpected \['x'\]"),
        (
            {"obs": np.zeros(3), "action": np.zeros(2), "reward": 0.0, "done": False},
            r"field 'action'( of sample 1)? has shape \(2,\)",
        ),
        ({"obs": np.zeros(3), "action": 0, "reward": None, "done": False}, "field 'reward' is None"),
    ],
)
def test_mismatched_sample_raises_naming_the_field(bad, match):
    buffer = ReplayBuffer(maxlen=8)
    fill(buffer, 2)
    with pytest.raises(ValueError, match=match):
        buffer.append(bad)
    with pytest.raises(ValueError, match=match):
        buffer.extend([transition(5), bad])
    assert len(buffer) == 2  # nothing of a rejected extend is stored


def test_first_sample_rules():
    with pytest.raises(ValueError, match="reserved"):
        ReplayBuffer(maxlen=4).append({"obs": np.zeros(2), "weight": 1.0})
    with pytest.raises(ValueError, match="only numbers"):
        ReplayBuffer(maxlen=4).append({"obs": np.zeros(2), "name": "pong"})
    with pytest.raises(ValueError, match="compress_fields names 'frames'"):
        ReplayBuffer(maxlen=4, compress_fields=["frames"]).append({"obs": np.zeros(2)})


def test_extend_batch_matches_extend(backend):
    a, b = PrioritizedBuffer(maxlen=32, seed=3), PrioritizedBuffer(maxlen=32, seed=3)
    samples = [transition(i) for i in range(20)]
    a.extend(samples)
    b.extend_batch({k: np.stack([np.asarray(s[k]) for s in samples]) for k in samples[0]})
    x, y = a.sample(8), b.sample(8)
    for key in x:
        torch.testing.assert_close(x[key], y[key])
    with pytest.raises(ValueError, match="has 3 rows"):
        b.extend_batch(
            {"obs": np.zeros((2, 3)), "action": np.zeros(3, int), "reward": np.zeros(2), "done": np.zeros(2, bool)}
        )


def test_ring_overwrites_oldest_and_len():
    buffer = ReplayBuffer(maxlen=5)
    fill(buffer, 3)
    assert len(buffer) == 3
    fill(buffer, 4, start=3)
    assert len(buffer) == 5
    assert drawn_ids(buffer) == [2, 3, 4, 5, 6]
    fill(buffer, 12, start=7)  # more than maxlen in one call: the last 5 stay
    assert drawn_ids(buffer) == [14, 15, 16, 17, 18]


def test_sample_returns_none_when_too_few():
    buffer = PrioritizedBuffer(maxlen=10)
    assert buffer.sample(1) is None
    fill(buffer, 3)
    assert buffer.sample(4) is None and buffer.sample(3) is not None
    with pytest.raises(ValueError, match="batch_size"):
        buffer.sample(0)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_sampling_frequencies_follow_priority_to_the_alpha(backend, alpha):
    buffer = PrioritizedBuffer(maxlen=8, alpha=alpha, seed=0)
    fill(buffer, 4)
    priorities = np.array([0.1, 1.0, 2.0, 4.0])
    buffer.update(priorities, unique_id=np.arange(4))
    expected = priorities**alpha / (priorities**alpha).sum()
    counts = np.zeros(4)
    draws = 0
    for _ in range(6000):
        idx = buffer.sample(3)["index"].numpy()
        counts += np.bincount(idx, minlength=8)[:4]
        draws += idx.size
    freq = counts / draws
    # stratified sampling has at most binomial variance: 5 standard deviations of 18000 draws
    tolerance = 5 * np.sqrt(expected * (1 - expected) / draws) + 1e-3
    np.testing.assert_array_less(np.abs(freq - expected), tolerance)


def test_importance_weights_by_hand(backend):
    buffer = PrioritizedBuffer(maxlen=4, alpha=0.5, beta=0.5, seed=0)
    fill(buffer, 4)
    buffer.update([1.0, 4.0, 16.0, 64.0], unique_id=[0, 1, 2, 3])
    # leaves p^alpha = 1, 2, 4, 8; w_i = (leaf_i / min leaf)^-beta = 1, 2^-0.5, 4^-0.5, 8^-0.5
    expected = {0: 1.0, 1: 2**-0.5, 2: 0.5, 3: 8**-0.5}
    seen = set()
    for _ in range(50):
        batch = buffer.sample(4)
        for i, w in zip(batch["index"].tolist(), batch["weight"].tolist()):
            assert w == pytest.approx(expected[i], rel=1e-6)
            seen.add(i)
    assert seen == {0, 1, 2, 3}


def test_importance_weights_on_random_priorities(backend):
    # against float64 arithmetic: the compiled path computes leaves and weights in float32 pow, which must stay
    # within float32 rounding, never exceed 1, and give the minimum-priority sample exactly 1
    rng = np.random.default_rng(5)
    buffer = PrioritizedBuffer(maxlen=300, alpha=0.6, beta=0.4, seed=1)
    fill(buffer, 300)
    priority = rng.uniform(0.5, 5.0, 300) ** 3  # leaves spread over ~3 decades
    priority[17] = 0.1  # one clear minimum
    buffer.update(priority, unique_id=np.arange(300))
    hit_min = False
    for _ in range(200):
        batch = buffer.sample(64)
        index, weight = batch["index"].numpy(), batch["weight"].numpy()
        expected = (priority[index] / priority[17]) ** (-0.6 * 0.4)
        np.testing.assert_allclose(weight, expected, rtol=2e-6)
        assert (weight <= 1.0).all()
        if (index == 17).any():
            hit_min = True
            assert (weight[index == 17] == 1.0).all()
    assert hit_min


def test_beta_anneals_linearly_to_one():
    buffer = PrioritizedBuffer(maxlen=4, beta=0.4, beta_anneal_steps=10)
    fill(buffer, 4)
    assert buffer.current_beta() == pytest.approx(0.4)
    for _ in range(5):
        buffer.sample(2)
    assert buffer.current_beta() == pytest.approx(0.7)
    for _ in range(10):
        buffer.sample(2)
    assert buffer.current_beta() == 1.0


def test_new_samples_enter_at_the_largest_priority(backend):
    buffer = PrioritizedBuffer(maxlen=8, alpha=1.0, seed=0)
    fill(buffer, 2)
    buffer.update([5.0, 0.5], unique_id=[0, 1])
    fill(buffer, 1, start=2)
    assert buffer.stats()["buffer/priority_max"] == 5.0
    counts = np.bincount(np.concatenate([buffer.sample(3)["index"].numpy() for _ in range(2000)]), minlength=3)
    # priorities 5, 0.5, 5 -> probabilities 10/21, 1/21, 10/21
    assert counts[2] / counts.sum() == pytest.approx(10 / 21, abs=0.02)


def test_update_by_unique_id(backend):
    buffer = PrioritizedBuffer(maxlen=8, alpha=1.0, seed=0)
    fill(buffer, 4)
    batch = buffer.sample(4)
    buffer.update(torch.full((4,), 3.0), unique_id=batch["unique_id"])
    np.testing.assert_array_equal(buffer.priority(batch["unique_id"]), 3.0)
    with pytest.raises(ValueError, match="2 priorities for 4 unique ids"):
        buffer.update([1.0, 2.0], unique_id=batch["unique_id"])
    with pytest.raises(ValueError, match="finite and >= 0, got -1.0 at position 1"):
        buffer.update([1.0, -1.0, 1.0, 1.0], unique_id=batch["unique_id"])
    with pytest.raises(ValueError, match="finite and >= 0, got nan at position 1"):
        buffer.update([1.0, float("nan"), 1.0, 1.0], unique_id=batch["unique_id"])
    with pytest.raises(TypeError, match="unique_id"):  # no "last sampled batch" to fall back on
        buffer.update([1.0, 1.0, 1.0, 1.0])


def test_priority_floor_is_eps(backend):
    buffer = PrioritizedBuffer(maxlen=4, alpha=1.0, eps=0.01)
    fill(buffer, 2)
    buffer.update([0.0, 1.0], unique_id=[0, 1])
    assert buffer.priority([0]).tolist() == [0.01] and buffer.stats()["buffer/priority_min"] == 0.01


def test_update_of_an_overwritten_slot_is_ignored(backend):
    buffer = PrioritizedBuffer(maxlen=4, alpha=1.0, seed=0)
    fill(buffer, 4)
    batch = buffer.sample(4)
    uid = batch["unique_id"].numpy()
    fill(buffer, 2, start=4)  # overwrites slots 0 and 1 (unique ids 0 and 1) with unique ids 4 and 5
    buffer.update(np.full(4, 7.0), unique_id=uid)
    np.testing.assert_array_equal(buffer.priority(uid), np.where(uid < 2, np.nan, 7.0))
    assert buffer.priority([4, 5]).tolist() == [1.0, 1.0]  # stored at the largest priority seen then, not updated
    assert buffer.stats()["buffer/ignored_updates"] == np.count_nonzero(uid < 2) > 0
    counts = np.bincount(np.concatenate([buffer.sample(4)["unique_id"].numpy() for _ in range(500)]), minlength=6)
    expected = buffer.priority(np.arange(2, 6))  # 7 for the two survivors (each drawn once above), 1 for ids 4, 5
    np.testing.assert_allclose(counts[2:] / counts.sum(), expected / expected.sum(), atol=0.03)


def test_update_of_an_evicted_sample_is_ignored(backend):
    buffer = PrioritizedBuffer(maxlen=4, max_use=1, seed=0)
    fill(buffer, 4)
    buffer.sample(4)  # every slot used once: all evicted
    assert len(buffer) == 0
    buffer.update([5.0, 5.0], unique_id=[0, 1])
    assert len(buffer) == 0 and buffer.sample(1) is None and buffer.stats()["buffer/ignored_updates"] == 2
    assert np.isnan(buffer.priority([0, 1])).all()


def test_max_use_evicts_exactly(backend):
    buffer = PrioritizedBuffer(maxlen=10, max_use=3, seed=0)
    fill(buffer, 10)
    uses = np.zeros(10, int)
    for _ in range(3):  # equal priorities + stratified sampling: each sample drawn once per batch of 10
        batch = buffer.sample(10)
        uses += np.bincount(batch["index"].numpy(), minlength=10)
    np.testing.assert_array_equal(uses, 3)
    assert len(buffer) == 0 and buffer.sample(1) is None
    assert buffer.stats()["buffer/evicted_by_use"] == 10


def test_max_use_with_uneven_priorities_never_draws_a_sample_more_than_allowed(backend):
    buffer = PrioritizedBuffer(maxlen=50, max_use=2, seed=0)
    fill(buffer, 50)
    counts = np.zeros(50, int)
    while len(buffer) >= 4:
        batch = buffer.sample(4)
        counts += np.bincount(batch["index"].numpy(), minlength=50)
        buffer.update(np.random.default_rng(0).random(4) + 0.01, unique_id=batch["unique_id"])
    # a slot may be drawn twice in the batch that exhausts it, so at most max_use + batch - 1; usually exactly 2
    assert counts.max() <= 2 + 3 and (counts >= 2).sum() >= 46


def test_max_staleness_evicts_exactly(backend):
    buffer = ReplayBuffer(maxlen=20, max_staleness=2, seed=0)
    for it in range(5):
        fill(buffer, 3, start=3 * it, learner_iter=it)
    # at learner_iter 5, samples stored at iterations 3 and 4 (ids 9..14) are at most 2 iterations old
    assert drawn_ids(buffer, learner_iter=5) == list(range(9, 15))
    assert len(buffer) == 6 and buffer.stats()["buffer/evicted_by_staleness"] == 9
    assert buffer.sample(1, learner_iter=7) is None and len(buffer) == 0
    with pytest.raises(ValueError, match="learner_iter order"):
        fill(buffer, 1, learner_iter=3)


def test_samples_per_insert_limits_sampling():
    buffer = ReplayBuffer(maxlen=100, samples_per_insert=2.0)
    fill(buffer, 10)  # allows 20 sampled transitions
    assert buffer.sample(8) is not None and buffer.sample(8) is not None
    assert buffer.sample(8) is None  # 24 > 20
    fill(buffer, 2)  # 24 allowed now
    assert buffer.sample(8) is not None


def test_sample_timeout_waits_for_the_writer():
    buffer = ReplayBuffer(maxlen=100, samples_per_insert=1.0)
    fill(buffer, 4)
    assert buffer.sample(4) is not None
    timer = threading.Timer(0.05, lambda: fill(buffer, 4, start=4))
    timer.start()
    try:
        assert buffer.sample(4, timeout=5.0) is not None
    finally:
        timer.join()
    assert buffer.sample(4, timeout=0.01) is None


def test_uniform_buffer_ignores_priorities_and_weights_are_one():
    buffer = ReplayBuffer(maxlen=4, seed=0)
    fill(buffer, 4)
    counts = np.zeros(4)
    for _ in range(2000):
        batch = buffer.sample(4)
        counts += np.bincount(batch["index"].numpy(), minlength=4)
        buffer.update(np.array([100.0, 0.0, 0.0, 0.0]), unique_id=batch["unique_id"])
    assert torch.all(batch["weight"] == 1.0)
    np.testing.assert_allclose(counts / counts.sum(), 0.25, atol=0.02)


def test_uniform_buffer_with_holes_samples_only_live_slots():
    buffer = ReplayBuffer(maxlen=8, max_use=1, seed=0)
    fill(buffer, 8)
    first = set(buffer.sample(3)["unique_id"].tolist())
    rest = np.concatenate([buffer.sample(1)["unique_id"].numpy() for _ in range(len(buffer))])
    assert first.isdisjoint(rest.tolist()) and len(buffer) == 0


def test_enable_priority_false_is_uniform():
    buffer = PrioritizedBuffer(maxlen=4, enable_priority=False, seed=0)
    fill(buffer, 4)
    buffer.update([100.0, 1.0, 1.0, 1.0], unique_id=[0, 1, 2, 3])
    idx = np.concatenate([buffer.sample(4)["index"].numpy() for _ in range(1000)])
    np.testing.assert_allclose(np.bincount(idx) / idx.size, 0.25, atol=0.03)


def test_clear_forgets_contents_and_fields():
    buffer = PrioritizedBuffer(maxlen=4)
    fill(buffer, 4)
    old = buffer.sample(2)
    buffer.clear()
    assert len(buffer) == 0 and buffer.sample(1) is None
    buffer.append({"x": np.zeros(5)})  # new fields are fine after clear
    assert buffer.sample(1)["x"].shape == (1, 5)
    assert buffer.sample(1)["unique_id"].item() > old["unique_id"].max().item()  # ids stay unique


def test_stats_figures():
    buffer = PrioritizedBuffer(maxlen=10, seed=0)
    fill(buffer, 4, learner_iter=0)
    fill(buffer, 2, start=4, learner_iter=3)
    batch = buffer.sample(6, learner_iter=3)
    buffer.update(np.arange(1.0, 7.0), unique_id=batch["unique_id"])
    stats = buffer.stats()
    assert stats["buffer/size"] == 6 and stats["buffer/sampled"] == 6
    assert stats["buffer/mean_use"] == 1.0  # six draws over six samples
    assert stats["buffer/mean_staleness"] == pytest.approx((4 * 3 + 2 * 0) / 6)
    assert stats["buffer/priority_mean"] == 3.5 and stats["buffer/priority_max"] == 6.0
    assert stats["buffer/pushes_per_s"] > 0 and stats["buffer/samples_per_s"] > 0
    for key in stats:
        assert key.startswith("buffer/")


def test_one_writer_one_reader_threads(backend):
    buffer = PrioritizedBuffer(maxlen=500, seed=0)
    fill(buffer, 64)
    errors = []

    def write():
        try:
            for i in range(64, 3000, 8):
                fill(buffer, 8, start=i)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        while writer.is_alive():
            batch = buffer.sample(32)
            # every row is consistent: the sample stored with unique id u has reward u
            np.testing.assert_array_equal(batch["reward"].numpy(), batch["unique_id"].numpy().astype(np.float32))
            buffer.update(np.random.default_rng(0).random(32) + 0.1, unique_id=batch["unique_id"])
    finally:
        writer.join()
    assert not errors and len(buffer) == 500
    tree = buffer._tree  # white box: the sums stayed consistent with the leaves under the two threads
    assert tree.total() == pytest.approx(tree.leaves.sum(), rel=1e-9)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(maxlen=0), "maxlen"),
        (dict(alpha=-1), "alpha"),
        (dict(beta=2), "beta"),
        (dict(eps=0), "eps"),
        (dict(max_use=0), "max_use"),
        (dict(samples_per_insert=0), "samples_per_insert"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PrioritizedBuffer(**kwargs)


def test_seeded_draws_repeat_and_both_backends_draw_the_same_batches():
    # the tree draws from its own generator, seeded from the buffer's seed: one seed, the same batches (fields
    # included) on either backend; another seed, other batches
    def draws(seed, backend):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("NERVEX_TREE_BACKEND", backend)
            buffer = PrioritizedBuffer(maxlen=64, seed=seed)
        fill(buffer, 64)
        buffer.update(np.arange(1, 65, dtype=np.float64), unique_id=np.arange(64))
        return [buffer.sample(16) for _ in range(5)]

    backends = ["numpy", "numba"] if numba_available() else ["numpy"]
    first = draws(7, backends[0])
    for batches in (draws(7, backends[0]), draws(7, backends[-1])):
        for x, y in zip(first, batches):
            for key in x:  # the weights go through pow: see test_tree's oracle test
                torch.testing.assert_close(x[key], y[key], rtol=1e-6 if key == "weight" else 0, atol=0)
    assert [b["index"].tolist() for b in draws(8, backends[0])] != [b["index"].tolist() for b in first]
