"""Whether a module tree still holds the tensors a cache read from it: a check by identity, scoped to that tree.

Walking a module tree (``parameters()``, iterating an ``nn.ParameterList``, reading each ``nn.Linear``'s tensors)
costs more than the arithmetic of a small RL net's step, so the fused layers and the Polyak updater keep lists of
tensors. ``load_state_dict``, ``.to()`` and in-place updates keep the tensor objects a module holds; only putting
another object into a module's slot replaces one: assigning or registering a parameter, buffer or submodule,
``load_state_dict(assign=True)``, or ``.to()`` under ``torch.__future__.set_overwrite_module_params_on_conversion``.
A :class:`ModuleWatch` holds every watched module's own slot dicts and the objects that were in them, and compares
them by identity: ~0.1 us per module, and no hook anywhere in the process.
"""

from __future__ import annotations

import operator
from itertools import chain
from typing import Any, Dict, List, Sequence, ValuesView

import torch.nn as nn

SLOTS = ("_parameters", "_buffers", "_modules")  # where nn.Module keeps what it holds


class ModuleWatch:
    """Tells whether any parameter, buffer or submodule of some modules was put in place of another.

    Args:
        modules: The modules to watch.
        recurse: Watch their submodules too (every module ``modules()`` reaches); False: only their own slots.
        slots: Which of each module's slots to watch (a cache that reads only parameters watches ``_parameters``).

    Example:
        >>> watch = ModuleWatch([layer])
        >>> if watch.replaced():  # True on the first call, then after an assignment such as layer.weight = ...
        ...     cached = [layer.weight, layer.bias]
    """

    def __init__(self, modules: Sequence[nn.Module], recurse: bool = True, slots: Sequence[str] = SLOTS) -> None:
        unknown = [slot for slot in slots if slot not in SLOTS]
        if unknown:
            raise ValueError(f"ModuleWatch: unknown slots {unknown}; choose among {SLOTS}")
        self._modules = list(modules)
        self._recurse = recurse
        self._slot_names = tuple(slots)
        self._slots: List[ValuesView[Any]] = []
        self._held: List[Any] = []  # the objects in the slots when last read (kept alive: identity stays meaningful)
        self._read = False

    def replaced(self) -> bool:
        """Whether a slot of a watched module holds another object (or one was added or removed) since the last call
        that returned True; True on the first call. A True answer re-reads the slots (a new submodule is watched)."""
        if self._read:
            current = list(chain.from_iterable(self._slots))
            if len(current) == len(self._held) and all(map(operator.is_, current, self._held)):
                return False
        modules = [m for root in self._modules for m in (root.modules() if self._recurse else (root,))]
        # the dicts are nn.Module's own storage; their live views follow every later assignment
        self._slots = [getattr(m, slot).values() for m in modules for slot in self._slot_names]
        self._held = list(chain.from_iterable(self._slots))
        self._read = True
        return True

    def __getstate__(self) -> Dict[str, Any]:
        # a copy (``copy.deepcopy`` of a model that holds a watch) watches the copied modules, read afresh
        return {"modules": self._modules, "recurse": self._recurse, "slots": self._slot_names}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["modules"], state["recurse"], state["slots"])
