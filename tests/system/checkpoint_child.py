"""Subprocess side of tests/system/test_checkpoints.py (signal handlers and SIGKILL must not touch pytest itself).

Usage:
    python checkpoint_child.py kill DIR MARKER  # save iteration 1, then hang halfway through writing iteration 2
    python checkpoint_child.py signals          # check StopSignals' flags; exit 0 when they behave
    python checkpoint_child.py escalate SIGNAME # a second stop signal goes to the previous handler
"""

import io
import os
import signal
import sys
import time

import torch

from nervex.system.checkpoints import CheckpointKeeper, StopSignals


def kill_midway(directory: str, marker: str) -> None:
    keeper = CheckpointKeeper(directory, keep=3)
    keeper.save({"train_iter": 1, "w": torch.full((4,), 1.0)}, 1)
    real_save = torch.save

    def half_then_hang(state, f, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(state, buffer, *args, **kwargs)
        data = buffer.getvalue()
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
        with open(marker, "w") as m:
            m.write(f.name if isinstance(f.name, str) else "")
        time.sleep(60)  # the parent SIGKILLs us here
        sys.exit(3)

    torch.save = half_then_hang
    keeper.save({"train_iter": 2, "w": torch.zeros(1 << 20)}, 2)
    sys.exit(4)  # not reached


def wait_for(predicate, what: str) -> None:
    # a signal sent to oneself is handled at the next bytecode boundary; poll in case it is a little later
    deadline = time.monotonic() + 5
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def check_signals() -> None:
    before_usr1 = signal.getsignal(signal.SIGUSR1)
    before_term = signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals:
        assert not signals.checkpoint_requested() and not signals.stop_requested()
        requested = []
        os.kill(os.getpid(), signal.SIGUSR1)
        wait_for(lambda: requested.append(signals.checkpoint_requested()) or requested[-1], "SIGUSR1")
        assert signals.last_signal == signal.SIGUSR1
        assert not signals.checkpoint_requested(), "reading the request clears it"
        assert not signals.stop_requested(), "SIGUSR1 must not stop training"

        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(signals.stop_requested, "SIGTERM")
        assert signals.last_signal == signal.SIGTERM
        assert signals.stop_requested(), "the stop request stays set"
        assert signals.checkpoint_requested(), "a stop also requests a checkpoint"
        assert not signals.checkpoint_requested()
        assert signal.getsignal(signal.SIGTERM) == signals._handle
    assert signal.getsignal(signal.SIGUSR1) == before_usr1, "restore puts back the previous SIGUSR1 handler"
    assert signal.getsignal(signal.SIGTERM) == before_term, "restore puts back the previous SIGTERM handler"
    print("signals ok", flush=True)


def escalate(name: str) -> None:
    signum = getattr(signal, name)
    # the previous handler is Python's own: a shell that starts the tests in the background without job control
    # hands its children SIGINT ignored, and Python then installs no KeyboardInterrupt handler
    signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    signals = StopSignals().install()
    os.kill(os.getpid(), signum)
    wait_for(signals.stop_requested, name)
    print("first stop seen", flush=True)
    try:
        os.kill(os.getpid(), signum)
        time.sleep(5)  # SIGTERM: the default action ends the process here
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
        sys.exit(0)
    sys.exit(5)  # the second signal was swallowed


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "kill":
        kill_midway(sys.argv[2], sys.argv[3])
    elif mode == "signals":
        check_signals()
    elif mode == "escalate":
        escalate(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {mode!r}; expected kill, signals or escalate")
