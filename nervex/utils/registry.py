"""A small name -> object registry used for policies, envs, models and env managers."""

from __future__ import annotations

import difflib
from typing import Any, Callable, Dict, Iterator, List, Optional


class Registry:
    """Maps names to classes or factories, with helpful errors for unknown names.

    Args:
        kind: What the registry holds (``'policy'``, ``'env'``...); used in error messages.

    Example:
        >>> POLICY_REGISTRY = Registry('policy')
        >>> POLICY_REGISTRY.register('dqn', DQNPolicy)
        >>> POLICY_REGISTRY.get('dqn')
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: Dict[str, Any] = {}

    def register(self, name: str, obj: Optional[Any] = None, force: bool = False) -> Any:
        """Register ``obj`` under ``name``; without ``obj`` it returns a decorator.

        Raises:
            KeyError: ``name`` is taken by a different object and ``force`` is False.
        """
        if obj is None:

            def decorator(target: Any) -> Any:
                self.register(name, target, force=force)
                return target

            return decorator
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self._items and self._items[name] is not obj and not force:
            raise KeyError(f"{self.kind} '{name}' is already registered to {self._items[name]!r}")
        self._items[name] = obj
        return obj

    def unregister(self, name: str) -> Any:
        """Remove ``name`` and return what it mapped to.

        Raises:
            KeyError: unknown name.
        """
        if name not in self._items:
            raise KeyError(self.unknown_message(name))
        return self._items.pop(name)

    def get(self, name: str) -> Any:
        """Return what ``name`` maps to.

        Raises:
            KeyError: unknown name; the message lists registered names and the nearest match.
        """
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        names = sorted(self._items)
        msg = f"unknown {self.kind} '{name}'; registered: {', '.join(names) if names else '(none)'}"
        close = difflib.get_close_matches(str(name), names, n=1)
        if close:
            msg += f"; did you mean '{close[0]}'?"
        return msg

    def build(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Look ``name`` up and call it with the given arguments."""
        factory: Callable[..., Any] = self.get(name)
        return factory(*args, **kwargs)

    def names(self) -> List[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


POLICY_REGISTRY = Registry("policy")
ENV_REGISTRY = Registry("env")
MODEL_REGISTRY = Registry("model")
ENV_MANAGER_REGISTRY = Registry("env_manager")
