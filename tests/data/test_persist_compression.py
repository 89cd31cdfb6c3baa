"""save -> load round trips (no pickle) and lz4 compression of chosen fields."""

import json
import zipfile

import numpy as np
import pytest
import torch

from nervex.data import PrioritizedBuffer, ReplayBuffer
from nervex.data.compression import compress_array, decompress_array


def frames(i: int) -> dict:
    """An Atari-like sample: a mostly flat 4x84x84 uint8 frame stack."""
    obs = np.zeros((4, 84, 84), dtype=np.uint8)
    obs[:, i % 70 : i % 70 + 10, 20:30] = 200
    return {"obs": obs, "next_obs": np.roll(obs, 1, axis=2), "action": i % 4, "reward": float(i), "info": {"t": i}}


def test_save_load_round_trip(tmp_path, backend):
    buffer = PrioritizedBuffer(maxlen=16, alpha=0.7, max_use=5, seed=0)
    buffer.extend([frames(i) for i in range(20)], learner_iter=3)  # wraps the ring
    batch = buffer.sample(8, learner_iter=4)
    buffer.update(np.linspace(0.5, 4.0, 8))
    path = str(tmp_path / "replay.npz")
    buffer.save(path)
    with np.load(path, allow_pickle=False) as f:  # plain arrays only
        header = json.loads(f["header"].tobytes())
    assert header["format"] == "nervex.replay" and header["filled"] == 16
    assert not any(name.endswith(".pkl") for name in zipfile.ZipFile(path).namelist())

    loaded = PrioritizedBuffer(maxlen=16, alpha=0.7, max_use=5, seed=0)
    loaded.load(path)
    assert len(loaded) == len(buffer)
    for key in ("buffer/priority_mean", "buffer/priority_max", "buffer/mean_use", "buffer/mean_staleness"):
        assert loaded.stats()[key] == pytest.approx(buffer.stats()[key])
    np.testing.assert_allclose(loaded._sum_tree.leaves, buffer._sum_tree.leaves)
    assert loaded._min_tree.min() == buffer._min_tree.min()
    # the same slots hold the same samples, and unique ids moved past those the loading buffer had issued
    index = batch["index"].numpy()
    again = loaded._storage.to_tensors(loaded._storage.gather(index))
    for key in ("obs", "next_obs", "reward"):
        torch.testing.assert_close(again[key], batch[key])
    torch.testing.assert_close(again["info"]["t"], batch["info"]["t"])
    # sampling and writing carry on
    assert loaded.sample(8) is not None
    loaded.extend([frames(i) for i in range(3)])
    assert len(loaded) == 16


def test_load_shifts_unique_ids_so_old_batches_cannot_update(tmp_path):
    source = PrioritizedBuffer(maxlen=4, alpha=1.0, seed=0)
    source.extend([frames(i) for i in range(4)])
    source.save(str(tmp_path / "r.npz"))
    target = PrioritizedBuffer(maxlen=4, alpha=1.0, seed=0)
    target.extend([frames(i) for i in range(4)])
    old = target.sample(4)
    target.load(str(tmp_path / "r.npz"))
    target.update(np.full(4, 9.0), unique_id=old["unique_id"])
    assert target.stats()["buffer/ignored_updates"] == 4 and target.stats()["buffer/priority_max"] == 1.0


def test_load_checks(tmp_path):
    buffer = ReplayBuffer(maxlen=8)
    buffer.extend([frames(i) for i in range(3)])
    buffer.save(str(tmp_path / "r.npz"))
    with pytest.raises(ValueError, match="maxlen=8"):
        ReplayBuffer(maxlen=9).load(str(tmp_path / "r.npz"))
    with pytest.raises(ValueError, match="compress_fields"):
        ReplayBuffer(maxlen=8, compress_fields=["obs"]).load(str(tmp_path / "r.npz"))
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(ValueError, match="not a nervex replay"):
        ReplayBuffer(maxlen=8).load(str(tmp_path / "other.npz"))
    uniform_into_prioritized = PrioritizedBuffer(maxlen=8)
    uniform_into_prioritized.load(str(tmp_path / "r.npz"))
    assert len(uniform_into_prioritized) == 3 and uniform_into_prioritized.stats()["buffer/priority_mean"] == 1.0


def test_save_load_empty_buffer(tmp_path):
    ReplayBuffer(maxlen=4).save(str(tmp_path / "e.npz"))
    buffer = ReplayBuffer(maxlen=4)
    buffer.load(str(tmp_path / "e.npz"))
    assert len(buffer) == 0 and buffer.sample(1) is None


def test_compress_array_round_trip():
    for array in (np.arange(24, dtype=np.float32).reshape(2, 3, 4), np.zeros((4, 84, 84), np.uint8), np.array(3)):
        data = compress_array(array)
        np.testing.assert_array_equal(decompress_array(data, array.dtype, array.shape), array)


def test_compressed_fields_round_trip_and_save_memory(tmp_path, backend):
    plain = ReplayBuffer(maxlen=64, seed=0)
    packed = ReplayBuffer(maxlen=64, compress_fields=["obs", "next_obs"], seed=0)
    samples = [frames(i) for i in range(64)]
    plain.extend(samples[:32])
    packed.extend(samples[:32])
    for s in samples[32:]:
        plain.append(s)
        packed.append(s)
    a, b = plain.sample(16), packed.sample(16)
    for key in ("obs", "next_obs", "action", "reward"):
        torch.testing.assert_close(a[key], b[key])
    np.testing.assert_array_equal(b["obs"][0].numpy(), samples[b["unique_id"][0].item()]["obs"])
    stats_plain, stats_packed = plain.stats(), packed.stats()
    assert stats_packed["buffer/compression_ratio"] > 10  # flat frames compress very well
    assert stats_packed["buffer/memory_mb"] < stats_plain["buffer/memory_mb"] / 10
    packed.save(str(tmp_path / "c.npz"))
    again = ReplayBuffer(maxlen=64, compress_fields=["obs", "next_obs"], seed=0)
    again.load(str(tmp_path / "c.npz"))
    c = again._storage.to_tensors(again._storage.gather(b["index"].numpy()))
    torch.testing.assert_close(c["obs"], b["obs"])


def test_compressing_a_nested_dict_compresses_its_leaves():
    buffer = ReplayBuffer(maxlen=4, compress_fields=["obs"])
    buffer.extend([{"obs": {"image": np.full((8, 8), i, np.uint8), "pos": np.float32(i)}, "r": 0.0} for i in range(4)])
    assert [c.compressed for c in buffer._storage.columns] == [True, True, False]
    batch = buffer.sample(4)
    np.testing.assert_array_equal(batch["obs"]["image"][:, 0, 0].numpy(), batch["unique_id"].numpy())
