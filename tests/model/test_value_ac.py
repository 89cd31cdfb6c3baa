import math

import pytest
import torch
import torch.nn as nn

from nervex.model import ConvDiscreteNet, ConvValueAC, ValueAC, create_model
from nervex.utils import MODEL_REGISTRY

MODES = ("compute_action", "compute_value", "compute_action_value")
ACTION_KEYS = {"discrete": {"logit"}, "continuous": {"mu", "sigma"}}


def _linears(module: nn.Module) -> list:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def _leaf_layers(module: nn.Module) -> list:
    return [
        (type(m), tuple(m.weight.shape) if hasattr(m, "weight") else None)
        for m in module.modules()
        if not list(m.children())
    ]


def _assert_orthogonal(weight: torch.Tensor, gain: float) -> None:
    w = weight.detach().flatten(start_dim=1)  # conv kernels as (out, in * kh * kw)
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    torch.testing.assert_close(gram, gain**2 * torch.eye(gram.shape[0]), atol=1e-5 * max(gain**2, 1.0), rtol=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("share_encoder", [False, True])
@pytest.mark.parametrize("action_space", ["discrete", "continuous"])
def test_value_ac_keys_and_shapes(action_space, share_encoder, mode):
    model = ValueAC(4, 3, action_space=action_space, hidden_sizes=(16, 8), share_encoder=share_encoder)
    out = model(torch.randn(5, 4), mode=mode)
    expected = set() if mode == "compute_value" else set(ACTION_KEYS[action_space])
    if mode != "compute_action":
        expected.add("value")
    assert set(out) == expected
    for key in expected - {"value"}:
        assert out[key].shape == (5, 3)
    if "value" in out:
        assert out["value"].shape == (5,)


@pytest.mark.parametrize("action_space", ["discrete", "continuous"])
def test_value_ac_keeps_leading_dims_and_flattens_obs_shape(action_space):
    model = ValueAC((2, 3), 4, action_space=action_space, hidden_sizes=(8,))
    x = torch.randn(7, 5, 2, 3)  # (T, B, *obs_shape)
    out = model(x)
    for key in ACTION_KEYS[action_space]:
        assert out[key].shape == (7, 5, 4)
    assert out["value"].shape == (7, 5)
    # each (t, b) row is the same as running it alone
    torch.testing.assert_close(out["value"][3, 2], model(x[3, 2:3])["value"][0])


def test_value_ac_casts_integer_input_and_names_expected_shape():
    model = ValueAC(4, 2)
    ints = torch.tensor([[1, 0, 2, 3]], dtype=torch.int64)
    for key, value in model(ints).items():
        torch.testing.assert_close(value, model(ints.float())[key])
    with pytest.raises(ValueError, match=r"ValueAC expects input of shape \(B, 4\), got \(2, 3\)"):
        model(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"expects input of shape \(B, 2, 3\), got \(5, 6\)"):
        ValueAC((2, 3), 2)(torch.zeros(5, 6))


def test_value_ac_by_hand_without_hidden_layers():
    # no trunk layers: logit = W_pi x + b_pi, value = w_v . x + b_v
    model = ValueAC(2, 2, hidden_sizes=())
    with torch.no_grad():
        model.action_head.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, -1.0]]))
        model.action_head.bias.copy_(torch.tensor([0.5, 0.0]))
        model.value_head.weight.copy_(torch.tensor([[3.0, -1.0]]))
        model.value_head.bias.fill_(1.0)
    out = model(torch.tensor([[1.0, 1.0], [2.0, 0.0]]))
    torch.testing.assert_close(out["logit"], torch.tensor([[3.5, -1.0], [2.5, 0.0]]))
    torch.testing.assert_close(out["value"], torch.tensor([3.0, 7.0]))


def test_compute_value_with_separate_trunks_leaves_the_policy_alone():
    model = ValueAC(4, 2, action_space="continuous")
    model(torch.randn(6, 4), mode="compute_value")["value"].sum().backward()
    policy_params = [*model.policy_net.parameters(), *model.action_head.parameters(), model.log_std]
    assert len(policy_params) == 4 + 2 + 1
    assert all(p.grad is None for p in policy_params)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.value_net.parameters())

    model.zero_grad(set_to_none=True)
    out = model(torch.randn(6, 4), mode="compute_action")
    (out["mu"].sum() + out["sigma"].sum()).backward()
    assert all(p.grad is None for p in [*model.value_net.parameters(), *model.value_head.parameters()])
    assert model.log_std.grad is not None


def test_compute_value_with_a_shared_trunk_trains_the_trunk():
    model = ValueAC(4, 2, share_encoder=True)
    assert not list(model.policy_net.parameters()) and not list(model.value_net.parameters())
    model(torch.randn(6, 4), mode="compute_value")["value"].sum().backward()
    assert all(p.grad is not None for p in model.encoder.parameters())
    assert all(p.grad is None for p in model.action_head.parameters())


def test_value_hidden_sizes_sets_the_value_trunk_only():
    model = ValueAC(4, 2, hidden_sizes=(32,), value_hidden_sizes=(16, 8))
    assert [layer.out_features for layer in _linears(model.policy_net)] == [32]
    assert [layer.out_features for layer in _linears(model.value_net)] == [16, 8]
    assert model.value_head.in_features == 8 and model.action_head.in_features == 32


@pytest.mark.parametrize("share_encoder", [False, True])
def test_value_ac_orthogonal_init_matches_sb3_gains(share_encoder):
    torch.manual_seed(0)
    model = ValueAC(4, 2, share_encoder=share_encoder)
    trunk = model.encoder if share_encoder else model.policy_net
    first, second = _linears(trunk)
    assert first.weight.shape == (64, 4) and second.weight.shape == (64, 64)
    _assert_orthogonal(first.weight, math.sqrt(2))  # out > in: the columns are orthonormal * sqrt(2)
    _assert_orthogonal(second.weight, math.sqrt(2))  # square: W W^T = 2 I
    _assert_orthogonal(model.action_head.weight, 0.01)  # (2, 64): W W^T = 1e-4 I
    _assert_orthogonal(model.value_head.weight, 1.0)  # (1, 64): a unit row
    if not share_encoder:
        for layer in _linears(model.value_net):
            _assert_orthogonal(layer.weight, math.sqrt(2))
    for layer in _linears(model):
        assert torch.count_nonzero(layer.bias) == 0


def test_value_ac_without_ortho_init_keeps_pytorch_default():
    torch.manual_seed(0)
    model = ValueAC(4, 2, ortho_init=False)
    # PyTorch's default draws biases from U(-1/sqrt(in), 1/sqrt(in)), so they are not zero
    assert all(torch.count_nonzero(layer.bias) > 0 for layer in _linears(model))
    w = model.action_head.weight.detach()
    assert not torch.allclose(w @ w.T, 1e-4 * torch.eye(2), atol=1e-5, rtol=0)


def test_continuous_sigma_is_exp_log_std_init():
    model = ValueAC(3, 2, action_space="continuous", log_std_init=-0.5)
    named = dict(model.named_parameters())
    assert "log_std" in named and named["log_std"].shape == (2,)
    assert sum(p is model.log_std for p in model.parameters()) == 1
    out = model(torch.randn(4, 3))
    torch.testing.assert_close(out["sigma"], torch.full((4, 2), math.exp(-0.5)))
    with torch.no_grad():
        model.log_std.copy_(torch.tensor([0.0, math.log(3.0)]))
    torch.testing.assert_close(model(torch.randn(2, 3))["sigma"], torch.tensor([[1.0, 3.0], [1.0, 3.0]]))


def test_default_parameter_count_equals_sb3_mlp_policy_on_cartpole():
    trunk = (4 * 64 + 64) + (64 * 64 + 64)  # obs 4 -> 64 -> 64, tanh
    expected = 2 * trunk + (64 * 2 + 2) + (64 + 1)  # pi and vf trunks, action head, value head
    assert expected == 9155
    assert sum(p.numel() for p in ValueAC(4, 2).parameters()) == expected
    # Pendulum: obs 3, one action dimension, plus the free log_std
    trunk = (3 * 64 + 64) + (64 * 64 + 64)
    expected = 2 * trunk + (64 * 1 + 1) + (64 + 1) + 1
    assert sum(p.numel() for p in ValueAC(3, 1, action_space="continuous").parameters()) == expected


@pytest.mark.parametrize(
    "obs_dim, action_space, n_actions",
    [(4, "discrete", 2), (3, "continuous", 1)],  # CartPole-v1, Pendulum-v1
)
def test_parameter_shapes_match_sb3_actor_critic_policy(obs_dim, action_space, n_actions):
    gymnasium = pytest.importorskip("gymnasium")
    policies = pytest.importorskip("stable_baselines3.common.policies")
    obs_space = gymnasium.spaces.Box(-1.0, 1.0, (obs_dim,))
    if action_space == "discrete":
        act_space = gymnasium.spaces.Discrete(n_actions)
    else:
        act_space = gymnasium.spaces.Box(-1.0, 1.0, (n_actions,))
    sb3 = policies.ActorCriticPolicy(obs_space, act_space, lambda _: 3e-4)
    ours = ValueAC(obs_dim, n_actions, action_space=action_space)
    assert sorted(p.shape for p in ours.parameters()) == sorted(p.shape for p in sb3.parameters())
    for sb3_trunk, our_trunk in [
        (sb3.mlp_extractor.policy_net, ours.policy_net),
        (sb3.mlp_extractor.value_net, ours.value_net),
    ]:
        assert _leaf_layers(our_trunk) == _leaf_layers(sb3_trunk)  # Linear(obs, 64), Tanh, Linear(64, 64), Tanh


def test_value_ac_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"action_space must be one of discrete, continuous, got 'box'"):
        ValueAC(4, 2, action_space="box")
    with pytest.raises(ValueError, match="value_hidden_sizes applies only with share_encoder=False"):
        ValueAC(4, 2, share_encoder=True, value_hidden_sizes=(8,))
    with pytest.raises(ValueError, match="log_std_init applies only to action_space='continuous'"):
        ValueAC(4, 2, log_std_init=-1.0)
    with pytest.raises(ValueError, match="action_dim must be a positive int, got 0"):
        ValueAC(4, 0)
    with pytest.raises(ValueError, match="action_dim must be a positive int, got 2.0"):
        ValueAC(4, 2.0)
    with pytest.raises(ValueError, match="unknown activation 'tanhh'"):
        ValueAC(4, 2, activation="tanhh")
    model = ValueAC(4, 2)
    with pytest.raises(
        ValueError,
        match=r"mode must be one of compute_action, compute_value, compute_action_value, "
        r"got 'compute_values'; did you mean 'compute_value'\?",
    ):
        model(torch.zeros(1, 4), mode="compute_values")


@pytest.mark.parametrize("mode", MODES)
def test_conv_value_ac_on_uint8_frames(mode):
    torch.manual_seed(0)
    model = ConvValueAC((4, 84, 84), action_dim=6)
    assert _linears(model.encoder)[0].in_features == 64 * 7 * 7  # 84 -> 20 -> 9 -> 7
    frames = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    out = model(frames, mode=mode)
    expected = {"compute_action": {"logit"}, "compute_value": {"value"}, "compute_action_value": {"logit", "value"}}
    assert set(out) == expected[mode]
    if "logit" in out:
        assert out["logit"].shape == (2, 6) and out["logit"].dtype == torch.float32
    if "value" in out:
        assert out["value"].shape == (2,) and out["value"].dtype == torch.float32
    scaled = model(frames.float() / 255.0, mode=mode)
    for key, value in out.items():
        torch.testing.assert_close(value, scaled[key])


def test_conv_value_ac_keeps_leading_dims_and_checks_shape():
    model = ConvValueAC((1, 36, 36), action_dim=3, hidden_size=16)
    out = model(torch.rand(5, 2, 1, 36, 36))
    assert out["logit"].shape == (5, 2, 3) and out["value"].shape == (5, 2)
    with pytest.raises(ValueError, match=r"ConvValueAC expects input of shape \(B, 1, 36, 36\), got \(3, 36, 36\)"):
        model(torch.zeros(3, 36, 36))
    with pytest.raises(ValueError, match="ConvValueAC obs_shape .* H and W must be at least 36"):
        ConvValueAC((4, 32, 84), action_dim=2)
    with pytest.raises(ValueError, match=r"ConvValueAC obs_shape must be \(C, H, W\)"):
        ConvValueAC((84, 84), action_dim=2)
    with pytest.raises(ValueError, match="ConvValueAC forward mode must be one of"):
        model(torch.zeros(1, 1, 36, 36), mode="act")


def test_conv_value_ac_orthogonal_init():
    torch.manual_seed(0)
    model = ConvValueAC((4, 84, 84), action_dim=6)
    conv1 = model.encoder[0][0]
    assert conv1.weight.shape == (32, 4, 8, 8)
    _assert_orthogonal(conv1.weight, math.sqrt(2))  # (32, 256): W W^T = 2 I
    fc = _linears(model.encoder)[0]
    _assert_orthogonal(fc.weight, math.sqrt(2))  # (512, 3136)
    _assert_orthogonal(model.action_head.weight, 0.01)
    _assert_orthogonal(model.value_head.weight, 1.0)
    for layer in model.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            assert torch.count_nonzero(layer.bias) == 0
    head_params = (512 * 6 + 6) + (512 + 1)
    encoder_params = (4 * 32 * 64 + 32) + (32 * 64 * 16 + 64) + (64 * 64 * 9 + 64) + (3136 * 512 + 512)
    assert sum(p.numel() for p in model.parameters()) == encoder_params + head_params


def test_conv_value_ac_trunk_is_conv_discrete_net_trunk():
    torch.manual_seed(0)
    q_net = ConvDiscreteNet((4, 84, 84), action_dim=6)
    model = ConvValueAC((4, 84, 84), action_dim=6)
    # same layout and keys: the Q-network's trunk loads into the actor-critic as is
    model.encoder.load_state_dict(q_net.encoder.state_dict())
    x = torch.rand(3, 4, 84, 84)
    torch.testing.assert_close(model.encoder(x), q_net.encoder(x))


def test_registry_and_create_model():
    assert MODEL_REGISTRY.get("value_ac") is ValueAC
    assert MODEL_REGISTRY.get("conv_value_ac") is ConvValueAC
    model = create_model("value_ac", obs_dim=3, action_dim=2, action_space="continuous", hidden_sizes=[8])
    assert isinstance(model, ValueAC) and set(model(torch.zeros(1, 3))) == {"mu", "sigma", "value"}
    model = create_model("conv_value_ac", obs_shape=(1, 36, 36), action_dim=2, hidden_size=8)
    assert isinstance(model, ConvValueAC) and model(torch.zeros(1, 1, 36, 36))["logit"].shape == (1, 2)


# ---- LSTM cores (IMPALA) ------------------------------------------------------------------------------------------
def _lstm_model(action_space: str = "discrete", layers: int = 1, share_encoder: bool = False) -> ValueAC:
    torch.manual_seed(0)
    return ValueAC(
        4,
        3,
        action_space=action_space,
        hidden_sizes=(8,),
        lstm_hidden_size=6,
        lstm_layers=layers,
        share_encoder=share_encoder,
    )


@pytest.mark.parametrize("share_encoder", [False, True])
@pytest.mark.parametrize("action_space", ["discrete", "continuous"])
def test_lstm_sequence_forward_equals_stepping_with_the_state(action_space, share_encoder):
    model = _lstm_model(action_space, layers=2, share_encoder=share_encoder)
    rows = 2 if share_encoder else 4  # two layers per core; separate policy and value cores by default
    assert model.recurrent and model.state_rows == rows and (model.value_core is None) == share_encoder
    obs = torch.randn(5, 3, 4)  # (T, B, obs)
    prev = {"h": torch.randn(3, rows, 6), "c": torch.randn(3, rows, 6)}  # batch first
    seq = model({"obs": obs, "prev_state": prev})
    key = "logit" if action_space == "discrete" else "mu"
    assert seq[key].shape == (5, 3, 3) and seq["value"].shape == (5, 3)
    state = prev
    for t in range(5):
        step = model({"obs": obs[t], "prev_state": state})
        assert step[key].shape == (3, 3) and step["value"].shape == (3,)
        torch.testing.assert_close(step[key], seq[key][t])
        torch.testing.assert_close(step["value"], seq["value"][t])
        state = step["next_state"]
    assert set(state) == {"h", "c"} and state["h"].shape == (3, rows, 6) and state["c"].shape == (3, rows, 6)
    torch.testing.assert_close(state, seq["next_state"])
    # each env's row depends on its own state only
    one = model({"obs": obs[:, 1:2], "prev_state": {k: v[1:2] for k, v in prev.items()}})
    torch.testing.assert_close(one["value"], seq["value"][:, 1:2])


def test_lstm_separate_cores_keep_policy_and_value_apart():
    model = _lstm_model(layers=2)
    obs = torch.randn(4, 3, 4)
    prev = {"h": torch.randn(3, 4, 6), "c": torch.randn(3, 4, 6)}
    out = model({"obs": obs, "prev_state": prev})
    # rows 0-1 are the policy core's state, rows 2-3 the value core's: changing the value rows moves only the value
    other = {k: v.clone() for k, v in prev.items()}
    other["h"][:, 2:] += 1.0
    moved = model({"obs": obs, "prev_state": other})
    torch.testing.assert_close(moved["logit"], out["logit"])
    assert not torch.allclose(moved["value"], out["value"])
    # the value loss reaches neither the policy trunk nor the policy core
    model.zero_grad()
    out["value"].sum().backward()
    policy_params = [*model.policy_net.parameters(), *model.core.parameters(), *model.action_head.parameters()]
    assert all(p.grad is None for p in policy_params)
    assert all(p.grad is not None for p in model.value_core.parameters())


def test_lstm_zero_state_formats_agree():
    model = _lstm_model(layers=2)
    obs = torch.randn(4, 3, 4)
    zeros = model({"obs": obs, "prev_state": model.initial_state(batch_size=3)})
    for other in (model(obs), model({"obs": obs}), model({"obs": obs, "prev_state": None})):
        torch.testing.assert_close(other["value"], zeros["value"])
    stored = {"h": torch.randn(3, 4, 6).numpy(), "c": torch.randn(3, 4, 6).numpy()}  # arrays, as replay stores them
    assert not torch.allclose(model({"obs": obs, "prev_state": stored})["value"], zeros["value"])


def test_lstm_hand_case_without_trunk():
    # one shared unit, no trunk layers: the LSTM equations by hand for two steps from a zero state
    model = ValueAC(1, 2, hidden_sizes=(), lstm_hidden_size=1, share_encoder=True, ortho_init=False)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.core.weight_ih_l0.copy_(torch.tensor([[1.0], [2.0], [0.5], [-1.0]]))  # input, forget, cell, output
        model.core.weight_hh_l0.fill_(1.0)
        model.value_head.weight.fill_(2.0)
        model.action_head.weight.copy_(torch.tensor([[1.0], [-1.0]]))
    x1, x2 = 1.0, -2.0

    def step(x, h, c):
        i, f = torch.sigmoid(torch.tensor(x + h)), torch.sigmoid(torch.tensor(2 * x + h))
        g, o = torch.tanh(torch.tensor(0.5 * x + h)), torch.sigmoid(torch.tensor(-x + h))
        c = f * c + i * g
        return float(o * torch.tanh(c)), float(c)

    h1, c1 = step(x1, 0.0, 0.0)
    h2, c2 = step(x2, h1, c1)
    out = model(torch.tensor([[[x1]], [[x2]]]))
    torch.testing.assert_close(out["value"], torch.tensor([[2 * h1], [2 * h2]]))
    torch.testing.assert_close(out["logit"], torch.tensor([[[h1, -h1]], [[h2, -h2]]]))
    torch.testing.assert_close(out["next_state"]["c"], torch.tensor([[[c2]]]))


def test_lstm_gradients_reach_the_trunk_through_time():
    model = _lstm_model(share_encoder=True)
    model(torch.randn(6, 2, 4))["value"][-1].sum().backward()  # only the last step's value
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.parameters())
    assert model.core.weight_hh_l0.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.action_head.parameters())


def test_lstm_parameter_count_and_registry():
    lstm = 4 * 32 * (64 + 32) + 2 * 4 * 32
    trunk = 4 * 64 + 64
    heads = (32 * 2 + 2) + (32 + 1)
    shared = create_model(
        "value_ac", obs_dim=4, action_dim=2, hidden_sizes=[64], lstm_hidden_size=32, share_encoder=True
    )
    assert sum(p.numel() for p in shared.parameters()) == trunk + lstm + heads
    separate = create_model("value_ac", obs_dim=4, action_dim=2, hidden_sizes=[64], lstm_hidden_size=32)
    assert sum(p.numel() for p in separate.parameters()) == 2 * (trunk + lstm) + heads
    state = separate.initial_state()
    assert set(state) == {"h", "c"} and state["h"].shape == (2, 32) and not state["h"].any()
    assert shared.initial_state()["h"].shape == (1, 32) and ValueAC(4, 2).state_rows == 0


def test_lstm_rejects_bad_arguments_and_inputs():
    with pytest.raises(ValueError, match="lstm_hidden_size must be a positive int, got 0"):
        ValueAC(4, 2, lstm_hidden_size=0)
    with pytest.raises(ValueError, match="lstm_layers must be a positive int, got 1.5"):
        ValueAC(4, 2, lstm_hidden_size=4, lstm_layers=1.5)
    with pytest.raises(ValueError, match="value_hidden_sizes applies only with share_encoder=False"):
        ValueAC(4, 2, lstm_hidden_size=4, share_encoder=True, value_hidden_sizes=(8,))
    model = _lstm_model()
    with pytest.raises(ValueError, match=r"one step \(B, 4\) or a time-major sequence \(T, B, 4\), got \(2, 3, 5, 4\)"):
        model(torch.zeros(2, 3, 5, 4))
    with pytest.raises(ValueError, match=r"prev_state needs 'h' and 'c' of shape \(B, R, H\) = \(2, 2, 6\)"):
        model({"obs": torch.zeros(2, 4), "prev_state": {"h": torch.zeros(2, 1, 6), "c": torch.zeros(2, 1, 6)}})
    with pytest.raises(ValueError, match=r"prev_state must be None or \{'h', 'c'\} .* got \['h'\]"):
        model({"obs": torch.zeros(2, 4), "prev_state": {"h": torch.zeros(2, 2, 6)}})
    with pytest.raises(ValueError, match="prev_state must be None or .* got list"):
        model({"obs": torch.zeros(2, 4), "prev_state": [None, None]})
    with pytest.raises(TypeError, match="without an LSTM takes an observation tensor, got a dict"):
        ValueAC(4, 2)({"obs": torch.zeros(2, 4)})
    with pytest.raises(RuntimeError, match="has no LSTM"):
        ValueAC(4, 2).initial_state()
