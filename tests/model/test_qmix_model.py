"""The QMIX mixer uses the state and is monotonic; VDN sums; the QMix model's shapes and shape errors; AgentNet's
sequence pass equals its step-by-step pass."""

import pytest
import torch

from nervex.model import VDN, AgentNet, QMix, QMixer, VDNMixer, create_model


def test_qmixer_output_changes_with_the_state():
    torch.manual_seed(0)
    mixer = QMixer(agent_num=3, state_dim=4, embed_dim=8)
    agent_q = torch.tensor([[1.0, -2.0, 0.5]]).repeat(2, 1)  # the same Qs
    states = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.5]])
    with torch.no_grad():
        q_tot = mixer(agent_q, states)
    assert q_tot.shape == (2,)
    assert abs((q_tot[0] - q_tot[1]).item()) > 1e-3


def test_qmixer_is_monotonic_in_every_agent_q():
    torch.manual_seed(1)
    for layers in (1, 2):
        mixer = QMixer(agent_num=3, state_dim=5, embed_dim=16, hypernet_layers=layers)
        agent_q = (torch.randn(64, 3) * 5).requires_grad_(True)
        state = torch.randn(64, 5)
        mixer(agent_q, state).sum().backward()
        assert (agent_q.grad >= 0).all()
        assert (agent_q.grad > 0).any()


def test_qmixer_final_bias_is_a_two_layer_net_of_the_state():
    mixer = QMixer(agent_num=2, state_dim=3)
    linear = [m for m in mixer.hyper_v if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linear] == [(3, 32), (32, 1)]
    # with every mixing weight at 0, Q_tot is V(s) alone
    for net in (mixer.hyper_w1, mixer.hyper_w2):
        for p in net.parameters():
            torch.nn.init.zeros_(p)
    state = torch.randn(4, 3)
    assert torch.allclose(mixer(torch.randn(4, 2), state), mixer.hyper_v(state).squeeze(-1))


def test_mixers_keep_leading_axes():
    mixer = QMixer(agent_num=2, state_dim=3)
    assert mixer(torch.randn(5, 4, 2), torch.randn(5, 4, 3)).shape == (5, 4)
    q = torch.tensor([[[1.0, 2.0], [3.0, -4.0]]])
    assert torch.equal(VDNMixer()(q), torch.tensor([[3.0, -1.0]]))
    assert torch.equal(VDNMixer()(q, torch.randn(1, 2, 7)), torch.tensor([[3.0, -1.0]]))  # the state is ignored


def test_mixer_shape_errors_are_named():
    mixer = QMixer(agent_num=2, state_dim=3)
    with pytest.raises(ValueError, match=r"agent_q has shape \(4, 3\); expected \(\.\.\., 2\)"):
        mixer(torch.randn(4, 3), torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"state has shape \(4, 5\); expected \(4, 3\)"):
        mixer(torch.randn(4, 2), torch.randn(4, 5))
    with pytest.raises(ValueError, match="needs the global state"):
        mixer(torch.randn(4, 2), None)
    with pytest.raises(ValueError, match="hypernet_layers must be 1 or 2"):
        QMixer(2, 3, hypernet_layers=3)


def make_model(**kw):
    torch.manual_seed(0)
    args = dict(obs_dim=5, action_dim=4, agent_num=3, state_dim=6, agent=dict(hidden_sizes=[16], hidden_size=8))
    return QMix(**{**args, **kw})


def test_qmix_model_step_sequence_and_mix_shapes():
    model = make_model()
    out = model({"obs": torch.randn(2, 3, 5), "last_action": torch.zeros(2, 3, 4), "prev_state": None})
    assert out["logit"].shape == (2, 3, 4) and out["next_state"]["h"].shape == (2, 3, 8)
    seq = model({"obs": torch.randn(7, 2, 3, 5), "last_action": torch.zeros(7, 2, 3, 4)}, sequence=True)
    assert seq["logit"].shape == (7, 2, 3, 4)
    mixed = model({"agent_q": torch.randn(7, 2, 3), "global_state": torch.randn(7, 2, 6)}, mode="mix")
    assert mixed["q_tot"].shape == (7, 2)
    assert model.initial_state()["h"].shape == (3, 8)
    assert make_model(agent=dict(rnn="none")).initial_state() is None


def test_qmix_model_last_action_is_part_of_the_agent_input():
    model = make_model()
    obs = torch.randn(1, 3, 5)
    a = model({"obs": obs, "last_action": torch.zeros(1, 3, 4)})["logit"]
    b = model({"obs": obs, "last_action": torch.eye(4)[[0, 1, 2]].unsqueeze(0)})["logit"]
    assert not torch.allclose(a, b)
    assert make_model(last_action=False).agent.obs_dim == 5 and model.agent.obs_dim == 9


def test_qmix_model_errors_are_named():
    model = make_model()
    with pytest.raises(ValueError, match=r"QMix expects obs of shape \(B, 3, 5\)"):
        model({"obs": torch.randn(2, 3, 6), "last_action": torch.zeros(2, 3, 4)})
    with pytest.raises(ValueError, match=r"QMix expects obs of shape \(T, B, 3, 5\)"):
        model({"obs": torch.randn(2, 3, 5), "last_action": torch.zeros(2, 3, 4)}, sequence=True)
    with pytest.raises(ValueError, match=r"needs data\['last_action'\] of shape \(2, 3, 4\)"):
        model({"obs": torch.randn(2, 3, 5)})
    with pytest.raises(ValueError, match="mode must be one of"):
        model({"obs": torch.randn(2, 3, 5)}, mode="mixer")
    with pytest.raises(ValueError, match="mixer must be one of"):
        make_model(mixer="qtran")
    with pytest.raises(ValueError, match="needs state_dim"):
        make_model(state_dim=None)
    with pytest.raises(ValueError, match="'vdn' has no parameters"):
        make_model(mixer="vdn", mixer_cfg=dict(embed_dim=8))


def test_registered_models():
    qmix = create_model("qmix", obs_dim=5, action_dim=4, agent_num=3, state_dim=6)
    assert isinstance(qmix.mixer, QMixer)
    vdn = create_model("vdn", obs_dim=5, action_dim=4, agent_num=3)
    assert isinstance(vdn, VDN) and isinstance(vdn.mixer, VDNMixer)
    assert sum(p.numel() for p in vdn.mixer.parameters()) == 0


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"share_params": False}, {"per_agent_heads": True}, {"rnn": "none"}],
    ids=["gru-shared", "gru-per-agent", "gru-per-agent-heads", "mlp"],
)
def test_agent_net_sequence_equals_stepping_one_step_at_a_time(kwargs):
    torch.manual_seed(0)
    net = AgentNet(obs_dim=5, action_dim=4, agent_num=3, hidden_sizes=[8], hidden_size=6, **kwargs)
    obs = torch.randn(7, 2, 3, 5)
    state = net.initial_state(2)
    if state is not None:
        state = {"h": torch.randn_like(state["h"])}
    seq = net({"obs": obs, "prev_state": state}, sequence=True)
    outs = []
    for t in range(7):
        step = net({"obs": obs[t], "prev_state": state})
        outs.append(step["logit"])
        state = step["next_state"]
    torch.testing.assert_close(seq["logit"], torch.stack(outs), rtol=1e-5, atol=1e-6)
    if state is not None:
        torch.testing.assert_close(seq["next_state"]["h"], state["h"], rtol=1e-5, atol=1e-6)
