"""Checkpoints that are written atomically and load with ``torch.load(..., weights_only=True)``.

A checkpoint may hold only tensors, plain numbers, strings, ``None`` and dicts / lists / tuples of them (which is what
``state_dict()`` of modules and optimizers returns). That keeps loading free of arbitrary unpickling, and saving checks
it up front so a bad value fails at save time, with its key path, instead of on the day the file is needed.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections import OrderedDict
from typing import Any, Dict, Optional, Union

import numpy as np
import torch

PathLike = Union[str, "os.PathLike[str]"]

_LEAF_TYPES = (bool, int, float, str, type(None))
_KEY_TYPES = (str, int)


def _describe(value: Any) -> str:
    hint = ""
    if isinstance(value, (np.ndarray, np.generic)):
        hint = " (convert with torch.from_numpy(...) or .item())"
    elif isinstance(value, torch.nn.Module) or hasattr(value, "state_dict"):
        hint = " (store its .state_dict() instead)"
    elif isinstance(value, dict) or (isinstance(value, tuple) and hasattr(value, "_fields")):
        hint = " (convert it to a plain dict / tuple)"
    return f"{type(value).__module__}.{type(value).__qualname__}{hint}"


def check_checkpoint_state(state: Any, path: str = "state") -> None:
    """Check that ``state`` holds only values ``torch.load(..., weights_only=True)`` can read back.

    Args:
        state: The object to save.
        path: The name used for ``state`` in error messages.

    Raises:
        TypeError: a value or key of another type; the message gives its key path, e.g.
            ``state['policy']['buffer']``, and its type.
    """
    if isinstance(state, torch.Tensor) or type(state) in _LEAF_TYPES:
        return
    if type(state) in (dict, OrderedDict):
        for key, value in state.items():
            if type(key) not in _KEY_TYPES:
                raise TypeError(f"checkpoint key {key!r} in {path} is a {_describe(key)}; keys must be str or int")
            check_checkpoint_state(value, f"{path}[{key!r}]")
        return
    if type(state) in (list, tuple, torch.Size):
        for i, value in enumerate(state):
            check_checkpoint_state(value, f"{path}[{i}]")
        return
    raise TypeError(
        f"checkpoint value {path} is a {_describe(state)}; a checkpoint may hold only tensors, state_dicts, "
        "numbers, strings, None and dicts / lists / tuples of them, so it loads with torch.load(weights_only=True)"
    )


def _fsync_dir(directory: str) -> None:
    # makes the rename itself durable; not possible on every platform (Windows), where os.replace is still atomic
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(state: Dict[str, Any], path: PathLike) -> None:
    """Save ``state`` to ``path`` atomically: readers see the old file or the complete new one, never a part.

    The state is written to a temporary file in the same directory, flushed to disk, then renamed over ``path``.
    Missing parent directories are created.

    Args:
        state: Tensors, state_dicts, plain numbers, strings and dicts / lists / tuples of them.
        path: Where the checkpoint goes.

    Raises:
        TypeError: ``state`` holds something else; the message names its key path. Nothing is written.
    """
    check_checkpoint_state(state)
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException as error:
        try:
            os.remove(tmp_path)
        except FileNotFoundError:
            pass
        os_error = _os_error_in(error)
        if os_error is not None and not isinstance(error, OSError):
            # torch.save reports a failed write (a full disk) as RuntimeError with the OSError as its context
            raise OSError(os_error.errno, f"cannot write checkpoint {path}: {os_error.strerror or os_error}") from error
        raise
    _fsync_dir(directory)


def _os_error_in(error: BaseException) -> Optional[OSError]:
    """The first ``OSError`` in ``error``'s cause/context chain (itself included), or None."""
    seen = set()
    current: Optional[BaseException] = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class CheckpointError(ValueError):
    """A checkpoint file exists but cannot be read: truncated, corrupted, or not a checkpoint."""


def load_checkpoint(path: PathLike, map_location: Any = "cpu") -> Dict[str, Any]:
    """Load a checkpoint written by ``save_checkpoint`` with ``torch.load(..., weights_only=True)``.

    Args:
        path: The checkpoint file.
        map_location: Where tensors are loaded, as for ``torch.load``; CPU by default.

    Returns:
        The saved state.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        pickle.UnpicklingError: the file holds objects a weights-only load refuses (it was not written by
            ``save_checkpoint``).
        CheckpointError: the file is truncated or corrupted, or not a torch checkpoint at all; one line naming
            the file and what the reader said.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint file '{path}' does not exist")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise pickle.UnpicklingError(
            f"checkpoint '{path}' cannot be loaded with weights_only=True; it holds objects other than tensors, "
            f"numbers, strings and containers: {e}"
        ) from e
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        # torch's zip reader says e.g. "PytorchStreamReader failed reading zip archive: failed finding central
        # directory"; keep its first line, name the file, and drop the traceback into the reader
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        size = os.path.getsize(path)
        raise CheckpointError(
            f"checkpoint '{path}' ({size} bytes) is truncated or corrupted, or not a checkpoint: {reason}"
        ) from None
