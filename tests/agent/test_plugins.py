import pytest
import torch
import torch.nn as nn

from nervex.agent import Agent


class FixedLogit(nn.Module):
    """Returns the logits it is given (data['logit']), times a parameter so that grad mode is observable."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, data: dict) -> dict:
        return {"logit": data["logit"] * self.scale}


class Accumulator(nn.Module):
    """A recurrent toy model: next_state = prev_state + x, one state per row (batch axis first)."""

    def forward(self, data: dict) -> dict:
        next_state = data["prev_state"] + data["x"]
        return {"logit": next_state, "next_state": next_state}


def _agent(*plugins, model=None) -> Agent:
    agent = Agent(model or FixedLogit())
    for name, kwargs in plugins:
        agent.add_plugin("main", name, **kwargs)
    return agent


LOGIT = torch.tensor([[0.1, 0.9, 0.3], [2.0, -1.0, 0.5], [0.0, 0.0, 5.0]])


def test_argmax_sample_sets_int64_action():
    out = _agent(("argmax_sample", {})).forward({"logit": LOGIT})
    assert out["action"].dtype == torch.int64 and out["action"].tolist() == [1, 0, 2]
    assert torch.equal(out["logit"], LOGIT)


def test_argmax_respects_action_mask():
    mask = torch.tensor([[1, 0, 1], [0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    out = _agent(("argmax_sample", {})).forward({"logit": LOGIT, "action_mask": mask})
    assert out["action"].tolist() == [2, 2, 2]
    with pytest.raises(ValueError, match="no legal action"):
        _agent(("argmax_sample", {})).forward({"logit": LOGIT, "action_mask": torch.zeros(3, 3, dtype=torch.bool)})


def test_eps_greedy_with_eps_zero_is_argmax():
    torch.manual_seed(0)
    logit = torch.randn(500, 4)
    out = _agent(("eps_greedy_sample", {})).forward({"logit": logit}, eps=0.0)
    assert torch.equal(out["action"], logit.argmax(dim=-1))


def test_eps_greedy_with_eps_one_is_uniform():
    torch.manual_seed(0)
    n, num_actions = 30000, 3
    logit = torch.tensor([[0.0, 0.0, 10.0]]).expand(n, num_actions)  # greedy would always pick 2
    out = _agent(("eps_greedy_sample", {})).forward({"logit": logit}, eps=1.0)
    freq = torch.bincount(out["action"], minlength=num_actions).float() / n
    torch.testing.assert_close(freq, torch.full((3,), 1 / 3), atol=0.015, rtol=0)


def test_eps_greedy_half_mixes_greedy_and_random():
    torch.manual_seed(1)
    n = 30000
    logit = torch.tensor([[0.0, 0.0, 10.0, 0.0]]).expand(n, 4)
    out = _agent(("eps_greedy_sample", {})).forward({"logit": logit}, eps=0.5)
    # P(greedy action) = (1 - eps) + eps / A = 0.5 + 0.125
    assert (out["action"] == 2).float().mean().item() == pytest.approx(0.625, abs=0.015)


def test_eps_greedy_random_actions_respect_the_mask_and_are_reproducible():
    n = 3000
    logit = torch.zeros(n, 3)
    mask = torch.tensor([[True, False, True]]).expand(n, 3)
    agent = _agent(("eps_greedy_sample", {}))
    torch.manual_seed(3)
    first = agent.forward({"logit": logit, "action_mask": mask}, eps=1.0)["action"]
    torch.manual_seed(3)
    second = agent.forward({"logit": logit, "action_mask": mask}, eps=1.0)["action"]
    assert torch.equal(first, second)
    assert (first != 1).all() and {0, 2} == set(first.tolist())


def test_eps_greedy_per_row_rates():
    # Ape-X: one rate per env; row 0 always greedy, row 1 always random (uniform over 4 actions)
    torch.manual_seed(0)
    logit = torch.tensor([[0.0, 3.0, 1.0, 2.0]]).repeat(2000, 1)
    eps = torch.tensor([0.0, 1.0]).repeat(1000)
    action = _agent(("eps_greedy_sample", {})).forward({"logit": logit}, eps=eps)["action"]
    assert (action[0::2] == 1).all()
    counts = torch.bincount(action[1::2], minlength=4).float() / 1000
    assert torch.allclose(counts, torch.full((4,), 0.25), atol=0.05)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({}, TypeError, "eps=0.1"),
        ({"eps": 1.5}, ValueError, r"\[0, 1\]"),
        ({"eps": [0.1, -0.1, 0.0]}, ValueError, r"\[0, 1\]"),
        ({"eps": [0.1, 0.1]}, ValueError, r"2 eps values for \(3,\) actions"),
    ],
)
def test_eps_greedy_needs_a_valid_eps(kwargs, error, message):
    with pytest.raises(error, match=message):
        _agent(("eps_greedy_sample", {})).forward({"logit": LOGIT}, **kwargs)


def test_multinomial_sample_follows_softmax():
    torch.manual_seed(0)
    probs = torch.tensor([0.2, 0.3, 0.5])
    n = 30000
    out = _agent(("multinomial_sample", {})).forward({"logit": probs.log().expand(n, 3)})
    assert out["action"].dtype == torch.int64 and out["action"].shape == (n,)
    freq = torch.bincount(out["action"], minlength=3).float() / n
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)


@pytest.mark.parametrize(
    "enable_grad, outer_no_grad, requires_grad", [(False, False, False), (True, False, True), (True, True, False)]
)
def test_grad_plugin(enable_grad, outer_no_grad, requires_grad):
    agent = _agent(("grad", {"enable_grad": enable_grad}), ("argmax_sample", {}))
    if outer_no_grad:
        with torch.no_grad():
            out = agent.forward({"logit": LOGIT})
    else:
        out = agent.forward({"logit": LOGIT})
    assert out["logit"].requires_grad is requires_grad
    assert out["action"].tolist() == [1, 0, 2]


def test_hidden_state_keeps_one_state_per_id_and_resets():
    agent = _agent(("hidden_state", {"state_num": 3, "init_fn": lambda: torch.zeros(1)}), model=Accumulator())
    data = {"x": torch.tensor([[1.0], [2.0]])}
    out = agent.forward(data, state_id=[0, 2])
    assert out["logit"].tolist() == [[1.0], [2.0]]
    assert "prev_state" not in data  # the caller's dict is not changed
    agent.forward({"x": torch.tensor([[10.0]])}, state_id=[2])
    plugin = agent.plugin("main", "hidden_state")
    assert [s.item() for s in plugin.states] == [1.0, 0.0, 12.0]
    agent.forward({"x": torch.ones(3, 1)})  # no state_id: every id, in order
    assert [s.item() for s in plugin.states] == [2.0, 1.0, 13.0]
    agent.reset(state_id=[0])
    assert [s.item() for s in plugin.states] == [0.0, 1.0, 13.0]
    agent.reset()
    assert [s.item() for s in plugin.states] == [0.0, 0.0, 0.0]


def test_hidden_state_detaches_stored_states_and_can_return_prev_state():
    class Linear(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, data: dict) -> dict:
            next_state = data["prev_state"] + self.w * data["x"]
            return {"logit": next_state, "next_state": next_state}

    init = lambda: torch.zeros(1)  # noqa: E731
    agent = _agent(("hidden_state", {"state_num": 2, "init_fn": init, "save_prev_state": True}), model=Linear())
    first = agent.forward({"x": torch.ones(2, 1)}, state_id=[0, 1])
    # an episode's first step stores the concrete zero state, never None
    assert torch.equal(first["prev_state"], torch.zeros(2, 1)) and first["logit"].requires_grad
    assert not any(s.requires_grad for s in agent.plugin("main", "hidden_state").states)
    second = agent.forward({"x": torch.ones(1, 1)}, state_id=[1])
    assert second["prev_state"].tolist() == [[1.0]] and second["logit"].item() == 2.0
    # the returned prev_state is a copy: later steps do not change what a transition stored
    agent.forward({"x": torch.ones(1, 1)}, state_id=[1])
    assert second["prev_state"].tolist() == [[1.0]]


def _lstm_agent(state_num: int, layers: int = 2, hidden: int = 3):
    from nervex.model import DRQN

    torch.manual_seed(0)
    model = DRQN(4, 2, encoder_hidden_sizes=[8], hidden_size=hidden, num_layers=layers)
    agent = Agent(model)
    agent.add_plugin("main", "hidden_state", state_num=state_num, init_fn=model.initial_state, save_prev_state=True)
    agent.add_plugin("main", "grad", enable_grad=False)
    return agent, model


def test_hidden_state_prev_state_is_the_state_the_actor_had():
    agent, model = _lstm_agent(state_num=3)
    obs = torch.randn(4, 3, 4)
    expected = model.initial_state(3)
    for t in range(4):
        out = agent.forward({"obs": obs[t]}, state_id=[0, 1, 2])
        for key in ("h", "c"):
            torch.testing.assert_close(out["prev_state"][key], expected[key], rtol=0, atol=1e-6)
        with torch.no_grad():
            expected = model({"obs": obs[t], "prev_state": expected})["next_state"]
    agent.reset(state_id=[1])  # an episode ends in env 1: only env 1 starts again from zeros
    states = agent.plugin("main", "hidden_state").states
    for key in ("h", "c"):
        assert not states[1][key].any()
        torch.testing.assert_close(states[0][key], expected[key][0], rtol=0, atol=1e-6)
        torch.testing.assert_close(states[2][key], expected[key][2], rtol=0, atol=1e-6)
    out = agent.forward({"obs": obs[0, [2, 1]]}, state_id=[2, 1])  # any subset, in any order
    assert torch.equal(out["prev_state"]["h"][0], states[2]["h"]) and not out["prev_state"]["h"][1].any()


def test_hidden_state_lstm_pair_splits_per_env_on_the_batch_axis():
    # (h, c) of a 2-layer LSTM: each env's stored prev_state is its own (layers, H) pair, as the policy's
    # per-env split of the output (by the first axis) hands it to the transition
    from nervex.policy.base_policy import _split_rows

    agent, model = _lstm_agent(state_num=3, layers=2, hidden=5)
    agent.forward({"obs": torch.randn(3, 4)}, state_id=[0, 1, 2])
    states = agent.plugin("main", "hidden_state").states
    out = agent.forward({"obs": torch.randn(2, 4)}, state_id=[2, 0])
    rows = _split_rows(out, 2)
    for row, env_id in zip(rows, [2, 0]):
        assert set(row["prev_state"]) == {"h", "c"}
        for key in ("h", "c"):
            assert row["prev_state"][key].shape == (2, 5)
            assert torch.equal(torch.from_numpy(row["prev_state"][key]), states[env_id][key])
    # and back: per-env states collated for the learner are the batch-first state the model takes
    from nervex.torch_utils import collate

    batch = collate([row["prev_state"] for row in rows])
    again = model({"obs": torch.zeros(2, 4), "prev_state": batch})
    direct = model(
        {"obs": torch.zeros(2, 4), "prev_state": {k: torch.stack([states[2][k], states[0][k]]) for k in "hc"}}
    )
    torch.testing.assert_close(again["logit"], direct["logit"])


def test_hidden_state_grows_for_new_ids():
    agent = _agent(("hidden_state", {"init_fn": lambda: torch.zeros(1)}), model=Accumulator())
    plugin = agent.plugin("main", "hidden_state")
    assert plugin.state_num == 1
    agent.forward({"x": torch.tensor([[1.0], [2.0]])}, state_id=[3, 0])
    assert plugin.state_num == 4 and [s.item() for s in plugin.states] == [2.0, 0.0, 0.0, 1.0]


def test_hidden_state_keeps_state_on_the_models_device_and_dtype():
    agent = _agent(("hidden_state", {"state_num": 2, "init_fn": lambda: torch.zeros(1)}), model=Accumulator())
    agent.forward({"x": torch.ones(2, 1, dtype=torch.float64)})
    assert agent.plugin("main", "hidden_state").states[0].dtype == torch.float64
    agent.reset(state_id=[0])
    assert [s.item() for s in agent.plugin("main", "hidden_state").states] == [0.0, 1.0]


@pytest.mark.parametrize(
    "state_id, data, error, message",
    [
        ([-1], {"x": torch.ones(1, 1)}, IndexError, r"state_id \[-1\] is negative"),
        ([0], torch.ones(1, 1), TypeError, "needs dict data"),
        ([1, 1], {"x": torch.ones(2, 1)}, ValueError, r"state_id \[1, 1\] lists an id twice"),
        ([0, 1], {"x": torch.ones(2, 2)}, ValueError, r"next_state leaf is \(2, 2\), expected shape \(2, 1\)"),
    ],
)
def test_hidden_state_errors(state_id, data, error, message):
    agent = _agent(("hidden_state", {"state_num": 2, "init_fn": lambda: torch.zeros(1)}), model=Accumulator())
    with pytest.raises(error, match=message):
        agent.forward(data, state_id=state_id)


def test_plugins_compose_on_one_model():
    agent = _agent(
        ("hidden_state", {"state_num": 2, "init_fn": lambda: torch.zeros(3)}),
        ("eps_greedy_sample", {}),
        ("grad", {"enable_grad": False}),
        model=Accumulator(),
    )
    out = agent.forward({"x": torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]])}, eps=0.0, state_id=[1, 0])
    assert out["action"].tolist() == [1, 0] and not out["logit"].requires_grad


def test_target_model_has_its_own_plugins():
    agent = Agent(FixedLogit())
    with pytest.raises(ValueError, match=r"add_plugin\('target', ...\): no such model; have \['main'\]"):
        agent.add_plugin("target", "argmax_sample")
    agent.add_model("target", update_type="assign", update_kwargs={"freq": 1})
    agent.add_plugin("target", "argmax_sample")
    assert agent.target_forward({"logit": LOGIT})["action"].tolist() == [1, 0, 2]
    assert "action" not in agent.forward({"logit": LOGIT})


@pytest.mark.parametrize(
    "model_name, name, kwargs, error, message",
    [
        (
            "main",
            "eps_greedy",
            {},
            ValueError,
            r"unknown agent plugin 'eps_greedy'; valid: .*did you mean 'eps_greedy_sample'",
        ),
        ("main", "grad", {}, TypeError, r"agent plugin 'grad' takes enable_grad"),
        ("main", "grad", {"enable_grad": 1}, TypeError, "True or False"),
        ("main", "hidden_state", {"state_num": 0, "init_fn": lambda: torch.zeros(1)}, ValueError, "positive int"),
        ("main", "hidden_state", {"state_num": 2}, TypeError, "takes init_fn, state_num, save_prev_state"),
        ("main", "hidden_state", {"state_num": 2, "init_fn": lambda: None}, TypeError, "concrete zero state"),
        ("main", "argmax_sample", {"eps": 0.1}, TypeError, "takes logit_key"),
        ("critic", "argmax_sample", {}, ValueError, r"add_plugin\('critic', ...\): no such model"),
    ],
)
def test_add_plugin_errors(model_name, name, kwargs, error, message):
    with pytest.raises(error, match=message):
        Agent(FixedLogit()).add_plugin(model_name, name, **kwargs)


def test_one_sampling_plugin_per_model_and_no_duplicates():
    agent = _agent(("argmax_sample", {}), ("grad", {"enable_grad": False}))
    assert agent.plugin("main", "grad").enable_grad is False
    with pytest.raises(KeyError, match=r"no plugin 'hidden_state'; it has \['argmax_sample', 'grad'\]"):
        agent.plugin("main", "hidden_state")
    with pytest.raises(ValueError, match="already has plugin 'argmax_sample'"):
        agent.add_plugin("main", "multinomial_sample")
    with pytest.raises(ValueError, match="already has plugin 'grad'"):
        agent.add_plugin("main", "grad", enable_grad=True)


def test_forward_kwargs_nobody_takes_are_an_error():
    with pytest.raises(TypeError, match=r"keyword\(s\) \['eps'\] that neither the 'main' model nor its plugins"):
        _agent(("argmax_sample", {})).forward({"logit": LOGIT}, eps=0.1)


def test_mode_switches_main_and_target():
    agent = Agent(nn.Sequential(nn.Dropout(0.5)))
    agent.add_model("target", update_type="assign", update_kwargs={"freq": 1})
    agent.mode(train=False)
    assert not agent.model.training and not agent.target_model.training
    agent.mode(train=True)
    assert agent.model.training and agent.target_model.training


class QValues(nn.Module):
    """A model whose discrete scores are called 'q', not 'logit'."""

    def forward(self, data: dict) -> dict:
        return {"q": data["q"]}


def test_sampling_plugins_read_any_logit_key():
    agent = _agent(("argmax_sample", {"logit_key": "q"}), model=QValues())
    assert agent.forward({"q": LOGIT})["action"].tolist() == [1, 0, 2]
    with pytest.raises(TypeError, match="a 'logit' tensor"):
        _agent(("argmax_sample", {}), model=QValues()).forward({"q": LOGIT})


def test_multinomial_sample_adds_the_log_prob_of_the_sampled_action():
    torch.manual_seed(0)
    out = _agent(("multinomial_sample", {})).forward({"logit": LOGIT})
    expected = torch.log_softmax(LOGIT, dim=-1).gather(1, out["action"][:, None]).squeeze(1)
    torch.testing.assert_close(out["logp"], expected)
    assert not out["logp"].requires_grad


class GaussianHead(nn.Module):
    def forward(self, data: dict) -> dict:
        return {"mu": data["mu"], "sigma": data["sigma"]}


def test_gaussian_sample_log_prob_and_deterministic_mode():
    mu = torch.tensor([[0.5, -1.0], [2.0, 0.0]])
    sigma = torch.tensor([[1.0, 2.0], [0.5, 0.5]])
    greedy = _agent(("gaussian_sample", {"deterministic": True}), model=GaussianHead()).forward(
        {"mu": mu, "sigma": sigma}
    )
    assert greedy["action"].tolist() == mu.tolist()
    # log N(mu; mu, sigma) = -sum(log sigma) - D/2 log(2 pi); row 0: -(0 + log 2) - log(2 pi)
    import math

    expected = [-(math.log(1.0) + math.log(2.0)) - math.log(2 * math.pi), -2 * math.log(0.5) - math.log(2 * math.pi)]
    assert greedy["logp"].tolist() == pytest.approx(expected, abs=1e-6)
    torch.manual_seed(1)
    sampled = _agent(("gaussian_sample", {}), model=GaussianHead()).forward({"mu": mu, "sigma": sigma})
    assert not torch.equal(sampled["action"], mu)
    z = (sampled["action"] - mu) / sigma
    by_hand = (-0.5 * z**2 - sigma.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
    torch.testing.assert_close(sampled["logp"], by_hand)


def test_squashed_gaussian_sample_stays_inside_asymmetric_bounds():
    torch.manual_seed(0)
    mu = torch.zeros(256, 2)
    sigma = torch.full((256, 2), 3.0)
    agent = _agent(("gaussian_sample", {"squash": True, "low": [-1.0, 0.0], "high": [3.0, 2.0]}), model=GaussianHead())
    action = agent.forward({"mu": mu, "sigma": sigma})["action"]
    assert action[:, 0].min() >= -1.0 and action[:, 0].max() <= 3.0
    assert action[:, 1].min() >= 0.0 and action[:, 1].max() <= 2.0
    assert action[:, 0].min() < 0.0 and action[:, 0].max() > 2.0  # the whole range is used, not [-1, 1]
    with pytest.raises(ValueError, match="set squash=True"):
        Agent(GaussianHead()).add_plugin("main", "gaussian_sample", low=-1.0, high=1.0)


def test_users_register_their_own_plugins():
    from nervex.agent import PLUGIN_REGISTRY, AgentPlugin, register_plugin

    class DoubleLogit(AgentPlugin):
        name = "double_logit"

        def __call__(self, forward, data, **kwargs):
            out = forward(data)
            out["logit"] = out["logit"] * 2
            return out

    register_plugin("double_logit", DoubleLogit)
    try:
        agent = _agent(("double_logit", {}), ("argmax_sample", {}))
        out = agent.forward({"logit": torch.tensor([[1.0, -3.0]])})
        assert out["logit"].tolist() == [[2.0, -6.0]] and out["action"].tolist() == [0]
        with pytest.raises(TypeError, match="AgentPlugin subclass"):
            register_plugin("not_a_plugin", dict)
    finally:
        PLUGIN_REGISTRY.unregister("double_logit")


class Linear2(nn.Module):
    """Q = obs @ W for a fixed W; fails on dict input, so the dict_obs plugin must hand it obs['obs']."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([[1.0, 4.0, 2.0], [0.0, 0.0, 0.0]]))

    def forward(self, x: torch.Tensor) -> dict:
        return {"logit": x @ self.w}


def test_dict_obs_feeds_the_model_its_obs_and_the_sampler_its_mask():
    # Q rows [1, 4, 2]: action 1 is the best and illegal in row 0; row 1 allows all
    data = {"obs": torch.tensor([[1.0, 0.0], [1.0, 0.0]]), "action_mask": torch.tensor([[1, 0, 1], [1, 1, 1]])}
    agent = _agent(("dict_obs", {}), ("argmax_sample", {}), model=Linear2())
    assert agent.forward(data)["action"].tolist() == [2, 1]
    eps = _agent(("dict_obs", {}), ("eps_greedy_sample", {}), model=Linear2())
    assert eps.forward(data, eps=0.0)["action"].tolist() == [2, 1]
    torch.manual_seed(0)
    many = {"obs": torch.tensor([[1.0, 0.0]]).repeat(3000, 1), "action_mask": torch.tensor([[1, 0, 1]]).repeat(3000, 1)}
    action = eps.forward(many, eps=1.0)["action"]
    counts = torch.bincount(action, minlength=3)
    assert counts[1] == 0 and abs(counts[0].item() - 1500) < 150  # uniform over the two legal actions
    plain = _agent(("dict_obs", {}), ("argmax_sample", {}), model=Linear2())
    assert plain.forward(torch.tensor([[1.0, 0.0]]))["action"].tolist() == [1]  # a tensor passes through
