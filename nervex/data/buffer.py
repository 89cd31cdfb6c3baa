"""Replay buffers: ``PrioritizedBuffer`` (proportional prioritized replay) and ``ReplayBuffer`` (uniform).

Both are ``replay_core.BaseBuffer`` (samples in a ``ColumnStorage`` used as a ring of ``maxlen`` slots, priorities in a
``PriorityTree``), configured: they declare the arguments and config keys, and return batches as dicts of tensors.
"""

from __future__ import annotations

from typing import Optional, Sequence

from nervex.config import Field, signature_config
from nervex.utils import Registry

from .replay_core import BaseBuffer

__all__ = ["BaseBuffer", "PrioritizedBuffer", "ReplayBuffer", "BUFFER_REGISTRY"]


class PrioritizedBuffer(BaseBuffer):
    """Proportional prioritized replay (Schaul et al., 2016) with stratified sampling.

    ``P(i) = p_i^alpha / sum_k p_k^alpha``; weights ``(p_i / p_min)^-beta`` (``beta`` annealed to 1 over
    ``beta_anneal_steps`` calls of ``sample``); new samples enter at the largest priority seen so far.

    Args:
        maxlen: Capacity; the oldest sample is overwritten when full.
        alpha: Priority exponent (0: uniform).
        beta: Importance-sampling exponent at the start.
        beta_anneal_steps: Number of ``sample`` calls over which ``beta`` grows linearly to 1 (0: constant).
        eps: Priority floor, so that no sample gets probability 0.
        max_use: Evict a sample once it has been drawn this many times (None: never).
        max_staleness: Evict samples stored more than this many learner iterations ago (None: never).
        samples_per_insert: Rate limit (as Reverb's ``SampleToInsertRatio``): ``sample`` draws only while the
            number of samples drawn stays <= ``samples_per_insert`` x the number stored (None: no limit).
        compress_fields: Fields kept lz4-compressed (e.g. ``['obs', 'next_obs']`` for Atari frames).
        enable_priority: False samples uniformly (weights 1) and ignores ``update``.
        seed: Seed of the sampling generator.

    Examples:
        >>> buffer = PrioritizedBuffer(maxlen=100, seed=0)
        >>> buffer.extend([{'obs': np.zeros(4), 'reward': 1.0} for _ in range(10)])
        >>> batch = buffer.sample(4)
        >>> batch['obs'].shape, batch['weight'].dtype
        (torch.Size([4, 4]), torch.float32)
        >>> buffer.update(np.array([0.5, 1.0, 2.0, 0.1]), unique_id=batch['unique_id'])
    """

    def __init__(
        self,
        maxlen: int = 10000,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_anneal_steps: int = 0,
        eps: float = 1e-6,
        max_use: Optional[int] = None,
        max_staleness: Optional[int] = None,
        samples_per_insert: Optional[float] = None,
        compress_fields: Sequence[str] = (),
        enable_priority: bool = True,
        seed: Optional[int] = None,
    ) -> None:
        super().__init__(
            maxlen,
            bool(enable_priority),
            alpha,
            beta,
            beta_anneal_steps,
            eps,
            max_use,
            max_staleness,
            samples_per_insert,
            compress_fields,
            seed,
        )

    # the defaults are the constructor's (declared once); the config system checks these ranges with the dotted key
    config = signature_config(
        __init__,
        maxlen=Field(..., ge=1),
        alpha=Field(..., ge=0),
        beta=Field(..., ge=0, le=1),
        beta_anneal_steps=Field(..., ge=0),
        eps=Field(..., gt=0),
        max_use=Field(..., ge=1, kind="int"),
        max_staleness=Field(..., ge=0, kind="int"),
        samples_per_insert=Field(..., gt=0, kind="number"),
        seed=Field(..., ge=0, kind="int"),
    )


class ReplayBuffer(BaseBuffer):
    """Uniform replay (with replacement) on the same columnar storage; ``weight`` is always 1.

    Args:
        maxlen, max_use, max_staleness, samples_per_insert, compress_fields, seed: As ``PrioritizedBuffer``.
    """

    def __init__(
        self,
        maxlen: int = 10000,
        max_use: Optional[int] = None,
        max_staleness: Optional[int] = None,
        samples_per_insert: Optional[float] = None,
        compress_fields: Sequence[str] = (),
        seed: Optional[int] = None,
    ) -> None:
        super().__init__(
            maxlen,
            False,
            max_use=max_use,
            max_staleness=max_staleness,
            samples_per_insert=samples_per_insert,
            compress_fields=compress_fields,
            seed=seed,
        )

    config = signature_config(
        __init__,
        maxlen=Field(..., ge=1),
        max_use=Field(..., ge=1, kind="int"),
        max_staleness=Field(..., ge=0, kind="int"),
        samples_per_insert=Field(..., gt=0, kind="number"),
        seed=Field(..., ge=0, kind="int"),
    )


BUFFER_REGISTRY = Registry("replay buffer")
BUFFER_REGISTRY.register("prioritized", PrioritizedBuffer)
BUFFER_REGISTRY.register("uniform", ReplayBuffer)
