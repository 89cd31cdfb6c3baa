"""PriorityTree: hand-checked cases and brute-force references on both backends, and the NumPy backend as the
compiled one's oracle (identical trees and draws on random operation sequences)."""

from functools import partial

import numpy as np
import pytest

from nervex.data import numpy_kernels
from nervex.data.tree import PriorityTree, numba_available

needs_numba = pytest.mark.skipif(not numba_available(), reason="numba missing")


def update(tree: PriorityTree, index, priority, eps: float = 1e-6):
    """``tree.update`` of slots that still hold the samples drawn from them (the unique id of slot i is i)."""
    index = np.asarray(index, dtype=np.int64)
    return tree.update(index, np.asarray(priority, dtype=np.float64), np.arange(tree.capacity), 0, eps)


def test_hand_case(backend):
    tree = PriorityTree(4, alpha=1.0)
    assert tree.capacity == 8 and tree.total() == 0.0 and tree.min() == np.inf
    tree.fill(0, 4, 1.0)
    assert update(tree, [1, 2, 3], [2.0, 3.0, 4.0]) == (0, 4.0)
    assert tree.total() == 10.0 and tree.min() == 1.0
    # prefix sums 0 | 1 | 3 | 6 | 10
    values = np.array([0.0, 0.999, 1.0, 2.99, 3.0, 5.999, 6.0, 9.999])
    assert tree.find(values).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    tree.remove(np.array([1]))  # an empty slot is skipped: prefix 0 | 1 | 1 | 4 | 8
    assert tree.find(np.array([0.5, 1.0, 3.9, 4.0])).tolist() == [0, 2, 2, 3]
    tree.remove(np.array([0]))
    assert tree.min() == 3.0 and tree.priorities[:4].tolist() == [np.inf, np.inf, 3.0, 4.0]
    update(tree, [3, 3], [0.5, 5.0])  # a repeated slot keeps its last priority
    assert tree.leaves[:4].tolist() == [0.0, 0.0, 3.0, 5.0] and tree.min() == 3.0


def test_leaves_are_priorities_to_the_alpha_and_weights_by_hand(backend):
    tree = PriorityTree(4, alpha=0.5)
    tree.fill(0, 4, np.array([1.0, 4.0, 16.0, 64.0]))
    assert tree.leaves[:4].tolist() == [1.0, 2.0, 4.0, 8.0] and tree.total() == 15.0
    uid, use = np.arange(10, 14), np.zeros(4, dtype=np.int64)
    index, weight, drawn_uid, block = tree.draw(15, 0.5, uid, use)
    # stratified: slice i of 15 equal slices of the total lands on the leaf that covers it
    assert index.tolist() == [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3]
    expected = {0: 1.0, 1: 2**-0.5, 2: 0.5, 3: 8**-0.5}  # (leaf / min leaf) ** -beta
    np.testing.assert_allclose(weight, [expected[i] for i in index.tolist()], rtol=1e-6)
    assert weight.dtype == np.float32 and drawn_uid.tolist() == (index + 10).tolist() and block is None
    assert use.tolist() == [1, 2, 4, 8]


@pytest.mark.parametrize("capacity", [1, 8, 100, 1000, 5000])
def test_random_operations_match_brute_force(backend, capacity):
    # priorities are multiples of 1/4 and alpha is 1: every sum is exact, so the tree must match the reference exactly
    rng = np.random.default_rng(capacity)
    tree = PriorityTree(capacity, alpha=1.0)
    priority = np.full(tree.capacity, np.inf)
    for step in range(80):
        op = step % 4
        if op == 0:  # batch update, repeats allowed: the last priority of a repeated slot wins
            index = rng.integers(0, capacity, int(rng.integers(1, 40)))
            value = rng.integers(1, 9, index.size) / 4.0
            update(tree, index, value)
            for i, v in zip(index, value):
                priority[i] = v
        elif op == 1:  # emptied slots
            index = np.unique(rng.integers(0, capacity, int(rng.integers(1, 10))))
            tree.remove(index)
            priority[index] = np.inf
        else:  # new samples over a range, one priority or one per slot (inf: empty)
            lo = int(rng.integers(0, capacity))
            hi = int(rng.integers(lo, capacity + 1))
            value = rng.choice([0.25, 1.5, np.inf], hi - lo) if op == 3 else 0.75
            tree.fill(lo, hi, value)
            priority[lo:hi] = value
        leaves = np.where(priority < np.inf, priority, 0.0)
        np.testing.assert_array_equal(tree.leaves, leaves)
        np.testing.assert_array_equal(tree.priorities, priority)
        assert tree.total() == leaves.sum() and tree.min() == priority.min()
        if leaves.sum() > 0:
            prefix = np.cumsum(leaves)
            query = np.concatenate([rng.random(50) * leaves.sum(), prefix[leaves > 0][:-1], [0.0, leaves.sum()]])
            found = tree.find(query)
            expect = np.searchsorted(prefix, np.minimum(query, np.nextafter(leaves.sum(), 0)), side="right")
            np.testing.assert_array_equal(found, expect)
            assert (leaves[found] > 0).all()


@needs_numba
@pytest.mark.parametrize("capacity", [1, 8, 16, 100, 3000, 70_000])
@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_numpy_backend_is_the_compiled_ones_oracle(capacity, alpha):
    # real-valued priorities over six decades: both backends must do the same arithmetic, so every sum, search and
    # draw is identical, not merely close. Only what goes through pow (the leaves for alpha != 1, the weights) may
    # differ in the last bit where NumPy vectorizes pow itself (AVX-512 builds) instead of calling the C library
    same_pow = np.testing.assert_array_equal if alpha == 1.0 else partial(np.testing.assert_allclose, rtol=1e-6)
    rng = np.random.default_rng(capacity)
    trees = [PriorityTree(capacity, alpha, seed=7, backend=b) for b in ("numpy", "numba")]
    slot_uid = np.arange(capacity, dtype=np.int64)
    uses = [np.zeros(capacity, dtype=np.int64) for _ in trees]
    for tree in trees:
        tree.fill(0, capacity, 1.0)
    for step in range(40):
        index = rng.integers(0, capacity, int(rng.integers(1, 80)))
        priority = rng.random(index.size) ** 3 * 1e3
        uid = np.where(rng.random(index.size) < 0.9, index, index + capacity)  # some were overwritten since
        assert len({tree.update(uid, priority, slot_uid, 0, 1e-6) for tree in trees}) == 1
        if step % 5 == 0 and capacity > 3:
            empty = np.unique(rng.integers(0, capacity, 3))
            for tree in trees:
                tree.remove(empty)
        if step % 7 == 0:
            lo = int(rng.integers(0, capacity))
            fresh = rng.random(min(capacity, lo + 9) - lo) + 0.5
            for tree in trees:
                tree.fill(lo, lo + fresh.size, fresh)
        a, b = trees
        same_pow(a.leaves, b.leaves)
        np.testing.assert_array_equal(a.priorities, b.priorities)
        same_pow(a.total(), b.total())
        assert a.min() == b.min()
        query = np.concatenate([rng.random(100) * a.total(), [0.0, a.total()]])
        np.testing.assert_array_equal(a.find(query), b.find(query))
        (ia, wa, ua, _), (ib, wb, ub, _) = (tree.draw(33, 0.4, slot_uid, use) for tree, use in zip(trees, uses))
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_allclose(wa, wb, rtol=1e-6)  # equal here; pow, see above
        np.testing.assert_array_equal(ua, ub)
        np.testing.assert_array_equal(uses[0], uses[1])


@needs_numba
def test_splitmix_uniforms_agree_and_look_uniform():
    from nervex.data import numba_kernels

    state = np.array([12345], dtype=np.uint64)
    u = numpy_kernels.uniforms(state, 200_000)
    compiled_state = np.array([12345], dtype=np.uint64)
    np.testing.assert_array_equal(numba_kernels.uniforms(compiled_state, 200_000), u)
    assert state[0] == compiled_state[0]  # both advance the state alike
    assert 0.0 <= u.min() and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01


def test_values_at_or_above_the_total_are_clipped(backend):
    tree = PriorityTree(8, alpha=1.0)
    tree.fill(2, 3, 1.0)
    tree.fill(5, 6, 1.0)  # trailing slots are empty
    assert tree.find(np.array([2.0, 5.0, 1.9999])).tolist() == [5, 5, 5]


def test_drift_is_removed_by_periodic_rebuild(backend):
    rng = np.random.default_rng(0)
    tree = PriorityTree(64, alpha=1.0)
    for _ in range(200):  # more than `capacity` slot updates: at least one exact rebuild
        update(tree, rng.integers(0, 64, 8), rng.random(8) * 1e6)
    assert tree.total() == pytest.approx(tree.leaves.sum(), rel=1e-12)


def drifted_tree() -> PriorityTree:
    """Slots 200-207 at priority 1; the sums over slots 0-7 and over 104-111 (in other top-level nodes) hold rounding
    drift: 16 for one slot of 13, and 3 for nothing (1e17 + 13 rounds to 1e17 + 16; removing 1e17 leaves 16, then
    removing the 13 leaves 3)."""
    tree = PriorityTree(512, alpha=1.0)
    tree.fill(200, 208, 1.0)
    update(tree, [2, 105], [1e17, 1e17])
    update(tree, [1, 104], [13.0, 13.0])
    tree.remove(np.array([2, 105]))
    tree.remove(np.array([104]))
    return tree


def test_a_search_in_drifted_sums_never_steps_past_the_last_nonempty_slot(backend):
    tree = drifted_tree()
    assert tree.total() == 16 + 3 + 8  # the sums, as the search sees them
    # running sums 13..16 lie in the first group's drift: the slot of 13 (the slots after it are empty)
    assert tree.find(np.array([0.0, 12.9, 13.0, 15.9])).tolist() == [1, 1, 1, 1]
    assert tree.find(np.array([19.0, 26.9])).tolist() == [200, 207]


def test_draws_that_reach_an_empty_slot_are_redrawn(backend):
    tree = drifted_tree()  # 3 / 27 of the total points into the group of slots 104-111, all empty
    uid, use = np.arange(512), np.zeros(512, dtype=np.int64)
    for _ in range(20):
        index, weight, drawn_uid, block = tree.draw(16, 0.4, uid, use)
        assert (tree.leaves[index] > 0).all() and np.isfinite(weight).all()
        assert drawn_uid.tolist() == index.tolist() and block is None
    assert use.sum() == 20 * 16 and use[tree.leaves == 0].sum() == 0


def test_bad_arguments_raise_naming_the_value(backend):
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        PriorityTree(0)
    with pytest.raises(ValueError, match="backend must be 'numpy' or 'numba', got 'cuda'"):
        PriorityTree(4, backend="cuda")
    tree = PriorityTree(4)
    with pytest.raises(ValueError, match=r"fill range \[2, 9\) is outside the tree's slots \[0, 8\)"):
        tree.fill(2, 9, 1.0)
    with pytest.raises(ValueError, match="total is 0.0"):
        tree.find(np.array([0.0]))
    with pytest.raises(RuntimeError, match="every slot is empty"):
        tree.draw(1, 0.4, np.arange(4), np.zeros(4, dtype=np.int64))
    tree.fill(0, 4, 1.0)
    with pytest.raises(ValueError, match="got -1.0 at position 1"):
        update(tree, [0, 1], [1.0, -1.0])
    with pytest.raises(ValueError, match="got nan at position 0"):
        update(tree, [0], [np.nan])
