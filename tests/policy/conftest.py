"""Fixtures shared by the policy tests."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """One torch thread: the same float results (and speed) whatever the machine's core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
