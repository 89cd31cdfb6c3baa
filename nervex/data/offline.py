"""Offline RL data: the on-disk trajectory format, its writer, and a Dataset / DataLoader to read it.

On-disk format (a directory):

* ``chunk_000000.npz``, ``chunk_000001.npz``, ... each written with ``np.savez`` and read with
  ``allow_pickle=False``. A chunk holds whole trajectories (a trajectory is never split across chunks):
  ``f0``, ``f1``, ... one array per field, the transitions stacked on dim 0; ``traj_len`` (``int64``), the length
  of each trajectory in order; ``header``, the UTF-8 bytes of a JSON object
  ``{"format": "nervex.trajectories", "version": 1, "fields": [{"path": [...], "dtype": "<f4", "shape": [...]}]}``.
* Field values follow the replay storage type rules (``float`` -> ``float32``, ``int`` -> ``int64``...); nested
  dicts are flattened, each leaf's ``path`` lists its keys.
* Chunks are written to a temporary file and linked into place under a name no other writer holds, so several
  writers may share a directory and a reader never sees a half-written chunk.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler, SequentialSampler

from .collate import collate
from .storage import ColumnStorage, unflatten

FORMAT = "nervex.trajectories"
FORMAT_VERSION = 1
CHUNK_PATTERN = "chunk_*.npz"
Transition = Mapping[str, Any]


class TrajectoryWriter:
    """Write trajectories (lists of transition dicts) to ``path`` in chunks of about ``chunk_size`` transitions.

    Args:
        path: Directory (created if missing).
        chunk_size: A chunk is written once this many transitions are buffered (it may hold one trajectory more).
        compress: Write chunks with ``np.savez_compressed`` (zlib; smaller, slower to write).

    Examples:
        >>> with TrajectoryWriter('data/cartpole') as writer:
        ...     writer.write(episode_transitions)
    """

    def __init__(self, path: str, chunk_size: int = 10000, compress: bool = False) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.path = path
        self.chunk_size = int(chunk_size)
        self.compress = compress
        os.makedirs(path, exist_ok=True)
        self._schema = ColumnStorage(0)
        self._parts: List[List[np.ndarray]] = []  # per buffered trajectory, one array per field
        self._lengths: List[int] = []
        self._buffered = 0
        self._closed = False
        self.n_transitions = 0
        self.n_chunks = 0

    def write(self, transitions: Sequence[Transition]) -> None:
        """Add one trajectory (written to disk once ``chunk_size`` transitions are buffered).

        Raises:
            ValueError: transitions whose fields or shapes differ from the first transition written.
            RuntimeError: the writer is closed.
        """
        if self._closed:
            raise RuntimeError(f"TrajectoryWriter({self.path!r}) is closed")
        if len(transitions) == 0:
            return
        if not self._schema.ready:
            self._schema.init_schema(transitions[0])
        columns = self._schema.convert_many(list(transitions))
        self._parts.append([np.asarray(c, dtype=col.dtype) for c, col in zip(columns, self._schema.columns)])
        self._lengths.append(len(transitions))
        self._buffered += len(transitions)
        self.n_transitions += len(transitions)
        if self._buffered >= self.chunk_size:
            self.flush()

    def flush(self) -> None:
        """Write the buffered trajectories as one chunk now."""
        if not self._parts:
            return
        header = {"format": FORMAT, "version": FORMAT_VERSION, "fields": self._schema.schema()}
        arrays = {f"f{i}": np.concatenate([p[i] for p in self._parts]) for i in range(len(self._schema.columns))}
        arrays["traj_len"] = np.asarray(self._lengths, dtype=np.int64)
        arrays["header"] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
        tmp = os.path.join(self.path, f".tmp_{os.getpid()}_{id(self)}.npz")
        with open(tmp, "wb") as f:
            (np.savez_compressed if self.compress else np.savez)(f, **arrays)
        self._publish(tmp)
        self._parts, self._lengths, self._buffered = [], [], 0
        self.n_chunks += 1

    def _publish(self, tmp: str) -> None:
        k = len(glob.glob(os.path.join(self.path, CHUNK_PATTERN)))
        try:
            while True:
                target = os.path.join(self.path, f"chunk_{k:06d}.npz")
                try:
                    os.link(tmp, target)  # fails if another writer took the name
                    return
                except FileExistsError:
                    k += 1
        except OSError:
            os.replace(tmp, target)  # file systems without hard links
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def close(self) -> None:
        """Write what is buffered and close. Safe to call twice."""
        if not self._closed:
            self.flush()
            self._closed = True

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class OfflineDataset(Dataset):
    """Transitions written by ``TrajectoryWriter`` (e.g. the serial actor's ``save_data``), held in memory.

    ``dataset[i]`` is one transition (a nested dict of arrays); ``dataset[list_of_indices]`` is a dict of batched
    arrays, which ``OfflineDataLoader`` uses to build a batch in one step per field.

    Args:
        path: Directory of ``chunk_*.npz`` files.
        fields: Dotted field names to load (a dict's name loads every leaf under it); None loads all.
        traj_transform: Applied to each trajectory (a list of transition dicts) at load time, returning the samples
            to keep, e.g. n-step samples from ``Adder.get_nstep_return_data``.

    Raises:
        FileNotFoundError: no chunk in ``path``.
        ValueError: chunks written with different fields, or a newer format.
    """

    def __init__(
        self,
        path: str,
        fields: Optional[Sequence[str]] = None,
        traj_transform: Optional[Callable[[List[Dict[str, Any]]], List[Dict[str, Any]]]] = None,
    ) -> None:
        files = sorted(glob.glob(os.path.join(path, CHUNK_PATTERN)))
        if not files:
            raise FileNotFoundError(
                f"no trajectory chunks ({CHUNK_PATTERN}) in {path}; write them with TrajectoryWriter "
                "or the actor's save_data option"
            )
        self.path = path
        description, columns, lengths = _read_chunks(files, fields)
        self._paths = [tuple(d["path"]) for d in description]
        self._columns = columns
        self.traj_lengths = lengths
        if traj_transform is not None:
            self._apply(traj_transform)
        self.traj_starts = np.concatenate(([0], np.cumsum(self.traj_lengths)[:-1])).astype(np.int64)

    @property
    def field_names(self) -> List[str]:
        return [".".join(p) for p in self._paths]

    @property
    def num_trajectories(self) -> int:
        return len(self.traj_lengths)

    def __len__(self) -> int:
        return int(self._columns[0].shape[0]) if self._columns else 0

    def __getitem__(self, index: Union[int, slice, Sequence[int], np.ndarray]) -> Dict[str, Any]:
        if isinstance(index, (int, np.integer)):
            return unflatten(self._paths, [c[index] for c in self._columns])
        if isinstance(index, slice):
            return unflatten(self._paths, [c[index] for c in self._columns])
        index = np.asarray(index, dtype=np.int64)
        return unflatten(self._paths, [c.take(index, axis=0) for c in self._columns])

    def trajectory(self, i: int) -> Dict[str, Any]:
        """Trajectory ``i`` as a dict of arrays, transitions on dim 0."""
        start = int(self.traj_starts[i])
        return self[slice(start, start + int(self.traj_lengths[i]))]

    def _apply(self, transform: Callable[[List[Dict[str, Any]]], List[Dict[str, Any]]]) -> None:
        schema = ColumnStorage(0)
        parts: List[List[Any]] = []
        lengths = []
        start = 0
        for length in self.traj_lengths.tolist():
            samples = transform([self[i] for i in range(start, start + length)])
            start += length
            lengths.append(len(samples))
            if samples:
                if not schema.ready:
                    schema.init_schema(samples[0])
                parts.append(
                    [np.asarray(c, dtype=col.dtype) for c, col in zip(schema.convert_many(samples), schema.columns)]
                )
        if not parts:
            raise ValueError(f"traj_transform returned no sample for any trajectory in {self.path}")
        self._paths = [c.path for c in schema.columns]
        self._columns = [np.concatenate([p[i] for p in parts]) for i in range(len(self._paths))]
        self.traj_lengths = np.asarray(lengths, dtype=np.int64)


def _read_chunks(files: Sequence[str], fields: Optional[Sequence[str]]) -> tuple:
    description = None
    keep: List[int] = []
    parts: List[List[np.ndarray]] = []
    lengths = []
    for file in files:
        with np.load(file, allow_pickle=False) as f:
            header = json.loads(f["header"].tobytes().decode("utf-8"))
            if header.get("format") != FORMAT or header.get("version", 0) > FORMAT_VERSION:
                raise ValueError(f"{file} is not a nervex trajectory chunk this version reads (header {header})")
            if description is None:
                description = header["fields"]
                keep = _select(description, fields, file)
            elif header["fields"] != description:
                raise ValueError(f"{file} has fields {header['fields']}, but {files[0]} has {description}")
            parts.append([f[f"f{i}"] for i in keep])
            lengths.append(f["traj_len"])
    columns = [np.concatenate([p[j] for p in parts]) for j in range(len(keep))]
    return [description[i] for i in keep], columns, np.concatenate(lengths).astype(np.int64)


def _select(description: Sequence[Mapping[str, Any]], fields: Optional[Sequence[str]], file: str) -> List[int]:
    names = [".".join(d["path"]) for d in description]
    if fields is None:
        return list(range(len(names)))
    for field in fields:
        if not any(n == field or n.startswith(field + ".") for n in names):
            raise ValueError(f"field '{field}' is not in {file} (fields: {', '.join(names)})")
    return [i for i, n in enumerate(names) if any(n == f or n.startswith(f + ".") for f in fields)]


class OfflineDataLoader(DataLoader):
    """A ``torch.utils.data.DataLoader`` over an ``OfflineDataset`` that builds each batch in one step per field.

    The sampler's indices are grouped by a ``BatchSampler``; the dataset returns the batch as a dict of arrays and
    ``collate_fn`` (``collate``) turns it into tensors.

    Args:
        dataset: The dataset (anything whose ``__getitem__`` accepts a list of indices).
        batch_size: Samples per batch.
        shuffle: Draw indices in random order (ignored when ``sampler`` is given).
        drop_last: Drop the last, smaller batch.
        sampler: Custom index sampler (e.g. ``WeightedRandomSampler``).
        seed: Seed of the shuffling generator.
        collate_fn: Batch dict -> tensors.
        num_workers, pin_memory: As ``DataLoader``.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        shuffle: bool = True,
        drop_last: bool = False,
        sampler: Optional[Sampler] = None,
        seed: Optional[int] = None,
        collate_fn: Callable[[Any], Any] = collate,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        if sampler is None:
            generator = torch.Generator().manual_seed(seed) if seed is not None else None
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        super().__init__(
            dataset,
            batch_size=None,
            sampler=BatchSampler(sampler, batch_size, drop_last),
            collate_fn=collate_fn,
            num_workers=num_workers,
            pin_memory=pin_memory,
        )
