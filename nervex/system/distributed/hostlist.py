"""Slurm host lists (``SLURM_JOB_NODELIST``'s format): expanded lazily, checked whole before the first host."""

from __future__ import annotations

import re
from typing import Iterator, List, Tuple, Union

_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() and int() also take other scripts' digits
HostPart = Union[str, List[Tuple[int, int, int]]]  # literal text, or a bracket group's (first, last, width) ranges


# ---- Slurm host lists -----------------------------------------------------------------------------------------------
def expand_hostlist(nodelist: str) -> Iterator[str]:
    """The hosts of a Slurm host list, in the order written (lazily: ``n[1-100000]`` costs nothing up front).

    ``node01``; ``node[01-03,07]`` (node01 node02 node03 node07); ``gpu-a[1-2],gpu-b5``; ``n[001-004]`` keeps the
    zero padding of the range's first number; several bracket groups in one name (``r[1-2]n[1-2]``) expand as a
    product, the last group fastest.

    Args:
        nodelist: The host list (``SLURM_JOB_NODELIST``'s format).

    Yields:
        Host names.

    Raises:
        ValueError: the list is empty or malformed (unbalanced or nested brackets, an empty name or range, a range
            whose end is below its start, anything but digits, ``-`` and ``,`` inside brackets); the whole list is
            checked by the call, before any host is produced.
    """
    items = [_parse_item(item, nodelist) for item in _split_top_level(nodelist)]
    return (host for parts in items for host in _expand_parts(parts))


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list (rank 0's node under ``srun``'s default block distribution).

    Args:
        nodelist: The host list, e.g. ``'gpu-a[1-2],gpu-b5'`` (gives ``'gpu-a1'``).

    Returns:
        The first host name.

    Raises:
        ValueError: the list is empty or malformed (see ``expand_hostlist``).
    """
    return next(expand_hostlist(nodelist))


def _split_top_level(nodelist: str) -> List[str]:
    """Split at the commas outside brackets, checking that the brackets balance and do not nest."""
    text = nodelist.strip()
    if not text:
        raise ValueError("the host list is empty")
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            if depth:
                raise ValueError(f"nested '[' at position {i} of host list {nodelist!r}")
            depth = 1
        elif char == "]":
            if not depth:
                raise ValueError(f"']' without '[' at position {i} of host list {nodelist!r}")
            depth = 0
        elif char == "," and not depth:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"'[' is never closed in host list {nodelist!r}")
    items.append(text[start:])
    for item in items:
        if not item.strip():
            raise ValueError(f"empty host name in host list {nodelist!r}")
    return [item.strip() for item in items]


def _parse_item(item: str, nodelist: str) -> List[HostPart]:
    """One host pattern as parts: literal text, or a bracket group's ranges (``'n[1-2]x'`` -> ``['n', [...], 'x']``)."""
    parts: List[HostPart] = []
    pos = 0
    while pos < len(item):
        open_at = item.find("[", pos)
        if open_at < 0:
            parts.append(item[pos:])
            break
        if open_at > pos:
            parts.append(item[pos:open_at])
        close_at = item.index("]", open_at)  # balanced: checked by _split_top_level
        parts.append(_parse_ranges(item[open_at + 1 : close_at], nodelist))
        pos = close_at + 1
    return parts


def _parse_ranges(body: str, nodelist: str) -> List[Tuple[int, int, int]]:
    """``'01-03,7'`` -> ``[(1, 3, 2), (7, 7, 1)]``: (first, last, zero-padded width)."""
    ranges = []
    for spec in body.split(","):
        low, sep, high = spec.strip().partition("-")
        if not _DIGITS.fullmatch(low) or (sep and not _DIGITS.fullmatch(high)):
            raise ValueError(f"bad range {spec!r} in '[{body}]' of host list {nodelist!r}: expected N or N-M")
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise ValueError(f"range {spec!r} of host list {nodelist!r} ends below its start")
        ranges.append((first, last, len(low)))
    return ranges


def _expand_parts(parts: List[HostPart]) -> Iterator[str]:
    if not parts:
        yield ""
        return
    head, rest = parts[0], parts[1:]
    heads = [head] if isinstance(head, str) else (f"{n:0{w}d}" for a, b, w in head for n in range(a, b + 1))
    for prefix in heads:
        for suffix in _expand_parts(rest):
            yield prefix + suffix


__all__ = ["expand_hostlist", "first_host"]
