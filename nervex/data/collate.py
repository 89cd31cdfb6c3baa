"""``collate``: lists of (nested) dicts of arrays and numbers -> one dict of batched torch tensors.

Lists of samples are stacked by ``nervex.torch_utils.collate`` (one implementation for the whole framework); this
module adds the case of a dict that is already batched (what ``OfflineDataset[indices]`` returns), which only needs
converting.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

from nervex.torch_utils import collate as _collate_list

_NUMBER = (bool, int, float, np.generic)


def collate(batch: Sequence[Any] | Mapping[str, Any]) -> Any:
    """Stack a list of samples into batched tensors, keeping the samples' dict structure.

    Leaves follow the storage type rules: Python ``float`` and ``float64`` -> ``float32``, ``int`` -> ``int64``,
    ``bool`` -> ``bool``, other dtypes kept; strings and ``None`` come back as lists. A dict of already batched
    arrays is converted leaf by leaf, without stacking.

    Args:
        batch: A non-empty list of samples, or a dict of batched arrays.

    Returns:
        The nested dict (or tensor / list) of batched tensors.

    Raises:
        ValueError: an empty list, or samples with different keys or leaf shapes (the message names the field).

    Shapes:
        each leaf ``x`` of shape ``S`` in ``B`` samples -> ``(B, *S)``; a batched dict keeps its shapes.

    Examples:
        >>> out = collate([{'obs': np.zeros(3), 'info': {'t': 1}}, {'obs': np.ones(3), 'info': {'t': 2}}])
        >>> out['obs'].shape, out['obs'].dtype, out['info']['t'].tolist()
        (torch.Size([2, 3]), torch.float32, [1, 2])
    """
    if isinstance(batch, Mapping):
        return _convert(batch)
    return _collate_list(batch)


def _convert(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _convert(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (np.ndarray, list, tuple)) or isinstance(value, _NUMBER):
        array = np.asarray(value)
        if array.dtype.kind in "biufc":
            if array.dtype == np.float64:
                array = array.astype(np.float32)
            return torch.from_numpy(np.ascontiguousarray(array))
    return value
