"""A process-wide count of module registrations, so caches of a module's tensors know when to refresh.

Walking a module tree (``parameters()``, iterating an ``nn.ParameterList``) costs more than the arithmetic of a small
RL net's step. ``load_state_dict`` and ``.to()`` keep the tensor objects a module holds; only registering or
assigning a parameter, buffer or submodule (on any module) can replace one, and each such event bumps this count.
A cache keyed by ``registration_count()`` is therefore valid while the count is unchanged.
"""

from __future__ import annotations

from typing import Any

from torch.nn.modules.module import (
    register_module_buffer_registration_hook,
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)

_registrations = [0]


def _note_registration(*_args: Any) -> None:
    _registrations[0] += 1


def registration_count() -> int:
    """How many parameters, buffers and submodules any module has registered (or had assigned) so far."""
    return _registrations[0]


register_module_parameter_registration_hook(_note_registration)
register_module_buffer_registration_hook(_note_registration)
register_module_module_registration_hook(_note_registration)
