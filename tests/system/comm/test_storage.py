"""The storage path: content-addressed round trips, atomic writes, corrupt files, traversal, a full disk, races."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import List

import numpy as np
import pytest

from nervex.system.comm import codec, storage
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.storage import Storage

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def store(tmp_path: Path) -> Storage:
    return Storage(str(tmp_path / "store"), min_free_bytes=0)


def refused(call, *args, status: int = 400, **kwargs) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        call(*args, **kwargs)
    assert info.value.status == status, str(info.value)
    return info.value


def files_under(root: str) -> List[str]:
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file())


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_put_get_round_trip_names_the_content(store: Storage):
    data = codec.encode_arrays({"reward": np.arange(5, dtype=np.float32)})
    name = store.put(data, "traj")
    assert name == f"traj/{hashlib.sha256(data).hexdigest()}.safetensors"
    assert store.get(name) == data
    assert files_under(store.root) == [name] and store.list("traj") == [name] and store.list("policy") == []
    np.testing.assert_array_equal(codec.decode_arrays(store.get(name))["reward"], np.arange(5, dtype=np.float32))


def test_put_of_stored_content_writes_nothing(store: Storage):
    name = store.put(b"weights", "policy")
    before = os.stat(os.path.join(store.root, name))
    assert store.put(b"weights", "policy") == name
    after = os.stat(os.path.join(store.root, name))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert files_under(store.root) == [name]


def test_put_rewrites_a_damaged_copy_of_the_same_content(store: Storage):
    name = store.put(b"weights" * 100, "policy")
    Path(store.root, name).write_bytes(b"weights" * 50)
    assert store.put(b"weights" * 100, "policy") == name
    assert store.get(name) == b"weights" * 100


def test_delete_is_idempotent_and_list_skips_temporary_files(store: Storage):
    names = [store.put(bytes([i]) * 10, "traj") for i in range(3)]
    Path(store.root, "traj", f"{storage.TEMP_PREFIX}123-abc").write_bytes(b"partial")
    assert store.list("traj") == sorted(names)
    store.delete(names[0])
    store.delete(names[0])
    assert store.list("traj") == sorted(names[1:])
    assert refused(store.get, names[0], status=404).field == "name"


def test_failed_rename_leaves_neither_final_nor_temporary_file(store: Storage, monkeypatch: pytest.MonkeyPatch):
    def fail(src: str, dst: str) -> None:
        raise OSError(errno.EIO, "simulated I/O error")

    monkeypatch.setattr(storage.os, "replace", fail)
    with pytest.raises(OSError):
        store.put(b"payload", "traj")
    assert store.list("traj") == [] and files_under(store.root) == []


def test_writer_killed_before_rename_leaves_only_a_temporary_file_for_collect_temp(store: Storage):
    result = run_python(
        f"""
        import os, signal
        from nervex.system.comm import storage
        storage.os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)
        storage.Storage({store.root!r}, min_free_bytes=0).put(b"x" * 100_000, "traj")
        """
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    leftovers = files_under(store.root)
    assert len(leftovers) == 1 and Path(leftovers[0]).name.startswith(storage.TEMP_PREFIX)
    assert store.list("traj") == []
    assert store.collect_temp(max_age_s=3600) == 0  # a young temporary file may belong to a live writer
    old = time.time() - 7200
    os.utime(os.path.join(store.root, leftovers[0]), (old, old))
    assert store.collect_temp(max_age_s=3600) == 1
    assert files_under(store.root) == []
    assert store.get(store.put(b"x" * 100_000, "traj")) == b"x" * 100_000


def test_collect_temp_never_touches_payloads(store: Storage):
    name = store.put(b"payload", "traj")
    old = time.time() - 7200
    os.utime(os.path.join(store.root, name), (old, old))
    assert store.collect_temp(max_age_s=0) == 0 and store.get(name) == b"payload"


@pytest.mark.parametrize(
    "damage",
    [lambda data: data[: len(data) // 2], lambda data: data[:10] + bytes([data[10] ^ 1]) + data[11:], lambda _: b""],
    ids=["truncated", "one bit flipped", "emptied"],
)
def test_corrupt_file_is_refused_and_deleted(store: Storage, damage):
    data = codec.encode_arrays({"obs": np.ones((4, 4), np.float32)})
    name = store.put(data, "traj")
    path = Path(store.root, name)
    path.write_bytes(damage(data))
    error = refused(store.get, name)
    assert "corrupt or truncated" in error.message and error.field == "name"
    assert not path.exists()
    refused(store.get, name, status=404)


DIGEST = "0a" * 32
TRAVERSAL_NAMES = [
    "../etc/passwd",
    "/etc/passwd",
    f"/traj/{DIGEST}.safetensors",
    f"traj/../../{DIGEST}.safetensors",
    f"../traj/{DIGEST}.safetensors",
    f"traj/{DIGEST}.safetensors/..",
    f"traj//{DIGEST}.safetensors",
    f"traj\\..\\{DIGEST}.safetensors",
    f"traj/{DIGEST.upper()}.safetensors",
    f"traj/{DIGEST[:63]}.safetensors",
    f"traj/{DIGEST}.safetensors\n",
    f"traj/{DIGEST}.pkl",
    f"Traj/{DIGEST}.safetensors",
    f"../{DIGEST}.safetensors",
    f"traj/sub/{DIGEST}.safetensors",
    f"traj/{storage.TEMP_PREFIX}1-ab",
    "",
    None,
]


@pytest.mark.parametrize("name", TRAVERSAL_NAMES)
def test_names_outside_the_layout_are_refused(store: Storage, tmp_path: Path, name):
    victim = tmp_path / f"{DIGEST}.safetensors"
    victim.write_bytes(b"not for you")
    assert refused(store.get, name).field == "name"
    assert refused(store.delete, name).field == "name"
    assert victim.read_bytes() == b"not for you"


@pytest.mark.parametrize("kind", ["..", "../traj", "traj/x", "Traj", "", "1traj", "a" * 33, None])
def test_bad_kinds_are_refused(store: Storage, kind):
    assert refused(store.put, b"data", kind).field == "kind"
    assert files_under(store.root) == []


def test_get_refuses_a_file_over_the_cap_without_reading_it(store: Storage):
    name = store.put(b"x" * 1000, "traj")
    assert refused(store.get, name, max_bytes=999, status=413).field == "name"
    assert store.get(name, max_bytes=1000) == b"x" * 1000


def test_full_disk_is_507_with_nothing_written(store: Storage, monkeypatch: pytest.MonkeyPatch):
    """``shutil.disk_usage`` is patched: a real disk cannot be filled safely in a test."""
    store.min_free_bytes = 1 << 20
    usage = shutil.disk_usage(store.root)
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda _: usage._replace(free=(1 << 20) + 99))
    fits = store.put(b"x" * 99, "traj")
    error = refused(store.put, b"y" * 100, "policy", status=507)
    assert "min_free_bytes" in error.message
    assert not Path(store.root, "policy").exists() and files_under(store.root) == [fits]


def test_disk_filling_up_midway_is_507_with_the_temporary_file_removed(store: Storage, monkeypatch: pytest.MonkeyPatch):
    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage.os, "fsync", no_space)
    refused(store.put, b"payload", "traj", status=507)
    assert files_under(store.root) == []


def test_concurrent_puts_of_the_same_content_from_threads(store: Storage):
    data = os.urandom(1 << 20)
    barrier = threading.Barrier(8)
    names: List[str] = []

    def put() -> None:
        barrier.wait(timeout=30)
        names.append(store.put(data, "traj"))

    threads = [threading.Thread(target=put) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(names) == 8 and len(set(names)) == 1
    assert files_under(store.root) == names[:1] and store.get(names[0]) == data


def test_concurrent_puts_of_the_same_content_from_processes(store: Storage, tmp_path: Path):
    go = tmp_path / "go"
    code = f"""
        import json, os, time
        from nervex.system.comm.storage import Storage
        store = Storage({store.root!r}, min_free_bytes=0)
        payloads = [bytes([i]) * (1 << 20) for i in range(5)]
        deadline = time.monotonic() + 30
        while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:
            time.sleep(0.001)
        print(json.dumps([store.put(data, "traj") for data in payloads]))
        """
    writers = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        time.sleep(1.0)  # both import before the start signal, so their puts overlap
        go.touch()
        outputs = [writer.communicate(timeout=60)[0] for writer in writers]
    finally:
        for writer in writers:
            writer.kill()
            writer.wait(timeout=10)
    assert [writer.returncode for writer in writers] == [0, 0]
    first, second = (json.loads(output) for output in outputs)
    assert first == second and len(set(first)) == 5
    assert files_under(store.root) == sorted(first)
    assert all(store.get(name) == bytes([i]) * (1 << 20) for i, name in enumerate(first))
