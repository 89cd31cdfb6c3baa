"""The parallel learner's checkpoints: written atomically every ``interval_s`` and on request, the last ``keep``
kept, the newest one that loads restored at start; and ``StopSignals``, which turns SIGUSR1 / SIGTERM / SIGINT into
flags the training loop polls.

A learner loop looks like::

    keeper = CheckpointKeeper(os.path.join(run_dir, "ckpt"), keep=3, interval_s=600)
    latest = keeper.load_latest()
    if latest is not None:
        learner.load_state_dict(latest[1])
    with StopSignals() as signals:
        while not signals.stop_requested():
            learner.train(...)
            if signals.checkpoint_requested() or keeper.due():
                keeper.save(learner.state_dict(), learner.last_iter)
        keeper.save(learner.state_dict(), learner.last_iter)

One keeper writes to a directory: ``collect_temp`` (run at construction) takes every temporary checkpoint file in it
for the leftover of a killed writer.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import re
import signal
import threading
import time
from types import FrameType
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from nervex.torch_utils.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

CORRUPT_SUFFIX = ".corrupt"


def _os_error_in(error: BaseException) -> Optional[OSError]:
    """The OSError behind ``error``: itself, or one in its cause / context chain.

    torch.save hides a failed write (ENOSPC) behind a RuntimeError ("unexpected pos ...") raised while closing the
    zip writer; the OSError is that RuntimeError's ``__context__``.
    """
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


class CheckpointKeeper:
    """Writes ``<directory>/<prefix><train_iter>.pt`` atomically, keeps the newest ``keep``, loads the newest valid.

    Args:
        directory: Where the checkpoints go; created if missing.
        keep: How many of this keeper's checkpoints remain after a save (at least 1). Other files are never touched.
        interval_s: Seconds between time-based saves (see ``due``); ``math.inf`` turns them off.
        first_interval_s: Seconds before the first time-based save (None: ``interval_s``); shorter, a process
            killed early still leaves a checkpoint.
        prefix: File name prefix; names are ``<prefix><train_iter>.pt``, as serial runs write them.
        clock: Monotonic seconds, replaceable in tests.
        logger: Where warnings go (default: the ``nervex`` logger).

    Raises:
        ValueError: ``keep`` below 1, a negative ``interval_s``, or a ``prefix`` that is empty, contains a path
            separator or starts with '.' (the temporary files' mark).
    """

    def __init__(
        self,
        directory: str,
        keep: int = 3,
        interval_s: float = 600.0,
        prefix: str = "iteration_",
        clock: Callable[[], float] = time.monotonic,
        logger: Optional[logging.Logger] = None,
        first_interval_s: Optional[float] = None,
    ) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"CheckpointKeeper keep={keep!r} must be an int >= 1 (how many checkpoints remain)")
        if math.isnan(interval_s) or interval_s < 0:
            raise ValueError(f"CheckpointKeeper interval_s={interval_s!r} must be >= 0 seconds (math.inf: never due)")
        if not prefix or prefix.startswith(".") or os.sep in prefix or (os.altsep and os.altsep in prefix):
            raise ValueError(
                f"CheckpointKeeper prefix={prefix!r} must be a non-empty file name prefix without a path separator "
                "that does not start with '.', e.g. 'iteration_'"
            )
        self.directory = os.path.abspath(directory)
        self.keep = keep
        self.interval_s = float(interval_s)
        self.first_interval_s = (
            self.interval_s if first_interval_s is None else min(float(first_interval_s), interval_s)
        )
        self._saved_once = False
        self.prefix = prefix
        self._clock = clock
        self.logger = logger or logging.getLogger("nervex")
        # names are parsed strictly: no sign, no leading zeros, so one train_iter has exactly one file name
        self._name_re = re.compile(rf"{re.escape(prefix)}(0|[1-9][0-9]*)\.pt")
        self._temp_re = re.compile(rf"\.{re.escape(prefix)}(0|[1-9][0-9]*)\.pt\..+\.tmp")
        os.makedirs(self.directory, exist_ok=True)
        self._last_save = clock()
        removed = self.collect_temp()
        if removed:
            self.logger.warning("removed %d unfinished checkpoint file(s) in '%s'", removed, self.directory)

    def path_of(self, train_iter: int) -> str:
        """The file that ``save(state, train_iter)`` writes."""
        return os.path.join(self.directory, f"{self.prefix}{train_iter}.pt")

    def due(self) -> bool:
        """Whether ``interval_s`` has passed since the last save attempt (``first_interval_s`` since construction)."""
        interval = self.interval_s if self._saved_once else self.first_interval_s
        return self._clock() - self._last_save >= interval

    def save(self, state: Dict[str, Any], train_iter: int) -> str:
        """Write ``state`` atomically as ``<prefix><train_iter>.pt``, then drop the oldest beyond ``keep``.

        Saving a ``train_iter`` again replaces its file atomically. Every attempt, failed ones included, restarts
        the ``due`` interval, so a full disk is retried every ``interval_s`` rather than on every step.

        Args:
            state: What ``save_checkpoint`` accepts (e.g. ``BaseLearner.state_dict()``).
            train_iter: The learner's iteration; it names the file and orders the checkpoints.

        Returns:
            The path written.

        Raises:
            ValueError: ``train_iter`` is not an int >= 0.
            TypeError: ``state`` holds a value a weights-only load refuses; nothing is written.
            OSError: the write failed (ENOSPC, EIO, ...), with the original errno and the path in the message; the
                temporary file is removed, and every existing checkpoint is as it was.
        """
        if isinstance(train_iter, bool) or not isinstance(train_iter, int) or train_iter < 0:
            raise ValueError(f"CheckpointKeeper.save train_iter={train_iter!r} must be an int >= 0")
        path = self.path_of(train_iter)
        self._last_save, self._saved_once = self._clock(), True
        try:
            save_checkpoint(state, path)
        except (OSError, RuntimeError) as e:
            os_error = _os_error_in(e)
            if os_error is None:
                raise
            raise OSError(
                os_error.errno,
                f"could not write checkpoint '{path}': {os_error.strerror or os_error}; "
                f"the checkpoints already in '{self.directory}' are untouched",
            ) from e
        newest = max((n for n, _ in self.list()), default=train_iter)
        if newest > train_iter:
            self.logger.warning(
                "checkpoint '%s' is older than '%s' in the same directory; load_latest will return the newer one",
                path,
                self.path_of(newest),
            )
        self._prune(keep_path=path)
        return path

    def _prune(self, keep_path: str) -> None:
        others = [path for _, path in self.list() if path != keep_path]
        for path in others[: max(0, len(others) + 1 - self.keep)]:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                # the new checkpoint is safe; an old one left behind costs disk space, not correctness
                self.logger.warning("could not remove old checkpoint '%s': %s", path, e)

    def list(self) -> List[Tuple[int, str]]:
        """This keeper's checkpoints as ``(train_iter, path)``, oldest first.

        Only names ``<prefix><train_iter>.pt`` count: temporary files, ``*.corrupt``, ``best.pt`` and the like are
        not this keeper's.
        """
        found = []
        for entry in os.scandir(self.directory):
            match = self._name_re.fullmatch(entry.name)
            if match and entry.is_file():
                found.append((int(match.group(1)), entry.path))
        return sorted(found)

    def load_latest(self, map_location: Any = "cpu") -> Optional[Tuple[str, Dict[str, Any]]]:
        """Load the newest checkpoint that loads.

        A newer one that does not (truncated, corrupted, or holding objects a weights-only load refuses) is logged
        as a warning naming the file and the reason, and renamed to ``<name>.corrupt``: it is kept for inspection but
        no longer counts as a checkpoint, so it is not retried, not returned by ``list`` and not pruned.

        Args:
            map_location: As for ``torch.load``; CPU by default.

        Returns:
            ``(path, state)``, or None when no checkpoint loads (or there is none).
        """
        for _, path in reversed(self.list()):
            try:
                return path, load_checkpoint(path, map_location=map_location)
            except FileNotFoundError:
                continue
            except (CheckpointError, pickle.UnpicklingError) as e:
                self._set_aside(path, e)
        return None

    def _set_aside(self, path: str, error: Exception) -> None:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        try:
            os.replace(path, path + CORRUPT_SUFFIX)
            where = f"moved to '{path + CORRUPT_SUFFIX}'"
        except OSError as e:
            where = f"left in place, could not rename it: {e}"
        self.logger.warning("skipping checkpoint '%s' (%s); trying the previous one: %s", path, where, reason)

    def collect_temp(self) -> int:
        """Remove the temporary files of writes that never finished (a writer killed before its rename).

        Returns:
            How many were removed.
        """
        removed = 0
        for entry in os.scandir(self.directory):
            if self._temp_re.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                try:
                    os.remove(entry.path)
                    removed += 1
                except FileNotFoundError:
                    pass
        return removed


def _default_signals(*names: str) -> Tuple[int, ...]:
    # SIGUSR1 does not exist on Windows
    return tuple(getattr(signal, name) for name in names if hasattr(signal, name))


class StopSignals:
    """Turns signals into flags that a training loop polls: a checkpoint request, and a stop.

    The handlers only count signals; the loop does the work between steps. A stop signal also requests a
    checkpoint (``checkpoint_requested`` turns True once), so "checkpoint and stop" is one path through the loop.
    A second stop signal while a stop is pending gives the signal back to the handler that was there before (for
    SIGTERM: terminate; for SIGINT: KeyboardInterrupt), so a learner stuck in a step can still be stopped.

    Use it as a context manager, or call ``install`` and ``restore``; both must run in the main thread.

    Args:
        checkpoint_signals: Signals that request a checkpoint and let training continue (default SIGUSR1).
        stop_signals: Signals that request a checkpoint and a stop (default SIGTERM, SIGINT).

    Example:
        >>> with StopSignals() as signals:
        ...     while not signals.stop_requested():
        ...         step()
        ...         if signals.checkpoint_requested():
        ...             save()
    """

    def __init__(
        self,
        checkpoint_signals: Iterable[int] = _default_signals("SIGUSR1"),
        stop_signals: Iterable[int] = _default_signals("SIGTERM", "SIGINT"),
    ) -> None:
        self.checkpoint_signals = tuple(checkpoint_signals)
        self.stop_signals = tuple(stop_signals)
        both = set(self.checkpoint_signals) & set(self.stop_signals)
        if both:
            raise ValueError(f"StopSignals: signal(s) {sorted(both)} are both checkpoint and stop signals; pick one")
        # the handler only increments _requested / _stops and the loop only writes _seen, so a signal that arrives
        # while the loop reads the flag is never lost
        self._requested = 0
        self._seen = 0
        self._stops = 0
        self.last_signal: Optional[int] = None
        self._previous: Dict[int, Any] = {}

    def install(self) -> StopSignals:
        """Install the handlers, remembering the previous ones.

        Raises:
            RuntimeError: called outside the main thread (Python delivers signals only there), or twice.
        """
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("StopSignals.install must run in the main thread; Python handles signals only there")
        if self._previous:
            raise RuntimeError("StopSignals.install called twice; call restore() first")
        for signum in self.checkpoint_signals + self.stop_signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        """Put back the handlers that were there before ``install``; a no-op when not installed."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, *exc_info: Any) -> None:
        self.restore()

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if signum in self.stop_signals:
            if self._stops:
                self._escalate(signum)
                return
            self._stops += 1
        self.last_signal = signum
        self._requested += 1

    def _escalate(self, signum: int) -> None:
        previous = self._previous.pop(signum, signal.SIG_DFL)
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, None)
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signum)

    def checkpoint_requested(self) -> bool:
        """Whether a checkpoint was requested (by any of the signals) since the last call; reading clears it."""
        requested = self._requested
        if requested == self._seen:
            return False
        self._seen = requested
        return True

    def stop_requested(self) -> bool:
        """Whether a stop signal arrived; it stays set."""
        return self._stops > 0
