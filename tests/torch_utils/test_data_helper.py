import warnings
from collections import namedtuple

import numpy as np
import pytest
import torch
from easydict import EasyDict

from nervex.torch_utils import collate, decollate, to_device, to_ndarray, to_tensor

Pair = namedtuple("Pair", ["h", "c"])


def test_to_tensor_nested_types_and_dtypes():
    obs = np.arange(6, dtype=np.float32).reshape(2, 3)
    item = {
        "obs": obs,
        "meta": {"reward": 1.5, "step": 3, "done": True, "name": "cartpole", "info": None},
        "seq": [np.int64(7), (np.zeros(2, dtype=np.uint8),)],
        "pair": Pair(h=np.ones(2), c=torch.zeros(1)),
    }
    out = to_tensor(item)
    assert out["obs"].dtype == torch.float32 and out["obs"].shape == (2, 3)
    assert out["meta"]["reward"].dtype == torch.float32 and out["meta"]["reward"].item() == 1.5
    assert out["meta"]["step"].dtype == torch.int64 and out["meta"]["step"].item() == 3
    assert out["meta"]["done"].dtype == torch.bool and out["meta"]["done"].item() is True
    assert out["meta"]["name"] == "cartpole" and out["meta"]["info"] is None
    assert out["seq"][0].dtype == torch.int64 and out["seq"][0].item() == 7
    assert isinstance(out["seq"][1], tuple) and out["seq"][1][0].dtype == torch.uint8
    assert isinstance(out["pair"], Pair) and out["pair"].h.dtype == torch.float64
    # from_numpy shares memory: no copy on the hot path
    obs[0, 0] = 42.0
    assert out["obs"][0, 0].item() == 42.0


def test_to_tensor_dtype_casts_every_leaf_and_keeps_mapping_type():
    out = to_tensor(EasyDict(a=np.ones(2, dtype=np.float64), b=3), dtype=torch.float32)
    assert isinstance(out, EasyDict)
    assert out.a.dtype == torch.float32 and out.b.dtype == torch.float32


def test_to_tensor_read_only_array_is_copied_without_warning():
    arr = np.ones(3)
    arr.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it wraps a non-writable array
        out = to_tensor(arr)
    assert torch.equal(out, torch.ones(3, dtype=torch.float64))


def test_to_ndarray_and_to_device_roundtrip():
    item = {"x": torch.tensor([1.0, 2.0], requires_grad=True), "y": [torch.tensor(3)], "z": "keep"}
    out = to_ndarray(item)
    np.testing.assert_array_equal(out["x"], np.array([1.0, 2.0], dtype=np.float32))
    assert isinstance(out["y"][0], np.ndarray) and out["y"][0] == 3 and out["z"] == "keep"
    moved = to_device(item, "cpu")
    assert moved["x"].device.type == "cpu" and moved["z"] == "keep"


def test_collate_nested_shapes_and_dtypes():
    batch = [
        {
            "obs": np.full(4, i, dtype=np.float64),
            "reward": float(i),
            "action": i,
            "done": i == 2,
            "frame": np.zeros((2, 3), dtype=np.uint8),
            "nested": {"t": torch.full((2,), float(i))},
            "prev_state": None,
        }
        for i in range(3)
    ]
    out = collate(batch)
    assert out["obs"].shape == (3, 4) and out["obs"].dtype == torch.float32
    assert torch.equal(out["obs"][:, 0], torch.tensor([0.0, 1.0, 2.0]))
    assert out["reward"].dtype == torch.float32 and torch.equal(out["reward"], torch.tensor([0.0, 1.0, 2.0]))
    assert out["action"].dtype == torch.int64 and torch.equal(out["action"], torch.tensor([0, 1, 2]))
    assert out["done"].dtype == torch.bool and torch.equal(out["done"], torch.tensor([False, False, True]))
    assert out["frame"].dtype == torch.uint8 and out["frame"].shape == (3, 2, 3)
    assert out["nested"]["t"].shape == (3, 2) and out["nested"]["t"][2, 0].item() == 2.0
    assert out["prev_state"] == [None, None, None]


@pytest.mark.parametrize(
    "values, dtype, expected",
    [
        ([1, 2], torch.int64, [1, 2]),
        ([1, 2.5], torch.float32, [1.0, 2.5]),  # a mix of int and float is a float field
        ([True, False], torch.bool, [True, False]),
        ([np.float64(0.5), 1.0], torch.float32, [0.5, 1.0]),
        ([np.int32(3), np.int32(4)], torch.int32, [3, 4]),
        ([np.float32(1.0), np.float64(2.0)], torch.float32, [1.0, 2.0]),  # promoted float64 is halved too
    ],
)
def test_collate_scalar_fields(values, dtype, expected):
    out = collate([{"v": v} for v in values])["v"]
    assert out.dtype == dtype
    assert out.tolist() == expected


def test_collate_tuples_namedtuples_and_plain_arrays():
    out = collate([Pair(h=np.ones(2), c=np.zeros(1)), Pair(h=np.ones(2), c=np.zeros(1))])
    assert isinstance(out, Pair) and out.h.shape == (2, 2) and out.c.shape == (2, 1)
    assert collate([np.arange(3), np.arange(3)]).shape == (2, 3)


def test_collate_errors_name_the_field():
    batch = [{"a": {"obs": np.zeros(4)}}, {"a": {"obs": np.zeros(4)}}, {"a": {"obs": np.zeros(3)}}]
    with pytest.raises(ValueError, match=r"field 'a\.obs' has shape \(4,\) in sample 0 but \(3,\) in sample 2"):
        collate(batch)
    with pytest.raises(ValueError, match=r"field 't' has shape \(2,\) in sample 0 but \(1,\) in sample 1"):
        collate([{"t": torch.zeros(2)}, {"t": torch.zeros(1)}])
    with pytest.raises(ValueError, match=r"keys \['x'\] in sample 0 but \['y'\] in sample 1"):
        collate([{"x": 1}, {"y": 1}])
    with pytest.raises(ValueError, match="empty"):
        collate([])


def test_decollate_inverts_collate():
    samples = [
        {"logit": np.full(3, i, dtype=np.float32), "action": i, "state": Pair(np.ones(2), np.ones(1))} for i in range(4)
    ]
    batch = collate(samples)
    batch["next_state"] = ["s0", "s1", "s2", "s3"]  # a model's per-sample list stays per sample
    out = decollate(batch)
    assert len(out) == 4
    for i, sample in enumerate(out):
        assert torch.equal(sample["logit"], torch.full((3,), float(i)))
        assert sample["action"].item() == i and sample["next_state"] == f"s{i}"
        assert isinstance(sample["state"], Pair) and sample["state"].h.shape == (2,)


def test_decollate_errors():
    with pytest.raises(ValueError, match="different batch sizes"):
        decollate({"a": torch.zeros(2), "b": torch.zeros(3)})
    with pytest.raises(ValueError, match="field 'loss' is a 0-d tensor"):
        decollate({"a": torch.zeros(2), "loss": torch.tensor(1.0)})
