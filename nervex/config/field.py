"""``Field``: a declared default that also states the values it accepts.

Defaults are declared once, in a class's ``config`` dict (or its constructor's signature, see
``signature_config``). Where a key has a range or a set of choices, the default is wrapped in a ``Field``; the
config system checks every value against it and names the dotted key when a value is out of range::

    config = dict(learn=dict(learning_rate=Field(1e-3, gt=0), batch_size=Field(64, ge=1)))

``plain_defaults(config)`` strips the wrappers (what a compiled config holds).
"""

from __future__ import annotations

import copy
import inspect
import math
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

_KINDS = {"int": int, "float": float, "number": float, "bool": bool, "str": str, "list": list}


class Field:
    """A default value with the constraints a user's value must meet.

    Args:
        default: The default (``None`` means "off" or "not set" for keys that accept ``None``).
        gt, ge, lt, le: Bounds for numbers (``gt=0``: must be > 0).
        choices: The accepted values (strings usually).
        kind: The expected type when ``default`` is ``None``: ``'int'``, ``'float'``, ``'number'``, ``'bool'``,
            ``'str'`` or ``'list'``. With a non-None default the type is the default's.
        nullable: Whether ``None`` is accepted (default: only when ``default`` is ``None``).

    Example:
        >>> Field(0.99, gt=0, le=1)          # a discount factor
        >>> Field(None, ge=1, kind='int')    # an optional count
    """

    __slots__ = ("default", "gt", "ge", "lt", "le", "choices", "kind", "nullable")

    def __init__(
        self,
        default: Any,
        *,
        gt: Optional[float] = None,
        ge: Optional[float] = None,
        lt: Optional[float] = None,
        le: Optional[float] = None,
        choices: Optional[Sequence[Any]] = None,
        kind: Optional[str] = None,
        nullable: Optional[bool] = None,
    ) -> None:
        if kind is not None and kind not in _KINDS:
            raise ValueError(f"Field kind must be one of {sorted(_KINDS)}, got {kind!r}")
        self.default = default
        self.gt, self.ge, self.lt, self.le = gt, ge, lt, le
        self.choices = tuple(choices) if choices is not None else None
        self.kind = kind
        self.nullable = default is None if nullable is None else bool(nullable)

    def with_default(self, default: Any) -> Field:
        """The same constraints around another default (a subclass overriding a base default)."""
        out = copy.copy(self)
        out.default = default
        if default is None:
            out.nullable = True
        return out

    def describe(self) -> str:
        """The accepted values in words, e.g. ``'> 0 and <= 1'``."""
        parts = []
        for op, bound in ((">", self.gt), (">=", self.ge), ("<", self.lt), ("<=", self.le)):
            if bound is not None:
                parts.append(f"{op} {bound:g}" if isinstance(bound, float) else f"{op} {bound}")
        if self.choices is not None:
            parts.append("one of " + ", ".join(repr(c) for c in self.choices))
        return " and ".join(parts)

    def violation(self, value: Any) -> Optional[str]:
        """Why ``value`` is not accepted (None when it is). ``value`` has already been type-checked."""
        if value is None:
            return None if self.nullable else "must not be null"
        if self.choices is not None and value not in self.choices:
            return f"must be {self.describe()}"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and math.isnan(value):
                return "must be a number, not nan"
            checks = (
                (self.gt, lambda b: value > b),
                (self.ge, lambda b: value >= b),
                (self.lt, lambda b: value < b),
                (self.le, lambda b: value <= b),
            )
            if not all(test(bound) for bound, test in checks if bound is not None):
                return f"must be {self.describe()}"
        return None

    def type_example(self) -> Any:
        """A value of the expected type, for the type check (the default, or one made from ``kind``)."""
        if self.default is not None or self.kind is None:
            return self.default
        return {"int": 0, "float": 0.0, "number": 0.0, "bool": False, "str": "", "list": []}[self.kind]

    def __repr__(self) -> str:
        rule = self.describe()
        return f"Field({self.default!r}{', ' + rule if rule else ''})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Field) and all(getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __hash__(self) -> int:
        return hash((self.default if not isinstance(self.default, list) else None, self.gt, self.ge, self.lt, self.le))


def plain_defaults(defaults: Any) -> Any:
    """``defaults`` with every ``Field`` replaced by its default (a deep copy; tuples become lists)."""
    if isinstance(defaults, Field):
        return plain_defaults(defaults.default)
    if isinstance(defaults, Mapping):
        return {str(k): plain_defaults(v) for k, v in defaults.items()}
    if isinstance(defaults, (list, tuple)):
        return [plain_defaults(v) for v in defaults]
    return copy.deepcopy(defaults)


def merge_defaults(base: Mapping[str, Any], override: Mapping[str, Any]) -> Dict[str, Any]:
    """Lay a subclass's declared defaults over its base's, keeping the base's constraints.

    A plain value over a ``Field`` keeps the ``Field``'s rule with the new default, so a subclass that only changes
    ``batch_size=256`` still gets ``batch_size >= 1`` checked.
    """
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        old = out.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping) and old:
            out[key] = merge_defaults(old, value)
        elif isinstance(old, Field) and not isinstance(value, Field):
            out[key] = old.with_default(copy.deepcopy(value))
        else:
            out[key] = copy.deepcopy(value)
    return out


def signature_config(func: Callable[..., Any], skip: Sequence[str] = (), **fields: Field) -> Dict[str, Any]:
    """The ``config`` of a class built with keyword arguments: its constructor's defaults, declared once there.

    Args:
        func: The constructor (``__init__``).
        skip: Parameters that are not config keys (``env_fn``...); ``self`` and ``*args``/``**kwargs`` are always
            skipped.
        **fields: Constraints for some keys, given as ``Field``s whose default is taken from the signature.

    Returns:
        ``{name: default or Field}`` in the signature's order.

    Raises:
        ValueError: a constrained key is not a keyword parameter with a default.
    """
    out: Dict[str, Any] = {}
    for name, param in inspect.signature(func).parameters.items():
        if name == "self" or name in skip or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.default is inspect.Parameter.empty:
            raise ValueError(f"{func.__qualname__}: parameter '{name}' has no default, so it cannot be a config key")
        out[name] = fields.pop(name).with_default(param.default) if name in fields else param.default
    if fields:
        raise ValueError(f"{func.__qualname__}: constrained keys {sorted(fields)} are not parameters with defaults")
    return out
