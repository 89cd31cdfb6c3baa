"""Equivalents of DDPG's, TD3's and SAC's update steps on the stock ``QAC``, differentiated by hand.

The steps are defined with autograd in the algorithm files (``critic_step``, ``actor_output`` and ``critic_values``
in ``off_policy_ac.py``, ``deterministic_actor_step`` in ``ddpg.py``, ``policy_sample``, ``sac_actor_step`` and
``temperature_step`` in ``sac.py``); each function here is registered with ``update_steps.equivalent_of`` as the
same computation, taken where its predicate holds (``fused_update_ok``: the stock ``QAC`` with a fused ``MLP`` actor
and ``BatchedCritics``, no module hooks, no gradient hooks on the tensors the step trains, which multi-learner
gradient all-reduce registers) and ``policy.learn.fused_update`` is on.

On a CPU these learners are bound by per-op overhead around their matmuls: autograd records a graph node per op,
the engine walks it back, and each ``AccumulateGrad`` detaches and stores. Here each step runs forward with no graph
(``fused_mlp``'s layer functions, which also serve its autograd nodes), keeps the activations its backward needs, and
writes each parameter's gradient into ``.grad`` as ``zero_grad(); loss.backward()`` would leave it; the optimizer then
steps as usual (clipping included). An update runs 1.3-2x as fast as through autograd (``docs/benchmarks.md``);
``tests/policy/test_fused_ac.py`` runs both from the same state and noise and compares every parameter, target,
Adam moment, loss and priority.

One approximation: the clamp after squashing (``loc + scale * tanh(u)`` may round one ulp past ``high``) passes
SAC's action gradient unmasked; where it clamps, ``1 - tanh(u)^2`` is at most ~1e-7 and the gradient with it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from nervex.model.qac import LOG_STD_MAX, LOG_STD_MIN, QAC, BatchedCritics
from nervex.rl_utils.td import weighted_mean
from nervex.torch_utils import MLP
from nervex.torch_utils.distribution import SquashBounds
from nervex.torch_utils.fused_mlp import (
    FUSED_ACTIVATIONS,
    batched_layers_backward,
    batched_layers_forward,
    layers_backward,
    layers_forward,
    writable,
)

from .ddpg import deterministic_actor_step
from .off_policy_ac import ActorCriticLearn, actor_output, critic_step, critic_values
from .sac import PolicySample, Temperature, policy_sample, sac_actor_step, squashed_gaussian, temperature_step
from .update_steps import equivalent_of

QAC_METHODS = ("forward", "compute_actor", "actor_head", "compute_critic", "flatten_obs", "critic_input")


# ---- when the hand-written steps apply -----------------------------------------------------------------------------
def _stock_methods(obj: object, cls: type, names: Sequence[str]) -> bool:
    return isinstance(obj, cls) and all(getattr(type(obj), name) is getattr(cls, name) for name in names)


def _module_hooks(module: torch.nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks)


def _gradient_hooks(tensors: Sequence[torch.Tensor]) -> bool:
    return any(t._backward_hooks or t._post_accumulate_grad_hooks for t in tensors)


# model -> (actor, critic, the actor's fused plan, the critics' activation, verdict): the verdict holds while the model
# holds the same actor and critic, built the same way
_STRUCTURE: weakref.WeakKeyDictionary[torch.nn.Module, Tuple[Any, Any, Any, Any, bool]] = weakref.WeakKeyDictionary()


def _structure_ok(model: torch.nn.Module, actor: Any, critic: Any) -> bool:
    """Whether ``model`` is a ``QAC`` (methods not overridden) whose actor is an ``MLP`` that runs fused and whose
    critics are ``BatchedCritics`` with a fused activation (asked on every step: the checks are cached)."""
    plan, activation = getattr(actor, "_fused", None), getattr(critic, "activation_name", None)
    cached = _STRUCTURE.get(model)
    if (
        cached is not None
        and cached[0] is actor
        and cached[1] is critic
        and cached[2] is plan
        and cached[3] is activation
    ):
        return cached[4]
    ok = bool(
        _stock_methods(model, QAC, QAC_METHODS)
        and _stock_methods(actor, MLP, ("forward", "fused_params"))
        and actor.fused_params() is not None
        and _stock_methods(critic, BatchedCritics, ("forward", "layer_params"))
        and activation in FUSED_ACTIVATIONS
    )
    _STRUCTURE[model] = (actor, critic, plan, activation, ok)
    return ok


def qac_fused_ok(model: torch.nn.Module) -> bool:
    """Whether the hand-written forward computes what ``model``'s own does: the stock ``QAC`` structure (see
    ``fused_update_ok``) and no forward or backward hooks on the model, its actor or its critics."""
    # the submodules straight from nn.Module's storage: attribute access through Module.__getattr__ costs ~1 us each
    submodules = model._modules
    actor, critic = submodules.get("actor"), submodules.get("critic")
    if not _structure_ok(model, actor, critic):
        return False
    return not (_module_hooks(model) or _module_hooks(actor) or _module_hooks(critic))


def fused_update_ok(model: torch.nn.Module, tensors: Sequence[torch.Tensor]) -> bool:
    """Whether a hand-written step that trains ``tensors`` computes what autograd would for ``model``.

    True for a ``QAC`` (methods not overridden) whose actor is an ``MLP`` that runs fused (``relu`` or ``tanh``, no
    LayerNorm), whose critics are ``BatchedCritics`` with a fused activation, with no forward or backward hooks on
    these modules and no gradient hooks on ``tensors`` (checked on every call: one may be added at any time).

    Args:
        model: The policy's model.
        tensors: The tensors the step's optimizer trains (``.grad`` is written for them).
    """
    return qac_fused_ok(model) and not _gradient_hooks(tensors)


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
    biases: List[torch.Tensor]
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
    return _CriticPass(out.squeeze(-1), outputs, weights, biases, num)


# ---- evaluations without a gradient (targets) -----------------------------------------------------------------------
def _evaluation_applies(ac: ActorCriticLearn, name: str, *_args: Any) -> bool:
    return qac_fused_ok(ac.agent.get_model(name))


@equivalent_of(actor_output, applies=_evaluation_applies)
def fused_actor_output(ac: ActorCriticLearn, name: str, obs: torch.Tensor) -> Dict[str, torch.Tensor]:
    """``actor_output`` on the model's layers, without the agent's plugin chain and the module calls (~50 us less
    per call on a CPU; the learner's agent adds no plugin that changes an output)."""
    model = ac.agent.get_model(name)
    acts, layer_params = _actor_layers(model.actor)
    with torch.no_grad():
        return model.actor_head(layers_forward(model.flatten_obs(obs), acts, layer_params)[-1])


@equivalent_of(critic_values, applies=_evaluation_applies)
def fused_critic_values(ac: ActorCriticLearn, name: str, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``critic_values`` on the model's layers (as ``fused_actor_output``)."""
    model = ac.agent.get_model(name)
    with torch.no_grad():
        return _critics_forward(model, model.critic_input(obs, action)).q


# ---- the critics' regression ----------------------------------------------------------------------------------------
def _critic_applies(ac: ActorCriticLearn, *_args: Any) -> bool:
    return fused_update_ok(ac.model, ac.critic_params)


@equivalent_of(critic_step, applies=_critic_applies)
def fused_critic_step(
    ac: ActorCriticLearn,
    obs: torch.Tensor,
    action: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor],
) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """``critic_step``: ``critic_loss``'s value, TD error (when ``ac.priority``) and gradient by hand, then the
    critics' optimizer step."""
    model = ac.model
    with torch.no_grad():
        run = _critics_forward(model, model.critic_input(obs, action))
        weights, biases = run.weights, run.biases
        q = run.q
        error = target - q  # (N, B), as critic_loss
        loss = weighted_mean(0.5 * error.square().sum(0), weight)
        td_error = error.abs().mean(0) if ac.priority else None
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
    ac.critic_optimizer.step()
    return loss, td_error, q


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
def _actor_applies(ac: ActorCriticLearn, *_args: Any) -> bool:
    return fused_update_ok(ac.model, ac.actor_params)


@equivalent_of(deterministic_actor_step, applies=_actor_applies)
def fused_deterministic_actor_step(
    ac: ActorCriticLearn, obs: torch.Tensor, weight: Optional[torch.Tensor]
) -> torch.Tensor:
    """``deterministic_actor_step``: the loss through ``Q_1`` and the actor's gradient by hand (the critics' weights
    get none), then the actor's optimizer step."""
    model = ac.model
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
    ac.actor_optimizer.step()
    return loss


# ---- SAC's actor and temperature ------------------------------------------------------------------------------------
@dataclass
class FusedSample(PolicySample):
    """``policy_sample``'s action and log-probability (no graph), with what the hand-written actor step reads.

    Attributes:
        flat_obs: The observations the actor read, :math:`(B, D)`.
        outputs: The actor's activations ``[input, h_1, ..., (mu, log_std)]``.
        eps, u: The standard-normal draw and the pre-squash sample ``mu + sigma * eps``, :math:`(B, A)`.
        sigma: ``exp(clamp(log_std))``, :math:`(B, A)`.
    """

    flat_obs: torch.Tensor
    outputs: List[torch.Tensor]
    eps: torch.Tensor
    u: torch.Tensor
    sigma: torch.Tensor


@equivalent_of(policy_sample, applies=_actor_applies)
def fused_policy_sample(ac: ActorCriticLearn, obs: torch.Tensor, bounds: SquashBounds) -> FusedSample:
    """``policy_sample`` (the same draws) with no graph, keeping the activations ``fused_sac_actor_step`` reads."""
    model = ac.model
    acts, layer_params = _actor_layers(model.actor)
    with torch.no_grad():
        flat = model.flatten_obs(obs)
        outputs = layers_forward(flat, acts, layer_params)
        gaussian = model.actor_head(outputs[-1])
        action, log_prob, eps, u = squashed_gaussian(gaussian, bounds).rsample_with_noise()
    return FusedSample(action, log_prob, flat, outputs, eps, u, gaussian["sigma"])


def _sac_actor_applies(ac: ActorCriticLearn, obs: torch.Tensor, sample: PolicySample, *_args: Any) -> bool:
    return isinstance(sample, FusedSample) and _actor_applies(ac)


@equivalent_of(sac_actor_step, applies=_sac_actor_applies)
def fused_sac_actor_step(
    ac: ActorCriticLearn, obs: torch.Tensor, sample: FusedSample, alpha: torch.Tensor, weight: Optional[torch.Tensor]
) -> torch.Tensor:
    """``sac_actor_step``: the loss through every critic's minimum and the actor's gradient by hand (the critics'
    weights get none), then the actor's optimizer step. Overwrites the sample's hidden activations (use it once)."""
    model = ac.model
    acts, layer_params = _actor_layers(model.actor)
    with torch.no_grad():
        flat = sample.flat_obs
        w = _loss_weight(weight, flat.shape[0], flat)  # d loss / d (a sample's term)
        run = _critics_forward(model, torch.cat([flat, sample.action], dim=-1))
        q_min, index = run.q.min(dim=0)  # critic_min: the gradient reaches the smallest critic of each sample
        loss = weighted_mean(alpha * sample.log_prob - q_min, weight)
        grad_q = torch.zeros_like(run.q).scatter_(0, index.unsqueeze(0), -w.unsqueeze(0))
        action_grad = _critics_action_grad(model, run, grad_q)
        out_grad = _squashed_gaussian_backward(model, sample, action_grad, (alpha * w).unsqueeze(-1))
        every = [True] * len(layer_params)
        layers_backward(
            out_grad, acts, sample.outputs, layer_params, every, False, _grad_slots(layer_params), consume=True
        )
    ac.actor_optimizer.step()
    return loss


def _squashed_gaussian_backward(
    model: QAC, sample: FusedSample, action_grad: torch.Tensor, logp_grad: torch.Tensor
) -> torch.Tensor:
    """The gradient of the actor MLP's output ``(mu, log_std)`` from the loss's gradients in the sample's action
    ``(B, A)`` and in its log-probability ``(B, 1)``, through ``a = loc + scale * tanh(mu + sigma * eps)``."""
    squashed = torch.tanh(sample.u)
    # u = mu + sigma * eps: d log_prob / du = 2 tanh(u); the action's path through the squash and the bounds
    u_grad = torch.ops.aten.tanh_backward(action_grad * model.action_scale, squashed)
    u_grad = u_grad.add_(squashed * logp_grad, alpha=2.0)
    # log_sigma: through u (times eps * sigma) and directly (d log_prob / d log_sigma = -1); then the clamp
    log_std = sample.outputs[-1][:, model.action_dim :]
    log_sigma_grad = (u_grad * sample.eps * sample.sigma).sub_(logp_grad)
    log_sigma_grad.mul_((log_std >= LOG_STD_MIN) & (log_std <= LOG_STD_MAX))
    return torch.cat([u_grad, log_sigma_grad], dim=-1)


def _temperature_applies(temperature: Temperature, *_args: Any) -> bool:
    return not _gradient_hooks([temperature.log_alpha])


@equivalent_of(temperature_step, applies=_temperature_applies)
def fused_temperature_step(temperature: Temperature, log_prob: torch.Tensor) -> torch.Tensor:
    """``temperature_step``: ``sac_alpha_loss``'s value and its gradient in ``log_alpha``,
    ``-mean(log_prob + target_entropy)``, without a graph; then its optimizer step."""
    log_alpha = temperature.log_alpha
    with torch.no_grad():
        shifted = log_prob + temperature.target_entropy
        loss = -(log_alpha * shifted).mean()
        log_alpha.grad = shifted.mean().neg_()
    temperature.optimizer.step()
    return loss
