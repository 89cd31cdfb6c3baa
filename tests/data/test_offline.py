"""TrajectoryWriter -> OfflineDataset / OfflineDataLoader round trips."""

import os

import numpy as np
import pytest
import torch

from nervex.data import OfflineDataLoader, OfflineDataset, TrajectoryWriter


def episode(ep: int, length: int) -> list:
    return [
        {"obs": np.full(3, 100 * ep + t, np.float32), "action": t % 2, "reward": float(t), "terminated": t == length - 1,
         "info": {"ep": ep}}
        for t in range(length)
    ]  # fmt: skip


def write(path, lengths, chunk_size=10) -> None:
    with TrajectoryWriter(str(path), chunk_size=chunk_size) as writer:
        for ep, length in enumerate(lengths):
            writer.write(episode(ep, length))


def test_round_trip_keeps_values_types_and_trajectories(tmp_path):
    write(tmp_path, [4, 7, 3, 12, 1], chunk_size=10)
    files = sorted(os.listdir(tmp_path))
    assert files == ["chunk_000000.npz", "chunk_000001.npz", "chunk_000002.npz"]  # 4+7 | 3+12 | 1
    data = OfflineDataset(str(tmp_path))
    assert len(data) == 27 and data.num_trajectories == 5
    assert data.traj_lengths.tolist() == [4, 7, 3, 12, 1] and data.traj_starts.tolist() == [0, 4, 11, 14, 26]
    item = data[5]  # episode 1, step 1
    assert item["obs"].dtype == np.float32 and item["obs"].tolist() == [101.0] * 3
    assert item["action"] == 1 and item["reward"] == 1.0 and item["info"]["ep"] == 1
    traj = data.trajectory(3)
    assert traj["obs"][:, 0].tolist() == [300.0 + t for t in range(12)]
    assert traj["terminated"].tolist() == [False] * 11 + [True] and traj["reward"].dtype == np.float32


def test_dataloader_visits_every_transition_once_per_epoch(tmp_path):
    write(tmp_path, [5, 6, 9])
    data = OfflineDataset(str(tmp_path))
    loader = OfflineDataLoader(data, batch_size=4, shuffle=True, seed=0)
    assert len(loader) == 5
    seen = []
    for batch in loader:
        assert isinstance(batch["obs"], torch.Tensor) and batch["obs"].dtype == torch.float32
        assert batch["info"]["ep"].dtype == torch.int64
        seen.extend((batch["obs"][:, 0].long() % 100 + 100 * batch["info"]["ep"]).tolist())
    expected = [100 * ep + t for ep, n in enumerate([5, 6, 9]) for t in range(n)]
    assert sorted(seen) == sorted(expected)
    batches = list(OfflineDataLoader(data, batch_size=4, shuffle=False, drop_last=True))
    assert len(batches) == 5 and batches[0]["reward"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_plain_torch_dataloader_with_collate(tmp_path):
    from torch.utils.data import DataLoader

    from nervex.data import collate

    write(tmp_path, [3, 3])
    batch = next(iter(DataLoader(OfflineDataset(str(tmp_path)), batch_size=6, collate_fn=collate)))
    assert batch["obs"].shape == (6, 3) and batch["action"].tolist() == [0, 1, 0, 0, 1, 0]


def test_fields_and_traj_transform(tmp_path):
    write(tmp_path, [3, 4])
    data = OfflineDataset(str(tmp_path), fields=["obs", "info"])
    assert data.field_names == ["obs", "info.ep"]

    def two_step(traj):  # e.g. n-step samples: pairs of consecutive transitions
        return [
            {"obs": a["obs"], "next_obs": b["obs"], "return": a["reward"] + b["reward"]} for a, b in zip(traj, traj[1:])
        ]

    pairs = OfflineDataset(str(tmp_path), traj_transform=two_step)
    assert len(pairs) == 5 and pairs.traj_lengths.tolist() == [2, 3]
    assert pairs[2]["next_obs"][0] == 101.0 and pairs[4]["return"] == 5.0


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no trajectory chunks"):
        OfflineDataset(str(tmp_path / "missing"))
    writer = TrajectoryWriter(str(tmp_path))
    writer.write(episode(0, 2))
    with pytest.raises(ValueError, match=r"field 'obs'( of sample \d+)? has shape \(4,\)"):
        writer.write(
            [{"obs": np.zeros(4, np.float32), "action": 0, "reward": 0.0, "terminated": False, "info": {"ep": 0}}]
        )
    writer.close()
    writer.close()
    with pytest.raises(RuntimeError, match="closed"):
        writer.write(episode(1, 2))
    with pytest.raises(ValueError, match="field 'nope'"):
        OfflineDataset(str(tmp_path), fields=["nope"])


def test_two_writers_share_a_directory(tmp_path):
    a, b = TrajectoryWriter(str(tmp_path), chunk_size=1), TrajectoryWriter(str(tmp_path), chunk_size=1)
    a.write(episode(0, 2))
    b.write(episode(1, 3))
    a.write(episode(2, 1))
    a.close()
    b.close()
    assert len(os.listdir(tmp_path)) == 3 and len(OfflineDataset(str(tmp_path))) == 6
