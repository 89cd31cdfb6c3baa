"""KaryTree against a brute-force reference (plain arrays) on random operations, on both backends.

Priorities are small multiples of 1/4, so every sum is exact and both backends must agree with the reference exactly.
"""

import numpy as np
import pytest

from nervex.data.kary_tree import KaryTree


def _reference_find(leaves: np.ndarray, value: np.ndarray) -> np.ndarray:
    # leaf i with prefix[i] <= v < prefix[i + 1]
    return np.searchsorted(np.cumsum(leaves), value, side="right")


@pytest.mark.parametrize("capacity, arity", [(1, 8), (8, 8), (100, 8), (1000, 8), (5000, 16), (300, 2)])
def test_random_operations_match_brute_force(backend, capacity, arity):
    if backend == "numba" and arity != 8:
        pytest.skip("the compiled backend exists for arity 8 only (see test_compiled_backend_is_for_arity_8)")
    rng = np.random.default_rng(capacity * arity)
    tree = KaryTree(capacity, arity=arity, backend=backend)
    sums = np.zeros(tree.capacity)
    mins = np.full(tree.capacity, np.inf)
    for step in range(60):
        n = int(rng.integers(1, 40))
        index = rng.integers(0, capacity, n)
        value = rng.integers(0, 9, n) / 4.0  # zeros included: empty leaves must never be found
        if step % 7 == 3:
            value[:] = 0.0
        tree.update(index, value, np.where(value > 0, value, np.inf))
        for i, v in zip(index, value):  # last occurrence wins
            sums[i], mins[i] = v, (v if v > 0 else np.inf)
        assert tree.total() == sums.sum()
        assert tree.min() == mins.min()
        np.testing.assert_array_equal(tree.leaves, sums)
        if sums.sum() > 0:
            query = rng.random(50) * sums.sum()
            query = np.concatenate([query, np.cumsum(sums)[sums > 0][:-1], [0.0, sums.sum()]])  # boundaries
            expect = np.minimum(_reference_find(sums, np.minimum(query, np.nextafter(sums.sum(), 0))), capacity - 1)
            found = tree.find(query)
            np.testing.assert_array_equal(found, expect)
            assert (tree.leaves[found] > 0).all()


def test_refresh_after_direct_writes(backend):
    tree = KaryTree(1000, backend=backend)
    tree.leaves[37:812] = np.arange(37, 812) / 8.0
    tree.min_leaves[37:812] = np.arange(37, 812) / 8.0
    tree.refresh(37, 812)
    assert tree.total() == (np.arange(37, 812) / 8.0).sum()
    assert tree.min() == 37 / 8.0
    tree.update(np.array([40]), np.array([0.0]), np.array([0.5]))
    assert tree.min() == 0.5
    assert tree.find(np.array([0.0])).tolist() == [37]


def test_stratified_sample_hits_each_slice(backend):
    tree = KaryTree(64, backend=backend)
    tree.update(np.arange(4), np.array([1.0, 1.0, 1.0, 1.0]), np.ones(4))
    index, empty = tree.sample(np.full(4, 0.5))
    assert index.tolist() == [0, 1, 2, 3] and empty == 0


def test_invalid_arguments():
    with pytest.raises(ValueError, match="arity"):
        KaryTree(10, arity=6, backend="numpy")
    with pytest.raises(ValueError, match="capacity"):
        KaryTree(0, backend="numpy")
    with pytest.raises(ValueError, match="outside"):
        KaryTree(8, backend="numpy").refresh(0, 9)
    with pytest.raises(ValueError, match="total"):
        KaryTree(8, backend="numpy").find(np.array([0.0]))


@pytest.mark.parametrize("arity", [8, 16])
def test_real_valued_priorities_stay_in_range_and_exact_min(backend, arity):
    if backend == "numba" and arity != 8:
        pytest.skip("the compiled backend exists for arity 8 only (see test_compiled_backend_is_for_arity_8)")
    # rounding in the running sums must never step past the last stored leaf, and the minimum stays exact
    rng = np.random.default_rng(arity)
    tree = KaryTree(3000, arity=arity, backend=backend)
    priority = np.full(tree.capacity, np.inf)
    for _ in range(40):
        index = rng.integers(0, 3000, 64)
        value = rng.random(64) ** 3 + 1e-6
        tree.update(index, value**0.6, value)
        priority[index] = value  # rng indices may repeat; the last value wins in both
        assert tree.min() == priority.min()
        query = np.concatenate([rng.random(256) * tree.total(), [tree.total(), np.nextafter(tree.total(), 0.0)]])
        found = tree.find(query)
        assert found.min() >= 0 and found.max() < 3000
        assert (tree.leaves[found] > 0).all()
    np.testing.assert_allclose(tree.total(), tree.leaves.sum(), rtol=1e-12)


def test_compiled_backend_is_for_arity_8():
    pytest.importorskip("numba")
    with pytest.raises(ValueError, match="arity 8"):
        KaryTree(100, arity=16, backend="numba")
    assert KaryTree(100, arity=16).backend == "numpy"  # the default backend picks what exists
