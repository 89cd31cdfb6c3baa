"""AsyncDataLoader: every batch delivered once, in order; clean stop; errors surface; priorities follow delivery."""

import threading
import time

import numpy as np
import pytest

from nervex.data import AsyncDataLoader, PrioritizedBuffer


def test_iterable_source_delivers_every_batch_once_in_order():
    batches = [{"i": np.array([k])} for k in range(50)]
    with AsyncDataLoader(batches, queue_size=3) as loader:
        got = [b["i"].item() for b in loader]
        assert got == list(range(50))
        with pytest.raises(StopIteration):
            next(loader)
    assert not loader.alive


def test_close_stops_a_producer_blocked_on_a_full_queue():
    def endless():
        k = 0
        while True:
            yield k
            k += 1

    loader = AsyncDataLoader(endless(), queue_size=2, poll_interval=0.01)
    assert [next(loader) for _ in range(5)] == [0, 1, 2, 3, 4]
    time.sleep(0.05)  # let the producer fill the queue and block
    start = time.monotonic()
    loader.close()
    assert not loader.alive and time.monotonic() - start < 2.0
    with pytest.raises(StopIteration):
        next(loader)


def test_source_errors_are_raised_by_next():
    def failing():
        yield 1
        raise KeyError("broken source")

    loader = AsyncDataLoader(failing())
    assert next(loader) == 1
    with pytest.raises(KeyError, match="broken source"):
        next(loader)
    loader.close()


def test_callable_source_and_max_batches():
    counter = iter(range(1000))
    loader = AsyncDataLoader(
        lambda: next(counter) if np.random.rand() < 0.5 else None, max_batches=7, poll_interval=0.001
    )
    assert len(list(loader)) == 7
    loader.close()


def test_buffer_source_with_a_concurrent_writer_and_priority_updates(backend):
    buffer = PrioritizedBuffer(maxlen=1000, alpha=1.0, seed=0)
    buffer.extend([{"x": np.float32(i)} for i in range(16)])
    stop = threading.Event()

    def writer():
        i = 16
        while not stop.is_set() and i < 5000:
            buffer.append({"x": np.float32(i)})
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    loader = AsyncDataLoader(buffer, batch_size=8, queue_size=4, max_batches=40)
    try:
        delivered = []
        for batch in loader:
            np.testing.assert_array_equal(batch["x"].numpy(), batch["unique_id"].numpy().astype(np.float32))
            uid = batch["unique_id"].numpy()
            buffer.update(uid % 5 + 0.5, unique_id=uid)  # this batch's samples, whatever the thread drew since
            priority = buffer.priority(uid)  # NaN for a sample the writer has overwritten meanwhile
            alive = ~np.isnan(priority)
            np.testing.assert_array_equal(priority[alive], (uid % 5 + 0.5)[alive])
            delivered.append(batch["unique_id"])
        assert len(delivered) == 40 == loader.delivered
    finally:
        loader.close()
        stop.set()
        thread.join()
    assert not loader.alive


def test_buffer_source_needs_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        AsyncDataLoader(PrioritizedBuffer(maxlen=4))
