"""The gradient steps of DDPG, TD3 and SAC on the stock ``QAC``, differentiated by hand.

On a CPU these learners are bound by per-op overhead around their matmuls: autograd records a graph node per op,
the engine walks it back, and each ``AccumulateGrad`` detaches and stores. Here each step runs forward with no graph
(``fused_mlp``'s layer functions, which also serve its autograd nodes), keeps the activations its backward needs, and
writes each parameter's gradient into ``.grad`` as ``zero_grad(); loss.backward()`` would leave it; the optimizer then
steps as usual (clipping included). A TD3 update on Pendulum-size inputs with [256, 256] networks and batch 256
runs ~15% faster than the same update through autograd, a SAC update ~20% (``docs/benchmarks.md``).

The losses are ``rl_utils``' (``critic_loss``, ``deterministic_actor_loss``, ``sac_actor_loss``, ``sac_alpha_loss``)
and stay the definition: each function below returns the loss value they give and the gradient autograd would
compute from them (``tests/policy/test_fused_ac.py`` runs both paths from the same state and noise and compares every
parameter). Each function also takes the autograd path, for what the hand-written one does not cover
(``fused_update_ok``): another model than ``QAC`` with a fused ``MLP`` actor and ``BatchedCritics``, gradient hooks
on a trained tensor (multi-learner gradient all-reduce uses them), module hooks, or ``policy.learn.fused_update: false``.

One approximation: the clamp after squashing (``loc + scale * tanh(u)`` may round one ulp past ``high``) passes
SAC's action gradient unmasked; where it clamps, ``1 - tanh(u)^2`` is at most ~1e-7 and the gradient with it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from nervex.agent import Agent
from nervex.model.qac import LOG_STD_MAX, LOG_STD_MIN, QAC, BatchedCritics
from nervex.rl_utils import critic_loss, deterministic_actor_loss, sac_actor_loss
from nervex.rl_utils.td import weighted_mean
from nervex.torch_utils import MLP, TanhGaussianDist
from nervex.torch_utils.fused_mlp import (
    FUSED_ACTIVATIONS,
    batched_layers_backward,
    batched_layers_forward,
    layers_backward,
    layers_forward,
    writable,
)
from nervex.torch_utils.registration import registration_count


# ---- when the hand-written path applies -----------------------------------------------------------------------------
def _stock_methods(obj: object, cls: type, names: Sequence[str]) -> bool:
    return isinstance(obj, cls) and all(getattr(type(obj), name) is getattr(cls, name) for name in names)


def _module_hooks(module: torch.nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks)


_STRUCTURE_OK: weakref.WeakKeyDictionary[torch.nn.Module, Tuple[int, bool]] = weakref.WeakKeyDictionary()


def _structure_ok(model: torch.nn.Module) -> bool:
    """The model's part of ``fused_update_ok``, cached until a module registers or replaces a tensor or submodule."""
    key = registration_count()
    cached = _STRUCTURE_OK.get(model)
    if cached is None or cached[0] != key:
        ok = bool(
            _stock_methods(model, QAC, ("forward", "compute_actor", "actor_head", "compute_critic", "flatten_obs"))
            and _stock_methods(model.actor, MLP, ("forward", "fused_params"))
            and model.actor.fused_params() is not None
            and _stock_methods(model.critic, BatchedCritics, ("forward", "layer_params"))
            and model.critic.activation_name in FUSED_ACTIVATIONS
        )
        cached = _STRUCTURE_OK[model] = (key, ok)
    return cached[1]


def fused_update_ok(model: torch.nn.Module, tensors: Sequence[torch.Tensor]) -> bool:
    """Whether the hand-written steps compute what autograd would for ``model``.

    True for a ``QAC`` (methods not overridden) whose actor is an ``MLP`` that runs fused (``relu`` or ``tanh``, no
    LayerNorm), whose critics are ``BatchedCritics`` with a fused activation, with no forward or backward hooks on
    these modules and no gradient hooks on ``tensors`` (the trained tensors; hooks are checked on every call, as one
    may be added at any time).

    Args:
        model: The policy's model.
        tensors: The tensors the optimizers train (``.grad`` is written for them).
    """
    if not _structure_ok(model):
        return False
    if _module_hooks(model) or _module_hooks(model.actor) or _module_hooks(model.critic):
        return False
    return not any(t._backward_hooks or t._post_accumulate_grad_hooks for t in tensors)


def _grad_slots(tensors: Sequence[torch.Tensor]) -> List[Optional[torch.Tensor]]:
    """Where the hand-written backward writes each tensor's gradient: its ``.grad`` from the last step when that fits
    (same shape, dtype and device, dense and contiguous: ``param.data = ...`` can leave one that does not), else a new
    tensor set as ``.grad``; None for a tensor that does not require a gradient (its gradient is computed and
    dropped). Overwritten whole, ``.grad`` ends as ``zero_grad(); loss.backward()`` leaves it, without a new tensor
    per step (a caller that kept last step's ``.grad`` sees it overwritten, as with ``zero_grad(set_to_none=False)``).
    """
    slots: List[Optional[torch.Tensor]] = []
    for tensor in tensors:
        if not tensor.requires_grad:
            slots.append(None)
            continue
        grad = tensor.grad
        if not writable(grad, tensor.shape, tensor):
            grad = tensor.grad = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        slots.append(grad)
    return slots


def _loss_weight(weight: Optional[torch.Tensor], batch: int, like: torch.Tensor) -> torch.Tensor:
    """``d weighted_mean(x, weight) / dx``: ``weight / B`` (``1 / B`` without weights), ``(B,)``."""
    if weight is None:
        return torch.full((batch,), 1.0 / batch, dtype=like.dtype, device=like.device)
    return weight.to(like.dtype) / batch


def _actor_layers(actor: MLP) -> Tuple[Tuple[Optional[str], ...], List[torch.Tensor]]:
    params = actor.fused_params()
    if params is None:
        raise ValueError("fused_ac: the actor MLP does not run fused (see fused_update_ok)")
    return params


# ---- the critics' forward without a graph ---------------------------------------------------------------------------
@dataclass
class _CriticPass:
    """The first ``num`` critics run forward at ``[obs, action]``, with the activations their backward reads."""

    q: torch.Tensor  # (num, B)
    outputs: List[torch.Tensor]
    weights: List[torch.Tensor]
    num: int


def _critics_forward(model: QAC, x: torch.Tensor, num: Optional[int] = None) -> _CriticPass:
    """The first ``num`` critics (all by default) on the critics' input ``x`` (``QAC.critic_input``), no graph."""
    critic = model.critic
    weights, biases = critic.layer_params()
    if num is None:
        num = critic.num
    elif num < critic.num:
        weights, biases = [w[:num] for w in weights], [b[:num] for b in biases]
    outputs, out = batched_layers_forward(x.expand(num, *x.shape), critic.activation_name, weights, biases)
    return _CriticPass(out.squeeze(-1), outputs, weights, num)


# ---- evaluations without a gradient (targets) -----------------------------------------------------------------------
def qac_forward(agent: Agent, name: str, data: Any, mode: str, fused: bool) -> Dict[str, torch.Tensor]:
    """``agent.model_forward(name, data, mode=mode)`` for an evaluation without gradient (a target); fused: the same
    computation as ``QAC.compute_actor`` / ``compute_critic`` on the model's layers, without the agent's plugin
    chain and the module calls (~50 us less per call on a CPU).

    Args:
        agent: The learner's agent (its plugins on ``name`` must not change the output: the learner's add none).
        name: The agent's model (``'main'``, ``'target'``).
        data: Observations for ``'compute_actor'``, ``{'obs', 'action'}`` for ``'compute_critic'``.
        mode: ``'compute_actor'`` or ``'compute_critic'``.
        fused: Take the direct path (``fused_update_ok`` holds for the model).

    Returns:
        What ``QAC.forward`` returns for ``mode``.
    """
    if not fused:
        return agent.model_forward(name, data, mode=mode)
    model = agent.get_model(name)
    with torch.no_grad():
        if mode == "compute_critic":
            return {"q": _critics_forward(model, model.critic_input(data["obs"], data["action"])).q}
        acts, layer_params = _actor_layers(model.actor)
        out = layers_forward(model.flatten_obs(data), acts, layer_params)[-1]
        return model.actor_head(out)


# ---- the critics' regression ----------------------------------------------------------------------------------------
def critic_update(
    agent: Agent,
    model: QAC,
    optimizer: torch.optim.Optimizer,
    obs: torch.Tensor,
    action: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor],
    fused: bool,
    td_error: bool = True,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """One optimizer step of every critic on ``critic_loss(Q(obs, action), target, weight)``.

    Args:
        agent: The learner's agent over ``model`` (the autograd path calls it).
        model: The QAC.
        optimizer: The critics' optimizer.
        obs, action: The batch's observations and stored actions.
        target: The detached target.
        weight: Importance weights, or None.
        fused: Take the hand-written path (``fused_update_ok``).
        td_error: Whether the TD error is wanted (prioritized replay); the hand-written path skips it otherwise.

    Returns:
        ``(loss, td_error, q)`` as ``critic_loss`` and the critics give them (detached; ``td_error`` may be None
        when not asked for).

    Shapes:
        - obs: :math:`(B, *obs_shape)`; action: :math:`(B, A)`; target, weight, td_error: :math:`(B,)`
        - q: :math:`(N, B)`
    """
    if not fused:
        q = agent.forward({"obs": obs, "action": action}, mode="compute_critic")["q"]
        loss, td_error = critic_loss(q, target, weight)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach(), td_error, q.detach()
    weights, biases = model.critic.layer_params()
    with torch.no_grad():
        run = _critics_forward(model, model.critic_input(obs, action))
        q = run.q
        error = target - q  # (N, B), as critic_loss
        loss = weighted_mean(0.5 * error.square().sum(0), weight)
        errors = error.abs().mean(0) if td_error else None
        # d loss / d q_ib = -(target_b - q_ib) w_b / B
        grad_q = error.mul_(-1.0 / q.shape[1] if weight is None else -_loss_weight(weight, q.shape[1], q))
        every = [True] * len(weights)
        slots = _grad_slots([*weights, *biases])
        batched_layers_backward(
            grad_q.unsqueeze(-1),
            run.outputs,
            weights,
            model.critic.activation_name,
            every,
            every,
            False,
            slots[: len(weights)],
            slots[len(weights) :],
            consume=True,
        )
    optimizer.step()
    return loss, errors, q


def _critics_action_grad(model: QAC, run: _CriticPass, grad_q: torch.Tensor) -> torch.Tensor:
    """``d loss / d action`` from ``d loss / d q`` (``(num, B)``), with no gradient for the critics' weights (an
    actor's loss), ``(B, A)``."""
    none = [False] * len(run.weights)
    # the input's gradient through the first layer's action rows only: the observation's is not needed
    first = run.weights[0]
    weights = [first[:, first.shape[1] - model.action_dim :], *run.weights[1:]]
    action_grad, _, _ = batched_layers_backward(
        grad_q.unsqueeze(-1), run.outputs, weights, model.critic.activation_name, none, none, True, consume=True
    )
    return action_grad[0] if run.num == 1 else action_grad.sum(0)


# ---- DDPG's and TD3's actor -----------------------------------------------------------------------------------------
def deterministic_actor_update(
    agent: Agent,
    model: QAC,
    optimizer: torch.optim.Optimizer,
    params: List[torch.Tensor],
    obs: torch.Tensor,
    weight: Optional[torch.Tensor],
    fused: bool,
) -> torch.Tensor:
    """One optimizer step of the actor on ``deterministic_actor_loss(Q_1(obs, mu(obs)), weight)`` (the first critic
    only; the critics' weights get no gradient).

    Args:
        agent, model, weight, fused: As for :func:`critic_update`.
        optimizer: The actor's optimizer.
        params: The actor's parameters (the autograd path's ``backward(inputs=...)``).
        obs: The batch's observations.

    Returns:
        The loss (detached).
    """
    if not fused:
        action = agent.forward(obs, mode="compute_actor")["action"]
        q = agent.forward({"obs": obs, "action": action}, mode="compute_critic", critics=1, param_grad=False)["q"]
        loss = deterministic_actor_loss(q, weight)
        optimizer.zero_grad()
        loss.backward(inputs=params)
        optimizer.step()
        return loss.detach()
    acts, layer_params = _actor_layers(model.actor)
    with torch.no_grad():
        flat = model.flatten_obs(obs)
        outputs = layers_forward(flat, acts, layer_params)
        action = model.actor_head(outputs[-1])["action"]
        squashed = torch.tanh(outputs[-1])  # the head's tanh, for its backward
        run = _critics_forward(model, torch.cat([flat, action], dim=-1), 1)
        loss = weighted_mean(-run.q[0], weight)
        action_grad = _critics_action_grad(model, run, -_loss_weight(weight, flat.shape[0], flat).unsqueeze(0))
        out_grad = torch.ops.aten.tanh_backward(action_grad * model.action_scale, squashed)
        every = [True] * len(layer_params)
        layers_backward(out_grad, acts, outputs, layer_params, every, False, _grad_slots(layer_params), consume=True)
    optimizer.step()
    return loss


# ---- SAC's actor ----------------------------------------------------------------------------------------------------
@dataclass
class SquashedSample:
    """A reparameterized action of SAC's actor and what its hand-written backward reads.

    Attributes:
        action: The squashed action in the bounds, :math:`(B, A)`.
        log_prob: Its log-probability (tanh correction included), :math:`(B,)`; with a graph on the autograd path.
        flat_obs: The observations the actor read, :math:`(B, D)` (fused path only, as the rest below).
        outputs: The actor's activations ``[input, h_1, ..., (mu, log_std)]``.
        eps, u: The standard-normal draw and the pre-squash sample ``mu + sigma * eps``, :math:`(B, A)`.
        sigma: ``exp(clamp(log_std))``, :math:`(B, A)`.
    """

    action: torch.Tensor
    log_prob: torch.Tensor
    flat_obs: Optional[torch.Tensor] = None
    outputs: Optional[List[torch.Tensor]] = None
    eps: Optional[torch.Tensor] = None
    u: Optional[torch.Tensor] = None
    sigma: Optional[torch.Tensor] = None


def sac_sample(
    agent: Agent,
    model: QAC,
    dist: Callable[[dict], TanhGaussianDist],
    obs: torch.Tensor,
    fused: bool,
) -> SquashedSample:
    """A reparameterized action of the current policy at ``obs`` and its log-probability (SAC's actor and
    temperature losses read them).

    Args:
        agent, model, fused: As for :func:`critic_update`.
        dist: The policy's distribution from the actor's ``{'mu', 'sigma', 'log_sigma'}``.
        obs: The batch's observations.
    """
    if not fused:
        action, log_prob = dist(agent.forward(obs, mode="compute_actor")).rsample_with_log_prob()
        return SquashedSample(action, log_prob)
    acts, layer_params = _actor_layers(model.actor)
    with torch.no_grad():
        flat = model.flatten_obs(obs)
        outputs = layers_forward(flat, acts, layer_params)
        gaussian = model.actor_head(outputs[-1])
        action, log_prob, eps, u = dist(gaussian).rsample_with_noise()
    return SquashedSample(action, log_prob, flat, outputs, eps, u, gaussian["sigma"])


def sac_actor_update(
    agent: Agent,
    model: QAC,
    optimizer: torch.optim.Optimizer,
    params: List[torch.Tensor],
    sample: SquashedSample,
    obs: torch.Tensor,
    alpha: torch.Tensor,
    weight: Optional[torch.Tensor],
    fused: bool,
) -> torch.Tensor:
    """One optimizer step of the actor on ``sac_actor_loss(Q(obs, a), log_prob, alpha, weight)`` for the sample's
    reparameterized ``a`` (every critic, at its current weights; the critics' weights get no gradient).

    Args:
        agent, model, weight, fused: As for :func:`critic_update`.
        optimizer, params: The actor's optimizer and parameters.
        sample: From :func:`sac_sample` (taken before this update's critic step); the fused path overwrites its
            hidden activations (``sample.outputs[1:-1]``, ``layers_backward(consume=True)``): use a sample once.
        obs: The batch's observations.
        alpha: The temperature (detached).

    Returns:
        The loss (detached).
    """
    if not fused:
        pair = {"obs": obs, "action": sample.action}
        q = agent.forward(pair, mode="compute_critic", param_grad=False)["q"]
        loss = sac_actor_loss(q, sample.log_prob, alpha, weight)
        optimizer.zero_grad()
        loss.backward(inputs=params)
        optimizer.step()
        return loss.detach()
    if sample.outputs is None or sample.flat_obs is None:
        raise ValueError("sac_actor_update: fused=True needs a sample drawn by sac_sample with fused=True")
    acts, layer_params = _actor_layers(model.actor)
    with torch.no_grad():
        flat, eps, u, sigma = sample.flat_obs, sample.eps, sample.u, sample.sigma
        w = _loss_weight(weight, flat.shape[0], flat)  # d loss / d (a sample's term)
        run = _critics_forward(model, torch.cat([flat, sample.action], dim=-1))
        q_min, index = run.q.min(dim=0)  # critic_min: the gradient reaches the smallest critic of each sample
        loss = weighted_mean(alpha * sample.log_prob - q_min, weight)
        grad_q = torch.zeros_like(run.q).scatter_(0, index.unsqueeze(0), -w.unsqueeze(0))
        action_grad = _critics_action_grad(model, run, grad_q)
        logp_grad = (alpha * w).unsqueeze(-1)  # d loss / d log_prob, (B, 1)
        squashed = torch.tanh(u)
        # u = mu + sigma * eps: d log_prob / du = 2 tanh(u); the action's path through the squash and the bounds
        u_grad = torch.ops.aten.tanh_backward(action_grad * model.action_scale, squashed)
        u_grad = u_grad.add_(squashed * logp_grad, alpha=2.0)
        # log_sigma: through u (times eps * sigma) and directly (d log_prob / d log_sigma = -1); then the clamp
        log_std = sample.outputs[-1][:, model.action_dim :]
        log_sigma_grad = (u_grad * eps * sigma).sub_(logp_grad)
        log_sigma_grad.mul_((log_std >= LOG_STD_MIN) & (log_std <= LOG_STD_MAX))
        out_grad = torch.cat([u_grad, log_sigma_grad], dim=-1)
        every = [True] * len(layer_params)
        layers_backward(
            out_grad, acts, sample.outputs, layer_params, every, False, _grad_slots(layer_params), consume=True
        )
    optimizer.step()
    return loss
