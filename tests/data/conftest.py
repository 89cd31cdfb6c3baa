"""Shared fixtures: every tree / buffer test runs on both tree backends (numba only where installed)."""

import pytest

from nervex.data.tree import numba_available

BACKENDS = ["numpy", pytest.param("numba", marks=pytest.mark.skipif(not numba_available(), reason="numba missing"))]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """The tree backend; also set as the default so buffers built inside the test use it."""
    monkeypatch.setenv("NERVEX_TREE_BACKEND", request.param)
    return request.param
