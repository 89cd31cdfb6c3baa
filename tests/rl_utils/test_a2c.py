"""A2C losses against values computed by hand."""

import pytest
import torch

from nervex.rl_utils import a2c_data, a2c_error


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float64, **kw)


def make(weight=None, entropy=None):
    logp = t([-0.5, -1.0, -2.0], requires_grad=True)
    value = t([1.0, 0.0, 2.0], requires_grad=True)
    adv = t([2.0, -1.0, 0.5], requires_grad=True)  # a graph-connected advantage must still be a constant
    return_ = t([3.0, -1.0, 2.0])
    return logp, value, adv, a2c_data(logp, entropy, value, adv, return_, weight)


def test_losses_and_gradients():
    logp, value, adv, data = make()
    loss = a2c_error(data)
    # -mean(adv * logp) = -(2 * -0.5 + -1 * -1 + 0.5 * -2) / 3 = -(-1 + 1 - 1) / 3
    assert loss.policy_loss.item() == pytest.approx(1.0 / 3)
    assert loss.value_loss.item() == pytest.approx((4.0 + 1.0 + 0.0) / 3)
    assert loss.entropy_loss.item() == 0.0 and loss.entropy_loss.dim() == 0
    (loss.policy_loss + loss.value_loss).backward()
    torch.testing.assert_close(logp.grad, t([-2.0 / 3, 1.0 / 3, -0.5 / 3]))
    torch.testing.assert_close(value.grad, t([2 * -2.0 / 3, 2 * 1.0 / 3, 0.0]))
    assert adv.grad is None  # no gradient flows into the advantages


def test_weights_and_entropy():
    entropy = t([1.0, 0.5, 0.0], requires_grad=True)
    _, _, _, data = make(weight=t([0.0, 2.0, 1.0]), entropy=entropy)
    loss = a2c_error(data)
    assert loss.policy_loss.item() == pytest.approx(-(0.0 + 2.0 * 1.0 + 1.0 * -1.0) / 3)
    assert loss.value_loss.item() == pytest.approx((0.0 + 2.0 * 1.0 + 0.0) / 3)
    assert loss.entropy_loss.item() == pytest.approx(-(0.0 + 2.0 * 0.5 + 0.0) / 3)
    loss.entropy_loss.backward()
    torch.testing.assert_close(entropy.grad, t([0.0, -2.0 / 3, -1.0 / 3]))


def test_time_major_shape():
    logp = torch.zeros(2, 3, dtype=torch.float64)
    adv = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    loss = a2c_error(a2c_data(logp - 1.0, None, logp, adv, logp + 2.0, None))
    assert loss.policy_loss.item() == pytest.approx(21.0 / 6)
    assert loss.value_loss.item() == pytest.approx(4.0)


def test_shape_mismatch_is_named():
    _, _, _, data = make()
    with pytest.raises(ValueError, match=r"value has shape \(3, 1\) but logp has shape \(3,\).*squeeze"):
        a2c_error(data._replace(value=torch.zeros(3, 1)))
    with pytest.raises(ValueError, match=r"return_ has shape \(2,\).*must be \(3,\)"):
        a2c_error(data._replace(return_=torch.zeros(2)))
