"""The NumPy backend of ``tree.PriorityTree``: ``numba_kernels``' functions, vectorized per tree level.

Same names, same signatures (the ``touch`` value the compiled kernels return to keep their prefetching loads alive is
0 here), and the same floating-point operations in the same order: the running sums of eight siblings use the compiled
scan's add tree, a repeated leaf in one update adds each of its changes in turn, leaves and weights use float32
``pow``. So both backends give identical trees and draws, which is what makes this module the tests' oracle for the
compiled one as well as the fallback where numba is missing (at about a tenth of its speed). The one exception:
NumPy builds that vectorize ``pow`` themselves (AVX-512) may round it differently in the last bit than the C library
that numba calls.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

A = 8  # children per node (numba_kernels.A)
_TOP_SEARCH = 256  # levels of at most this many nodes are searched as one prefix (numba_kernels.find)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _step8(children: np.ndarray, r: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per row of ``children (n, 8)``, the child holding the running sum ``r`` and ``r`` minus what precedes it."""
    n = r.size
    c0, c1, c2, c3, c4, c5, c6, c7 = children.T  # column by column: NumPy is slow along short rows
    sums = np.empty((A - 1, n))  # c0, s1 .. s6, added as numba_kernels._step8 adds them
    sums[0] = c0
    s1 = np.add(c0, c1, out=sums[1])
    np.add(s1, c2, out=sums[2])
    s3 = np.add(s1, c2 + c3, out=sums[3])
    np.add(s3, c4, out=sums[4])
    s5 = np.add(s3, c4 + c5, out=sums[5])
    np.add(s5, c6, out=sums[6])
    c = (sums <= r).sum(axis=0)
    before = np.where(c > 0, sums[c - 1, np.arange(n)], 0.0)  # the sums are nondecreasing: the largest one <= r
    stuck = np.flatnonzero((c == A - 1) & ~(c7 > 0.0))
    if stuck.size:  # rounding: stay on the last non-empty child, and sum what precedes it one by one
        nonempty = children[stuck, 1 : A - 1] > 0.0
        c[stuck] = np.where(nonempty.any(axis=1), A - 2 - np.argmax(nonempty[:, ::-1], axis=1), 0)
        running = np.cumsum(children[stuck], axis=1)
        before[stuck] = np.where(c[stuck] > 0, running[np.arange(stuck.size), c[stuck] - 1], 0.0)
    return c, r - before


def find(flat, offsets, sizes, depth, values, out):
    n = values.size
    top = depth
    while top > 0 and sizes[top - 1] <= _TOP_SEARCH:
        top -= 1
    if top < depth:
        level = flat[offsets[top] : offsets[top] + sizes[top]]
        prefix = np.zeros(level.size)
        np.cumsum(level[:-1], out=prefix[1:])
        nonempty = np.flatnonzero(level > 0.0)
        idx = np.minimum(np.searchsorted(prefix, values, side="right") - 1, nonempty[-1] if nonempty.size else 0)
        residual = values - prefix[idx]
    else:
        idx, residual = np.zeros(n, dtype=np.int64), values.copy()
    for k in range(top - 1 if top < depth else depth, -1, -1):
        last = sizes[k] - 1 if k == depth else A - 1
        # every stored level is whole groups of siblings (the top one padded): the level's groups come first here
        c, residual = _step8(flat[offsets[k] :].reshape(-1, A)[idx], residual)
        idx = idx * A + np.minimum(c, last)
    out[:] = idx
    return 0.0


def update(sflat, mflat, offsets, depth, index, svalues, mvalues):
    n = index.size
    if n == 0:
        return 0.0
    # each occurrence adds its change to the ancestors; a repeated leaf's change is from its previous occurrence
    order = np.argsort(index, kind="stable")
    leaf, value = index[order], svalues[order]
    repeat = leaf[1:] == leaf[:-1]
    previous = sflat[offsets[0] + leaf]
    previous[1:][repeat] = value[:-1][repeat]
    delta = np.empty(n)
    delta[order] = value - previous
    last = np.append(~repeat, True)  # the last occurrence of each leaf is the value it keeps
    sflat[offsets[0] + leaf[last]] = value[last]
    mflat[offsets[0] + leaf[last]] = mvalues[order][last]
    if depth:
        levels = np.arange(1, depth + 1)[:, None]
        ancestors = offsets[1:, None] + index // A**levels  # added in index order at each node, as the kernel does
        np.add.at(sflat, ancestors.ravel(), np.broadcast_to(delta, ancestors.shape).ravel())
    node = leaf[last]
    for k in range(1, depth + 1):  # minima are exact: recompute every ancestor from its children
        node = node // A
        mflat[offsets[k] + node] = mflat[offsets[k - 1] :].reshape(-1, A)[node].min(axis=1)
    return 0.0


def uniforms(state, n):
    z = state[0] + _GOLDEN * np.arange(1, n + 1, dtype=np.uint64)  # splitmix64's states, wrapping as in C
    if n:
        state[0] = z[-1]
    z = (z ^ (z >> 30)) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> 27)) * np.uint64(0x94D049BB133111EB)
    z ^= z >> 31
    return (z >> 11).astype(np.float64) * (1.0 / 9007199254740992.0)


def leaf_values(priority, alpha):
    if alpha == 1.0:
        return priority.astype(np.float64)
    out = priority**alpha
    mid = (priority > 1e-30) & (priority < 1e30)
    out[mid] = priority[mid].astype(np.float32) ** np.float32(alpha)
    return out


def draw(
    sflat, mflat, offsets, sizes, depth, rng, alpha, beta, uid_store, use, index, weight, uid, src, record, table, block
):
    top = sflat[offsets[depth] : offsets[depth] + sizes[depth]]
    total = np.cumsum(top)[-1]
    if not total > 0.0:
        return -1, total
    n = index.size
    values = np.minimum((np.arange(n) + uniforms(rng, n)) * (total / n), np.nextafter(total, 0.0))
    find(sflat, offsets, sizes, depth, values, index)
    minimum = mflat[offsets[depth] : offsets[depth] + sizes[depth]].min()
    scale = 1.0 / leaf_values(np.array([minimum]), alpha)[0]
    beyond = index >= uid_store.size  # cannot happen with consistent sums (numba_kernels.draw)
    index[beyond] = uid_store.size - 1
    leaf = sflat[offsets[0] + index]
    empty = int(np.count_nonzero(beyond)) + int(np.count_nonzero(leaf <= 0.0))
    with np.errstate(divide="ignore"):  # an empty slot's weight (inf) is replaced when the tree redraws it
        weight[:] = (leaf * scale).astype(np.float32) ** np.float32(-beta)
    uid[:] = uid_store[index]
    np.add.at(use, index, 1)
    if table.shape[0]:  # the drawn records, then each packed field's bytes to its place in the block
        records = src[: src.size // record * record].reshape(-1, record)[index]
        for width, _, count, offset in table.tolist():
            size = width * count
            block[n * offset : n * (offset + size)].reshape(n, size)[...] = records[:, offset : offset + size]
    return empty, 0.0


def update_priorities(uid, p, first_uid, uid_store, eps, alpha, sflat, mflat, offsets, depth):
    invalid = ~((p >= 0.0) & (p < np.inf))
    if invalid.any():
        return -1, int(np.argmax(invalid)), 0.0
    index = (uid - first_uid) % uid_store.size
    keep = uid_store[index] == uid  # the others were overwritten or evicted since they were drawn
    q = np.maximum(p[keep], eps)
    update(sflat, mflat, offsets, depth, index[keep], leaf_values(q, alpha), q)
    return 0, p.size - q.size, float(q.max()) if q.size else 0.0
