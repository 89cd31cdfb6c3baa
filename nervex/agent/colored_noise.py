"""Temporally correlated exploration for a squashed-Gaussian actor (SAC): ``a = squash(mu + sigma * eps)`` with the
standard-normal ``eps`` drawn from a per-env process instead of independently at every step.

Every process here has unit stationary variance and zero mean, so each action's marginal distribution is still the
policy's; only successive draws are correlated, which lets an agent push in one direction for many steps (what a
sparse-reward task such as MountainCar needs to build momentum). Processes (``type``):

- ``white``: i.i.d. ``N(0, 1)``, the usual SAC sampling.
- ``ar1``: ``eps_t = rho * eps_{t-1} + sqrt(1 - rho^2) * xi_t``, an Ornstein-Uhlenbeck process sampled at unit
  steps and normalised to unit variance; lag-k autocorrelation ``rho^k`` (correlation time ``1 / (1 - rho)`` steps).
- ``pink``: Gaussian noise with power spectral density ``1 / f^beta`` (``beta`` 1: pink), generated per env in
  sequences of ``seq_len`` steps with an FFT (Eberhard et al. 2023, "Pink Noise Is All You Need").

All draws come from torch's global RNG, so a seeded run repeats itself.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from nervex.torch_utils.distribution import SquashBounds, TanhGaussianDist, squash_bounds

from .plugins import AgentPlugin, ForwardFn, register_plugin

NOISE_TYPES: Tuple[str, ...] = ("white", "ar1", "pink")


def powerlaw_noise(beta: float, seq_len: int, size: Tuple[int, ...] = ()) -> torch.Tensor:
    """Gaussian sequences whose power spectral density falls as ``1 / f^beta``, with unit variance at every step.

    Random Fourier coefficients with amplitude ``f^(-beta / 2)`` (Timmer and Koenig 1995, as the ``colorednoise``
    package): the zero frequency gets the amplitude of the lowest resolved one (``1 / seq_len``), and the result is
    divided by its exact standard deviation, so ``Var[y_t] = 1`` over draws for every ``t`` (a single sequence of
    strongly coloured noise varies less than that around its own mean).

    Args:
        beta: Spectral exponent: 0 white, 1 pink, 2 red (Brownian-like).
        seq_len: Steps per sequence, >= 2.
        size: Leading shape: the result holds ``prod(size)`` independent sequences.

    Returns:
        float32 tensor of shape ``(*size, seq_len)``.

    Shapes:
        ``(*size, seq_len)``.
    """
    freq = torch.fft.rfftfreq(seq_len, dtype=torch.float64)
    freq[0] = 1.0 / seq_len
    amplitude = freq ** (-beta / 2.0)
    # the zero frequency, and the Nyquist one of an even length, are real: sqrt(2) keeps their power per mode
    real_only = torch.zeros_like(amplitude, dtype=torch.bool)
    real_only[0] = True
    if seq_len % 2 == 0:
        real_only[-1] = True
    real_amp = torch.where(real_only, amplitude * math.sqrt(2.0), amplitude)
    imag_amp = torch.where(real_only, torch.zeros_like(amplitude), amplitude)
    shape = (*size, amplitude.shape[0])
    real = torch.randn(shape, dtype=torch.float64) * real_amp
    imag = torch.randn(shape, dtype=torch.float64) * imag_amp
    # irfft: y_t = (1/N) (S_0 + 2 sum_k Re(S_k e^{2 pi i k t / N}) + S_{N/2} (-1)^t); every term's variance is constant
    variance = (torch.where(real_only, real_amp**2, 4.0 * amplitude**2)).sum() / seq_len**2
    y = torch.fft.irfft(torch.complex(real, imag), n=seq_len) / variance.sqrt()
    return y.float()


class NoiseProcess:
    """Per-env sequences of standard-normal draws, keyed by env id (``state_id``): the ``white`` process.

    ``sample(ids, dim)`` returns the next draw of each listed env's process; ``reset(ids)`` restarts the listed
    envs' processes (all when None), e.g. at an episode's end. Subclasses keep one state per id.
    """

    type = "white"

    def sample(self, ids: List[int], dim: int) -> torch.Tensor:
        """The next ``(len(ids), dim)`` draws, row ``k`` from env ``ids[k]``'s process (float32, on the CPU)."""
        return torch.randn(len(ids), dim)

    def reset(self, ids: Optional[Iterable[int]] = None) -> None:
        """Restart the processes of ``ids`` (all when None); white noise has no state."""

    @property
    def states(self) -> Dict[int, Any]:
        """Each id's current state (a copy of the dict; white noise has none)."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class _StatefulNoise(NoiseProcess):
    """A process with one state per id, forgotten by ``reset``."""

    def __init__(self) -> None:
        self._states: Dict[int, Any] = {}

    def reset(self, ids: Optional[Iterable[int]] = None) -> None:
        if ids is None:
            self._states.clear()
            return
        for i in ids:
            self._states.pop(int(i), None)

    @property
    def states(self) -> Dict[int, Any]:
        return dict(self._states)


class AR1Noise(_StatefulNoise):
    """``eps_t = rho * eps_{t-1} + sqrt(1 - rho^2) * xi_t``, ``xi_t ~ N(0, 1)`` i.i.d.; a (re)started process
    draws ``eps_0 ~ N(0, 1)``, so it is stationary from its first step.

    Args:
        rho: Lag-1 autocorrelation, in ``[0, 1)`` (0 is white noise).
    """

    type = "ar1"

    def __init__(self, rho: float) -> None:
        super().__init__()
        self.rho = float(rho)
        self._innovation_scale = math.sqrt(1.0 - self.rho**2)

    def sample(self, ids: List[int], dim: int) -> torch.Tensor:
        xi = torch.randn(len(ids), dim)
        out = torch.empty_like(xi)
        for k, i in enumerate(ids):
            prev = self._states.get(i)
            out[k] = xi[k] if prev is None else self.rho * prev + self._innovation_scale * xi[k]
            self._states[i] = out[k].clone()
        return out

    def __repr__(self) -> str:
        return f"AR1Noise(rho={self.rho})"


class PinkNoise(_StatefulNoise):
    """Power-law noise (``1 / f^beta``) per env: a sequence of ``seq_len`` draws per dimension made with
    :func:`powerlaw_noise` when the env's process starts (or runs out), then read one step at a time.

    Args:
        beta: Spectral exponent (1: pink, 0: white, 2: red).
        seq_len: Steps per generated sequence; the env's episode length is a good choice (a longer episode
            continues with a fresh, independent sequence).
    """

    type = "pink"

    def __init__(self, beta: float, seq_len: int) -> None:
        super().__init__()
        self.beta = float(beta)
        self.seq_len = int(seq_len)

    def sample(self, ids: List[int], dim: int) -> torch.Tensor:
        rows = []
        for i in ids:
            sequence, t = self._states.get(i, (None, self.seq_len))
            if sequence is None or t >= self.seq_len or sequence.shape[1] != dim:
                sequence, t = powerlaw_noise(self.beta, self.seq_len, (dim,)).t().contiguous(), 0
            rows.append(sequence[t])
            self._states[i] = (sequence, t + 1)
        return torch.stack(rows) if rows else torch.empty(0, dim)

    def __repr__(self) -> str:
        return f"PinkNoise(beta={self.beta}, seq_len={self.seq_len})"


def make_noise_process(noise: str = "white", rho: float = 0.9, beta: float = 1.0, seq_len: int = 1000) -> NoiseProcess:
    """The process ``noise`` names, with its arguments checked (the others are ignored: ``rho`` is ar1's,
    ``beta`` and ``seq_len`` pink's).

    Raises:
        ValueError: an unknown ``noise`` or an argument out of range, named in the message.
    """
    if noise not in NOISE_TYPES:
        raise ValueError(f"colored noise: unknown type {noise!r}; valid: {', '.join(NOISE_TYPES)}")
    if noise == "ar1":
        if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not 0.0 <= rho < 1.0:
            raise ValueError(f"colored noise: ar1 needs rho in [0, 1), got {rho!r}")
        return AR1Noise(rho)
    if noise == "pink":
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= beta <= 4.0:
            raise ValueError(f"colored noise: pink needs beta in [0, 4], got {beta!r}")
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
            raise ValueError(f"colored noise: pink needs an int seq_len >= 2, got {seq_len!r}")
        return PinkNoise(beta, seq_len)
    return NoiseProcess()


class ColoredGaussianSamplePlugin(AgentPlugin):
    """Samples a tanh-squashed Gaussian action ``squash(mu + sigma * eps)`` into ``[low, high]`` with ``eps`` from
    one noise process per env (see the module docstring); ``noise='white'`` makes the same draws as
    ``gaussian_sample`` with ``squash=True`` under the same seed (its actions equal to rounding).

    ``forward(data, state_id=[...])``: row ``k`` of the batch is env ``state_id[k]`` (ids ``0 .. B-1`` when None).
    ``reset(state_id)`` restarts the listed envs' processes (all when None), e.g. at an episode's end. Unlike
    ``gaussian_sample`` it adds no ``logp``: with correlated noise the chance of an action given the state depends on
    the earlier draws, so the policy's density would misstate it.

    Args:
        noise: The process: ``'white'``, ``'ar1'`` or ``'pink'``.
        rho: ar1's lag-1 autocorrelation, in ``[0, 1)``.
        beta: pink's spectral exponent (1: pink).
        seq_len: pink's sequence length (steps).
        low, high: Action bounds (scalars or per dimension); None for actions in ``[-1, 1]``.
        mu_key, sigma_key: Output fields of the pre-squash mean and standard deviation.

    Shapes:
        ``mu``, ``sigma`` ``(B, D)`` -> ``action`` ``(B, D)``.
    """

    name = "colored_gaussian_sample"
    samples_action = True
    forward_kwargs = ("state_id",)

    def __init__(
        self,
        noise: str = "white",
        rho: float = 0.9,
        beta: float = 1.0,
        seq_len: int = 1000,
        low: Any = None,
        high: Any = None,
        mu_key: str = "mu",
        sigma_key: str = "sigma",
    ) -> None:
        if (low is None) != (high is None):
            raise ValueError(f"{self.name}: give both low and high (the action bounds), or neither")
        self.process = make_noise_process(noise, rho, beta, seq_len)
        self.low, self.high = low, high
        self.mu_key, self.sigma_key = mu_key, sigma_key
        self._bounds: Optional[SquashBounds] = None  # made at the first call, when the action's size is known

    def __call__(
        self, forward: ForwardFn, data: Any, state_id: Optional[Iterable[int]] = None, **kwargs: Any
    ) -> Dict[str, Any]:
        output = forward(data)
        missing = [k for k in (self.mu_key, self.sigma_key) if not isinstance(output.get(k), torch.Tensor)]
        if missing:
            raise TypeError(f"{self.name} needs the model output to hold tensors {missing}; got {sorted(output)}")
        mu, sigma = output[self.mu_key], output[self.sigma_key]
        ids = list(range(mu.shape[0])) if state_id is None else [int(i) for i in state_id]
        if len(ids) != mu.shape[0]:
            raise ValueError(f"{self.name}: got {len(ids)} state ids for a batch of {mu.shape[0]} actions")
        with torch.no_grad():
            eps = self.process.sample(ids, mu.shape[-1]).to(mu)
            # the squashed mean of N(mu + sigma * eps, .) is the squashed sample itself: the squash and the bounds'
            # clamp stay TanhGaussianDist's
            action = TanhGaussianDist(torch.addcmul(mu, sigma, eps), sigma, self._squash_bounds(mu)).mode()
        output["action"] = action
        return output

    def _squash_bounds(self, mu: torch.Tensor) -> Optional[SquashBounds]:
        if self.low is None:
            return None
        bounds = self._bounds
        if bounds is None or bounds.low.shape[0] != mu.shape[-1] or bounds.low.device != mu.device:
            bounds = self._bounds = squash_bounds(self.low, self.high, mu.shape[-1], mu.dtype, mu.device)
        return bounds

    def reset(self, state_id: Optional[Iterable[int]] = None) -> None:
        self.process.reset(state_id)

    def __repr__(self) -> str:
        return f"ColoredGaussianSamplePlugin({self.process!r})"


register_plugin(ColoredGaussianSamplePlugin.name, ColoredGaussianSamplePlugin)
