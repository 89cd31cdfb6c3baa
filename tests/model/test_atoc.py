"""ATOC's model: shapes, who communicates, what the channel mixes, groups, delta Q."""

import pytest
import torch

from nervex.model import ATOC

OBS, ACT, AGENTS, THOUGHT = 4, 2, 4, 8


def make(**kwargs) -> ATOC:
    torch.manual_seed(0)
    return ATOC(OBS, ACT, AGENTS, thought_size=THOUGHT, actor_hidden_sizes=[16], **kwargs)


def set_initiation(model: ATOC, logit: float) -> None:
    """Make the attention unit say ``sigmoid(logit)`` for every thought: zero last weights, bias ``logit``."""
    last = model.attention.layers[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(logit)


def test_shapes_and_bounds():
    model = make(action_low=0.0, action_high=1.0, group_size=3)
    obs = torch.randn(5, AGENTS, OBS)
    out = model(obs)
    assert out["action"].shape == (5, AGENTS, ACT)
    assert out["thought"].shape == out["integrated"].shape == (5, AGENTS, THOUGHT)
    assert out["initiator_prob"].shape == out["initiator"].shape == (5, AGENTS)
    assert out["group"].shape == (5, AGENTS, 3) and out["group"].dtype == torch.int64
    assert bool((out["action"] >= 0).all() and (out["action"] <= 1).all())
    assert model({"obs": obs}, mode="compute_actor")["action"].shape == (5, AGENTS, ACT)  # a dict observation
    q = model({"obs": obs, "action": out["action"]}, mode="compute_critic")["q"]
    assert q.shape == (1, 5, AGENTS)
    with pytest.raises(ValueError, match="per-agent observations"):
        model(torch.randn(5, AGENTS + 1, OBS))
    with pytest.raises(ValueError, match="did you mean 'compute_actor'"):
        model(obs, mode="compute_actr")


def test_groups_start_with_the_initiator_then_nearest_by_position():
    model = make(group_size=2, group_by="position", position_dims=[0, 1])
    obs = torch.zeros(1, AGENTS, OBS)
    obs[0, :, 0] = torch.tensor([0.0, 5.0, 0.5, 4.0])  # x positions: 0 <-> 2 and 1 <-> 3 are pairs
    group = model.groups(obs, torch.zeros(1, AGENTS, THOUGHT))
    assert group[0].tolist() == [[0, 2], [1, 3], [2, 0], [3, 1]]
    # by thought: the same pairs when the thoughts are the positions
    model = make(group_size=2)
    thought = torch.zeros(1, AGENTS, THOUGHT)
    thought[0, :, 0] = obs[0, :, 0]
    assert model.groups(obs, thought)[0].tolist() == [[0, 2], [1, 3], [2, 0], [3, 1]]
    # two agents on the same spot: each still comes first in its own group
    assert make(group_size=2).groups(obs, torch.zeros(1, AGENTS, THOUGHT))[0, :, 0].tolist() == [0, 1, 2, 3]


def test_agents_outside_every_group_keep_their_thought():
    model = make(group_size=2)
    thought = torch.randn(2, AGENTS, THOUGHT)
    group = torch.tensor([[0, 1], [1, 0], [2, 3], [3, 2]]).expand(2, AGENTS, 2)
    initiator = torch.zeros(2, AGENTS, dtype=torch.bool)
    initiator[0, 0] = True  # sample 0: agent 0 talks with agent 1; sample 1: nobody talks
    out = model.communicate(thought, group, initiator)
    assert torch.equal(out[0, 2:], thought[0, 2:])
    assert torch.equal(out[1], thought[1])
    assert not torch.allclose(out[0, :2], thought[0, :2])
    integrated, _ = model.channel(thought[0, :2].unsqueeze(0))
    torch.testing.assert_close(out[0, :2], integrated[0])


def test_an_agent_in_two_groups_takes_the_mean_of_its_integrated_thoughts():
    model = make(group_size=2)
    thought = torch.randn(1, AGENTS, THOUGHT)
    group = torch.tensor([[[0, 1], [1, 0], [2, 1], [3, 2]]])
    initiator = torch.tensor([[True, False, True, False]])  # agent 1 is in both groups {0, 1} and {2, 1}
    out = model.communicate(thought, group, initiator)
    first, _ = model.channel(thought[:, [0, 1]])
    second, _ = model.channel(thought[:, [2, 1]])
    torch.testing.assert_close(out[0, 1], (first[0, 1] + second[0, 1]) / 2)
    torch.testing.assert_close(out[0, 0], first[0, 0])
    torch.testing.assert_close(out[0, 2], second[0, 0])
    assert torch.equal(out[0, 3], thought[0, 3])


def test_the_attention_unit_decides_whether_communication_happens():
    model = make(group_size=2)
    obs = torch.randn(3, AGENTS, OBS)
    set_initiation(model, -10.0)  # nobody initiates: the plain actor
    quiet = model(obs)
    assert not quiet["initiator"].any()
    assert torch.equal(quiet["integrated"], quiet["thought"])
    torch.testing.assert_close(quiet["action"], model.decode(quiet["thought"]))
    set_initiation(model, 10.0)  # everybody initiates
    loud = model(obs)
    assert loud["initiator"].all()
    assert (loud["integrated"] - loud["thought"]).abs().amax(-1).gt(1e-4).all()
    assert not torch.allclose(loud["action"], quiet["action"])


def test_the_channel_mixes_thoughts_within_a_group_only():
    model = make(group_size=2)
    thought = torch.randn(1, AGENTS, THOUGHT)
    group = torch.tensor([[[0, 1], [1, 0], [2, 3], [3, 2]]])
    initiator = torch.tensor([[True, False, False, False]])  # the group {0, 1}
    base = model.communicate(thought, group, initiator)
    member = thought.clone()
    member[0, 1] += 1.0
    outsider = thought.clone()
    outsider[0, 3] += 1.0
    assert not torch.allclose(model.communicate(member, group, initiator)[0, 0], base[0, 0])
    torch.testing.assert_close(model.communicate(outsider, group, initiator)[0, 0], base[0, 0])


def test_the_actor_gradient_reaches_every_group_member_through_the_channel():
    model = make(group_size=2)
    obs = torch.randn(1, AGENTS, OBS, requires_grad=True)
    thought = model.actor_encoder(obs)
    group = torch.tensor([[[0, 2], [1, 0], [2, 3], [3, 2]]])
    initiator = torch.tensor([[True, False, False, False]])  # the group {0, 2}
    action = model.decode(model.communicate(thought, group, initiator))
    action[0, 0].sum().backward()  # agent 0's action
    grad = obs.grad[0].abs().sum(-1)
    assert grad[0] > 0 and grad[2] > 0  # through the channel into agent 2's part I
    assert grad[1] == 0 and grad[3] == 0


def test_delta_q_is_the_group_mean_of_q_with_minus_without_communication():
    model = make(group_size=2)
    obs = torch.randn(2, AGENTS, OBS)
    out = model(obs)
    delta_q = model.delta_q(obs, out["thought"], out["group"])
    assert delta_q.shape == (2, AGENTS)
    b, i = 1, 2
    members = out["group"][b, i]
    member_thought = out["thought"][b, members]
    integrated, _ = model.channel(member_thought.unsqueeze(0))
    q = lambda h: model.compute_critic(obs[b, members], model.decode(h))["q"][0]  # noqa: E731
    expected = (q(integrated[0]) - q(member_thought)).mean()
    torch.testing.assert_close(delta_q[b, i], expected.detach())


def test_without_communication_the_actor_is_part_two_of_part_one():
    model = make(communication=False)
    obs = torch.randn(3, AGENTS, OBS)
    out = model(obs)
    assert not out["initiator"].any()
    torch.testing.assert_close(out["action"], model.decode(model.actor_encoder(obs)))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(thought_size=7), "thought_size must be even"),
        (dict(group_size=1), "group_size must be an int in 2..agent_num"),
        (dict(group_size=5), "group_size must be an int in 2..agent_num"),
        (dict(group_by="position"), "needs position_dims"),
        (dict(group_by="position", position_dims=[4]), "needs position_dims"),
        (dict(position_dims=[0]), "only read with group_by: position"),
        (dict(group_by="near"), "group_by must be one of"),
        (dict(initiator_threshold=1.0), "initiator_threshold"),
    ],
)
def test_bad_arguments_name_the_key(kwargs, message):
    args = {"thought_size": THOUGHT, **kwargs}
    with pytest.raises(ValueError, match=message):
        ATOC(OBS, ACT, AGENTS, **args)
