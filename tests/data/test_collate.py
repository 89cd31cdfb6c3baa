"""collate: lists of nested dicts of arrays and numbers -> batched tensors."""

import numpy as np
import pytest
import torch

from nervex.data import collate


def test_nested_dicts_are_stacked_with_the_type_rules():
    samples = [
        {"obs": np.full((2, 3), i, dtype=np.float64), "reward": 0.5 * i, "action": i, "done": i == 1,
         "frame": np.full(4, i, dtype=np.uint8), "info": {"t": np.int32(i), "state": {"h": torch.full((2,), float(i))}}}
        for i in range(3)
    ]  # fmt: skip
    out = collate(samples)
    assert out["obs"].shape == (3, 2, 3) and out["obs"].dtype == torch.float32
    assert out["obs"][:, 0, 0].tolist() == [0.0, 1.0, 2.0]
    assert out["reward"].dtype == torch.float32 and out["reward"].tolist() == [0.0, 0.5, 1.0]
    assert out["action"].dtype == torch.int64 and out["action"].tolist() == [0, 1, 2]
    assert out["done"].dtype == torch.bool and out["done"].tolist() == [False, True, False]
    assert out["frame"].dtype == torch.uint8
    assert out["info"]["t"].dtype == torch.int32
    assert out["info"]["state"]["h"].shape == (3, 2) and out["info"]["state"]["h"][:, 0].tolist() == [0.0, 1.0, 2.0]


def test_lists_strings_and_batched_dicts():
    out = collate([{"pair": (1, 2.0), "name": "a"}, {"pair": (3, 4.0), "name": "b"}])  # tuples collate per position
    assert out["pair"][0].tolist() == [1, 3] and out["pair"][1].tolist() == [2.0, 4.0]
    assert out["name"] == ["a", "b"]
    batched = collate({"obs": np.zeros((5, 2)), "act": np.arange(5), "nested": {"x": [1.0, 2.0]}})
    assert batched["obs"].dtype == torch.float32 and batched["obs"].shape == (5, 2)
    assert batched["act"].tolist() == [0, 1, 2, 3, 4] and batched["nested"]["x"].dtype == torch.float32


@pytest.mark.parametrize(
    "samples,match",
    [
        ([{"a": np.zeros(3)}, {"a": np.zeros(4)}], r"field 'a' has shape \(3,\) in sample 0 but \(4,\) in sample 1"),
        ([{"a": {"b": np.zeros(2)}}, {"a": {"b": np.zeros(3)}}], r"field 'a.b'"),
        ([{"a": 1}, {"b": 1}], r"\['a'\] in sample 0 but \['b'\] in sample 1"),
        ([], "at least one sample"),
    ],
)
def test_mismatches_raise(samples, match):
    with pytest.raises(ValueError, match=match):
        collate(samples)
