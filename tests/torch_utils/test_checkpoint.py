import os
import pickle

import numpy as np
import pytest
import torch

from nervex.torch_utils import Adam, load_checkpoint, save_checkpoint
from nervex.torch_utils import checkpoint as checkpoint_module


def _state(value: float) -> dict:
    model = torch.nn.Linear(2, 1)
    torch.nn.init.constant_(model.weight, value)
    optimizer = Adam(model.parameters(), lr=1e-3)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()  # optimizer state now holds tensors and int keys
    return {
        "version": 1,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "train_iter": 7,
        "lr": 1e-3,
        "name": "run",
        "shape": (2, 1),
        "history": [1.0, None],
    }


def _leftovers(directory) -> list:
    return [name for name in os.listdir(directory) if name.endswith(".tmp")]


def test_save_then_weights_only_load_roundtrip(tmp_path):
    path = tmp_path / "sub" / "ckpt.pt"  # missing parent directories are created
    state = _state(0.5)
    save_checkpoint(state, path)
    loaded = load_checkpoint(path)
    assert torch.equal(loaded["model"]["weight"], state["model"]["weight"])
    assert loaded["optimizer"]["state"][0]["step"] == state["optimizer"]["state"][0]["step"]
    assert (loaded["train_iter"], loaded["lr"], loaded["name"], loaded["shape"]) == (7, 1e-3, "run", (2, 1))
    assert loaded["history"] == [1.0, None]
    assert torch.load(path, weights_only=True)["train_iter"] == 7
    assert _leftovers(path.parent) == []


def test_bad_value_is_rejected_and_old_checkpoint_survives(tmp_path):
    path = tmp_path / "ckpt.pt"
    good = _state(0.5)
    save_checkpoint(good, path)
    bad = _state(9.0)
    bad["extra"] = {"buffer": [1, object()]}
    with pytest.raises(TypeError, match=r"state\['extra'\]\['buffer'\]\[1\] is a builtins.object"):
        save_checkpoint(bad, path)
    assert torch.equal(load_checkpoint(path)["model"]["weight"], good["model"]["weight"])
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "value, hint",
    [
        (np.float64(1.0), r"numpy\.float64 \(convert with torch\.from_numpy"),
        (torch.nn.Linear(1, 1), r"Linear \(store its \.state_dict\(\) instead\)"),
    ],
)
def test_rejected_values_come_with_a_hint(tmp_path, value, hint):
    with pytest.raises(TypeError, match=hint):
        save_checkpoint({"x": value}, tmp_path / "c.pt")
    assert not (tmp_path / "c.pt").exists()


def test_crash_mid_write_leaves_old_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(_state(0.5), path)
    old_bytes = path.read_bytes()

    def crashing_save(obj, f):
        f.write(b"half a checkpoint")
        raise RuntimeError("disk full")

    monkeypatch.setattr(checkpoint_module.torch, "save", crashing_save)
    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(_state(9.0), path)
    assert path.read_bytes() == old_bytes
    assert _leftovers(tmp_path) == []


def test_load_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.pt"
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        load_checkpoint(missing)


class _Custom:
    pass


def test_load_refuses_arbitrary_objects(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"obj": _Custom()}, path)
    with pytest.raises(pickle.UnpicklingError, match="evil.pt"):
        load_checkpoint(path)
