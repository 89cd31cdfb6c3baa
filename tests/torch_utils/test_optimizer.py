import math

import pytest
import torch

from nervex.torch_utils import Adam


def _param_with_grad(grad):
    param = torch.nn.Parameter(torch.zeros(len(grad)))
    param.grad = torch.tensor(grad)
    return param


def test_clip_norm_scales_the_gradient_to_the_bound():
    # ||(3, 4, 12)|| = 13; clipping to 1.3 scales by 1.3 / 13 = 0.1
    param = _param_with_grad([3.0, 4.0, 12.0])
    optimizer = Adam([param], lr=0.01, grad_clip_type="clip_norm", clip_value=1.3)
    optimizer.step()
    torch.testing.assert_close(param.grad, torch.tensor([0.3, 0.4, 1.2]), rtol=1e-5, atol=1e-6)
    assert param.grad.norm().item() <= 1.3 + 1e-5
    # the step used the clipped gradient: same result as plain Adam on the hand-clipped gradient
    reference = _param_with_grad([0.3, 0.4, 1.2])
    torch.optim.Adam([reference], lr=0.01).step()
    torch.testing.assert_close(param.detach(), reference.detach())


def test_clip_norm_leaves_small_gradients_alone():
    param = _param_with_grad([0.3, 0.4])  # norm 0.5 < 1
    Adam([param], grad_clip_type="clip_norm", clip_value=1.0).step()
    torch.testing.assert_close(param.grad, torch.tensor([0.3, 0.4]))


def test_clip_value_clamps_each_element():
    param = _param_with_grad([3.0, -4.0, 0.5])
    Adam([param], grad_clip_type="clip_value", clip_value=1.0).step()
    assert param.grad.tolist() == [1.0, -1.0, 0.5]


@pytest.mark.parametrize(
    "ignore_type, grad, skipped",
    [
        ("ignore_norm", [3.0, 4.0, 12.0], True),  # norm 13 > 10
        ("ignore_norm", [3.0, 4.0], False),  # norm 5
        ("ignore_norm", [math.nan, 1.0], True),  # non-finite never passes
        ("ignore_value", [11.0, 0.0], True),
        ("ignore_value", [-9.0, 9.0], False),
    ],
)
def test_grad_ignore_skips_the_step_and_counts_it(ignore_type, grad, skipped):
    param = _param_with_grad(grad)
    optimizer = Adam([param], lr=0.1, grad_ignore_type=ignore_type, ignore_value=10.0)
    optimizer.step()
    assert optimizer.ignored_steps == int(skipped)
    assert torch.equal(param.detach(), torch.zeros(len(grad))) == skipped


def test_ignore_is_checked_before_clipping():
    param = _param_with_grad([30.0, 40.0])  # norm 50: would be clipped to 1, but is ignored first
    optimizer = Adam(
        [param], grad_clip_type="clip_norm", clip_value=1.0, grad_ignore_type="ignore_norm", ignore_value=20
    )
    optimizer.step()
    assert optimizer.ignored_steps == 1 and param.grad.tolist() == [30.0, 40.0]


def test_closure_loss_is_returned():
    param = torch.nn.Parameter(torch.tensor([2.0]))
    optimizer = Adam([param], grad_clip_type="clip_norm", clip_value=1.0)

    def closure():
        optimizer.zero_grad()
        loss = (param**2).sum()
        loss.backward()
        return loss

    assert optimizer.step(closure).item() == 4.0
    assert param.grad.item() == pytest.approx(1.0, rel=1e-5)  # d/dp p^2 = 4, clipped to norm 1


def test_weight_decay_and_torch_kwargs_pass_through():
    optimizer = Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.5, weight_decay=0.01, amsgrad=True, foreach=False)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["amsgrad"], group["foreach"]) == (0.5, 0.01, True, False)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"grad_clip_type": "clip_nrom"},
            r"unknown grad_clip_type 'clip_nrom'; valid: clip_norm, clip_value.*'clip_norm'",
        ),
        ({"grad_ignore_type": "norm"}, r"unknown grad_ignore_type 'norm'; valid: ignore_norm, ignore_value"),
        ({"grad_clip_type": "clip_norm", "clip_value": 0.0}, "clip_value must be a positive"),
        ({"grad_ignore_type": "ignore_norm", "ignore_value": -1}, "ignore_value must be a positive"),
    ],
)
def test_bad_options_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Adam([torch.nn.Parameter(torch.zeros(1))], **kwargs)


def test_step_runs_registered_hooks_and_shows_in_the_profiler_like_torchs():
    # the fast path skips torch's profiler range and hook loop only while neither is in use
    param = _param_with_grad([1.0, -2.0])
    optimizer = Adam([param], lr=0.1)
    calls = []
    pre = optimizer.register_step_pre_hook(lambda opt, args, kwargs: calls.append("pre"))
    post = optimizer.register_step_post_hook(lambda opt, args, kwargs: calls.append("post"))
    optimizer.step()
    assert calls == ["pre", "post"]
    pre.remove(), post.remove()
    optimizer.step()
    assert calls == ["pre", "post"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        optimizer.step()
    assert any(e.name == "Optimizer.step#Adam.step" for e in prof.events())
    # three steps of lr 0.1 on a constant gradient move each coordinate by ~0.1 against its sign
    torch.testing.assert_close(param.detach(), torch.tensor([-0.3, 0.3]), rtol=1e-4, atol=1e-4)
