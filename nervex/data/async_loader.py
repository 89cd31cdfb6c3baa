"""``AsyncDataLoader``: prefetch learner batches in a background thread so the learner never waits on sampling."""

from __future__ import annotations

import queue
import threading
import warnings
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import torch

from .replay_core import BaseBuffer

Source = Union[BaseBuffer, Iterable[Any], Callable[[], Any]]


class _End:
    """Put in the queue after the last batch."""


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class AsyncDataLoader:
    """Iterate over batches that a background thread draws ahead of time.

    Sources:
        * a replay buffer: the thread calls ``buffer.sample(batch_size, learner_iter_fn())`` forever (waiting while
          the buffer cannot give a batch);
        * an iterable (a ``DataLoader``, a list, a generator): its batches, then ``StopIteration``;
        * a callable returning a batch, or ``None`` when none is ready yet.

    Every batch the source gives is delivered exactly once, in order. ``close()`` (or leaving the ``with`` block)
    stops the thread; a batch it was preparing is dropped. Exceptions raised by the source are re-raised by
    ``next()``.

    A thread (not a process) is used: sampling is NumPy and lz4 work that releases the GIL for its heavy parts, and
    the batches need no copying between processes.

    Args:
        source: Where batches come from (see above).
        batch_size: Batch size when ``source`` is a buffer.
        queue_size: Number of batches prepared ahead.
        pin_memory: Pin the tensors (only when CUDA is available; otherwise they stay in ordinary CPU memory).
        learner_iter_fn: Returns the learner's iteration, passed to ``buffer.sample`` (for ``max_staleness``).
        max_batches: Stop after this many batches (None: until the source ends or ``close()``).
        poll_interval: Seconds between checks for ``close()`` while waiting.

    Examples:
        >>> with AsyncDataLoader(buffer, batch_size=64, learner_iter_fn=lambda: learner.last_iter) as loader:
        ...     for batch in loader:
        ...         info = learner.train(batch)
        ...         buffer.update(info['priority'], unique_id=batch['unique_id'])
    """

    def __init__(
        self,
        source: Source,
        batch_size: Optional[int] = None,
        queue_size: int = 4,
        pin_memory: bool = False,
        learner_iter_fn: Optional[Callable[[], int]] = None,
        max_batches: Optional[int] = None,
        poll_interval: float = 0.05,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        produce = _producer(source, batch_size, learner_iter_fn, poll_interval)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._poll = poll_interval
        self._finished = False
        self.delivered = 0
        pin = bool(pin_memory) and torch.cuda.is_available()
        self._thread = threading.Thread(
            target=_run,
            args=(produce, self._queue, self._stop, max_batches, pin, poll_interval),
            name="nervex-async-data-loader",
            daemon=True,
        )
        self._thread.start()
        # the thread holds no reference to self, so a loader that is dropped without close() still stops its thread
        self._finalizer = weakref.finalize(self, self._stop.set)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=self._poll)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._finished = True
                    raise StopIteration from None
        if isinstance(item, _End):
            self._finished = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._finished = True
            raise item.error
        self.delivered += 1
        return item

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for it (at most ``timeout`` seconds). Safe to call twice."""
        self._stop.set()
        self._finished = True
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout)
        if self._thread.is_alive():
            warnings.warn(
                f"AsyncDataLoader thread still running after {timeout}s: its source is blocking", stacklevel=2
            )

    @property
    def alive(self) -> bool:
        """Whether the background thread is running."""
        return self._thread.is_alive()

    def __enter__(self) -> AsyncDataLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _producer(
    source: Source, batch_size: Optional[int], learner_iter_fn: Optional[Callable[[], int]], poll: float
) -> Callable[[], Any]:
    """A function returning the next batch, ``None`` when none is ready yet, or ``_End`` when the source is over."""
    if isinstance(source, BaseBuffer):
        if batch_size is None or batch_size < 1:
            raise ValueError(f"AsyncDataLoader over a replay buffer needs batch_size >= 1, got {batch_size}")
        iter_fn = learner_iter_fn or (lambda: 0)
        return lambda: source.sample(batch_size, iter_fn(), poll)
    if hasattr(source, "__iter__"):
        iterator = iter(source)
        return lambda: next(iterator, _End())
    if callable(source):
        return source
    raise TypeError(f"AsyncDataLoader source must be a replay buffer, an iterable or a callable, got {type(source)}")


def _run(
    produce: Callable[[], Any],
    out: queue.Queue[Any],
    stop: threading.Event,
    max_batches: Optional[int],
    pin: bool,
    poll: float,
) -> None:
    produced = 0
    try:
        while not stop.is_set() and (max_batches is None or produced < max_batches):
            item = produce()
            if item is None:
                stop.wait(poll)  # a callable source with nothing ready; a buffer source already waited
                continue
            if isinstance(item, _End):
                break
            if pin:
                item = _pin(item)
            if not _put(out, item, stop, poll):
                return
            produced += 1
    except BaseException as error:  # delivered to the consumer, which re-raises it
        _put(out, _Failure(error), stop, poll)
        return
    _put(out, _End(), stop, poll)


def _put(out: queue.Queue[Any], item: Any, stop: threading.Event, poll: float) -> bool:
    while not stop.is_set():
        try:
            out.put(item, timeout=poll)
            return True
        except queue.Full:
            continue
    return False


def _pin(item: Any) -> Any:
    if isinstance(item, torch.Tensor):
        return item.pin_memory()
    if isinstance(item, dict):
        return {k: _pin(v) for k, v in item.items()}
    if isinstance(item, (list, tuple)):
        return type(item)(_pin(v) for v in item)
    return item
