"""Checks of decoded arrays against what they must mean: required keys, dtypes, shared dimensions, finite values.

``decode_arrays`` checks that a buffer is well-formed safetensors; a ``Schema`` then checks that its arrays are the
ones a role expects (a trajectory's ``obs``, ``action``, ``reward`` of one length ``T``, no NaN reward), and refuses
anything else with a ``ProtocolError`` naming the array.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple, Union

import numpy as np

from .errors import ProtocolError

Dim = Union[int, str, None]


@dataclass(frozen=True)
class ArraySpec:
    """What one array must be.

    Args:
        dtypes: The accepted NumPy dtypes, by name (``('float32', 'float64')``; one name alone is accepted too).
        shape: One entry per dimension: an int (that size), a name (a size shared by every array that uses the name,
            e.g. ``'T'``) or None (any size).
        finite: Refuse NaN and infinities (float arrays).
        low, high: Inclusive bounds on the values (NaN is outside any bounds).
        required: Whether the array must be present.
    """

    dtypes: Union[str, Tuple[str, ...]]
    shape: Tuple[Dim, ...]
    finite: bool = False
    low: Optional[float] = None
    high: Optional[float] = None
    required: bool = True

    def __post_init__(self) -> None:
        dtypes = (self.dtypes,) if isinstance(self.dtypes, str) else self.dtypes
        object.__setattr__(self, "dtypes", tuple(np.dtype(d).name for d in dtypes))
        object.__setattr__(self, "shape", tuple(self.shape))

    def describe(self) -> str:
        dims = ", ".join("*" if d is None else str(d) for d in self.shape)
        return f"{' or '.join(self.dtypes)} of shape ({dims}{',' if len(self.shape) == 1 else ''})"


@dataclass(frozen=True)
class Schema:
    """A declarative check of decoded arrays: which keys, their dtypes and shapes, and their values.

    Example, a trajectory of ``T`` steps of CartPole with a recurrent state of 64 units::

        Schema({
            "obs": ArraySpec("float32", ("T", 4), finite=True),
            "action": ArraySpec("int64", ("T",), low=0, high=1),
            "reward": ArraySpec("float32", ("T",), finite=True),
            "terminated": ArraySpec("bool", ("T",)),
            "truncated": ArraySpec("bool", ("T",)),
            "logp": ArraySpec("float32", ("T",), finite=True, high=0.0),
            "prev_state/h": ArraySpec("float32", (1, 64), finite=True, required=False),
        })

    Args:
        fields: ``{name: ArraySpec}`` (flat names, as ``decode_arrays`` returns them).
        allow_extra: Accept arrays the schema does not name (refused by default: a typo is not silently dropped).
    """

    fields: Mapping[str, ArraySpec]
    allow_extra: bool = False

    def validate(self, arrays: Mapping[str, np.ndarray], dims: Optional[Mapping[str, int]] = None) -> Dict[str, int]:
        """Check ``arrays`` against the schema.

        Args:
            arrays: The decoded arrays.
            dims: Sizes of named dimensions known in advance (``{'T': 64}``).

        Returns:
            The size of every named dimension (``{'T': 64}``).

        Raises:
            ProtocolError: 400 naming the first offending array and what was expected and found.
        """
        self._check_keys(arrays)
        bound: Dict[str, Tuple[int, str]] = {name: (int(size), "the caller") for name, size in (dims or {}).items()}
        for name, spec in self.fields.items():
            if name in arrays:
                _check_array(name, spec, arrays[name], bound)
        return {name: size for name, (size, _) in bound.items()}

    def _check_keys(self, arrays: Mapping[str, np.ndarray]) -> None:
        for name, spec in self.fields.items():
            if spec.required and name not in arrays:
                raise ProtocolError(400, f"missing array {name!r}: expected {spec.describe()}", field=name)
        extra = [name for name in arrays if name not in self.fields]
        if extra and not self.allow_extra:
            close = difflib.get_close_matches(extra[0], list(self.fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; expected only {sorted(self.fields)}"
            raise ProtocolError(400, f"unexpected array {extra[0]!r}{hint}", field=extra[0])


def _check_array(name: str, spec: ArraySpec, array: np.ndarray, bound: Dict[str, Tuple[int, str]]) -> None:
    if array.dtype.name not in spec.dtypes:
        raise ProtocolError(400, f"{name}: expected {spec.describe()}, found dtype {array.dtype}", field=name)
    if array.ndim != len(spec.shape):
        raise ProtocolError(400, f"{name}: expected {spec.describe()}, found shape {array.shape}", field=name)
    for axis, (want, size) in enumerate(zip(spec.shape, array.shape)):
        if isinstance(want, str):
            have, source = bound.setdefault(want, (size, name))
            if have != size:
                raise ProtocolError(
                    400, f"{name}: dimension {axis} ({want}) is {size}, but {want} = {have} from {source}", field=name
                )
        elif want is not None and want != size:
            raise ProtocolError(400, f"{name}: expected {spec.describe()}, found shape {array.shape}", field=name)
    _check_values(name, spec, array)


def _check_values(name: str, spec: ArraySpec, array: np.ndarray) -> None:
    if spec.finite and array.dtype.kind == "f":
        _refuse_where(name, array, ~np.isfinite(array), "finite values")
    if spec.low is not None or spec.high is not None:
        low = -np.inf if spec.low is None else spec.low
        high = np.inf if spec.high is None else spec.high
        _refuse_where(name, array, ~((array >= low) & (array <= high)), f"values in [{low}, {high}]")


def _refuse_where(name: str, array: np.ndarray, bad: np.ndarray, expected: str) -> None:
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ProtocolError(400, f"{name}: expected {expected}, found {array[index]} at index {index}", field=name)
