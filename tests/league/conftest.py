"""Fixtures of the league's tests: every test of league logic runs over both stores."""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Mapping, Optional

import pytest

from nervex.league import League, MemoryStore, SQLiteStore


@pytest.fixture(params=["memory", "sqlite"])
def make_league(request, tmp_path) -> Iterator[Callable[..., League]]:
    """``make_league(cfg, rng=0)``: a league over a ``MemoryStore`` or an ``SQLiteStore`` in ``tmp_path``."""
    opened: List[League] = []

    def make(cfg: Optional[Mapping[str, Any]] = None, rng: Any = 0) -> League:
        if request.param == "memory":
            store = MemoryStore()
        else:
            store = SQLiteStore(str(tmp_path / f"league{len(opened)}.sqlite"))
        league = League(store, cfg, rng=rng)
        opened.append(league)
        return league

    yield make
    for league in opened:
        league.close()
