"""SumTree / MinTree against brute-force references on seeded random operations, plus hand-checked cases."""

import numpy as np
import pytest

from nervex.data.tree import MinTree, SumTree, next_power_of_two


def check_find(tree: SumTree, leaves: np.ndarray, values: np.ndarray) -> None:
    """Each found leaf i must satisfy prefix[i] <= v < prefix[i + 1] (up to rounding) and hold a positive value."""
    prefix = np.concatenate(([0.0], np.cumsum(leaves)))
    found = tree.find(values)
    tol = 1e-9 * prefix[-1]
    for v, i in zip(values, found):
        assert leaves[i] > 0, f"value {v} landed on empty leaf {i}"
        assert prefix[i] - tol <= v < prefix[i + 1] + tol, f"value {v} -> leaf {i}, prefix {prefix[i]}..{prefix[i + 1]}"


def test_next_power_of_two():
    assert [next_power_of_two(n) for n in (0, 1, 2, 3, 5, 8, 100_000)] == [1, 1, 2, 4, 8, 8, 131072]


def test_sum_tree_hand_case(backend):
    tree = SumTree(4, backend=backend)
    tree.update([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0])
    assert tree.total() == 10.0
    # prefix sums 0 | 1 | 3 | 6 | 10
    values = np.array([0.0, 0.999, 1.0, 2.99, 3.0, 5.999, 6.0, 9.999])
    assert tree.find(values).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    tree.update([1], [0.0])  # an empty leaf is skipped: prefix 0 | 1 | 1 | 4 | 8
    assert tree.find(np.array([0.5, 1.0, 3.9, 4.0])).tolist() == [0, 2, 2, 3]


@pytest.mark.parametrize("capacity,top_size", [(1, 1), (5, 2), (64, 4), (1000, 8), (3000, 512)])
def test_sum_tree_matches_brute_force(backend, capacity, top_size):
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity, top_size=top_size, backend=backend)
    leaves = np.zeros(tree.capacity)
    for step in range(300):
        op = rng.integers(4)
        if op == 0:  # batch update, duplicates allowed: the last value of a repeated index wins
            index = rng.integers(0, capacity, rng.integers(1, 40))
            value = rng.random(index.size) * rng.choice([1e-3, 1.0, 1e3])
            value[rng.random(index.size) < 0.2] = 0.0
            tree.update(index, value)
            for i, v in zip(index, value):
                leaves[i] = v
        elif op == 1:  # direct writes to a range, then refresh
            lo = int(rng.integers(0, capacity))
            hi = int(rng.integers(lo, capacity + 1))
            tree.leaves[lo:hi] = leaves[lo:hi] = rng.random(hi - lo)
            tree.refresh(lo, hi)
        elif op == 2 and leaves.sum() > 0:
            values = rng.random(50) * tree.total()
            check_find(tree, leaves, values)
        assert tree.total() == pytest.approx(leaves.sum(), rel=1e-9, abs=1e-12), f"step {step}"
    tree.rebuild()
    for k in range(1, tree.depth + 1):  # after a rebuild every node is exactly the sum of its children
        child = tree.levels[k - 1]
        np.testing.assert_array_equal(tree.levels[k], child[0::2] + child[1::2])


def test_sum_tree_find_values_at_or_above_total_are_clipped(backend):
    tree = SumTree(8, top_size=2, backend=backend)
    tree.update([2, 5], [1.0, 1.0])  # trailing leaves are empty
    assert tree.find(np.array([2.0, 5.0, 1.9999])).tolist() == [5, 5, 5]


def test_sum_tree_empty_search_raises(backend):
    with pytest.raises(ValueError, match="total is 0"):
        SumTree(8, backend=backend).find(np.array([0.0]))


def test_sum_tree_drift_is_removed_by_periodic_rebuild(backend):
    rng = np.random.default_rng(0)
    tree = SumTree(64, top_size=2, backend=backend)
    for _ in range(200):  # more than `capacity` leaf updates: at least one automatic rebuild
        tree.update(rng.integers(0, 64, 8), rng.random(8) * 1e6)
    assert tree.total() == pytest.approx(tree.leaves.sum(), rel=1e-12)


def test_deduplicate_keeps_one_of_each():
    tree = SumTree(16)
    index, value = tree.deduplicate(np.array([3, 1, 3, 7, 1]), np.array([0.1, 0.2, 0.3, 0.4, 0.5]))
    assert sorted(index.tolist()) == [1, 3, 7]
    assert dict(zip(index.tolist(), value.tolist())) == {1: 0.5, 3: 0.3, 7: 0.4}


@pytest.mark.parametrize("capacity,top_size", [(1, 1), (7, 2), (256, 4), (2000, 16)])
def test_min_tree_matches_brute_force(backend, capacity, top_size):
    rng = np.random.default_rng(capacity)
    tree = MinTree(capacity, top_size=top_size, backend=backend)
    leaves = np.full(tree.capacity, np.inf)
    pool = np.array([0.5, 1.0, 2.0, 3.0, np.inf])  # a small pool: ties at the minimum are common
    for step in range(400):
        op = rng.integers(3)
        if op == 0:
            index = rng.integers(0, capacity, rng.integers(1, 20))
            value = rng.choice(pool, index.size) if rng.random() < 0.5 else rng.random(index.size) + 0.1
            tree.update(index, value)
            for i, v in zip(index, value):
                leaves[i] = v
        elif op == 1:
            lo = int(rng.integers(0, capacity))
            hi = int(rng.integers(lo, capacity + 1))
            old_min = leaves[lo:hi].min() if hi > lo else np.inf
            tree.leaves[lo:hi] = leaves[lo:hi] = rng.choice(pool, hi - lo)
            tree.refresh(lo, hi, old_min)
        else:
            lo = int(rng.integers(0, capacity))
            hi = int(rng.integers(lo, capacity + 1))
            value = rng.random() + 0.1
            tree.update_range(lo, hi, value)
            leaves[lo:hi] = value
        assert tree.min() == leaves.min(), f"step {step}"


def test_min_tree_hand_case(backend):
    tree = MinTree(4, backend=backend)
    assert tree.min() == np.inf
    tree.update([0, 1, 2], [3.0, 1.0, 2.0])
    assert tree.min() == 1.0
    tree.update([1], [np.inf])  # emptying the minimum: the next one shows
    assert tree.min() == 2.0
    tree.update([3, 3], [0.5, 4.0])  # repeated index: one value is kept
    assert tree.min() in (0.5, 2.0) and tree.min() == tree.leaves.min()


def test_trees_reject_bad_arguments():
    with pytest.raises(ValueError, match="capacity"):
        SumTree(0)
    with pytest.raises(ValueError, match="one value per index"):
        SumTree(4).update([0, 1], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="backend"):
        SumTree(4, backend="cuda")
    with pytest.raises(ValueError, match="outside"):
        SumTree(4).refresh(0, 5)
