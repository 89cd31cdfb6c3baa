"""The compiled backend of ``tree.PriorityTree``: numba kernels over its flat 8-ary sum and min arrays.

``numpy_kernels`` holds the same functions with the same signatures and the same floating-point operations in the
same order, vectorized per level; it is the fallback without numba and the oracle the tests compare these against.
Imported only through ``tree.tree_backend``. Every kernel is a module-level function with ``cache=True``: numba
compiles each once per installation and stores the machine code next to this file (or in ``NUMBA_CACHE_DIR``), so a
new process loads them in milliseconds instead of compiling for ~1 s. (Kernels built inside a factory would be closures
over each other, whose cache keys change in every process: a cache that never hits and grows.)

The kernels are written for memory, not arithmetic: on a 1M-leaf tree a batch costs mostly cache misses, so searches
go level by level across the batch (independent loads overlap), comparisons are branch-free (the direction is a coin
flip), and ``draw`` touches the min-tree lines that the following priority update will write.
"""

import numba
import numpy as np

_jit = numba.njit(nogil=True, cache=True)

# children per node: 8 float64 fill one 64-byte cache line. A module constant (not an argument) so the scans over
# siblings are unrolled.
A = 8


# ---- search and update ---------------------------------------------------------------------------------------
@numba.njit(nogil=True, inline="always", cache=True)
def _step8(flat, first, r):  # pragma: no cover - compiled
    # which of the 8 siblings at flat[first:first + 8] holds the running sum r, and r minus what precedes it.
    # Branch-free (the child taken is random): the running sums with a log-depth add tree, one comparison each, and
    # the child is how many of them are <= r (they are a prefix, values being >= 0); what precedes it is the largest
    # running sum <= r. This is ~25 instructions, a third fewer than an explicit select of the child's prefix, and
    # the arithmetic, not memory, is most of a descent (the tree fits in L3).
    c0, c1, c2, c3 = flat[first], flat[first + 1], flat[first + 2], flat[first + 3]
    c4, c5, c6, c7 = flat[first + 4], flat[first + 5], flat[first + 6], flat[first + 7]
    s1 = c0 + c1
    s3 = s1 + (c2 + c3)
    s2 = s1 + c2
    s4 = s3 + c4
    s5 = s3 + (c4 + c5)
    s6 = s5 + c6
    m0, m1, m2, m3 = c0 <= r, s1 <= r, s2 <= r, s3 <= r
    m4, m5, m6 = s4 <= r, s5 <= r, s6 <= r
    c = (m0 + m1) + (m2 + m3) + ((m4 + m5) + m6)
    b0, b1, b2, b3 = c0 if m0 else 0.0, s1 if m1 else 0.0, s2 if m2 else 0.0, s3 if m3 else 0.0
    b4, b5, b6 = s4 if m4 else 0.0, s5 if m5 else 0.0, s6 if m6 else 0.0
    before = max(max(max(b0, b1), max(b2, b3)), max(max(b4, b5), b6))
    if c == 7 and not c7 > 0.0:
        # rounding left r at or above the sum of the non-empty children (or the top level's zero padding follows):
        # stay on the last non-empty child, never step onto the empty ones after it (they may lie past the leaves)
        c = 0
        for t in range(1, 7):
            if flat[first + t] > 0.0:
                c = t
        before = 0.0
        for t in range(c):
            before += flat[first + t]
    return c, r - before


@_jit
def find(flat, offsets, sizes, depth, values, out):  # pragma: no cover - compiled
    n = values.size
    residual = values.copy()
    # the small top levels (all of them with at most 256 nodes): one branch-free binary search per sample in the
    # running sums of the lowest such level, instead of a step per level (8 cheap steps replace 2 or 3 scans of 8)
    top = depth
    while top > 0 and sizes[top - 1] <= 256:
        top -= 1
    touch = 0.0
    if top < depth:
        size = sizes[top]
        base = offsets[top]
        prefix = np.empty(size)
        running = 0.0
        last = 0
        for t in range(size):
            prefix[t] = running
            running += flat[base + t]
            if flat[base + t] > 0.0:
                last = t
        for i in range(n):
            v = residual[i]
            j = 0
            width = size
            while width > 1:
                half = width >> 1
                j += half * (prefix[j + half] <= v)
                width -= half
            # rounding can leave v at or above the running sum of the non-empty nodes: stay on the last of them
            j = min(j, last)
            residual[i] = v - prefix[j]
            out[i] = j
    else:
        for i in range(n):
            out[i] = 0
    # then level by level across the batch, so the cache misses of independent samples overlap; a top level that is
    # searched this way is padded with zeros to A slots, so it is scanned like any group of siblings (of node 0)
    for k in range(top - 1 if top < depth else depth, -1, -1):
        base = offsets[k]
        # rounding can put the running sum of the top level a hair below the clipped value: never step into
        # its zero padding (that would index past the leaves)
        last = sizes[k] - 1 if k == depth else A - 1
        # first a light pass that only loads each sample's sibling line: with few instructions per sample, many
        # more misses are in flight at once than in the scan below, which then finds its lines in L1
        for i in range(n):
            touch += flat[base + out[i] * A]
        for i in range(n):
            c, r = _step8(flat, base + out[i] * A, residual[i])
            residual[i] = r
            out[i] = out[i] * A + min(c, last)
    return touch


@_jit
def update(sflat, mflat, offsets, depth, index, svalues, mvalues):  # pragma: no cover - compiled
    # load the lines the walk below needs first (leaves and level 1 of both trees miss the cache): their misses
    # then overlap instead of stalling one sample at a time
    touch = 0.0
    if depth >= 1:
        for i in range(index.size):
            j = index[i]
            touch += sflat[offsets[0] + j] + mflat[offsets[0] + j] + sflat[offsets[1] + j // A]
            touch += mflat[offsets[1] + j // A]
    # sequential, so a repeated index ends with its last value
    for i in range(index.size):
        j = index[i]
        delta = svalues[i] - sflat[offsets[0] + j]
        sflat[offsets[0] + j] = svalues[i]
        # sums: add the change to each ancestor (one line per level; drift is removed by the periodic rebuild)
        a = j
        for k in range(1, depth + 1):
            a //= A
            sflat[offsets[k] + a] += delta
        old = mflat[offsets[0] + j]
        new = mvalues[i]
        mflat[offsets[0] + j] = new
        # minima: exact; walk up only while an ancestor can change (new below it, or old was its minimum)
        for k in range(1, depth + 1):
            j //= A
            parent = offsets[k] + j
            current = mflat[parent]
            if new < current:
                m = new
            elif old == current and new > old:
                first = offsets[k - 1] + j * A
                m = mflat[first]
                for t in range(1, A):
                    m = min(m, mflat[first + t])
            else:
                break
            if m == current:
                break
            mflat[parent] = m
            old, new = current, m
    return touch


@numba.njit(nogil=True, inline="always", cache=True)
def uniform(state):  # pragma: no cover - compiled
    # a float64 in [0, 1) from splitmix64 (state: a uint64 array of one element, advanced in place): statistically
    # sound for sampling, and ~1 ns where a NumPy Generator call costs ~1 us per batch
    z = state[0] + np.uint64(0x9E3779B97F4A7C15)
    state[0] = z
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@numba.njit(nogil=True, cache=True)
def uniforms(state, n):  # pragma: no cover - compiled
    """``n`` numbers of ``uniform``."""
    out = np.empty(n)
    for i in range(n):
        out[i] = uniform(state)
    return out


@numba.njit(nogil=True, cache=True)
def leaf_value(priority, alpha):  # pragma: no cover - compiled
    # the sum tree's leaf for a priority: priority ** alpha, in float32 (half the cost of a float64 pow, and the
    # priorities are float32 TD errors anyway) unless that would overflow or underflow. The buffer computes the leaf
    # of new samples and the importance weights' normalizer with this same function, so the sample with the minimum
    # priority gets a weight of exactly 1.
    if alpha == 1.0:
        return priority
    if 1e-30 < priority < 1e30:
        return np.float64(np.float32(priority) ** np.float32(alpha))
    return priority**alpha


@numba.njit(nogil=True, cache=True)
def leaf_values(priority, alpha):  # pragma: no cover - compiled
    """``leaf_value`` of each priority."""
    out = np.empty(priority.size)
    for i in range(priority.size):
        out[i] = leaf_value(priority[i], alpha)
    return out


@_jit
def draw(
    sflat, mflat, offsets, sizes, depth, rng, alpha, beta, uid_store, use, index, weight, uid, src, record, table, block
):  # pragma: no cover - compiled
    # the buffer's whole draw: stratified values (one in each of n equal slices of the total, uniform numbers from the
    # buffer's splitmix64 state rng), search, importance weights normalized by the minimum priority, unique ids, use
    # counts, and the copy of the samples' packed columns into one field-major block (packing.PackedPlan: src,
    # record, table; block: n * record bytes, rounded to words)
    top = offsets[depth]
    total = 0.0
    m = np.inf
    for t in range(sizes[depth]):
        total += sflat[top + t]  # the running sum total() computes
        m = min(m, mflat[top + t])
    if not total > 0.0:
        return -1, total
    n = index.size
    below_total = np.nextafter(total, 0.0)
    values = np.empty(n)
    width = total / n
    for i in range(n):
        values[i] = min((i + uniform(rng)) * width, below_total)
    touch = find(sflat, offsets, sizes, depth, values, index)
    scale = 1.0 / leaf_value(m, alpha)  # the min leaf, computed as the update computed it
    # float32 pow (the weights are float32) costs half a float64 pow; the sample with the minimum priority still
    # gets exactly 1 (leaf * scale is within an ulp of 1 in float64, so exactly 1 in float32)
    minus_beta = np.float32(-beta)
    empty = 0
    base = offsets[0]
    # a light pass that only loads the lines the loop below reads (ids, use counts, min leaves, records): with few
    # instructions per sample, many more of their cache misses are in flight at once
    limit = uid_store.size - 1
    for i in range(n):
        j = min(index[i], limit)
        touch += uid_store[j] + use[j] + mflat[base + j]
        if table.shape[0] > 0:
            touch += src[j * record]
    for i in range(n):
        j = index[i]
        if j >= uid_store.size:  # cannot happen with consistent sums; guards the writes below all the same
            j = uid_store.size - 1
            index[i] = j
            empty += 1
        leaf = sflat[base + j]
        empty += leaf <= 0.0
        weight[i] = np.float32(leaf * scale) ** minus_beta
        uid[i] = uid_store[j]
        use[j] += 1
        touch += mflat[base + j]  # the priority update writes this line next
    if table.shape[0] > 0:
        _copy_fields(src, record, table, index, block)
    return empty, touch


@numba.njit(nogil=True, inline="always", cache=True)
def _copy_fields(src, record, table, index, block):  # pragma: no cover - compiled
    # field by field (the records are in L1 after the draw's first pass), each in words of the widest size that
    # divides its offset, its size and the record: field f of sample i goes to block[n * offset_f + i * size_f]
    n = index.size
    for f in range(table.shape[0]):
        width, first, count, offset = table[f, 0], table[f, 1], table[f, 2], table[f, 3]
        if width == 8:
            _copy_words(src.view(np.uint64), block.view(np.uint64), record // 8, first, count, n * offset // 8, index)
        elif width == 4:
            _copy_words(src.view(np.uint32), block.view(np.uint32), record // 4, first, count, n * offset // 4, index)
        elif width == 2:
            _copy_words(src.view(np.uint16), block.view(np.uint16), record // 2, first, count, n * offset // 2, index)
        else:
            _copy_words(src, block, record, first, count, n * offset, index)


@numba.njit(nogil=True, inline="always", cache=True)
def _copy_words(src, dst, stride, first, count, out, index):  # pragma: no cover - compiled
    # rows of 1 and 2 words (scalars, small vectors) get loops of their own: a loop over a run-time count costs more
    # per row than the copy itself
    n = index.size
    if count == 1:
        for i in range(n):
            dst[out + i] = src[index[i] * stride + first]
    elif count == 2:
        for i in range(n):
            s = index[i] * stride + first
            dst[out + 2 * i] = src[s]
            dst[out + 2 * i + 1] = src[s + 1]
    else:
        for i in range(n):
            s = index[i] * stride + first
            d = out + i * count
            for e in range(count):
                dst[d + e] = src[s + e]


@_jit
def update_priorities(uid, p, first_uid, uid_store, eps, alpha, sflat, mflat, offsets, depth):
    # pragma: no cover - compiled
    # the sample with unique id u lives in slot (u - first_uid) % slots while it is stored (the buffer's ring)
    for i in range(p.size):
        if not (p[i] >= 0.0 and p[i] < np.inf):
            return -1, i, 0.0
    keep = np.empty(p.size, dtype=np.int64)
    leaf = np.empty(p.size)
    raw = np.empty(p.size)
    kept = 0
    p_max = 0.0
    for i in range(p.size):
        j = (uid[i] - first_uid) % uid_store.size
        if uid_store[j] != uid[i]:
            continue  # overwritten or evicted since it was drawn
        q = max(p[i], eps)
        p_max = max(p_max, q)
        keep[kept] = j
        leaf[kept] = leaf_value(q, alpha)
        raw[kept] = q  # the min tree holds raw priorities
        kept += 1
    update(sflat, mflat, offsets, depth, keep[:kept], leaf[:kept], raw[:kept])
    return 0, p.size - kept, p_max
