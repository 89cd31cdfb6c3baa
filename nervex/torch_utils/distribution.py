"""Action distributions for sampling plugins and policy losses: categorical (with action masks), diagonal Gaussian
and the tanh-squashed Gaussian of SAC.

They are written with plain tensor formulas (no ``torch.distributions``): the formulas are the ones the tests check by
hand, and skipping ``torch.distributions``' argument validation and broadcasting machinery makes constructing one per
forward pass cheap.

Argument checks that would need a device-to-host sync (reading a value of a tensor on an accelerator) are controlled by
``validate_args``: ``None`` (the default) runs them only where they are free of a sync, ``True`` always, ``False``
never. The one exception is the action mask of :class:`CategoricalDist`, checked by default everywhere because a row
with no legal action would otherwise silently produce ``nan`` probabilities.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

Bound = Union[torch.Tensor, float, Sequence[float], np.ndarray]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_LOG_2 = math.log(2.0)


def _check_values(tensor: torch.Tensor, validate_args: Optional[bool]) -> bool:
    """Whether to run a value check on ``tensor``: on CPU (no sync) unless told otherwise."""
    if validate_args is None:
        return tensor.device.type == "cpu"
    return validate_args


def _check_action_shape(cls_name: str, action: torch.Tensor, expected: Tuple[int, ...]) -> None:
    if tuple(action.shape) != expected:
        raise ValueError(f"{cls_name}.log_prob: action has shape {tuple(action.shape)}; expected {expected}")


class CategoricalDist:
    """Categorical distribution over the last dimension of ``logit``, with an optional mask of legal actions.

    Illegal actions get a logit of ``-inf``: probability 0, ``log_prob`` ``-inf``, never sampled, and no contribution
    (not ``nan``) to the entropy or to its gradient.

    Args:
        logit: Unnormalized log-probabilities.
        mask: Legal actions (bool or 0/1, 1 = legal), same shape as ``logit``; ``None``: every action is legal.
        validate_args: Check that every row has a legal action. ``None`` and ``True`` check (one device sync when
            ``mask`` is on an accelerator); ``False`` skips the check.

    Shapes:
        - logit, mask: :math:`(*, A)`
        - sample(), mode(), log_prob(), entropy(): :math:`(*)`

    Raises:
        ValueError: ``mask`` does not have the shape of ``logit``, or a row has no legal action.
    """

    def __init__(self, logit: torch.Tensor, mask: Optional[torch.Tensor] = None, validate_args: Optional[bool] = None):
        if logit.dim() < 1:
            raise ValueError(f"CategoricalDist: logit has shape {tuple(logit.shape)}; expected (*, A)")
        self.mask: Optional[torch.Tensor] = None
        if mask is not None:
            if mask.shape != logit.shape:
                raise ValueError(
                    f"CategoricalDist: mask has shape {tuple(mask.shape)}; expected the logit shape {tuple(logit.shape)}"
                )
            mask = mask.to(torch.bool)
            if validate_args is not False:
                has_legal = mask.any(-1)
                if not bool(has_legal.all()):
                    first = tuple(int(i) for i in (~has_legal).nonzero()[0])
                    raise ValueError(f"CategoricalDist: mask row {first} has no legal action; every row needs one")
            logit = logit.masked_fill(~mask, float("-inf"))
            self.mask = mask
        self.logit = logit
        self.logp = F.log_softmax(logit, dim=-1)
        self._probs: Optional[torch.Tensor] = None

    @property
    def batch_shape(self) -> Tuple[int, ...]:
        """The leading dimensions :math:`(*)`."""
        return tuple(self.logit.shape[:-1])

    @property
    def probs(self) -> torch.Tensor:
        """Action probabilities, :math:`(*, A)`; 0 for illegal actions."""
        if self._probs is None:
            self._probs = self.logp.exp()
        return self._probs

    @torch.no_grad()
    def sample(self) -> torch.Tensor:
        """Draw one action per row: int64, :math:`(*)`.

        Inverse-CDF sampling: the first action whose cumulative probability exceeds ``u ~ U[0, total)``. It is exact,
        never picks a zero-probability (masked) action, and costs a few elementwise kernels where
        ``torch.multinomial`` costs ~35 us even for a handful of rows.
        """
        cdf = self.probs.cumsum(-1)
        u = torch.rand(cdf.shape[:-1] + (1,), device=cdf.device, dtype=cdf.dtype) * cdf[..., -1:]
        return (cdf <= u).sum(-1)

    def mode(self) -> torch.Tensor:
        """The most likely legal action per row: int64, :math:`(*)`."""
        return self.logit.argmax(dim=-1)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        """Log-probability of ``action`` (integer, :math:`(*)`); ``-inf`` for an illegal action.

        Raises:
            ValueError: ``action`` is not shaped like the batch :math:`(*)`.
        """
        _check_action_shape("CategoricalDist", action, self.batch_shape)
        return self.logp.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        """``-sum_a p(a) log p(a)`` over legal actions, :math:`(*)`; finite, with finite gradients, under a mask."""
        logp = self.logp if self.mask is None else self.logp.masked_fill(~self.mask, 0.0)
        return -(self.probs * logp).sum(-1)


class GaussianDist:
    """Diagonal Gaussian over the last dimension; ``log_prob`` and ``entropy`` sum over it.

    Args:
        mu: Means.
        sigma: Standard deviations, > 0; any shape that broadcasts to ``mu`` (e.g. a state-independent :math:`(D,)`).
        validate_args: Check ``sigma > 0``. ``None``: only when ``sigma`` is on the CPU, where the check needs no
            device sync (on an accelerator it would stall every forward pass); ``True``: always; ``False``: never.

    Shapes:
        - mu: :math:`(*, D)`
        - sigma: broadcastable to :math:`(*, D)`
        - sample(), rsample(), mode(): :math:`(*, D)`
        - log_prob(), entropy(): :math:`(*)`

    Raises:
        ValueError: ``sigma`` does not broadcast to ``mu``, or (when checked) has a value that is not > 0.
    """

    def __init__(self, mu: torch.Tensor, sigma: torch.Tensor, validate_args: Optional[bool] = None):
        if mu.dim() < 1:
            raise ValueError(f"GaussianDist: mu has shape {tuple(mu.shape)}; expected (*, D)")
        try:
            sigma = sigma.expand_as(mu)
        except RuntimeError:
            raise ValueError(
                f"GaussianDist: sigma has shape {tuple(sigma.shape)}, which does not broadcast to mu's "
                f"{tuple(mu.shape)}"
            ) from None
        if _check_values(sigma, validate_args) and not bool((sigma > 0).all()):
            raise ValueError(
                f"GaussianDist: sigma must be > 0, got min {sigma.min().item()} (use softplus or exp of log_std)"
            )
        self.mu = mu
        self.sigma = sigma

    def sample(self) -> torch.Tensor:
        """A sample without gradient, :math:`(*, D)`."""
        with torch.no_grad():
            return self.rsample()

    def rsample(self) -> torch.Tensor:
        """A reparameterized sample ``mu + sigma * eps``, ``eps ~ N(0, 1)``; gradients flow into mu and sigma."""
        return self.mu + self.sigma * torch.randn_like(self.mu)

    def mode(self) -> torch.Tensor:
        """The mean ``mu``, :math:`(*, D)`."""
        return self.mu

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        """``sum_d [-(a_d - mu_d)^2 / (2 sigma_d^2) - log sigma_d - log(2 pi) / 2]``, :math:`(*)`.

        Raises:
            ValueError: ``action`` is not shaped like ``mu``.
        """
        _check_action_shape("GaussianDist", action, tuple(self.mu.shape))
        z = (action - self.mu) / self.sigma
        return (-0.5 * z.square() - self.sigma.log() - _HALF_LOG_2PI).sum(-1)

    def entropy(self) -> torch.Tensor:
        """``sum_d [1/2 + log(2 pi) / 2 + log sigma_d]``, :math:`(*)`."""
        return (0.5 + _HALF_LOG_2PI + self.sigma.log()).sum(-1)


class SquashBounds(NamedTuple):
    """A squashed Gaussian's action bounds with what its formulas derive from them, computed once
    (:func:`squash_bounds`) instead of at every :class:`TanhGaussianDist` construction."""

    low: torch.Tensor
    high: torch.Tensor
    loc: torch.Tensor  # (high + low) / 2
    scale: torch.Tensor  # (high - low) / 2
    log_scale_sum: torch.Tensor  # sum_d log scale_d


def squash_bounds(
    low: Bound,
    high: Bound,
    dim: int,
    dtype: torch.dtype = torch.float32,
    device: Any = None,
    validate_args: Optional[bool] = None,
) -> SquashBounds:
    """The :class:`SquashBounds` of an action space ``[low, high]`` of ``dim`` dimensions.

    Args:
        low, high: The bounds, scalars or :math:`(dim,)` (tensors, arrays or numbers).
        dim: Action dimensions.
        dtype, device: Of the bound tensors.
        validate_args: Check ``low < high``: ``None`` where it needs no device sync (host values, CPU tensors).

    Raises:
        ValueError: a bound does not broadcast to :math:`(dim,)`, or ``low >= high`` somewhere.
    """
    on_host = not (isinstance(low, torch.Tensor) or isinstance(high, torch.Tensor))
    bounds = []
    for name, value in (("low", low), ("high", high)):
        bound = torch.as_tensor(value, dtype=dtype, device=device)
        if bound.dim() > 1 or (bound.dim() == 1 and bound.shape[0] != dim):
            raise ValueError(f"TanhGaussianDist: {name} has shape {tuple(bound.shape)}; expected a scalar or ({dim},)")
        bounds.append(bound.expand(dim))
    low_t, high_t = bounds
    if on_host:  # compared before they reach the device, so no sync
        ordered = bool(np.all(np.asarray(low, dtype=np.float64) < np.asarray(high, dtype=np.float64)))
    else:
        ordered = not _check_values(low_t, validate_args) or bool((low_t < high_t).all())
    if not ordered:
        raise ValueError(f"TanhGaussianDist: need low < high in every dimension, got low={low}, high={high}")
    scale = (high_t - low_t) / 2
    return SquashBounds(low_t, high_t, (high_t + low_t) / 2, scale, scale.log().sum())


class TanhGaussianDist:
    """SAC's squashed Gaussian: ``u ~ N(mu, sigma)``, ``a = loc + scale * tanh(u)`` with ``loc = (high + low) / 2``,
    ``scale = (high - low) / 2`` per dimension (``a = tanh(u)`` in ``[-1, 1]`` without bounds).

    ``log p(a) = log N(u; mu, sigma) - sum_d log(1 - tanh(u_d)^2) - sum_d log(scale_d)``, with
    ``log(1 - tanh(u)^2)`` written ``2 * (log 2 - u - softplus(-2u))``, which stays finite where ``tanh(u)`` rounds
    to +-1.

    Args:
        mu: Means of the pre-squash Gaussian.
        sigma: Its standard deviations, > 0, broadcastable to ``mu`` (see :class:`GaussianDist`).
        low: Lower action bounds (e.g. an env's ``Box.low``), a scalar or :math:`(D,)`; ``None`` with ``high``.
            NumPy / float bounds are copied to ``mu``'s device on every construction: a policy on an accelerator
            should convert them to tensors there once. A :class:`SquashBounds` (with ``high=None``) is used as it is:
            the cheapest construction, for a learner that builds one distribution per step.
        high: Upper action bounds, a scalar or :math:`(D,)`; ``None`` with ``low``.
        validate_args: As for :class:`GaussianDist`; also checks ``low < high`` (always free for non-tensor bounds).
        log_sigma: ``log(sigma)`` where the caller has it (a model's clamped log-std), so it is not recomputed.

    Shapes:
        - mu: :math:`(*, D)`
        - actions: :math:`(*, D)`; log-probs: :math:`(*)`

    Raises:
        ValueError: only one of ``low``/``high`` is given, a bound does not broadcast to :math:`(D,)`, or
            ``low >= high`` somewhere.
    """

    def __init__(
        self,
        mu: torch.Tensor,
        sigma: torch.Tensor,
        low: Optional[Union[Bound, SquashBounds]] = None,
        high: Optional[Bound] = None,
        validate_args: Optional[bool] = None,
        log_sigma: Optional[torch.Tensor] = None,
    ):
        self.base = GaussianDist(mu, sigma, validate_args)
        self.log_sigma = log_sigma
        self.bounds: Optional[SquashBounds] = None
        if isinstance(low, SquashBounds):
            if high is not None:
                raise ValueError("TanhGaussianDist: with SquashBounds as low, leave high None")
            self.bounds = low
        elif (low is None) != (high is None):
            raise ValueError("TanhGaussianDist: give both low and high, or neither (actions in [-1, 1])")
        elif low is not None:
            self.bounds = squash_bounds(low, high, mu.shape[-1], mu.dtype, mu.device, validate_args)

    @property
    def low(self) -> Optional[torch.Tensor]:
        return None if self.bounds is None else self.bounds.low

    @property
    def high(self) -> Optional[torch.Tensor]:
        return None if self.bounds is None else self.bounds.high

    def _squash(self, u: torch.Tensor) -> torch.Tensor:
        a = torch.tanh(u)
        if self.bounds is None:
            return a
        b = self.bounds
        # clamped because loc + scale * 1 may round one ulp past high
        return torch.clamp(torch.addcmul(b.loc, b.scale, a), b.low, b.high)

    def _log_scale_sum(self) -> Union[torch.Tensor, float]:
        return 0.0 if self.bounds is None else self.bounds.log_scale_sum

    def _log_prob_u(self, u: torch.Tensor) -> torch.Tensor:
        log_det_tanh = (2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))).sum(-1)
        return self.base.log_prob(u) - log_det_tanh - self._log_scale_sum()

    def rsample_with_log_prob(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """A reparameterized action and its log-probability, computed from the pre-squash sample (exact).

        With ``u = mu + sigma * eps`` the Gaussian term is ``-eps^2 / 2 - log sigma - log(2 pi) / 2`` per dimension,
        so the log-probability costs a few fused kernels: per dimension ``t = -2u`` and
        ``log p = -(eps^2 / 2 + log sigma + t - 2 softplus(t)) - log(2 pi) / 2 - 2 log 2 - log scale``.

        Returns:
            ``(action, log_prob)``, shapes :math:`(*, D)` and :math:`(*)`.
        """
        action, log_prob, _, _ = self.rsample_with_noise()
        return action, log_prob

    def rsample_with_noise(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """As :meth:`rsample_with_log_prob`, also returning the draw: ``(action, log_prob, eps, u)`` with
        ``u = mu + sigma * eps`` the pre-squash sample (for a backward written by hand: ``d log_prob / du = 2 tanh u``,
        ``d log_prob / d log sigma = -1`` besides the path through ``u``).

        Shapes:
            action, eps, u: :math:`(*, D)`; log_prob: :math:`(*)`.
        """
        mu, sigma = self.base.mu, self.base.sigma
        eps = torch.randn_like(mu)
        u = torch.addcmul(mu, sigma, eps)
        t = u * -2.0
        log_sigma = sigma.log() if self.log_sigma is None else self.log_sigma
        per_dim = torch.addcmul(log_sigma, eps, eps, value=0.5).add_(t).sub_(F.softplus(t), alpha=2.0)
        const = mu.shape[-1] * (_HALF_LOG_2PI + 2.0 * _LOG_2)
        log_prob = (-const - self._log_scale_sum()) - per_dim.sum(-1)
        return self._squash(u), log_prob, eps, u

    def sample_with_log_prob(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`rsample_with_log_prob`, without gradient."""
        with torch.no_grad():
            return self.rsample_with_log_prob()

    def mode(self) -> torch.Tensor:
        """The squashed mean ``loc + scale * tanh(mu)``, :math:`(*, D)` (deterministic evaluation action)."""
        return self._squash(self.base.mu)

    def log_prob(self, action: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """Log-probability of a given action, through ``u = atanh(clamp((a - loc) / scale, -1 + eps, 1 - eps))``.

        Less accurate than the log-prob returned with a sample: near the bounds ``tanh`` is flat, so the clamp and
        the rounding of ``a`` move ``u`` a lot. Prefer :meth:`rsample_with_log_prob` for actions drawn here.

        Args:
            action: Actions within ``[low, high]``.
            eps: Clamp margin, in the ``[-1, 1]`` space.

        Returns:
            The log-probabilities, :math:`(*)`.

        Raises:
            ValueError: ``action`` is not shaped like ``mu``.
        """
        _check_action_shape("TanhGaussianDist", action, tuple(self.base.mu.shape))
        y = action if self.bounds is None else (action - self.bounds.loc) / self.bounds.scale
        u = torch.atanh(y.clamp(-1.0 + eps, 1.0 - eps))
        return self._log_prob_u(u)

    def entropy(self) -> torch.Tensor:
        """Not available in closed form.

        Raises:
            NotImplementedError: always; estimate it with ``-log_prob`` of a sample from :meth:`rsample_with_log_prob`.
        """
        raise NotImplementedError(
            "TanhGaussianDist has no closed-form entropy; estimate it as -log_prob of a sample "
            "(action, log_prob = dist.rsample_with_log_prob(); entropy ~ -log_prob)"
        )
