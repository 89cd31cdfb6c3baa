"""Optional compiled kernels for ``SumTree``'s two hot operations (batched search and batched update).

NumPy pays ~0.3 us per call, so a vectorized descent costs ~2 us per tree level however small the batch; a compiled
loop does the same descent in ~0.05 us per sample and level. When ``numba`` can be imported the trees use these
kernels (``backend='numba'``); otherwise, or with ``NERVEX_TREE_BACKEND=numpy`` in the environment, they use the
vectorized NumPy code. Both backends walk the same tree with the same comparisons (results agree up to rounding in
how repeated indices are summed), and the test suite runs both against brute-force references.

The kernels themselves live in ``numba_kernels`` (compiled once per installation, cached on disk). ``numba`` is a
dependency of nervex, but a platform without a numba wheel still gets a working (slower) buffer through NumPy.
"""

from __future__ import annotations

import os
import warnings
from types import SimpleNamespace
from typing import Any, Optional

_KERNELS: Optional[Any] = None
_IMPORT_ERROR: Optional[str] = None


def numba_available() -> bool:
    """Whether the compiled kernels can be used."""
    return _load() is not None


def default_backend() -> str:
    """``'numba'`` when available and not disabled by ``NERVEX_TREE_BACKEND=numpy``, else ``'numpy'``."""
    choice = os.environ.get("NERVEX_TREE_BACKEND", "").strip().lower()
    if choice not in ("", "numpy", "numba"):
        raise ValueError(f"NERVEX_TREE_BACKEND must be 'numpy' or 'numba', got {choice!r}")
    if choice == "numpy":
        return "numpy"
    if choice == "numba" and not numba_available():
        raise ImportError(f"NERVEX_TREE_BACKEND=numba but numba cannot be imported: {_IMPORT_ERROR}")
    return "numba" if numba_available() else "numpy"


def kernels() -> Any:
    """The compiled kernels (``find``, ``update``); raises ``ImportError`` without numba."""
    loaded = _load()
    if loaded is None:
        raise ImportError(f"the numba tree backend needs numba: {_IMPORT_ERROR}")
    return loaded


def _load() -> Optional[Any]:
    global _KERNELS, _IMPORT_ERROR
    if _KERNELS is None and _IMPORT_ERROR is None:
        try:
            _KERNELS = _compile()
        except ImportError as error:
            _IMPORT_ERROR = str(error)
        except RuntimeError as error:
            # numba found no writable place for its cache (a read-only install and no usable home directory):
            # say so once and use NumPy rather than fail; NUMBA_CACHE_DIR=/some/writable/dir restores the kernels
            _IMPORT_ERROR = f"numba could not set up its kernel cache ({error}); set NUMBA_CACHE_DIR"
            warnings.warn(f"nervex replay trees fall back to NumPy: {_IMPORT_ERROR}", RuntimeWarning, stacklevel=2)
    return _KERNELS


def _compile() -> Any:
    from . import numba_kernels as nk  # ImportError without numba

    return SimpleNamespace(find=nk.binary_find, sum_update=nk.binary_sum_update, min_update=nk.binary_min_update)
