"""The replay file format: what ``BaseBuffer.save`` writes and ``BaseBuffer.load`` reads.

One ``.npz`` (``np.savez``, read back with ``allow_pickle=False``) of plain arrays, plus ``header``: the UTF-8 bytes of
a JSON object with ``format``, ``version`` and what the buffer puts there (its schema and counters). Nothing in the
file is unpickled or evaluated.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Mapping, Tuple

import numpy as np

FORMAT = "nervex.replay"
FORMAT_VERSION = 1


def write_replay_file(path: str, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``header`` (JSON-ready) and ``arrays`` to ``path`` atomically (a temporary file renamed into place)."""
    header = {"format": FORMAT, "version": FORMAT_VERSION, **header}
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, header=np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8), **arrays)
    os.replace(tmp, path)


def read_replay_file(path: str) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """The header and arrays ``write_replay_file`` wrote to ``path``.

    Raises:
        ValueError: not a nervex replay file, or one of a newer format version.
    """
    with np.load(path, allow_pickle=False) as f:
        if "header" not in f.files:
            raise ValueError(f"{path} is not a nervex replay buffer file (no header)")
        header = json.loads(f["header"].tobytes().decode("utf-8"))
        if header.get("format") != FORMAT:
            raise ValueError(f"{path} is not a nervex replay buffer file (format {header.get('format')!r})")
        if header.get("version", 0) > FORMAT_VERSION:
            raise ValueError(
                f"{path} has replay format version {header['version']}; this nervex reads up to {FORMAT_VERSION}"
            )
        return header, {k: f[k] for k in f.files if k != "header"}
