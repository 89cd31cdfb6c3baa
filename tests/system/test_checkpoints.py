"""CheckpointKeeper on real files: keep K, a truncated or half-written newest file, a full disk; StopSignals in a
subprocess so its handlers never touch pytest."""

import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import nervex.torch_utils.checkpoint as checkpoint_module
from nervex.system.checkpoints import CheckpointKeeper, StopSignals
from nervex.torch_utils import load_checkpoint, save_checkpoint

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoint_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOGGER = "test_checkpoints"


def state_of(train_iter, size=4):
    return {"version": 2, "policy": {"w": torch.full((size,), float(train_iter))}, "train_iter": train_iter}


def names(directory):
    return sorted(os.listdir(directory))


def run_child(*args, timeout=30):
    return subprocess.run(
        [sys.executable, CHILD, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False
    )


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_keeps_the_newest_k_and_leaves_other_files_alone(tmp_path):
    save_checkpoint({"w": torch.ones(2)}, tmp_path / "best.pt")
    keeper = CheckpointKeeper(str(tmp_path), keep=3)
    saved = {i: state_of(i) for i in range(1, 7)}
    for i, state in saved.items():
        assert keeper.save(state, i) == str(tmp_path / f"iteration_{i}.pt")
    assert names(tmp_path) == ["best.pt", "iteration_4.pt", "iteration_5.pt", "iteration_6.pt"]
    assert torch.equal(load_checkpoint(tmp_path / "best.pt")["w"], torch.ones(2))
    path, state = keeper.load_latest()
    assert path == str(tmp_path / "iteration_6.pt")
    assert state["train_iter"] == 6 and torch.equal(state["policy"]["w"], torch.full((4,), 6.0))


def test_list_parses_names_strictly(tmp_path):
    for name in ["iteration_07.pt", "iteration_-1.pt", "iteration_3.pt.corrupt", "iteration_x.pt", "final.pt"]:
        (tmp_path / name).write_bytes(b"not mine")
    (tmp_path / "iteration_9.pt").mkdir()
    (tmp_path / ".iteration_4.pt.abc123.tmp.keep").write_bytes(b"not a temp file of this keeper")
    keeper = CheckpointKeeper(str(tmp_path), keep=1)
    assert keeper.list() == []
    keeper.save(state_of(2), 2)
    keeper.save(state_of(10), 10)
    assert keeper.list() == [(10, str(tmp_path / "iteration_10.pt"))], "sorted by number, 10 > 2"
    assert "iteration_07.pt" in names(tmp_path) and ".iteration_4.pt.abc123.tmp.keep" in names(tmp_path)


def test_saving_the_same_iteration_twice_replaces_it(tmp_path):
    keeper = CheckpointKeeper(str(tmp_path), keep=2)
    keeper.save(state_of(1), 5)
    keeper.save(state_of(2), 5)
    assert names(tmp_path) == ["iteration_5.pt"]
    assert torch.equal(keeper.load_latest()[1]["policy"]["w"], torch.full((4,), 2.0))


def test_an_older_iteration_is_kept_and_warned_about(tmp_path, caplog):
    keeper = CheckpointKeeper(str(tmp_path), keep=3, logger=logging.getLogger(LOGGER))
    for i in (8, 9, 10):
        keeper.save(state_of(i), i)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        keeper.save(state_of(5), 5)
    assert [n for n, _ in keeper.list()] == [5, 9, 10], "the file just written survives its own pruning"
    assert "iteration_5.pt" in caplog.text and "iteration_10.pt" in caplog.text


def test_due_after_the_interval_and_reset_by_a_save(tmp_path):
    clock = FakeClock()
    keeper = CheckpointKeeper(str(tmp_path), interval_s=60, clock=clock)
    assert not keeper.due()
    clock.now += 59.9
    assert not keeper.due()
    clock.now += 0.1
    assert keeper.due()
    keeper.save(state_of(1), 1)
    assert not keeper.due()
    clock.now += 60
    assert keeper.due()
    with pytest.raises(TypeError):
        keeper.save({"bad": object()}, 2)
    assert not keeper.due(), "a failed attempt restarts the interval too"
    assert not CheckpointKeeper(str(tmp_path), interval_s=float("inf"), clock=clock).due()


def test_truncated_newest_falls_back_to_the_previous_one(tmp_path, caplog):
    keeper = CheckpointKeeper(str(tmp_path), logger=logging.getLogger(LOGGER))
    keeper.save(state_of(1, size=1000), 1)
    path2 = keeper.save(state_of(2, size=1000), 2)
    size = os.path.getsize(path2)
    os.truncate(path2, size // 2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        path, state = keeper.load_latest()
    assert path == str(tmp_path / "iteration_1.pt")
    assert torch.equal(state["policy"]["w"], torch.full((1000,), 1.0))
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and path2 in warning[0] and "truncated" in warning[0], warning
    assert names(tmp_path) == ["iteration_1.pt", "iteration_2.pt.corrupt"], "set aside, not retried"
    assert os.path.getsize(path2 + ".corrupt") == size // 2
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert keeper.load_latest()[0] == path
    assert not caplog.records


def test_no_checkpoint_that_loads_gives_none(tmp_path):
    keeper = CheckpointKeeper(str(tmp_path))
    assert keeper.load_latest() is None
    (tmp_path / "iteration_3.pt").write_bytes(b"PK\x03\x04 not a zip")
    (tmp_path / "iteration_4.pt").write_bytes(b"")
    assert keeper.load_latest() is None
    assert names(tmp_path) == ["iteration_3.pt.corrupt", "iteration_4.pt.corrupt"]


def test_write_killed_midway_leaves_the_previous_checkpoint(tmp_path):
    directory, marker = tmp_path / "ckpt", tmp_path / "marker"
    child = subprocess.Popen(
        [sys.executable, CHILD, "kill", str(directory), str(marker)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists(), f"the child never reached the write (rc={child.poll()}): {child.stderr.read()[-2000:]}"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    left = names(directory)
    assert "iteration_2.pt" not in left, "no half file under the final name"
    assert "iteration_1.pt" in left
    temps = [n for n in left if n.startswith(".iteration_2.pt.") and n.endswith(".tmp")]
    assert len(temps) == 1 and os.path.getsize(directory / temps[0]) > 0, left

    assert CheckpointKeeper(str(directory)).collect_temp() == 0, "the constructor already collected it"
    assert names(directory) == ["iteration_1.pt"]
    path, state = CheckpointKeeper(str(directory)).load_latest()
    assert path == str(directory / "iteration_1.pt") and torch.equal(state["w"], torch.full((4,), 1.0))


def test_collect_temp_removes_only_temp_files(tmp_path):
    keeper = CheckpointKeeper(str(tmp_path))
    for name in [".iteration_5.pt.k2j_x9a1.tmp", ".iteration_6.pt.zzzzzzzz.tmp", ".best.pt.abcdefgh.tmp", "a.tmp"]:
        (tmp_path / name).write_bytes(b"x")
    assert keeper.collect_temp() == 2
    assert names(tmp_path) == [".best.pt.abcdefgh.tmp", "a.tmp"]


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs: a real ENOSPC, from the kernel."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no 'mount' command to create a 1 MiB tmpfs; the monkeypatched ENOSPC tests still run")
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    if out.returncode != 0:
        pytest.skip(f"mounting a 1 MiB tmpfs is not permitted here ({out.stderr.strip()}); needs root")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=10, check=False)


def test_full_disk_keeps_previous_checkpoints(tiny_disk):
    keeper = CheckpointKeeper(str(tiny_disk), keep=3)
    keeper.save(state_of(1, size=25_000), 1)  # about 100 kB each
    keeper.save(state_of(2, size=25_000), 2)
    before = {name: (tiny_disk / name).read_bytes() for name in names(tiny_disk)}
    with pytest.raises(OSError) as raised:
        keeper.save(state_of(3, size=500_000), 3)  # 2 MB on a 1 MiB disk
    assert raised.value.errno == errno.ENOSPC
    assert str(tiny_disk / "iteration_3.pt") in str(raised.value)
    assert {name: (tiny_disk / name).read_bytes() for name in names(tiny_disk)} == before, "no temp file, no change"
    path, state = keeper.load_latest()
    assert path == str(tiny_disk / "iteration_2.pt")
    assert torch.equal(state["policy"]["w"], torch.full((25_000,), 2.0))
    keeper.save(state_of(3, size=25_000), 3)  # the failed attempt left no space taken
    assert [n for n, _ in keeper.list()] == [1, 2, 3]


def test_enospc_at_fsync_keeps_previous_checkpoints(tmp_path, monkeypatch):
    keeper = CheckpointKeeper(str(tmp_path), keep=3)
    keeper.save(state_of(1), 1)

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as raised:
        keeper.save(state_of(2), 2)
    monkeypatch.undo()
    assert raised.value.errno == errno.ENOSPC and "iteration_2.pt" in str(raised.value)
    assert names(tmp_path) == ["iteration_1.pt"]
    assert keeper.load_latest()[1]["train_iter"] == 1


def test_enospc_hidden_by_torch_save_is_reported_as_oserror(tmp_path, monkeypatch):
    # torch.save turns a failed write into "RuntimeError: unexpected pos ..."; the keeper finds the OSError behind it
    keeper = CheckpointKeeper(str(tmp_path), keep=3)
    keeper.save(state_of(1), 1)
    real_fdopen = os.fdopen

    class FullFile:
        def __init__(self, f):
            self._f, self.written = f, 0

        def write(self, data):
            self.written += len(data)
            if self.written > 4096:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self._f.write(data)

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

    monkeypatch.setattr(checkpoint_module.os, "fdopen", lambda *a, **k: FullFile(real_fdopen(*a, **k)))
    with pytest.raises(OSError) as raised:
        keeper.save(state_of(2, size=100_000), 2)
    monkeypatch.undo()
    assert raised.value.errno == errno.ENOSPC and "iteration_2.pt" in str(raised.value)
    chain, error = [], raised.value
    while error is not None and len(chain) < 10:
        chain.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(e, RuntimeError) for e in chain), "torch's own error stays in the chain"
    assert names(tmp_path) == ["iteration_1.pt"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(keep=0), "keep=0"),
        (dict(interval_s=-1), "interval_s=-1"),
        (dict(prefix=".iteration_"), "prefix='.iteration_'"),
        (dict(prefix="ckpt/iteration_"), "prefix='ckpt/iteration_'"),
    ],
)
def test_bad_arguments_are_named(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        CheckpointKeeper(str(tmp_path), **kwargs)


@pytest.mark.parametrize("train_iter", [-1, True, 1.0])
def test_bad_train_iter_writes_nothing(tmp_path, train_iter):
    keeper = CheckpointKeeper(str(tmp_path))
    with pytest.raises(ValueError, match="train_iter="):
        keeper.save(state_of(1), train_iter)
    assert names(tmp_path) == []


def test_signals_set_flags_in_a_subprocess():
    out = run_child("signals")
    assert out.returncode == 0 and "signals ok" in out.stdout, out.stderr[-3000:]


def test_second_sigterm_terminates():
    out = run_child("escalate", "SIGTERM")
    assert out.returncode == -signal.SIGTERM and "first stop seen" in out.stdout, (out.returncode, out.stderr[-3000:])


def test_second_sigint_raises_keyboard_interrupt():
    out = run_child("escalate", "SIGINT")
    assert out.returncode == 0 and "KeyboardInterrupt" in out.stdout, (out.returncode, out.stderr[-3000:])


def test_signals_install_only_in_the_main_thread():
    errors = []
    thread = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, StopSignals().install)))
    thread.start()
    thread.join(timeout=10)
    assert "main thread" in str(errors[0].value)


def test_a_signal_cannot_both_checkpoint_and_stop():
    with pytest.raises(ValueError, match="both"):
        StopSignals(checkpoint_signals=[signal.SIGTERM], stop_signals=[signal.SIGTERM])
