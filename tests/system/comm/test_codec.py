"""The bulk-data codec: round trips, hand-built malformed buffers, pickles that must never run, schemas, state_dicts."""

from __future__ import annotations

import io
import json
import pickle
import struct
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

from nervex.system.comm import codec
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.schema import ArraySpec, Schema


def raw_safetensors(header: Any, buffer: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors buffer built by hand: ``header`` (an object, or the header's bytes as they are) and ``buffer``."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(head) if length is None else length) + head + buffer


def refused(call, *args, status: int = 400, **kwargs) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        call(*args, **kwargs)
    assert info.value.status == status, str(info.value)
    return info.value


class Canary:
    """Unpickling this creates the file at ``path`` (harmless, but proof that a pickle ran)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


# -------------------------------------------------------------------------------------------------------- round trips

DTYPE_VALUES = {
    "bool": [True, False, True],
    "uint8": [0, 255, 7],
    "int8": [-128, 127, 0],
    "int16": [-32768, 32767, 1],
    "int32": [-(2**31), 2**31 - 1, 2],
    "int64": [-(2**63), 2**63 - 1, 3],
    "float16": [-65504.0, np.inf, np.nan],
    "float32": [np.finfo(np.float32).tiny, -np.inf, np.nan],
    "float64": [np.finfo(np.float64).max, 1e-300, np.nan],
}


@pytest.mark.parametrize("dtype", sorted(DTYPE_VALUES))
def test_every_allowed_dtype_round_trips_exactly(dtype: str):
    values = np.array(DTYPE_VALUES[dtype], dtype=dtype)
    arrays = {"vector": values, "scalar": values[:1].reshape(()), "empty": np.zeros((0, 3), dtype=dtype)}
    decoded = codec.decode_arrays(codec.encode_arrays(arrays))
    assert sorted(decoded) == ["empty", "scalar", "vector"]
    for name, array in arrays.items():
        assert decoded[name].dtype == np.dtype(dtype) and decoded[name].shape == array.shape, name
        assert decoded[name].tobytes() == array.tobytes(), name  # bit-exact, NaN payloads included


def test_torch_tensors_big_endian_and_strided_arrays_are_encoded_by_value():
    tensor = torch.arange(12, dtype=torch.float32, requires_grad=True).reshape(3, 4)
    arrays = {"t": tensor.t(), "big": np.arange(5, dtype=">i4"), "strided": np.arange(10.0)[::3]}
    decoded = codec.decode_arrays(codec.encode_arrays(arrays))
    np.testing.assert_array_equal(decoded["t"], tensor.detach().numpy().T)
    np.testing.assert_array_equal(decoded["big"], [0, 1, 2, 3, 4])
    assert decoded["big"].dtype == np.dtype("int32") and decoded["big"].dtype.isnative
    np.testing.assert_array_equal(decoded["strided"], [0.0, 3.0, 6.0, 9.0])


def test_decoded_arrays_are_writable_copies():
    data = codec.encode_arrays({"x": np.arange(4, dtype=np.int64)})
    first, second = codec.decode_arrays(data)["x"], codec.decode_arrays(data)["x"]
    first[0] = 99
    assert second[0] == 0 and codec.decode_arrays(data)["x"][0] == 0


def test_nested_dicts_are_flattened_and_restored_only_when_asked():
    h, c = np.ones((1, 8), np.float32), np.zeros((1, 8), np.float32)
    data = codec.encode_arrays({"obs": np.zeros(3), "prev_state": {"h": h, "c": c}}, metadata={"version": "7"})
    arrays, metadata = codec.decode_arrays_and_metadata(data)
    assert sorted(arrays) == ["obs", "prev_state/c", "prev_state/h"] and metadata == {"version": "7"}
    nested = codec.unflatten_arrays(arrays)
    np.testing.assert_array_equal(nested["prev_state"]["h"], h)
    with pytest.raises(ProtocolError):
        codec.unflatten_arrays({"a": 1, "a/b": 2})


def test_our_bytes_are_standard_safetensors_and_we_read_theirs():
    ours = codec.encode_arrays({"x": np.arange(6, dtype=np.int16).reshape(2, 3)})
    np.testing.assert_array_equal(safetensors.numpy.load(ours)["x"], [[0, 1, 2], [3, 4, 5]])
    theirs = safetensors.torch.save({"w": torch.full((2, 2), 0.5), "n": torch.tensor(3)}, metadata={"a": "b"})
    arrays, metadata = codec.decode_arrays_and_metadata(theirs)
    np.testing.assert_array_equal(arrays["w"], np.full((2, 2), 0.5, np.float32))
    assert arrays["n"].dtype == np.int64 and arrays["n"].shape == () and metadata == {"a": "b"}


@pytest.mark.parametrize(
    "arrays, error",
    [
        ({"x": torch.ones(2, dtype=torch.bfloat16)}, TypeError),
        ({"x": np.array([object()], dtype=object)}, TypeError),
        ({"x": np.ones(2, dtype=np.complex64)}, TypeError),
        ({"x": 1.5}, TypeError),
        ({"a/b": np.ones(1), "a": {"b": np.ones(1)}}, ValueError),
        ({"__metadata__": np.ones(1)}, ValueError),
    ],
    ids=["bfloat16", "object array", "complex", "python float", "flattened names collide", "reserved name"],
)
def test_encode_refuses_what_it_cannot_represent(arrays: Dict[str, Any], error: type):
    with pytest.raises(error):
        codec.encode_arrays(arrays)


# --------------------------------------------------------------------------------------------- malformed buffers

F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
MALFORMED = {
    "shorter than the length prefix": (b"\x01\x02", "data"),
    "header length of 2**63": (raw_safetensors({}, length=2**63), "header"),
    "header length over the 1 MiB cap": (raw_safetensors(b" " * 16, length=(1 << 20) + 1), "header"),
    "header length past the end": (raw_safetensors(b"{}", length=100), "header"),
    "header not JSON": (raw_safetensors(b"{not json"), "header"),
    "header not UTF-8": (raw_safetensors(b'{"\xff": 1}'), "header"),
    "header a JSON list": (raw_safetensors([]), "header"),
    "duplicate tensor name": (raw_safetensors(b'{"x": {}, "x": {}}'), "x"),
    "entry not an object": (raw_safetensors({"x": [1, 2]}), "x"),
    "entry with an extra key": (raw_safetensors({"x": {**F32_2, "pickle": "yes"}}, bytes(8)), "x"),
    "unknown dtype string": (raw_safetensors({"x": {**F32_2, "dtype": "F128"}}, bytes(8)), "x.dtype"),
    "BF16 (no NumPy dtype)": (raw_safetensors({"x": {**F32_2, "dtype": "BF16"}}, bytes(4)), "x.dtype"),
    "object dtype": (raw_safetensors({"x": {**F32_2, "dtype": "O"}}, bytes(8)), "x.dtype"),
    "negative shape": (raw_safetensors({"x": {**F32_2, "shape": [-2]}}, bytes(8)), "x.shape"),
    "float in shape": (raw_safetensors({"x": {**F32_2, "shape": [2.0]}}, bytes(8)), "x.shape"),
    "bool in shape": (raw_safetensors({"x": {**F32_2, "shape": [True, 2]}}, bytes(8)), "x.shape"),
    "offsets past the end": (raw_safetensors({"x": {**F32_2, "data_offsets": [0, 800]}}, bytes(8)), "x.data_offsets"),
    "offsets reversed": (raw_safetensors({"x": {**F32_2, "data_offsets": [8, 0]}}, bytes(8)), "x.data_offsets"),
    "shape/offsets size mismatch": (raw_safetensors({"x": {**F32_2, "shape": [3]}}, bytes(8)), "x.data_offsets"),
    "huge shape, small offsets": (
        raw_safetensors({"x": {**F32_2, "shape": [2**40, 2**40]}}, bytes(8)),
        "x.data_offsets",
    ),
    "overlapping offsets": (
        raw_safetensors({"a": F32_2, "b": {**F32_2, "data_offsets": [4, 12]}}, bytes(12)),
        "b.data_offsets",
    ),
    "gap between tensors": (
        raw_safetensors({"a": F32_2, "b": {**F32_2, "data_offsets": [12, 20]}}, bytes(20)),
        "b.data_offsets",
    ),
    "trailing bytes": (raw_safetensors({"x": F32_2}, bytes(9)), "data"),
    "metadata not strings": (raw_safetensors({"__metadata__": {"n": 1}}), "__metadata__"),
    "BOOL byte other than 0/1": (
        raw_safetensors({"flags": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}}, b"\x01\x02"),
        "flags",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_buffers_are_refused_naming_the_field(case: str):
    data, field = MALFORMED[case]
    error = refused(codec.decode_arrays, data)
    assert error.field == field, str(error)


def test_well_formed_hand_built_buffer_is_accepted():
    """The control for the table above: the same construction with consistent fields decodes."""
    buffer = struct.pack("<2f", 1.5, -2.0) + struct.pack("<h", 7)
    header = {"a": F32_2, "b": {"dtype": "I16", "shape": [], "data_offsets": [8, 10]}, "__metadata__": {"k": "v"}}
    arrays = codec.decode_arrays(raw_safetensors(header, buffer))
    np.testing.assert_array_equal(arrays["a"], [1.5, -2.0])
    assert arrays["b"] == 7 and arrays["b"].dtype == np.int16


def test_payload_over_the_cap_is_refused_before_parsing():
    data = codec.encode_arrays({"x": np.zeros(1000)})
    assert refused(codec.decode_arrays, data, max_bytes=len(data) - 1, status=413).field == "data"
    assert codec.decode_arrays(data, max_bytes=len(data))["x"].shape == (1000,)


# ------------------------------------------------------------------------------------------------ never unpickled


def test_pickled_payloads_never_run(tmp_path: Path):
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(Canary(control)))
    assert control.exists(), "the canary must work for the test to mean anything"
    canary = tmp_path / "canary"
    payload = pickle.dumps(Canary(canary))
    refused(codec.decode_arrays, payload)
    refused(codec.decode_state_dict, payload)
    refused(codec.decode_npz, payload)
    refused(codec.decode_arrays, codec.from_inline(codec.to_inline(payload)))
    torch_file = io.BytesIO()
    torch.save({"x": Canary(canary)}, torch_file)  # a zip holding data.pkl
    refused(codec.decode_npz, torch_file.getvalue())
    refused(codec.decode_arrays, torch_file.getvalue())
    assert not canary.exists()


def test_object_array_npz_is_refused_naming_the_field(tmp_path: Path):
    canary = tmp_path / "canary"
    buffer = io.BytesIO()
    np.savez(buffer, reward=np.zeros(3, np.float32), obj=np.array([Canary(canary)], dtype=object))
    assert refused(codec.decode_npz, buffer.getvalue()).field == "obj"
    assert not canary.exists()


def test_plain_npz_is_read():
    buffer = io.BytesIO()
    np.savez_compressed(buffer, obs=np.arange(6.0).reshape(3, 2), done=np.array([False, True, False]))
    arrays = codec.decode_npz(buffer.getvalue())
    np.testing.assert_array_equal(arrays["obs"], np.arange(6.0).reshape(3, 2))
    assert arrays["done"].dtype == np.bool_


def test_npz_over_the_cap_or_corrupt_or_of_a_foreign_dtype_is_refused():
    buffer = io.BytesIO()
    np.savez_compressed(buffer, zeros=np.zeros(100_000, np.uint8))  # compresses to a few hundred bytes
    data = buffer.getvalue()
    assert len(data) < 10_000
    refused(codec.decode_npz, data, max_bytes=10_000, status=413)
    refused(codec.decode_npz, data[: len(data) // 2])
    refused(codec.decode_npz, b"PK\x03\x04" + bytes(100))
    buffer = io.BytesIO()
    np.savez(buffer, when=np.array(["2024-01-01"], dtype="datetime64[D]"))
    assert refused(codec.decode_npz, buffer.getvalue()).field == "when"


# ----------------------------------------------------------------------------------------------------------- schema

F32 = ("float32",)
TRAJECTORY = Schema(
    {
        "obs": ArraySpec(F32, ("T", 4), finite=True),
        "action": ArraySpec("int64", ("T",), low=0, high=1),
        "reward": ArraySpec(F32, ("T",), finite=True),
        "terminated": ArraySpec("bool", ("T",)),
        "truncated": ArraySpec("bool", ("T",)),
        "logp": ArraySpec(F32, ("T",), finite=True, high=0.0),
        "prev_state/h": ArraySpec(F32, (1, None), finite=True, required=False),
    }
)


def trajectory(steps: int = 5, **replace: np.ndarray) -> Dict[str, np.ndarray]:
    arrays = {
        "obs": np.zeros((steps, 4), np.float32),
        "action": np.arange(steps, dtype=np.int64) % 2,
        "reward": np.ones(steps, np.float32),
        "terminated": np.eye(1, steps, steps - 1, dtype=bool)[0],
        "truncated": np.zeros(steps, bool),
        "logp": np.full(steps, -0.69, np.float32),
    }
    return {**arrays, **replace}


def test_valid_trajectory_passes_and_binds_T():
    assert TRAJECTORY.validate(trajectory(5)) == {"T": 5}
    assert TRAJECTORY.validate(trajectory(3, **{"prev_state/h": np.zeros((1, 64), np.float32)})) == {"T": 3}
    data = codec.encode_arrays(trajectory(4))
    assert sorted(codec.decode_arrays(data, TRAJECTORY)) == sorted(trajectory(4))


def nan_at(index: int, steps: int = 5) -> np.ndarray:
    reward = np.ones(steps, np.float32)
    reward[index] = np.nan
    return reward


SCHEMA_CASES = {
    "NaN reward": (trajectory(reward=nan_at(3)), "reward", "found nan at index (3,)"),
    "inf in obs": (trajectory(obs=np.full((5, 4), np.inf, np.float32)), "obs", "finite"),
    "missing reward": ({k: v for k, v in trajectory().items() if k != "reward"}, "reward", "missing"),
    "T differs across keys": (trajectory(reward=np.ones(6, np.float32)), "reward", "T = 5 from obs"),
    "fixed dimension wrong": (trajectory(obs=np.zeros((5, 3), np.float32)), "obs", "found shape (5, 3)"),
    "wrong rank": (trajectory(action=np.zeros((5, 1), np.int64)), "action", "found shape (5, 1)"),
    "wrong dtype": (trajectory(reward=np.ones(5, np.float64)), "reward", "found dtype float64"),
    "action out of range": (trajectory(action=np.array([0, 1, 2, 0, 1])), "action", "found 2 at index (2,)"),
    "positive log-probability": (trajectory(logp=np.full(5, 0.5, np.float32)), "logp", "values in [-inf, 0.0]"),
    "typo in a key": (
        {**trajectory(), "rewrad": np.ones(5, np.float32)},
        "rewrad",
        "did you mean 'reward'?",
    ),
}


@pytest.mark.parametrize("case", list(SCHEMA_CASES))
def test_schema_refuses_naming_the_field_and_what_was_expected(case: str):
    arrays, field, words = SCHEMA_CASES[case]
    error = refused(TRAJECTORY.validate, arrays)
    assert error.field == field and words in error.message, str(error)


def test_schema_is_checked_by_decode_and_knows_dims_in_advance():
    data = codec.encode_arrays(trajectory(reward=nan_at(0)))
    assert refused(codec.decode_arrays, data, schema=TRAJECTORY).field == "reward"
    error = refused(TRAJECTORY.validate, trajectory(5), dims={"T": 8})
    assert error.field == "obs" and "T = 8" in error.message
    assert Schema(TRAJECTORY.fields, allow_extra=True).validate({**trajectory(2), "extra": np.ones(1)}) == {"T": 2}


# ------------------------------------------------------------------------------------------------------ state_dicts


def test_policy_snapshot_round_trip_gives_identical_actions():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    net.train()
    net(torch.randn(16, 4))  # moves the BatchNorm running statistics and its int64 counter
    net.eval()
    torch.manual_seed(1)
    copy = torch.nn.Sequential(
        torch.nn.Linear(4, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 2)
    )
    copy.load_state_dict(codec.decode_state_dict(codec.encode_state_dict(net.state_dict())))
    copy.eval()
    for name, tensor in net.state_dict().items():
        assert copy.state_dict()[name].dtype == tensor.dtype and torch.equal(copy.state_dict()[name], tensor), name
    obs = torch.randn(64, 4)
    with torch.no_grad():
        assert torch.equal(copy(obs), net(obs))
        assert torch.equal(copy(obs).argmax(-1), net(obs).argmax(-1))


def test_checkpoint_with_optimizer_state_and_plain_numbers_round_trips():
    def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad()
        model(torch.ones(3, 2)).pow(2).sum().backward()
        optimizer.step()

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    train_step(model, optimizer)
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "train_iter": 7, "lag": None}
    restored = codec.decode_state_dict(codec.encode_state_dict(checkpoint))
    assert restored["train_iter"] == 7 and restored["lag"] is None
    assert restored["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert set(restored["optimizer"]["state"]) == {0, 1}  # int keys, which Optimizer.load_state_dict matches on
    twin = torch.nn.Linear(2, 2)
    twin_optimizer = torch.optim.Adam(twin.parameters(), lr=0.5)
    twin.load_state_dict(restored["model"])
    twin_optimizer.load_state_dict(restored["optimizer"])
    train_step(model, optimizer)
    train_step(twin, twin_optimizer)
    assert torch.equal(twin.weight, model.weight) and torch.equal(twin.bias, model.bias)


def test_plain_safetensors_file_loads_as_a_flat_state_dict():
    net = torch.nn.Linear(3, 2)
    state_dict = codec.decode_state_dict(safetensors.torch.save(net.state_dict()))
    assert sorted(state_dict) == ["bias", "weight"] and torch.equal(state_dict["weight"], net.weight.detach())


@pytest.mark.parametrize(
    "state_dict", [{"x": np.float32(1.0)}, {"x": object()}, {(1, 2): torch.ones(1)}, {True: torch.ones(1)}]
)
def test_state_dict_with_values_the_codec_cannot_restore_is_refused(state_dict: Dict[Any, Any]):
    with pytest.raises(TypeError):
        codec.encode_state_dict(state_dict)


def forged_tree(tree: Any, arrays: Dict[str, np.ndarray] | None = None) -> bytes:
    return codec.encode_arrays(arrays or {}, metadata={codec.TREE_KEY: json.dumps(tree)})


@pytest.mark.parametrize(
    "data",
    [
        forged_tree({"dict": [["w", {"tensor": "missing"}]]}),
        forged_tree({"dict": []}, {"unused": np.ones(1)}),
        forged_tree({"dict": [["a", {"tensor": "w"}], ["b", {"tensor": "w"}]]}, {"w": np.ones(1)}),
        forged_tree({"pickle": "cos\nsystem"}),
        forged_tree({"dict": [[1.5, {"value": 1}]]}),
        forged_tree({"value": {"nested": "object"}}),
        forged_tree({"list": []}),
        forged_tree(json.loads('{"list": [' * 100 + "]}" * 100)),
        codec.encode_arrays({}, metadata={codec.TREE_KEY: "{not json"}),
    ],
    ids=["missing array", "unused array", "array used twice", "unknown tag", "float key", "bad value", "root not a dict",
         "too deep", "not JSON"],
)  # fmt: skip
def test_forged_state_dict_tree_is_refused(data: bytes):
    assert refused(codec.decode_state_dict, data).field == f"__metadata__.{codec.TREE_KEY}"


# ----------------------------------------------------------------------------------------------------------- inline


def test_inline_round_trip_and_caps():
    data = codec.encode_arrays({"reward": np.ones(3, np.float32)})
    text = codec.to_inline(data)
    assert json.loads(json.dumps({"arrays": text}))["arrays"] == text
    assert codec.from_inline(text, max_bytes=len(data)) == data
    assert refused(codec.from_inline, text, max_bytes=len(data) - 1, status=413).field == "inline"
    assert refused(codec.from_inline, "x" * 10_000, max_bytes=100, field="arrays", status=413).field == "arrays"
    refused(codec.from_inline, "not base64!")
    refused(codec.from_inline, "é")
    refused(codec.from_inline, b"AAAA")
