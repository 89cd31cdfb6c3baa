"""Importing the modules a config names (``policy.import_names``, ``env.import_names``)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Sequence


def import_modules(names: Any, key: str, search_dirs: Sequence[str] = ()) -> None:
    """Import every module in ``names`` so that what they register (policies, envs, models) can be looked up.

    A module that is not found on ``sys.path`` is looked for again in ``search_dirs`` (the config file's folder and
    the working directory), so ``nervex -c my.yaml`` finds ``my_policy.py`` next to ``my.yaml``.

    Args:
        names: Module names (``['my_policy']``, ``['app_zoo.classic_control.cartpole.envs']``).
        key: The config key that named them, for messages (``'policy.import_names'``).
        search_dirs: Folders to add to ``sys.path`` when a module is not found.

    Raises:
        ValueError: ``names`` is not a list of strings, or a module cannot be found (the message names the key and
            the module). Errors raised inside a module that is found propagate, with a note naming the key.
    """
    from nervex.config import ConfigError  # the config package imports no nervex module at import time

    if names is None:
        return
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise ConfigError(f"key '{key}' must be a list of module names, got {names!r}")
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise ConfigError(f"key '{key}[{i}]' must be a module name (a string), got {name!r}")
        _import_one(name, f"{key}[{i}]", search_dirs, ConfigError)


def _import_one(name: str, key: str, search_dirs: Sequence[str], error: type) -> None:
    try:
        importlib.import_module(name)
        return
    except ModuleNotFoundError as e:
        if e.name is None or not name.startswith(e.name):
            raise  # the module was found but imports something missing: show the real traceback
        first_error = e
    except Exception as e:
        e.add_note(f"(raised while importing '{name}', named by the config key '{key}')")
        raise
    added = [os.path.abspath(d) for d in search_dirs if d and os.path.abspath(d) not in sys.path]
    sys.path[:0] = added
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is None or not name.startswith(e.name):
            raise
        where = ", ".join([p or "." for p in sys.path[:3]] + ["..."])
        raise error(
            f"key '{key}': cannot import module '{name}' ({first_error}); it must be importable from the "
            f"working directory, the config file's folder or PYTHONPATH (sys.path: {where})"
        ) from None
