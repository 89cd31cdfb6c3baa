"""DDPG, TD3 and SAC: the update steps' hand-differentiated equivalents (``fused_ac``) against the autograd
references the algorithm files define, through the seam that chooses between them (``update_steps``)."""

import contextlib
import copy
import re

import pytest
import torch

from nervex.model import QAC
from nervex.policy import DDPGPolicy, SACPolicy, TD3Policy, ddpg, fused_ac, off_policy_ac, sac, update_steps
from nervex.policy.fused_ac import fused_update_ok
from nervex.torch_utils import TanhGaussianDist, cpu_matmul

LOW, HIGH = [-1.0, 0.0], [3.0, 0.5]  # asymmetric: loc and scale differ per dimension
MODEL = {"obs_dim": 3, "action_dim": 2, "action_low": LOW, "action_high": HIGH, "hidden_sizes": [32, 24]}
CLASSES = {"ddpg": DDPGPolicy, "td3": TD3Policy, "sac": SACPolicy}
PENDULUM_SHAPES = {"action_dim": 1, "action_low": [-2.0], "action_high": [2.0], "hidden_sizes": [64, 48]}


def make(name, fused, model=None, **cfg):
    torch.manual_seed(0)
    learn = {"fused_update": fused, **cfg.pop("learn", {})}
    return CLASSES[name]({"policy_type": name, "model": {**MODEL, **(model or {})}, "learn": learn, **cfg})


def batch(seed, size=16, nstep=1, action_dim=2):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(size, 3, generator=g),
        "next_obs": torch.randn(size, 3, generator=g),
        "action": (torch.rand(size, 2, generator=g) * torch.tensor([4.0, 0.5]) + torch.tensor([-1.0, 0.0]))[
            :, :action_dim
        ],
        "reward": torch.randn(size, nstep, generator=g),
        # a terminal and a truncated (not terminal: it bootstraps) sample in the same batch
        "terminated": torch.tensor([True, False, False, False] * (size // 4)),
        "value_gamma": torch.rand(size, generator=g),
        "weight": torch.rand(size, generator=g) + 0.5,
    }


def run_updates(policy, steps=4, nstep=1):
    infos = []
    for i in range(steps):
        torch.manual_seed(100 + i)  # the same noise draws on both paths
        infos.append(policy.learn_mode.forward(batch(seed=i, nstep=nstep, action_dim=policy.model.action_dim)))
    return infos


CASES = [
    ("ddpg", {}),
    ("ddpg", {"priority": True, "nstep": 3}),
    ("td3", {"learn": {"actor_update_freq": 2}}),
    ("td3", {"priority": True, "nstep": 3, "learn": {"actor_update_freq": 1, "grad_clip": 0.5}}),
    ("sac", {}),
    ("sac", {"priority": True, "nstep": 3, "learn": {"auto_alpha": False, "alpha": 0.2}}),
    ("sac", {"model": {"critic_num": 3, "activation": "tanh"}}),
    # Pendulum's shapes: a 1-D action (outer products instead of matmuls) and an input narrow against the hidden
    # width (the transposed weight gradient)
    ("td3", {"model": PENDULUM_SHAPES, "learn": {"actor_update_freq": 1}}),
    ("sac", {"model": PENDULUM_SHAPES}),
]


def assert_same_steps(name, cfg, use_cuda=False, fused_backend=None, plain_backend=None):
    """Same start, same batches, same noise: every parameter, target copy, optimizer moment, loss and priority of
    the hand-written step equals the autograd step's (float rounding apart). ``*_backend``: a CPU matmul backend
    forced for each path's updates (``'onednn'`` for every product, or ``'blas'``; None: the process's own)."""
    cfg = {**cfg, "use_cuda": use_cuda}  # each path deep-copies its own below
    cfg_fused, cfg_plain = copy.deepcopy(cfg), copy.deepcopy(cfg)
    model = cfg.get("model")
    fused = make(name, True, model=cfg_fused.pop("model", None), **cfg_fused)
    plain = make(name, False, model=cfg_plain.pop("model", None), **cfg_plain)
    assert fused_update_ok(fused.model, trained(fused)), model
    assert_every_step_takes(fused, r"^nervex\.policy\.fused_ac$")
    assert_every_step_takes(plain, r"^nervex\.policy\.(off_policy_ac|ddpg|sac)$")
    assert next(fused.model.parameters()).device.type == ("cuda" if use_cuda else "cpu")
    nstep = cfg.get("nstep", 1)
    with cpu_backend(fused_backend):
        got = run_updates(fused, nstep=nstep)
    with cpu_backend(plain_backend):
        want = run_updates(plain, nstep=nstep)
    for info_got, info_want in zip(got, want):
        assert info_got.keys() == info_want.keys()
        for key, value in info_want.items():
            torch.testing.assert_close(torch.as_tensor(info_got[key]), torch.as_tensor(value), rtol=1e-4, atol=1e-5)
    for a, b in zip(fused.model.parameters(), plain.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    targets = fused._learn_agent.get_model("target"), plain._learn_agent.get_model("target")
    for a, b in zip(targets[0].parameters(), targets[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for opt_got, opt_want in zip(fused.learn_mode.optimizers().values(), plain.learn_mode.optimizers().values()):
        for p_got, p_want in zip(opt_got.param_groups[0]["params"], opt_want.param_groups[0]["params"]):
            state_got, state_want = opt_got.state[p_got], opt_want.state[p_want]
            torch.testing.assert_close(state_got["exp_avg_sq"], state_want["exp_avg_sq"], rtol=1e-4, atol=1e-9)
    if name == "sac" and cfg.get("learn", {}).get("auto_alpha", True):
        torch.testing.assert_close(fused._log_alpha.detach(), plain._log_alpha.detach())
        assert fused._log_alpha.item() != 0.0  # the temperature moved


def trained(policy):
    return [p for opt in policy.learn_mode.optimizers().values() for g in opt.param_groups for p in g["params"]]


def step_calls(policy):
    """Every update step of the policy's update, with arguments like those its update passes."""
    ac = policy._ac
    obs = batch(seed=0)["obs"].to(policy.device)  # the model's device: SAC's sample below runs the step
    calls = [
        (off_policy_ac.actor_output, (ac, "target", obs)),
        (off_policy_ac.critic_values, (ac, "target", obs, None)),
    ]
    calls.append((off_policy_ac.critic_step, (ac, obs, None, None, None)))
    if isinstance(policy, SACPolicy):
        sample = sac.policy_sample.implementation(ac, obs, policy._bounds)(ac, obs, policy._bounds)
        calls += [(sac.policy_sample, (ac, obs, None)), (sac.sac_actor_step, (ac, obs, sample, None, None))]
        if policy._auto_alpha:
            calls.append((sac.temperature_step, (policy._temperature, None)))
    else:
        calls.append((ddpg.deterministic_actor_step, (ac, obs, None)))
    return calls


def assert_every_step_takes(policy, module):
    """Every step of the policy's update runs the implementation from ``module`` (a regex of module names)."""
    for step, args in step_calls(policy):
        chosen = step.implementation(*args)
        assert re.search(module, chosen.__module__), (step, chosen)


CASE_IDS = [f"{n}-{i}" for i, (n, _) in enumerate(CASES)]


@contextlib.contextmanager
def cpu_backend(name):
    """``name`` (``'onednn'``: every CPU float32 product, no size floor; ``'blas'``: none) for the block."""
    if name is None:
        yield
        return
    saved = cpu_matmul.ONEDNN_MIN_MACS, cpu_matmul._DECISIONS
    cpu_matmul.ONEDNN_MIN_MACS, cpu_matmul._DECISIONS = 0, {torch.get_num_threads(): name == "onednn"}
    try:
        yield
    finally:
        cpu_matmul.ONEDNN_MIN_MACS, cpu_matmul._DECISIONS = saved


@pytest.mark.parametrize("name,cfg", CASES, ids=CASE_IDS)
def test_hand_written_step_equals_autograd(name, cfg):
    assert_same_steps(name, cfg)


@pytest.mark.skipif(cpu_matmul._LINEAR is None, reason="this torch build has no oneDNN linear op")
@pytest.mark.parametrize("name,cfg", CASES, ids=CASE_IDS)
def test_hand_written_step_through_onednn_equals_autograd_through_blas(name, cfg):
    """The hand-written step with every product in oneDNN (``nervex.torch_utils.cpu_matmul``, where the CPU's
    large products go when oneDNN is faster) against the autograd step with every product in torch's BLAS."""
    assert_same_steps(name, cfg, fused_backend="onednn", plain_backend="blas")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name,cfg", CASES, ids=CASE_IDS)
def test_hand_written_step_equals_autograd_on_the_gpu(name, cfg):
    """The same comparison with ``policy.use_cuda``: model, batches, noise and optimizer state on the device (the
    noise is drawn from the CUDA generator, which ``torch.manual_seed`` seeds for both paths alike)."""
    if torch.backends.cuda.matmul.allow_tf32:  # TF32 matmuls round differently in the two paths' layouts
        pytest.skip("torch.backends.cuda.matmul.allow_tf32 is on")
    assert_same_steps(name, cfg, use_cuda=True)


@pytest.mark.parametrize("name", ["ddpg", "td3"])
def test_the_actor_step_climbs_the_critic_it_follows(name):
    """A value that could be wrong (a flipped gradient lowers it): after one update, the first critic (the one the
    actor step read, unchanged since) values the new actor's actions above the old actor's."""
    policy = make(name, True, learn={"actor_update_freq": 1} if name == "td3" else {})
    data = batch(seed=0)
    old_actor = copy.deepcopy(policy.model.actor)
    policy.learn_mode.forward(data)
    model = policy.model
    with torch.no_grad():
        new_q = model.compute_critic(data["obs"], model.compute_actor(data["obs"])["action"], critics=1)["q"]
        old_action = model.action_loc + model.action_scale * torch.tanh(old_actor(data["obs"]))
        old_q = model.compute_critic(data["obs"], old_action, critics=1)["q"]
    assert new_q.mean() > old_q.mean()


def test_the_hand_written_step_reuses_each_gradient_tensor_and_replaces_one_that_does_not_fit():
    """The gradients are written into last step's ``.grad`` (no new tensor per step); a ``.grad`` left unfit by
    someone else (wrong dtype, non-contiguous) or cleared by ``zero_grad`` is replaced, and the step still equals
    autograd's."""
    fused, plain = make("td3", True, learn={"actor_update_freq": 1}), make("td3", False, learn={"actor_update_freq": 1})
    critic_w = fused.model.critic.weights[1]
    torch.manual_seed(100)  # the same smoothing noise on both paths
    fused.learn_mode.forward(batch(seed=0))
    first = critic_w.grad
    torch.manual_seed(101)
    fused.learn_mode.forward(batch(seed=1))
    assert critic_w.grad is first  # overwritten in place
    actor_w = fused.model.actor.layers[0][0].weight
    actor_w.grad = torch.zeros(actor_w.shape[1], actor_w.shape[0]).t()  # the right shape, not contiguous
    critic_w.grad = None  # as zero_grad(set_to_none=True) leaves it
    torch.manual_seed(102)
    fused.learn_mode.forward(batch(seed=2))
    assert actor_w.grad.is_contiguous() and critic_w.grad is not None and critic_w.grad is not first
    for i in range(3):
        torch.manual_seed(100 + i)
        plain.learn_mode.forward(batch(seed=i))
    for a, b in zip(fused.model.parameters(), plain.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def assert_steps_on_the_main_model_take_autograd(policy):
    ac = policy._ac
    obs = batch(seed=0)["obs"].to(policy.device)  # the model's device: SAC's sample below runs the step
    for step, args in step_calls(policy)[2:]:
        if args[0] is ac:  # the temperature's step does not read the model
            assert step.implementation(*args) is step.reference, step
    assert off_policy_ac.actor_output.implementation(ac, "main", obs) is off_policy_ac.actor_output.reference
    # the target copy, made before the change, is still the stock QAC
    assert off_policy_ac.actor_output.implementation(ac, "target", obs) is fused_ac.fused_actor_output


def test_gradient_hooks_and_other_models_take_autograd():
    """A post-accumulate-grad hook (what multi-learner all-reduce registers) still fires: the steps that train the
    hooked tensor fall back to autograd, the others stay fused; so does a model whose actor does not run fused
    (LayerNorm)."""
    policy = make("td3", True, learn={"actor_update_freq": 1})
    ac = policy._ac
    obs = batch(seed=0)["obs"].to(policy.device)  # the model's device: SAC's sample below runs the step
    assert fused_update_ok(policy.model, trained(policy))
    calls = []
    handle = policy.model.critic.weights[0].register_post_accumulate_grad_hook(lambda p: calls.append(p.shape))
    assert not fused_update_ok(policy.model, trained(policy))
    assert off_policy_ac.critic_step.implementation(ac, obs, None, None, None) is off_policy_ac.critic_step.reference
    assert ddpg.deterministic_actor_step.implementation(ac, obs, None) is fused_ac.fused_deterministic_actor_step
    policy.learn_mode.forward(batch(seed=0))
    assert calls == [policy.model.critic.weights[0].shape]
    handle.remove()
    assert fused_update_ok(policy.model, trained(policy))
    assert_every_step_takes(policy, r"^nervex\.policy\.fused_ac$")

    hook = policy.model.actor.register_forward_hook(lambda *args: None)
    assert not fused_update_ok(policy.model, trained(policy))
    assert_steps_on_the_main_model_take_autograd(policy)
    hook.remove()

    class LoggingQAC(QAC):
        def compute_critic(self, obs, action, critics=None, param_grad=True):
            return super().compute_critic(obs, action, critics, param_grad)

    assert not fused_update_ok(LoggingQAC(**MODEL), [])
    custom = QAC(**MODEL)
    custom.actor.layers[0][0].weight = torch.nn.Parameter(custom.actor.layers[0][0].weight.detach().clone())
    assert fused_update_ok(custom, [])  # a replaced parameter is picked up (the caches refresh)
    sac_policy = make("sac", True)
    sac_before = [p.detach().clone() for p in sac_policy.model.actor.parameters()]
    sac_policy.model.actor._fused = None  # as an MLP with LayerNorm: runs its layers one by one
    assert not fused_update_ok(sac_policy.model, trained(sac_policy))
    assert_steps_on_the_main_model_take_autograd(sac_policy)
    sac_policy.learn_mode.forward(batch(seed=0))
    assert any(not torch.equal(a, b) for a, b in zip(sac_before, sac_policy.model.actor.parameters()))


def test_a_hook_on_the_temperature_takes_its_autograd_step_and_fires():
    policy = make("sac", True)
    log_alpha = policy._temperature.log_alpha
    fired = []
    log_alpha.register_post_accumulate_grad_hook(lambda p: fired.append(p.grad.item()))
    assert sac.temperature_step.implementation(policy._temperature, None) is sac.temperature_step.reference
    assert (
        sac.sac_actor_step.implementation(
            policy._ac, None, fused_ac.fused_policy_sample(policy._ac, batch(0)["obs"], policy._bounds), None, None
        )
        is fused_ac.fused_sac_actor_step
    )
    policy.learn_mode.forward(batch(seed=0))
    assert len(fired) == 1 and fired[0] != 0.0


def test_a_step_without_an_equivalent_runs_its_reference_and_the_seam_lists_what_is_registered():
    """A new algorithm's step (here a COMA-like critic step) takes autograd with nothing registered for it; the
    registry names each step's equivalent; a second equivalent for one step is refused."""

    @update_steps.update_step
    def new_critic_step(parts, x):
        return ("reference", x)

    parts = type("Parts", (), {"use_equivalents": True})()
    assert new_critic_step(parts, 3) == ("reference", 3)
    listed = update_steps.equivalents()
    assert listed[f"{__name__}.{new_critic_step.__qualname__}"] is None
    assert listed["nervex.policy.off_policy_ac.critic_step"] == "nervex.policy.fused_ac.fused_critic_step"
    assert listed["nervex.policy.sac.temperature_step"] == "nervex.policy.fused_ac.fused_temperature_step"

    @update_steps.equivalent_of(new_critic_step, applies=lambda parts, x: x > 0)
    def fast_critic_step(parts, x):
        return ("equivalent", x)

    assert new_critic_step(parts, 3) == ("equivalent", 3)
    assert new_critic_step(parts, -1) == ("reference", -1)  # where the predicate fails
    parts.use_equivalents = False  # policy.learn.fused_update: false
    assert new_critic_step(parts, 3) == ("reference", 3)
    with pytest.raises(ValueError, match="has the equivalent .*fast_critic_step already"):
        update_steps.equivalent_of(new_critic_step, applies=lambda *a: True)(lambda parts, x: x)
    with pytest.raises(TypeError, match="not marked @update_step"):
        update_steps.equivalent_of(lambda parts: None, applies=lambda *a: True)


def test_rsample_with_noise_returns_the_draw_behind_the_action():
    mu, log_sigma = torch.randn(5, 2), torch.randn(5, 2) * 0.3
    dist = TanhGaussianDist(mu, log_sigma.exp(), LOW, HIGH, log_sigma=log_sigma)
    torch.manual_seed(3)
    action, log_prob = dist.rsample_with_log_prob()
    torch.manual_seed(3)
    action2, log_prob2, eps, u = dist.rsample_with_noise()
    torch.testing.assert_close(action, action2)
    torch.testing.assert_close(log_prob, log_prob2)
    torch.testing.assert_close(u, mu + log_sigma.exp() * eps)
    loc, scale = (torch.tensor(HIGH) + torch.tensor(LOW)) / 2, (torch.tensor(HIGH) - torch.tensor(LOW)) / 2
    torch.testing.assert_close(action, loc + scale * torch.tanh(u))


def test_the_hand_written_step_refuses_a_misshapen_action_as_the_model_does():
    """The fused critic step reads its input through ``QAC.critic_input``: a batch whose actions have the wrong width
    gets the model's error, naming the shapes, on both paths."""
    for fused in (True, False):
        policy = make("td3", fused)
        data = batch(seed=0)
        data["action"] = data["action"][:, :1]
        with pytest.raises(ValueError, match=r"action has shape \(16, 1\); expected \(16, 2\)"):
            policy.learn_mode.forward(data)
