"""Running statistics against NumPy over the whole data and reward scaling against a hand-run reference."""

import math

import numpy as np
import pytest
import torch

from nervex.torch_utils import ReturnNormalizer, RunningMeanStd


def moments_with_prior(samples, epsilon):
    """Mean and variance of the samples together with a pseudo-batch of weight ``epsilon``, mean 0 and variance 1.

    This is what the running statistics must equal, written as one weighted sum over all the data.
    """
    total = epsilon + len(samples)
    mean = sum(samples) / total
    m2 = epsilon * (1.0 + mean**2) + sum((x - mean) ** 2 for x in samples)
    return mean, m2 / total


class TestRunningMeanStd:
    def test_matches_numpy_over_concatenated_batches(self):
        rng = np.random.default_rng(0)
        batches = [rng.normal(3.0, 2.0, size=(n, 2)) * [1.0, 10.0] for n in (1, 7, 50, 3)]
        rms = RunningMeanStd(shape=(2,), epsilon=0.0)
        for batch in batches:
            rms.update(batch)
        everything = np.concatenate(batches)
        np.testing.assert_allclose(rms.mean, everything.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(rms.var, everything.var(axis=0), rtol=1e-12)
        assert rms.count == 61 and rms.mean.dtype == np.float64

    def test_default_epsilon_acts_as_a_prior_pseudo_batch(self):
        rms = RunningMeanStd()
        for batch in ([1.0, 2.0], [4.0], [-3.0, 0.5, 2.5]):
            rms.update(np.array(batch))
        mean, var = moments_with_prior([1.0, 2.0, 4.0, -3.0, 0.5, 2.5], 1e-4)
        assert rms.mean == pytest.approx(mean, rel=1e-12) and rms.var == pytest.approx(var, rel=1e-12)
        assert rms.count == pytest.approx(6.0001)

    def test_tensor_batch_and_empty_batch(self):
        rms = RunningMeanStd(shape=(1,), epsilon=0.0)
        rms.update(torch.tensor([[1.0], [3.0]]))
        rms.update(np.zeros((0, 1)))
        np.testing.assert_allclose(rms.mean, [2.0])
        np.testing.assert_allclose(rms.var, [1.0])

    def test_normalize_numpy_and_tensor(self):
        rms = RunningMeanStd(shape=(2,), epsilon=0.0)
        rms.update(np.array([[1.0, 0.0], [3.0, 0.0]]))  # mean (2, 0), var (1, 0)
        out = rms.normalize(np.array([[4.0, 0.5], [-100.0, 0.0]]), clip=5.0)
        assert out.dtype == np.float32
        # (4 - 2) / sqrt(1 + 1e-8); 0.5 / sqrt(0 + 1e-8) = 5000 -> clipped to 5; (-100 - 2) / 1 -> -5
        np.testing.assert_allclose(out, [[2.0 / math.sqrt(1 + 1e-8), 5.0], [-5.0, 0.0]], rtol=1e-6)
        tensor_out = rms.normalize(torch.tensor([[4.0, 0.5]], dtype=torch.float64), clip=5.0)
        assert tensor_out.dtype == torch.float64
        torch.testing.assert_close(tensor_out, torch.tensor([[2.0 / math.sqrt(1 + 1e-8), 5.0]], dtype=torch.float64))
        int_out = rms.normalize(torch.tensor([[4, 0]]))
        assert int_out.dtype == torch.float32 and int_out[0].tolist() == pytest.approx([2.0, 0.0], rel=1e-6)

    def test_update_shape_mismatch_raises(self):
        with pytest.raises(ValueError, match=r"x has shape \(4, 3\); expected \(N, \*\(2,\)\)"):
            RunningMeanStd(shape=(2,)).update(np.zeros((4, 3)))

    def test_state_dict_roundtrip_weights_only(self, tmp_path):
        rms = RunningMeanStd(shape=(2,))
        rms.update(np.array([[1.0, 2.0], [3.0, -4.0], [0.0, 0.5]]))
        path = tmp_path / "rms.pt"
        torch.save(rms.state_dict(), path)
        state = torch.load(path, weights_only=True)
        assert isinstance(state["mean"], torch.Tensor) and isinstance(state["count"], float)
        restored = RunningMeanStd(shape=(2,))
        restored.load_state_dict(state)
        np.testing.assert_array_equal(restored.mean, rms.mean)
        np.testing.assert_array_equal(restored.var, rms.var)
        assert restored.count == rms.count
        state["mean"][0] = 99.0  # the state is a copy, not a view of the live statistics
        assert rms.mean[0] != 99.0

    def test_load_shape_mismatch_names_both_shapes(self):
        state = RunningMeanStd(shape=(3,)).state_dict()
        with pytest.raises(ValueError, match=r"saved mean has shape \(3,\) but this normalizer's shape is \(2,\)"):
            RunningMeanStd(shape=(2,)).load_state_dict(state)


GAMMA = 0.5
# env id, reward, done; env "a" ends its episode at the third step, so its running return restarts
STEPS = [
    ("a", 1.0, False),
    ("b", 2.0, False),
    ("a", 2.0, True),
    ("b", 2.0, False),
    ("a", 3.0, False),
    ("b", -1.0, False),
]
RETURNS = [1.0, 2.0, 0.5 * 1.0 + 2.0, 0.5 * 2.0 + 2.0, 3.0, 0.5 * 3.0 - 1.0]  # hand-run running returns


class TestReturnNormalizer:
    def test_against_hand_run_reference(self):
        normalizer = ReturnNormalizer(GAMMA)
        for k, (env_id, reward, done) in enumerate(STEPS):
            _, var = moments_with_prior(RETURNS[: k + 1], 1e-4)
            expected = max(-10.0, min(10.0, reward / math.sqrt(var + 1e-8)))
            assert normalizer.scale(env_id, reward, done) == pytest.approx(expected, rel=1e-10), STEPS[k]
        # the last scaled reward is inside the clip range (the first is clipped: see test_first_reward_is_clipped)
        _, var = moments_with_prior(RETURNS, 1e-4)
        assert -1.0 / math.sqrt(var) > -10.0
        assert normalizer.returns == {"a": 3.0, "b": 0.5}

    def test_first_reward_is_clipped(self):
        assert ReturnNormalizer(0.99, clip=10.0).scale(0, 1.0, False) == 10.0
        assert ReturnNormalizer(0.99, clip=3.0).scale(0, -1.0, False) == -3.0

    def test_num_envs_hint_and_any_hashable_id(self):
        normalizer = ReturnNormalizer(0.9, num_envs_hint=2)
        assert normalizer.returns == {0: 0.0, 1: 0.0}
        normalizer.scale(("worker", 3), 1.0, False)
        assert normalizer.returns[("worker", 3)] == 1.0

    def test_state_dict_keeps_statistics_not_running_returns(self, tmp_path):
        normalizer = ReturnNormalizer(GAMMA)
        for env_id, reward, done in STEPS:
            normalizer.scale(env_id, reward, done)
        torch.save(normalizer.state_dict(), tmp_path / "ret.pt")
        restored = ReturnNormalizer(GAMMA)
        restored.load_state_dict(torch.load(tmp_path / "ret.pt", weights_only=True))
        assert restored.returns == {}
        assert restored.ret_rms.var == normalizer.ret_rms.var and restored.ret_rms.count == normalizer.ret_rms.count
        with pytest.raises(ValueError, match="missing key 'ret_rms'"):
            restored.load_state_dict({})
