"""save -> load round trips (no pickle) and lz4 compression of chosen fields."""

import json
import os
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
    buffer.update(np.linspace(0.5, 4.0, 8), unique_id=batch["unique_id"])
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
    stored = np.arange(4, 20)  # the ids in the ring; the loading buffer had issued none, so they are unchanged
    np.testing.assert_array_equal(loaded.priority(stored), buffer.priority(stored))
    # every sample drawn is the one stored under its unique id, field by field (from a copy without max_use)
    copy = PrioritizedBuffer(maxlen=16, alpha=0.7, seed=1)
    copy.load(path)
    for _ in range(5):
        drawn = copy.sample(8)
        for uid, obs, next_obs, reward, t in zip(
            drawn["unique_id"].tolist(), drawn["obs"], drawn["next_obs"], drawn["reward"], drawn["info"]["t"]
        ):
            expected = frames(uid)
            np.testing.assert_array_equal(obs.numpy(), expected["obs"])
            np.testing.assert_array_equal(next_obs.numpy(), expected["next_obs"])
            assert reward.item() == uid and t.item() == uid
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
    c = again.sample(16)
    for uid, obs in zip(c["unique_id"].tolist(), c["obs"]):
        np.testing.assert_array_equal(obs.numpy(), samples[uid]["obs"])


def test_compressing_a_nested_dict_compresses_its_leaves():
    buffer = ReplayBuffer(maxlen=4, compress_fields=["obs"])
    buffer.extend([{"obs": {"image": np.full((8, 8), i, np.uint8), "pos": np.float32(i)}, "r": 0.0} for i in range(4)])
    assert buffer.stats()["buffer/compression_ratio"] > 1.0
    batch = buffer.sample(4)
    np.testing.assert_array_equal(batch["obs"]["image"][:, 0, 0].numpy(), batch["unique_id"].numpy())


def test_a_buffer_saved_by_an_earlier_nervex_loads(tmp_path):
    # replay_v1.npz: format version 1, written before the buffer was rebuilt on one tree (maxlen 8, alpha 0.6, 11
    # samples, so ids 3..10 are stored; ids 9, 10, 5, 6 drawn and updated to uid / 2 + 1 / 4; "frame" compressed)
    buffer = PrioritizedBuffer(maxlen=8, alpha=0.6, compress_fields=["frame"], seed=0)
    buffer.load(os.path.join(os.path.dirname(__file__), "replay_v1.npz"))
    assert len(buffer) == 8
    updated = {5: 2.75, 6: 3.25, 9: 4.75, 10: 5.25}
    np.testing.assert_array_equal(buffer.priority(np.arange(3, 11)), [updated.get(u, 1.0) for u in range(3, 11)])
    stats = buffer.stats()
    assert stats["buffer/pushed"] == 11 and stats["buffer/sampled"] == 4 and stats["buffer/mean_use"] == 0.5
    for _ in range(10):
        batch = buffer.sample(4)
        for uid, obs, frame, reward, t in zip(
            batch["unique_id"].tolist(), batch["obs"], batch["frame"], batch["reward"], batch["info"]["t"]
        ):
            assert obs.tolist() == [uid, -uid] and (frame == uid).all() and reward.item() == uid == t.item()
    batch = buffer.sample(2)
    buffer.update([8.0, 8.0], unique_id=batch["unique_id"])
    assert buffer.stats()["buffer/priority_max"] == 8.0


def test_a_newer_format_version_is_refused(tmp_path):
    path = str(tmp_path / "future.npz")
    header = {"format": "nervex.replay", "version": 99, "maxlen": 4}
    np.savez(path, header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8))
    with pytest.raises(ValueError, match="replay format version 99; this nervex reads up to 1"):
        ReplayBuffer(maxlen=4).load(path)
