"""Samples from real policies' Adders survive encode -> decode with their types; malformed files are refused."""

import json
import os

import numpy as np
import pytest
import torch

from nervex.config import read_config
from nervex.entry import SerialTrainer
from nervex.system.comm.codec import decode_arrays_and_metadata, encode_arrays
from nervex.system.comm.errors import ProtocolError
from nervex.system.samples import SAMPLES_KEY, decode_samples, encode_samples

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config")


def collect(tmp_path, name, min_samples=1):
    cfg = read_config(os.path.join(CARTPOLE, name))
    cfg.env.update(manager_type="base", collector_env_num=2, evaluator_env_num=1)
    with SerialTrainer(cfg, seed=0, exp_name=name, run_root=str(tmp_path)) as trainer:
        samples = []
        while len(samples) < min_samples:
            setting = trainer.policy.command_mode.get_setting_collect(trainer.command_info())
            samples += trainer.actor.collect(trainer.contract.collect, setting)
    return samples


def assert_same(a, b, where=""):
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    else:
        assert a == b, where


@pytest.mark.parametrize("config", ["cartpole_dqn.yaml", "cartpole_r2d2.yaml", "cartpole_ppo.yaml"])
def test_real_samples_round_trip_with_their_types(tmp_path, config):
    samples = collect(tmp_path, config)
    decoded, metadata = decode_samples(encode_samples(samples, metadata={"task_id": "t1"}))
    assert metadata == {"task_id": "t1"}
    assert len(decoded) == len(samples)
    for i, (a, b) in enumerate(zip(samples, decoded)):
        assert_same(a, b, f"sample {i}")


def test_a_nested_recurrent_state_keeps_its_nesting():
    samples = [{"obs": np.full(3, i, np.float32), "prev_state": {"h": torch.full((1, 2), float(i))}} for i in range(4)]
    decoded, _ = decode_samples(encode_samples(samples))
    assert torch.equal(decoded[3]["prev_state"]["h"], torch.full((1, 2), 3.0))
    assert decoded[0]["obs"].dtype == np.float32 and decoded[2]["obs"][0] == 2.0


def sample(reward=1.0):
    return {"obs": np.zeros(4, np.float32), "action": np.int64(1), "reward": np.float32(reward), "done": False}


def test_a_nan_reward_is_refused_naming_reward():
    data = encode_samples([sample(), sample(float("nan"))])
    with pytest.raises(ProtocolError) as e:
        decode_samples(data)
    assert e.value.status == 400 and e.value.field == "reward" and "sample 1" in e.value.message


def forged(arrays, layout):
    return encode_arrays(arrays, metadata={SAMPLES_KEY: json.dumps(layout)} if layout is not None else None)


@pytest.mark.parametrize(
    "arrays, layout, field",
    [
        ({"obs": np.zeros((2, 4), np.float32)}, None, "__metadata__.nervex.samples"),
        ({"obs": np.zeros((2, 4), np.float32)}, {"n": 3, "kinds": {"obs": "ndarray"}}, "obs"),
        ({"obs": np.zeros((2, 4), np.float32)}, {"n": 2, "kinds": {"obs": "ndarray", "act": "int"}}, "act"),
        (
            {"obs": np.zeros((2, 4), np.float32)},
            {"n": 2, "kinds": {"obs": "pickle"}},
            "__metadata__.nervex.samples.kinds",
        ),
        ({"obs": np.zeros((2, 4), np.float32)}, {"n": 0, "kinds": {"obs": "ndarray"}}, "__metadata__.nervex.samples.n"),
        ({"done": np.zeros(2, np.float32)}, {"n": 2, "kinds": {"done": "bool"}}, "done"),
        ({"action": np.zeros((2, 2), np.int64)}, {"n": 2, "kinds": {"action": "int"}}, "action"),
    ],
    ids=["no layout", "wrong rows", "leaf missing", "unknown kind", "no samples", "bool as float", "scalar as matrix"],
)
def test_forged_sample_files_are_refused_naming_the_field(arrays, layout, field):
    with pytest.raises(ProtocolError) as e:
        decode_samples(forged(arrays, layout))
    assert e.value.status == 400 and e.value.field == field


def test_samples_that_differ_are_refused_at_the_actor():
    with pytest.raises(ValueError, match="keys that differ"):
        encode_samples([sample(), {**sample(), "extra": 1}])
    with pytest.raises(ValueError, match="'action' is a int, sample 0's a numpy"):
        encode_samples([sample(), {**sample(), "action": 1}])
    with pytest.raises(ValueError, match="different shapes"):
        encode_samples([sample(), {**sample(), "obs": np.zeros(5, np.float32)}])
    with pytest.raises(ValueError, match="at least one"):
        encode_samples([])


def test_the_file_is_plain_safetensors_with_one_array_per_leaf():
    arrays, metadata = decode_arrays_and_metadata(encode_samples([sample(), sample(2.0)]))
    assert sorted(arrays) == ["action", "done", "obs", "reward"]
    assert arrays["obs"].shape == (2, 4) and arrays["reward"].tolist() == [1.0, 2.0]
    assert json.loads(metadata[SAMPLES_KEY])["n"] == 2
