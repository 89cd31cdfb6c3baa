"""The entry: the builder (``compile_config``, ``make_*``), ``SerialTrainer``, ``serial_pipeline`` and the command
line. Names load on first use, so ``nervex plot`` (``nervex.entry.cli``) starts without importing torch."""

from importlib import import_module
from typing import Any

_WHERE = {
    "compile_config": "builder",
    "compile_parallel_config": "builder",
    "config_parts": "builder",
    "make_actor": "builder",
    "make_buffer": "builder",
    "make_env_managers": "builder",
    "make_evaluator": "builder",
    "make_learner": "builder",
    "make_policy": "builder",
    "DefaultCallbacks": "callbacks",
    "LeagueTrainer": "league_entry",
    "league_pipeline": "league_entry",
    "SerialTrainer": "serial_entry",
    "load_policy": "serial_entry",
    "serial_eval": "serial_entry",
    "serial_pipeline": "serial_entry",
}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'nervex.entry' has no attribute {name!r}")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(list(globals()) + __all__)
