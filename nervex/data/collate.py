"""``collate``: lists of (nested) dicts of arrays and numbers -> one dict of batched torch tensors."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

_NUMBER = (bool, int, float, np.generic)


def collate(batch: Sequence[Any] | Mapping[str, Any]) -> Any:
    """Stack a list of samples into batched tensors, keeping the samples' dict structure.

    Leaves are stacked on a new dim 0 with the storage type rules: Python ``float`` and ``float64`` -> ``float32``,
    ``int`` -> ``int64``, ``bool`` -> ``bool``, other dtypes kept. Strings and ``None`` are returned as a list. Tuples
    and lists of leaves are collated element-wise (like ``torch.utils.data.default_collate``).

    A dict of already batched arrays (what ``OfflineDataset[indices]`` returns) is converted leaf by leaf, without
    stacking.

    Args:
        batch: A non-empty list of samples, or a dict of batched arrays.

    Returns:
        The nested dict (or tensor / list) of batched tensors.

    Raises:
        ValueError: samples with different keys or leaf shapes (the message names the field and both shapes).

    Shapes:
        each leaf ``x`` of shape ``S`` in ``B`` samples -> ``(B, *S)``.

    Examples:
        >>> out = collate([{'obs': np.zeros(3), 'info': {'t': 1}}, {'obs': np.ones(3), 'info': {'t': 2}}])
        >>> out['obs'].shape, out['obs'].dtype, out['info']['t'].tolist()
        (torch.Size([2, 3]), torch.float32, [1, 2])
    """
    if isinstance(batch, Mapping):
        return _convert(batch, "")
    if len(batch) == 0:
        raise ValueError("collate got an empty list; pass at least one sample")
    return _collate(batch, "")


def _collate(batch: Sequence[Any], path: str) -> Any:
    first = batch[0]
    if isinstance(first, Mapping):
        keys = first.keys()
        for i, sample in enumerate(batch):
            if not isinstance(sample, Mapping) or sample.keys() != keys:
                got = sorted(sample.keys()) if isinstance(sample, Mapping) else type(sample).__name__
                raise ValueError(f"collate: sample {i}{_at(path)} has keys {got}, but sample 0 has {sorted(keys)}")
        return {k: _collate([sample[k] for sample in batch], f"{path}.{k}" if path else str(k)) for k in keys}
    if isinstance(first, torch.Tensor):
        _check_shapes([tuple(x.shape) for x in batch], path)
        return torch.stack(list(batch))
    if isinstance(first, np.ndarray) or isinstance(first, _NUMBER):
        if isinstance(first, np.ndarray):
            _check_shapes([np.shape(x) for x in batch], path)
        return _to_tensor(np.asarray(batch))
    if isinstance(first, (tuple, list)):
        if any(len(x) != len(first) for x in batch):
            raise ValueError(f"collate: sequences{_at(path)} have different lengths")
        return [_collate(list(items), f"{path}[{i}]") for i, items in enumerate(zip(*batch))]
    return list(batch)


def _convert(value: Any, path: str) -> Any:
    if isinstance(value, Mapping):
        return {k: _convert(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (np.ndarray, list, tuple)) or isinstance(value, _NUMBER):
        array = np.asarray(value)
        if array.dtype.kind in "biufc":
            return _to_tensor(array)
    return value


def _to_tensor(array: np.ndarray) -> torch.Tensor:
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    if array.dtype.kind not in "biufc":
        return array.tolist()
    return torch.from_numpy(np.ascontiguousarray(array))


def _check_shapes(shapes: Sequence[tuple], path: str) -> None:
    for i, shape in enumerate(shapes):
        if shape != shapes[0]:
            raise ValueError(f"collate: field{_at(path)} has shape {shape} in sample {i} but {shapes[0]} in sample 0")


def _at(path: str) -> str:
    return f" '{path}'" if path else ""
