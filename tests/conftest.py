import multiprocessing as mp

import pytest


@pytest.fixture(autouse=True)
def no_child_process_left():
    """Every test must leave no worker process behind, even when it fails; leftovers are killed, then reported."""
    yield
    leftovers = mp.active_children()
    for process in leftovers:
        process.kill()
        process.join(5)
    assert not leftovers, f"child processes left alive: {leftovers}"
