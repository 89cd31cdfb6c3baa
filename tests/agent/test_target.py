import pytest
import torch
import torch.nn as nn

from nervex.agent import Agent


class Tiny(nn.Module):
    """One parameter, one float buffer and one integer buffer, so every kind of state is covered."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2))
        self.register_buffer("running", torch.zeros(2))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> dict:
        return {"logit": x * self.w + self.running}


def _set_main(agent: Agent, value: float, count: int = 0) -> None:
    with torch.no_grad():
        agent.model.w.fill_(value)
        agent.model.running.fill_(value)
        agent.model.count.fill_(count)


def _target_values(agent: Agent) -> tuple:
    target = agent.target_model
    return target.w.tolist(), target.running.tolist(), int(target.count)


def test_momentum_moves_params_and_buffers_by_theta_each_call():
    agent = Agent(Tiny())
    agent.add_model("target", update_type="momentum", update_kwargs={"theta": 0.1})
    _set_main(agent, 1.0, count=5)
    # target <- 0.9 * target + 0.1 * 1: 0.1, 0.19, 0.271, 0.3439
    for expected in (0.1, 0.19, 0.271, 0.3439):
        agent.target_update()
        w, running, count = _target_values(agent)
        assert w == pytest.approx([expected] * 2, abs=1e-6)
        assert running == pytest.approx([expected] * 2, abs=1e-6)
        assert count == 5  # integer buffers cannot be averaged: copied
    assert agent.model.w.tolist() == [1.0, 1.0]  # the main model is never touched


def test_momentum_follows_a_parameter_replaced_after_the_first_update():
    agent = Agent(Tiny())
    agent.add_model("target", update_type="momentum", update_kwargs={"theta": 0.5})
    _set_main(agent, 1.0)
    agent.target_update()  # tensor lists collected and cached: target w = 0.5
    agent.model.w = nn.Parameter(torch.full((2,), 3.0))  # a new object: the cache must not keep the old one
    agent.target_update()
    assert _target_values(agent)[0] == pytest.approx([1.75, 1.75])  # 0.5 * 0.5 + 0.5 * 3
    with torch.no_grad():
        agent.model.w.fill_(5.0)  # in place: the cached tensors see it
    agent.target_update()
    assert _target_values(agent)[0] == pytest.approx([3.375, 3.375])


def test_momentum_theta_one_is_a_copy():
    agent = Agent(Tiny())
    agent.add_model("target", update_type="momentum", update_kwargs={"theta": 1.0})
    _set_main(agent, 3.0)
    agent.target_update()
    assert _target_values(agent)[0] == [3.0, 3.0]


def test_assign_copies_on_every_nth_call_only():
    agent = Agent(Tiny())
    agent.add_model("target", update_type="assign", update_kwargs={"freq": 3})
    _set_main(agent, 1.0, count=4)
    observed = []
    for call in range(1, 7):
        if call == 4:
            _set_main(agent, 2.0, count=8)
        agent.target_update()
        observed.append(_target_values(agent))
    assert observed == [
        ([0.0, 0.0], [0.0, 0.0], 0),
        ([0.0, 0.0], [0.0, 0.0], 0),
        ([1.0, 1.0], [1.0, 1.0], 4),  # 3rd call copies
        ([1.0, 1.0], [1.0, 1.0], 4),  # main changed, target waits
        ([1.0, 1.0], [1.0, 1.0], 4),
        ([2.0, 2.0], [2.0, 2.0], 8),  # 6th call copies
    ]


def test_target_is_a_frozen_independent_copy_and_runs_without_grad():
    agent = Agent(Tiny())
    agent.add_model("target", update_type="assign", update_kwargs={"freq": 1})
    _set_main(agent, 1.0)
    assert _target_values(agent)[0] == [0.0, 0.0]
    assert not any(p.requires_grad for p in agent.target_model.parameters())
    assert all(p.requires_grad for p in agent.model.parameters())
    agent.target_update()
    out = agent.target_forward(torch.ones(2))
    assert out["logit"].tolist() == [2.0, 2.0] and not out["logit"].requires_grad


@pytest.mark.parametrize(
    "update_type, update_kwargs, message",
    [
        ("asign", {"freq": 2}, r"unknown target update_type 'asign'; valid: assign, momentum; did you mean 'assign'"),
        ("assign", None, r"takes update_kwargs=\{'freq': 100\}"),
        ("assign", {"freq": 2, "theta": 0.1}, r"unknown key\(s\) \['theta'\]"),
        ("assign", {"freq": 0}, "int >= 1"),
        ("assign", {"freq": 2.5}, "int >= 1"),
        ("momentum", {"freq": 2}, r"takes update_kwargs=\{'theta': 0.005\}"),
        ("momentum", {"theta": 0.0}, r"in \(0, 1\]"),
        ("momentum", {"theta": 1.5}, r"in \(0, 1\]"),
    ],
)
def test_bad_target_settings_are_rejected(update_type, update_kwargs, message):
    with pytest.raises(ValueError, match=message):
        Agent(Tiny()).add_model("target", update_type=update_type, update_kwargs=update_kwargs)


def test_target_calls_need_a_target_model():
    agent = Agent(Tiny())
    with pytest.raises(RuntimeError, match="add_model"):
        agent.target_update()
    with pytest.raises(RuntimeError, match="add_model"):
        agent.target_forward(torch.ones(2))
    with pytest.raises(ValueError, match="'main' already exists"):
        agent.add_model("main", update_type="assign", update_kwargs={"freq": 1})
    with pytest.raises(ValueError, match="unknown source 'critic'"):
        agent.add_model("target_critic", update_type="assign", update_kwargs={"freq": 1}, source="critic")
    with pytest.raises(ValueError, match="give update_type for a tracking copy, or model="):
        agent.add_model("other", update_type=None)


def test_named_models_track_their_own_sources():
    """Twin critics and their targets as named models: each target follows its own source, by exactly theta."""
    agent = Agent(Tiny())
    critic = Tiny()
    agent.add_model("critic", model=critic)
    agent.add_model("target", update_type="momentum", update_kwargs={"theta": 0.5})
    agent.add_model("target_critic", update_type="assign", update_kwargs={"freq": 1}, source="critic")
    assert agent.extra_model_names == ["critic", "target", "target_critic"]
    _set_main(agent, 2.0)
    with torch.no_grad():
        critic.w.fill_(-4.0)
    agent.target_update()
    assert agent.get_model("target").w.tolist() == [1.0, 1.0]  # 0.5 * 0 + 0.5 * 2
    assert agent.get_model("target_critic").w.tolist() == [-4.0, -4.0]
    agent.target_update(name="target")  # only the named copy moves
    assert agent.get_model("target").w.tolist() == [1.5, 1.5]
    out = agent.model_forward("critic", torch.ones(2))
    assert out["logit"].tolist() == [-4.0, -4.0] and out["logit"].requires_grad  # an independent model learns
    assert not agent.model_forward("target_critic", torch.ones(2))["logit"].requires_grad
    with pytest.raises(KeyError, match="no model 'actor'"):
        agent.get_model("actor")


def test_target_update_from_a_given_state_dict_nervex_style():
    """nerveX's ``agent.target_update(agent.state_dict()['model'])`` moves the target towards the given weights."""
    agent = Agent(Tiny())
    agent.add_model("target", update_type="assign", update_kwargs={"freq": 2})
    _set_main(agent, 1.0)
    agent.target_update(agent.state_dict()["model"])
    assert _target_values(agent)[0] == [0.0, 0.0]  # 1st of 2
    agent.target_update(agent.state_dict()["model"])
    assert _target_values(agent)[0] == [1.0, 1.0]
    momentum = Agent(Tiny())
    momentum.add_model("target", update_type="momentum", update_kwargs={"theta": 0.25})
    _set_main(momentum, 4.0, count=3)
    momentum.target_update(momentum.state_dict()["model"])
    assert _target_values(momentum) == ([1.0, 1.0], [1.0, 1.0], 3)


def test_state_dict_roundtrip_keeps_targets_and_update_counts():
    agent = Agent(Tiny())
    agent.add_model("target", update_type="assign", update_kwargs={"freq": 2})
    _set_main(agent, 1.0)
    agent.target_update()  # 1st of 2: target still 0
    state = agent.state_dict()
    assert set(state) == {"model", "models", "update_counts"} and state["update_counts"] == {"target": 1}

    fresh = Agent(Tiny())
    fresh.add_model("target", update_type="assign", update_kwargs={"freq": 2})
    fresh.load_state_dict(state)
    assert fresh.model.w.tolist() == [1.0, 1.0] and _target_values(fresh)[0] == [0.0, 0.0]
    fresh.target_update()  # the 2nd call overall copies, as it would have without the restart
    assert _target_values(fresh)[0] == [1.0, 1.0]

    plain = Agent(Tiny())  # an agent without a target ignores the learner's target weights
    plain.load_state_dict(state)
    assert plain.model.w.tolist() == [1.0, 1.0] and plain.state_dict()["models"] == {}

    no_target_saved = Agent(Tiny())
    no_target_saved.add_model("target", update_type="assign", update_kwargs={"freq": 2})
    no_target_saved.load_state_dict({"model": state["model"]})  # an eval snapshot: the target starts at the weights
    assert _target_values(no_target_saved)[0] == [1.0, 1.0]
