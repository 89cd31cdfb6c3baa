"""ColumnStorage: the packed block of small columns (layout, gathers equal to per-column indexing), compressed
columns, and the pool of large batch arrays."""

import gc

import numpy as np
import torch

from nervex.data.packing import PACK_ROW_BYTES
from nervex.data.pool import ArrayPool
from nervex.data.storage import ColumnStorage


def make_sample(rng: np.random.Generator) -> dict:
    return dict(
        obs=rng.standard_normal(4).astype(np.float32),
        action=int(rng.integers(0, 5)),
        reward=float(rng.standard_normal()),
        terminated=bool(rng.random() < 0.5),
        frame=rng.integers(0, 255, (3, 30), dtype=np.uint8),  # 90 bytes: stored on its own
        info=dict(mask=rng.integers(-9, 9, (2, 3)).astype(np.int16)),
    )


def test_small_columns_share_one_aligned_record_and_gather_matches_indexing():
    rng = np.random.default_rng(0)
    storage = ColumnStorage(50)
    samples = [make_sample(rng) for _ in range(50)]
    storage.init_schema(samples[0])
    storage.write_rows(0, storage.convert_many(samples), 0, 50)
    packed = {c.name: c.packed for c in storage.columns}
    assert packed == {
        "obs": True,
        "action": True,
        "reward": True,
        "terminated": True,
        "frame": False,
        "info.mask": True,
    }
    record = storage.columns[0].data.strides[0]
    assert record <= PACK_ROW_BYTES and PACK_ROW_BYTES % record == 0  # no record straddles a cache line
    for col in storage.columns:
        assert col.data.flags.aligned and col.data.shape == (50, *col.shape)
        assert col.data.ctypes.data % col.dtype.alignment == 0
    index = rng.integers(0, 50, 64)
    rows = storage.gather(index)
    for col, got in zip(storage.columns, rows):
        assert got.flags.c_contiguous and got.dtype == col.dtype
        expected = np.stack([np.asarray(s[col.path[0]] if len(col.path) == 1 else s["info"]["mask"]) for s in samples])
        np.testing.assert_array_equal(got, expected[index].astype(col.dtype))
    batch = storage.to_tensors(rows)
    assert batch["info"]["mask"].shape == (64, 2, 3) and batch["info"]["mask"].is_contiguous()
    assert batch["obs"].dtype == torch.float32


def test_writing_one_packed_field_leaves_its_neighbours_alone():
    storage = ColumnStorage(4)
    storage.init_schema(dict(a=1, b=1.0, c=True))
    storage.write_one(2, [7, 2.5, True])
    storage.columns[1].data[2] = -1.0
    a, b, c = storage.gather(np.array([2, 0]))
    assert a.tolist() == [7, 0] and b.tolist() == [-1.0, 0.0] and c.tolist() == [True, False]


def test_a_single_small_column_is_not_packed():
    storage = ColumnStorage(4)
    storage.init_schema(dict(obs=np.zeros(4, np.float32), frame=np.zeros((10, 10), np.uint8)))
    assert [c.packed for c in storage.columns] == [False, False]
    assert storage.gather(np.array([1, 3]))[0].shape == (2, 4)


def test_large_batches_reuse_released_arrays_but_never_held_ones():
    from nervex.data import ReplayBuffer

    n = 300
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (n, 4, 40, 40), dtype=np.uint8)  # 6.4 KB rows: pooled batches of 32
    buffer = ReplayBuffer(maxlen=n, seed=0)
    buffer.extend_batch({"obs": frames, "reward": np.arange(n, dtype=np.float32)})
    held = [buffer.sample(32) for _ in range(12)]  # more than the pool keeps
    assert len({b["obs"].data_ptr() for b in held}) == 12  # nothing held is handed out again
    for b in held:
        np.testing.assert_array_equal(b["obs"].numpy(), frames[b["index"].numpy()])
    pointer = held[0]["obs"].data_ptr()
    view = held[0]["obs"][:2]  # a view keeps the array in use
    held.clear()
    again = [buffer.sample(32) for _ in range(9)]
    assert all(b["obs"].data_ptr() != pointer for b in again)
    del view, again
    first = buffer.sample(32)["obs"].data_ptr()  # dropped at once: its array is free for the next batch
    reused = buffer.sample(32)
    assert reused["obs"].data_ptr() == first
    np.testing.assert_array_equal(reused["obs"].numpy(), frames[reused["index"].numpy()])


def test_compressing_a_dict_compresses_its_leaves():
    storage = ColumnStorage(4, compress_fields=["obs"])
    storage.init_schema({"obs": {"image": np.zeros((8, 8), np.uint8), "pos": np.float32(0)}, "r": 0.0})
    assert [c.compressed for c in storage.columns] == [True, True, False]


def test_pool_never_hands_out_memory_a_live_batch_holds():
    pool = ArrayPool(size=4)
    shape = (16, 4, 40, 40)  # 100 KB: large enough to be pooled
    holders = [  # what a learner may keep of a batch: its tensors, slices and views of them, NumPy views
        lambda a: torch.from_numpy(a),
        lambda a: torch.from_numpy(a)[1:3],
        lambda a: torch.from_numpy(a).numpy()[::2],
        lambda a: a[2:],
        lambda a: a.reshape(-1)[5:],
        lambda a: memoryview(a),
    ]
    held, pooled = [], set()
    for i, hold in enumerate(holders):
        array = pool.empty(shape, np.uint8)
        array[...] = i
        pooled.add(array.ctypes.data)
        held.append(hold(array))
        del array
    gc.collect()
    for _ in range(20):  # new arrays, from the pool or beyond its size, never overlap what is held
        fresh = pool.empty(shape, np.uint8)
        assert not any(np.shares_memory(fresh, np.asarray(h)) for h in held)
        fresh[...] = 255
        del fresh
    for i, h in enumerate(held):
        assert (np.asarray(h) == i).all()  # what is held was never written over
    held.clear()
    gc.collect()
    again = [pool.empty(shape, np.uint8) for _ in range(4)]  # released: the pooled memory is handed out again
    assert {a.ctypes.data for a in again} <= pooled and len({a.ctypes.data for a in again}) == 4
