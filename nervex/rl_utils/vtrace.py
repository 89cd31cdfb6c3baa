"""V-trace off-policy actor-critic targets and losses (Espeholt et al., 2018, IMPALA).

Conventions:

- Sequences are time-major: an unroll of ``T`` steps from ``B`` environments is ``(T, B)``; state values are
  ``(T + 1, B)``, ``V(x_0) ... V(x_T)``, the last row being the bootstrap value of the state after the unroll.
- ``terminated`` is the only thing that cuts bootstrapping: the step's discount becomes 0, so neither the next
  state's value nor the rest of the unroll (which then belongs to the next episode) flows into the targets before it.
- A time-limit truncation bootstraps. At the unroll's last step this is the caller's bootstrap row: give
  ``V(final observation)`` there and ``terminated = False``. Inside the unroll it cannot be expressed, because
  ``V(x_{t+1})`` would be the value of the next episode's first observation: end unrolls at truncations (or accept
  the bias of treating them as terminations, as the original IMPALA does).
- The policy enters through log-probabilities of the taken actions, like ``ppo.py`` and ``a2c.py``: discrete and
  continuous actions share one loss. For logits, ``CategoricalDist(logit).log_prob(action)`` (and ``.entropy()``)
  from :mod:`nervex.torch_utils` gives them; the behaviour log-probabilities are the actor's, stored with the unroll.
- Importance ratios are formed in log space, ``exp(min(log pi - log mu, log clip))``, so a large log-ratio clips
  instead of overflowing; every target is computed without gradient.
"""

from __future__ import annotations

import math
from collections import namedtuple
from typing import Union

import torch

from .a2c import check_same_shape, entropy_term
from .td import weighted_mean

vtrace_data = namedtuple(
    "vtrace_data", ["target_logp", "behaviour_logp", "entropy", "value", "reward", "terminated", "weight"]
)
vtrace_loss = namedtuple("vtrace_loss", ["policy_loss", "value_loss", "entropy_loss"])

Gammas = Union[float, torch.Tensor]


def check_unroll(fn_name: str, reward: torch.Tensor, values_name: str, values: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``values`` is laid out ``(T + 1, B)`` for a ``(T, B)`` ``reward``.

    Args:
        fn_name: Name of the calling function, for the message.
        reward: The per-step rewards; their shape defines ``T`` and ``B``.
        values_name: Name of the state-value argument, for the message.
        values: State values including the bootstrap row.

    Raises:
        ValueError: ``reward`` is 0-dim or ``values`` has another shape; the message names both and the fix.
    """
    if reward.dim() == 0:
        raise ValueError(f"{fn_name}: reward is a scalar; expected (T, B), time first")
    expected = (reward.shape[0] + 1,) + tuple(reward.shape[1:])
    shape = tuple(values.shape)
    if shape != expected:
        if shape == expected + (1,):
            hint = " (squeeze(-1) it)"
        elif shape == tuple(reward.shape):
            hint = " (it has T rows: append the bootstrap value V(x_T) as the last row)"
        else:
            hint = ""
        raise ValueError(
            f"{fn_name}: {values_name} has shape {shape} but reward has shape {tuple(reward.shape)}; expected "
            f"(T + 1, B) = {expected}, the last row being the bootstrap value{hint}"
        )


def per_step(fn_name: str, name: str, x: Gammas, like: torch.Tensor) -> torch.Tensor:
    """``x`` (a float, or a tensor shaped like ``like``) as a tensor of ``like``'s shape, dtype and device.

    Raises:
        ValueError: ``x`` is a tensor of another shape.
    """
    if isinstance(x, torch.Tensor):
        check_same_shape(fn_name, "reward", tuple(like.shape), **{name: x})
        return x.to(like.dtype)
    return torch.full_like(like, float(x))


def step_discounts(gamma: float, terminated: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Per-step discounts ``gamma * (1 - terminated)``; ``terminated=None`` means ``gamma`` everywhere.

    Shapes:
        - terminated, like, output: :math:`(T, B)`
    """
    if terminated is None:
        return torch.full_like(like, gamma)
    return gamma * (1.0 - terminated.to(like.dtype))


def clipped_ratio(log_ratio: torch.Tensor, clip: float) -> torch.Tensor:
    """``min(exp(log_ratio), clip)`` computed as ``exp(min(log_ratio, log clip))``: no overflow; ``clip`` may be inf.

    Shapes:
        - log_ratio, output: any, the same
    """
    return log_ratio.clamp(max=math.log(clip)).exp()


def vtrace_nstep_return(
    clipped_rhos: torch.Tensor,
    clipped_cs: torch.Tensor,
    reward: torch.Tensor,
    bootstrap_values: torch.Tensor,
    gammas: Gammas = 0.99,
    lambda_: float = 1.0,
) -> torch.Tensor:
    """V-trace targets ``v_s`` by the backward recursion of the paper's Remark 1.

    ``delta_t = rho_t * (r_t + gamma_t * V(x_{t+1}) - V(x_t))`` and
    ``v_s - V(x_s) = delta_s + gamma_s * lambda_ * c_s * (v_{s+1} - V(x_{s+1}))`` with ``v_T = V(x_T)``, which
    unrolls to ``v_s = V(x_s) + sum_t (prod_{i=s}^{t-1} gamma_i * lambda_ * c_i) * delta_t``.

    Args:
        clipped_rhos: ``min(rho_bar, pi / mu)`` per step.
        clipped_cs: ``min(c_bar, pi / mu)`` per step; multiplied by ``lambda_`` here.
        reward: ``r_0 ... r_{T-1}``.
        bootstrap_values: ``V(x_0) ... V(x_T)``; pass them detached (or call under ``torch.no_grad()``) to use the
            result as a target.
        gammas: Discount per step, a float or a tensor like ``reward``; 0 at a terminated step (see
            :func:`step_discounts`).
        lambda_: Trace cut factor (``1``: the paper's V-trace; ``< 1`` shortens the traces, as scalable_agent and
            rlax do).

    Returns:
        The V-trace targets ``v_0 ... v_{T-1}``.

    Shapes:
        - clipped_rhos, clipped_cs, reward, gammas: :math:`(T, B)`
        - bootstrap_values: :math:`(T + 1, B)`
        - output: :math:`(T, B)`

    Raises:
        ValueError: ``bootstrap_values`` is not ``(T + 1, B)`` or a per-step tensor is not shaped like ``reward``.
    """
    name = "vtrace_nstep_return"
    check_unroll(name, reward, "bootstrap_values", bootstrap_values)
    check_same_shape(name, "reward", tuple(reward.shape), clipped_rhos=clipped_rhos, clipped_cs=clipped_cs)
    gammas = per_step(name, "gammas", gammas, reward)
    values = bootstrap_values
    deltas = clipped_rhos * (reward + gammas * values[1:] - values[:-1])
    decays = gammas * lambda_ * clipped_cs
    corrections = torch.empty_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in reversed(range(deltas.shape[0])):
        running = deltas[t] + decays[t] * running
        corrections[t] = running
    return values[:-1] + corrections


def vtrace_advantages(
    clipped_pg_rhos: torch.Tensor,
    reward: torch.Tensor,
    vtrace_returns: torch.Tensor,
    bootstrap_values: torch.Tensor,
    gammas: Gammas = 0.99,
) -> torch.Tensor:
    """Policy-gradient advantages ``rho_pg_s * (r_s + gamma_s * v_{s+1} - V(x_s))`` with ``v_T = V(x_T)``.

    Args:
        clipped_pg_rhos: ``min(rho_pg_bar, pi / mu)`` per step.
        reward: ``r_0 ... r_{T-1}``.
        vtrace_returns: ``v_0 ... v_{T-1}`` from :func:`vtrace_nstep_return`; shifted by one step here.
        bootstrap_values: ``V(x_0) ... V(x_T)``.
        gammas: Discount per step, a float or a tensor like ``reward``.

    Returns:
        The advantages, to be treated as constants of the policy gradient.

    Shapes:
        - clipped_pg_rhos, reward, vtrace_returns, gammas: :math:`(T, B)`
        - bootstrap_values: :math:`(T + 1, B)`
        - output: :math:`(T, B)`

    Raises:
        ValueError: ``bootstrap_values`` is not ``(T + 1, B)`` or a per-step tensor is not shaped like ``reward``.
    """
    name = "vtrace_advantages"
    check_unroll(name, reward, "bootstrap_values", bootstrap_values)
    shape = tuple(reward.shape)
    check_same_shape(name, "reward", shape, clipped_pg_rhos=clipped_pg_rhos, vtrace_returns=vtrace_returns)
    gammas = per_step(name, "gammas", gammas, reward)
    next_returns = torch.cat([vtrace_returns[1:], bootstrap_values[-1:]], dim=0)
    return clipped_pg_rhos * (reward + gammas * next_returns - bootstrap_values[:-1])


def check_logp(fn_name: str, name: str, logp: torch.Tensor, reward: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``logp`` is shaped like ``reward``, hinting at logits passed by mistake."""
    shape, expected = tuple(logp.shape), tuple(reward.shape)
    if shape[:-1] == expected and shape[-1] != 1:
        raise ValueError(
            f"{fn_name}: {name} has shape {shape} but reward has shape {expected}; pass the log-probabilities of the "
            f"taken actions, {expected} (these look like logits: use CategoricalDist(logit).log_prob(action))"
        )
    check_same_shape(fn_name, "reward", expected, **{name: logp})


def check_clip_ratios(fn_name: str, **ratios: float) -> None:
    """Raise ``ValueError`` unless every clip ratio is > 0 (``inf`` means no clipping)."""
    for name, ratio in ratios.items():
        if not ratio > 0:
            raise ValueError(f"{fn_name}: {name} must be > 0 (inf: no clipping), got {ratio}")


def vtrace_error(
    data: vtrace_data,
    gamma: float = 0.99,
    lambda_: float = 0.95,
    rho_clip_ratio: float = 1.0,
    c_clip_ratio: float = 1.0,
    rho_pg_clip_ratio: float = 1.0,
) -> vtrace_loss:
    """IMPALA's policy, value and entropy losses from V-trace targets.

    With ``log_rho = target_logp - behaviour_logp``, ``rho = min(rho_bar, e^log_rho)``,
    ``c = min(c_bar, e^log_rho)``, ``rho_pg = min(rho_pg_bar, e^log_rho)``, per-step discounts
    ``gamma_t = gamma * (1 - terminated_t)``, ``v`` from :func:`vtrace_nstep_return` and
    ``mean_w(x) = mean(weight * x)`` over all ``T * B`` entries:

    - ``policy_loss = -mean_w(adv * target_logp)`` with ``adv`` from :func:`vtrace_advantages` (detached);
    - ``value_loss = mean_w((V(x_s) - v_s)^2)`` over ``s < T`` (no 0.5, as in ``a2c.py``/``ppo.py``);
    - ``entropy_loss = -mean_w(entropy)``, a zero scalar when ``entropy`` is ``None``.

    The policy combines them as ``policy_loss + vf_coef * value_loss + ent_coef * entropy_loss``.

    Args:
        data: ``vtrace_data(target_logp, behaviour_logp, entropy, value, reward, terminated, weight)``:

            - ``target_logp``: ``log pi(a_t | x_t)`` of the taken actions under the policy being trained (with
              gradient); for continuous actions the log-density summed over action dimensions;
            - ``behaviour_logp``: ``log mu(a_t | x_t)`` under the actor's policy (treated as a constant);
            - ``entropy``: entropy of ``pi`` per step, or ``None``;
            - ``value``: ``V(x_0) ... V(x_T)`` from the trained network (with gradient); the last row is the
              bootstrap value, see the module docstring for truncations;
            - ``reward``; ``terminated`` (bool or 0/1, or ``None``: no termination in the unroll);
            - ``weight``: 0/1 mask of padded steps, or ``None``. It masks the loss only, not the recursion:
              padding must come after a terminated step so that it does not flow into real steps' targets.
        gamma: Discount factor.
        lambda_: Trace cut factor applied to ``c`` (1: the paper's V-trace).
        rho_clip_ratio: ``rho_bar``, clip of the importance weights in ``delta_t`` (the targets' fixed point).
        c_clip_ratio: ``c_bar``, clip of the trace coefficients (the contraction speed).
        rho_pg_clip_ratio: clip of the importance weights of the policy gradient.

    Returns:
        ``vtrace_loss(policy_loss, value_loss, entropy_loss)``, each a scalar.

    Shapes:
        - target_logp, behaviour_logp, entropy, reward, terminated, weight: :math:`(T, B)`
        - value: :math:`(T + 1, B)`
        - output: three scalars

    Raises:
        ValueError: a field is not ``(T, B)`` (logits instead of log-probabilities are named as such), ``value``
            is not ``(T + 1, B)``, or a clip ratio is not > 0.
    """
    name = "vtrace_error"
    check_clip_ratios(
        name, rho_clip_ratio=rho_clip_ratio, c_clip_ratio=c_clip_ratio, rho_pg_clip_ratio=rho_pg_clip_ratio
    )
    target_logp, behaviour_logp, entropy, value, reward, terminated, weight = data
    check_unroll(name, reward, "value", value)
    check_logp(name, "target_logp", target_logp, reward)
    check_logp(name, "behaviour_logp", behaviour_logp, reward)
    check_same_shape(name, "reward", tuple(reward.shape), entropy=entropy, terminated=terminated, weight=weight)
    with torch.no_grad():
        reward = reward.to(value.dtype)
        values = value.detach()
        log_rho = target_logp.detach().to(value.dtype) - behaviour_logp.to(value.dtype)
        rhos = clipped_ratio(log_rho, rho_clip_ratio)
        cs = clipped_ratio(log_rho, c_clip_ratio)
        pg_rhos = clipped_ratio(log_rho, rho_pg_clip_ratio)
        gammas = step_discounts(gamma, terminated, reward)
        returns = vtrace_nstep_return(rhos, cs, reward, values, gammas, lambda_)
        adv = vtrace_advantages(pg_rhos, reward, returns, values, gammas)
    policy_loss = -weighted_mean(adv.to(target_logp.dtype) * target_logp, weight)
    value_loss = weighted_mean((value[:-1] - returns).square(), weight)
    return vtrace_loss(policy_loss, value_loss, entropy_term(entropy, weight, target_logp))
