"""Loading ``sumo_rl`` on ``libsumo``, the PettingZoo shim, the shipped scenarios and the one-simulation rule.

``libsumo`` runs SUMO inside the Python process (about 16x the steps per second of TraCI's socket on the single
intersection, ``bench/sumo_signals.py``), but it holds **one simulation per process**. :class:`LibsumoSlot` is the process's
record of who holds it: a second SUMO env of this package in the same process raises
:class:`LibsumoBusyError` naming the holder and the fix (one env per subprocess worker) instead of silently
restarting the first env's simulation.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Dict, Optional, Tuple

INSTALL_HINT = "pip install -e .[sumo]  (eclipse-sumo, libsumo and sumo-rl wheels; no system SUMO needed)"

# scenario name -> (net file, route file), relative to sumo_rl/nets
SCENARIOS: Dict[str, Tuple[str, str]] = {
    "single-intersection": (
        "single-intersection/single-intersection.net.xml",
        "single-intersection/single-intersection.rou.xml",
    ),
    "2x2grid": ("2x2grid/2x2.net.xml", "2x2grid/2x2.rou.xml"),
}


class LibsumoBusyError(RuntimeError):
    """A second libsumo simulation was about to start in a process that already runs one."""


def apply_agent_selector_shim(env_module: types.ModuleType) -> bool:
    """Make sumo-rl 1.4.5's PettingZoo env work with PettingZoo >= 1.25.

    sumo-rl calls ``agent_selector(agents)`` after ``from pettingzoo.utils import agent_selector``; PettingZoo 1.25
    turned that name into a module (the class is now ``AgentSelector``). The shim rebinds the name in sumo-rl's
    ``environment.env`` module only; nothing of PettingZoo changes.

    Args:
        env_module: ``sumo_rl.environment.env``.

    Returns:
        Whether the name was rebound (False on PettingZoo < 1.25 or an already patched module).
    """
    selector = getattr(env_module, "agent_selector", None)
    if isinstance(selector, types.ModuleType):
        env_module.agent_selector = selector.AgentSelector
        return True
    return False


def _traci_is_libsumo() -> bool:
    traci = sys.modules.get("traci")
    return traci is not None and bool(getattr(traci, "isLibsumo", lambda: False)())


def load_sumo_rl() -> types.ModuleType:
    """Import ``sumo_rl`` with ``libsumo`` as its ``traci``, ``SUMO_HOME`` from the ``eclipse-sumo`` wheel when
    unset, and the ``agent_selector`` shim applied.

    ``traci`` re-exports libsumo only when ``LIBSUMO_AS_TRACI`` is set at its import, and ``import libsumo`` itself
    imports the plain ``traci`` package first; a ``traci`` package imported that way is imported again (before
    sumo-rl binds it) so that it re-exports libsumo.

    Raises:
        ImportError: the ``sumo`` extra is missing (the message says how to install it).
        RuntimeError: sumo-rl was already imported on the pure-Python ``traci`` (it would drive TraCI's socket while
            believing it drives libsumo), or ``libsumo`` failed to load.
    """
    if "sumo_rl" in sys.modules and _traci_is_libsumo():
        return sys.modules["sumo_rl"]
    try:
        import sumo
    except ImportError as e:
        raise ImportError(f"the SUMO envs need the SUMO wheels ({e.name} is missing): {INSTALL_HINT}") from e
    os.environ.setdefault("SUMO_HOME", sumo.SUMO_HOME)
    os.environ.setdefault("LIBSUMO_AS_TRACI", "1")  # sumo-rl reads it at import; traci then re-exports libsumo
    if "traci" in sys.modules and not _traci_is_libsumo():
        if "sumo_rl.environment.env" in sys.modules:
            raise RuntimeError(
                "app_zoo.sumo: sumo_rl was imported before LIBSUMO_AS_TRACI was set, so it drives the pure-Python "
                "traci in this process; import app_zoo.sumo (or build a SUMO env) before importing sumo_rl, or set "
                "LIBSUMO_AS_TRACI=1 in the environment"
            )
        del sys.modules["traci"]  # imported plain (e.g. by `import libsumo`): import it again as libsumo's view
    try:
        import sumo_rl
        from sumo_rl.environment import env as env_module
    except ImportError as e:
        raise ImportError(f"the SUMO envs need sumo-rl ({e}): {INSTALL_HINT}") from e
    if not (env_module.LIBSUMO and _traci_is_libsumo()):
        raise RuntimeError(
            "app_zoo.sumo: traci did not load libsumo (is the libsumo wheel installed for this Python? "
            f"{INSTALL_HINT}); sumo-rl would fall back to TraCI's socket"
        )
    apply_agent_selector_shim(env_module)
    return sumo_rl


def scenario_files(scenario: str, net_file: Optional[str] = None, route_file: Optional[str] = None) -> Tuple[str, str]:
    """The net and route files of a shipped scenario, either replaced by an explicit path.

    Raises:
        KeyError: an unknown scenario (lists the known ones).
        FileNotFoundError: a file that does not exist (names it).
    """
    import sumo_rl

    if scenario not in SCENARIOS:
        raise KeyError(
            f"unknown SUMO scenario {scenario!r}; shipped: {sorted(SCENARIOS)} (or give net_file and route_file)"
        )
    nets = os.path.join(os.path.dirname(sumo_rl.__file__), "nets")
    net, route = (os.path.join(nets, rel) for rel in SCENARIOS[scenario])
    net, route = net_file or net, route_file or route
    for key, path in (("net_file", net), ("route_file", route)):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"SUMO {key} {path!r} does not exist")
    return net, route


class LibsumoSlot:
    """The process's one libsumo simulation: who holds it (a description and the pid it was taken in)."""

    _holder: Optional[Tuple[str, int]] = None

    @classmethod
    def acquire(cls, who: str) -> None:
        """Take the slot for ``who``.

        Raises:
            LibsumoBusyError: another env holds it (in this process, or in the parent this process was forked from
                while that env's simulation was running); the message names both and the fix.
        """
        if cls._holder is not None:
            holder, pid = cls._holder
            where = "this process" if pid == os.getpid() else f"process {pid}, which forked this one while it ran"
            raise LibsumoBusyError(
                f"libsumo runs one simulation per process: {holder} already holds it ({where}), so {who} cannot start "
                f"a second. Give each SUMO env its own process: env.manager_type: subprocess with env.manager."
                f"worker_num >= max(collector_env_num, evaluator_env_num), or close the first env"
            )
        cls._holder = (who, os.getpid())

    @classmethod
    def release(cls, who: str) -> None:
        """Free the slot if ``who`` holds it."""
        if cls._holder is not None and cls._holder[0] == who:
            cls._holder = None

    @classmethod
    def holder(cls) -> Optional[str]:
        """The description of the env holding the slot, or None."""
        return None if cls._holder is None else cls._holder[0]


__all__ = [
    "SCENARIOS",
    "INSTALL_HINT",
    "LibsumoBusyError",
    "LibsumoSlot",
    "apply_agent_selector_shim",
    "load_sumo_rl",
    "scenario_files",
]
