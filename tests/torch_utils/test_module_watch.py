"""ModuleWatch: the caches of a module's tensors refresh after a replacement, and importing nervex hooks nothing."""

import copy
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from nervex.agent import Agent
from nervex.model import QAC
from nervex.torch_utils import MLP
from nervex.torch_utils.module_watch import ModuleWatch


def test_a_watch_reports_each_replacement_once_and_nothing_else():
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    watch = ModuleWatch([net])
    assert watch.replaced()  # the first look
    assert not watch.replaced()
    with torch.no_grad():  # in-place updates, load_state_dict and .to() keep the objects
        net[0].weight.add_(1.0)
    net.load_state_dict(copy.deepcopy(net.state_dict()))
    net.to(torch.float32)
    assert not watch.replaced()
    net[2].bias = nn.Parameter(torch.zeros(1))  # a parameter deep in the tree
    assert watch.replaced() and not watch.replaced()
    net[0] = nn.Linear(3, 4)  # a submodule
    assert watch.replaced() and not watch.replaced()
    net[0].weight = nn.Parameter(torch.zeros(4, 3))  # a parameter of the new submodule is watched too
    assert watch.replaced()
    net[1].register_buffer("scale", torch.ones(1))  # an added buffer
    assert watch.replaced()
    net.load_state_dict(copy.deepcopy(net.state_dict()), assign=True)  # assign=True replaces every tensor
    assert watch.replaced() and not watch.replaced()


def test_a_watch_without_recursion_sees_only_its_modules_own_slots():
    outer = nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.Linear(4, 4)))
    watch = ModuleWatch([outer], recurse=False)
    watch.replaced()
    outer[1][0].weight = nn.Parameter(torch.zeros(4, 4))  # inside a submodule: not watched
    assert not watch.replaced()
    outer[1] = nn.Linear(4, 4)  # the module's own slot
    assert watch.replaced()


def test_the_mlp_and_critic_caches_refresh_after_a_parameter_is_replaced():
    """The fused forward must read the new tensor: a stale cache would compute with the old weights."""
    model = QAC(3, 2, hidden_sizes=[8])
    x = torch.randn(5, 3)
    before = model.actor(x)
    first = model.actor.layers[0][0]
    first.weight = nn.Parameter(torch.zeros_like(first.weight))
    first.bias = nn.Parameter(torch.zeros_like(first.bias))
    after = model.actor(x)
    torch.testing.assert_close(after, model.actor.layers[-1](torch.zeros(5, 8)))  # relu(0) = 0 into the last layer
    assert not torch.allclose(before, after)
    assert model.actor.fused_params()[1][0] is first.weight

    sa = torch.randn(5, 5)
    model.critic.weights[0] = nn.Parameter(torch.zeros_like(model.critic.weights[0]))
    weights, _ = model.critic.layer_params()
    assert weights[0] is model.critic.weights[0]
    q = model.critic(sa)  # the hidden layer is relu(bias) for every input: q is the same for each sample
    torch.testing.assert_close(q, q[:, :1].expand_as(q))


def test_the_polyak_update_follows_a_replaced_parameter():
    """The target updater's tensor lists refresh: after ``main``'s weight is replaced the target moves toward the
    new one (a stale list would move it toward the old, detached tensor)."""
    main = MLP(2, [3], out_dim=1)
    agent = Agent(main)
    agent.add_model("target", update_type="momentum", update_kwargs={"theta": 1.0})
    agent.target_update()
    new = nn.Parameter(torch.full_like(main.layers[0][0].weight, 0.5))
    main.layers[0][0].weight = new
    agent.target_update()
    torch.testing.assert_close(agent.get_model("target").layers[0][0].weight, new.detach())


def test_a_copied_model_watches_its_own_tensors():
    model = QAC(3, 2, hidden_sizes=[8])
    model.critic.layer_params(), model.actor.fused_params()
    clone = copy.deepcopy(model)
    assert clone.critic.layer_params()[0][0] is clone.critic.weights[0]
    assert clone.actor.fused_params()[1][0] is clone.actor.layers[0][0].weight


@pytest.mark.timeout(120)
def test_importing_nervex_installs_no_global_module_hook():
    code = (
        "import torch.nn.modules.module as m\n"
        "import nervex, nervex.policy, nervex.model, nervex.agent, nervex.torch_utils, nervex.entry\n"
        "hooks = [m._global_parameter_registration_hooks, m._global_buffer_registration_hooks,\n"
        "         m._global_module_registration_hooks, m._global_forward_hooks, m._global_forward_pre_hooks,\n"
        "         m._global_backward_hooks, m._global_backward_pre_hooks]\n"
        "print(sum(len(h) for h in hooks))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, check=True)
    assert out.stdout.strip() == "0", out.stderr
