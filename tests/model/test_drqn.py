import pytest
import torch

from nervex.model import DRQN, create_model


def _state(batch, layers, hidden, keys, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(batch, layers, hidden, generator=g) for k in keys}


@pytest.mark.parametrize("rnn, keys", [("lstm", ("h", "c")), ("gru", ("h",))])
def test_one_step_shapes_and_initial_state(rnn, keys):
    model = DRQN(4, 3, encoder_hidden_sizes=[16], hidden_size=8, rnn=rnn, num_layers=2)
    zero = model.initial_state()
    assert set(zero) == set(keys) and all(v.shape == (2, 8) and not v.any() for v in zero.values())
    assert all(v.shape == (5, 2, 8) for v in model.initial_state(5).values())
    out = model({"obs": torch.randn(5, 4), "prev_state": model.initial_state(5)})
    assert out["logit"].shape == (5, 3)
    assert set(out["next_state"]) == set(keys) and all(v.shape == (5, 2, 8) for v in out["next_state"].values())
    # None means the zero state
    obs = torch.randn(5, 4)
    none = model({"obs": obs, "prev_state": None})
    assert torch.equal(none["logit"], model({"obs": obs, "prev_state": model.initial_state(5)})["logit"])


@pytest.mark.parametrize("rnn", ["lstm", "gru"])
def test_sequence_forward_equals_repeated_one_step_forward(rnn):
    torch.manual_seed(0)
    model = DRQN(4, 3, encoder_hidden_sizes=[16], hidden_size=8, rnn=rnn, num_layers=2)
    obs = torch.randn(6, 5, 4)  # (T, B, obs)
    state = _state(5, 2, 8, model.state_keys)
    seq = model({"obs": obs, "prev_state": state}, sequence=True)
    assert seq["logit"].shape == (6, 5, 3)
    step_state, logits = state, []
    for t in range(6):
        out = model({"obs": obs[t], "prev_state": step_state})
        logits.append(out["logit"])
        step_state = out["next_state"]
    torch.testing.assert_close(seq["logit"], torch.stack(logits))
    for key in model.state_keys:
        torch.testing.assert_close(seq["next_state"][key], step_state[key])


def test_state_batch_axis_is_first_rows_are_independent():
    # row b of the state belongs to sample b only: permuting the batch permutes outputs and states alike
    torch.manual_seed(0)
    model = DRQN(4, 3, encoder_hidden_sizes=[16], hidden_size=8, num_layers=2)
    obs, state = torch.randn(3, 4), _state(3, 2, 8, ("h", "c"))
    perm = torch.tensor([2, 0, 1])
    out = model({"obs": obs, "prev_state": state})
    permuted = model({"obs": obs[perm], "prev_state": {k: v[perm] for k, v in state.items()}})
    torch.testing.assert_close(permuted["logit"], out["logit"][perm])
    for key in ("h", "c"):
        torch.testing.assert_close(permuted["next_state"][key], out["next_state"][key][perm])


def test_lengths_run_each_sample_for_its_own_steps():
    torch.manual_seed(0)
    model = DRQN(4, 2, encoder_hidden_sizes=[16], hidden_size=8, num_layers=2)
    obs, state = torch.randn(5, 3, 4), _state(3, 2, 8, ("h", "c"))
    lengths = [0, 2, 5]
    out = model({"obs": obs, "prev_state": state, "lengths": lengths}, sequence=True)
    for b, length in enumerate(lengths):
        row = {k: v[b : b + 1] for k, v in state.items()}
        if length == 0:
            expected = row
        else:
            ref = model({"obs": obs[:length, b : b + 1], "prev_state": row}, sequence=True)
            expected = ref["next_state"]
            torch.testing.assert_close(out["logit"][:length, b], ref["logit"][:, 0])
        for key in ("h", "c"):
            torch.testing.assert_close(out["next_state"][key][b : b + 1], expected[key])


def test_conv_encoder_for_images():
    model = DRQN((4, 84, 84), 6, encoder_hidden_sizes=[64], hidden_size=32)
    obs = torch.randint(0, 255, (2, 3, 4, 84, 84), dtype=torch.uint8)
    out = model({"obs": obs, "prev_state": model.initial_state(3)}, sequence=True)
    assert out["logit"].shape == (2, 3, 6) and out["next_state"]["h"].shape == (3, 1, 32)


def test_registered_and_dueling_head_by_default():
    model = create_model("drqn", obs_shape=4, action_dim=2)
    assert isinstance(model, DRQN) and model.head.dueling


@pytest.mark.parametrize(
    "kwargs, data, sequence, message",
    [
        ({"rnn": "rnn"}, None, False, r"rnn must be one of \['gru', 'lstm'\]"),
        ({"num_layers": 0}, None, False, "num_layers must be a positive int"),
        ({"obs_shape": (4, 84, 84), "encoder_hidden_sizes": [64, 64]}, None, False, "takes one encoder width"),
        ({}, {"obs": torch.zeros(2, 3, 4)}, False, r"expects obs of shape \(B, 4\).*sequence=True"),
        ({}, {"obs": torch.zeros(2, 4), "prev_state": {"h": torch.zeros(2, 1, 8)}}, False, r"keys \['h', 'c'\]"),
        (
            {},
            {"obs": torch.zeros(2, 4), "prev_state": {"h": torch.zeros(1, 2, 8), "c": torch.zeros(1, 2, 8)}},
            False,
            "batch axis comes first",
        ),
        ({}, {"obs": torch.zeros(2, 4), "lengths": [1, 1]}, False, "pass sequence=True"),
        ({}, {"obs": torch.zeros(3, 2, 4), "lengths": [1, 4]}, True, r"lengths must be \(B,\)"),
    ],
)
def test_errors(kwargs, data, sequence, message):
    build = {"obs_shape": 4, "action_dim": 2, "hidden_size": 8, **kwargs}
    with pytest.raises(ValueError, match=message):
        model = DRQN(**build)
        model(data, sequence=sequence)
