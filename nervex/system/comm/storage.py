"""The storage path of the parallel mode: content-addressed files that every process can reach.

A payload (the bytes ``codec.encode_arrays`` or ``codec.encode_state_dict`` made) is stored as
``<root>/<kind>/<sha256>.safetensors`` and named by its relative path, ``'<kind>/<sha256>.safetensors'``; that name is
what control messages carry. Writes are atomic: the bytes go to a temporary file (``.tmp-*``) in the same directory,
are flushed and fsync-ed, and are renamed onto the final name, then the directory is fsync-ed; so a final name only
ever holds complete content, and a writer killed midway leaves at most a temporary file for ``collect_temp``.

Reads check the name (nothing outside ``<root>/<kind>/``) and the content (its SHA-256 must be the name). A file that
fails that check is deleted, so that the next ``put`` of the content writes it afresh and no reader trusts it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import shutil
import time
from typing import List, Optional

from .errors import ProtocolError

KIND_PATTERN = r"[a-z][a-z0-9_]{0,31}"
"""A kind of payload: a directory under the root (``'traj'``, ``'policy'``)."""
SUFFIX = ".safetensors"
TEMP_PREFIX = ".tmp-"

_KIND = re.compile(KIND_PATTERN)
_NAME = re.compile(rf"({KIND_PATTERN})/([0-9a-f]{{64}}){re.escape(SUFFIX)}")
_FILE = re.compile(rf"[0-9a-f]{{64}}{re.escape(SUFFIX)}")
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


class Storage:
    """Content-addressed payload files under one root directory.

    Args:
        root: The directory (created if missing); on a cluster, one on a file system every node mounts.
        min_free_bytes: ``put`` refuses a write that would leave less free space than this on the root's file system.
            The check is a guard, not a reservation: concurrent writers may each pass it.

    Example:
        >>> storage = Storage("/scratch/run1/data")
        >>> name = storage.put(codec.encode_arrays(trajectory), "traj")   # 'traj/3f0c...e1.safetensors'
        >>> codec.decode_arrays(storage.get(name), schema)
    """

    def __init__(self, root: str, min_free_bytes: int = 256 << 20):
        self.root = os.path.abspath(root)
        self.min_free_bytes = int(min_free_bytes)
        os.makedirs(self.root, exist_ok=True)

    def put(self, data: bytes, kind: str) -> str:
        """Store ``data`` atomically and return its name; storing content that is already there writes nothing.

        Args:
            data: The payload.
            kind: Its kind (a lowercase identifier, the directory it goes to).

        Returns:
            ``'<kind>/<sha256 of data>.safetensors'``.

        Raises:
            ProtocolError: 400 for a kind that does not match ``KIND_PATTERN``; 507 when the write would leave less
                than ``min_free_bytes`` free (nothing is written) or the file system runs out of space midway (the
                temporary file is removed).
        """
        _check_kind(kind)
        digest = hashlib.sha256(data).hexdigest()
        name = f"{kind}/{digest}{SUFFIX}"
        path = self._path(name)
        if _holds(path, digest):
            return name
        free = shutil.disk_usage(self.root).free
        if free - len(data) < self.min_free_bytes:
            raise ProtocolError(
                507,
                f"storing {len(data)} bytes would leave {free - len(data)} bytes free under {self.root}, "
                f"below min_free_bytes = {self.min_free_bytes}",
                field="data",
            )
        try:
            self._make_kind_dir(kind)
            self._write_atomically(path, data)
        except OSError as e:
            if e.errno in _NO_SPACE:
                raise ProtocolError(507, f"the file system under {self.root} is full: {e}", field="data") from None
            raise
        return name

    def get(self, name: str, max_bytes: int = 256 << 20) -> bytes:
        """The payload stored under ``name``, after checking it is the content the name promises.

        Args:
            name: What ``put`` returned.
            max_bytes: The largest payload accepted (checked before reading).

        Raises:
            ProtocolError: 400 for a name that is not ``'<kind>/<64 hex>.safetensors'`` (no other path is ever
                opened) or for a file whose SHA-256 is not its name (corrupt or truncated: the file is deleted);
                404 for a name with no file; 413 for a file over ``max_bytes``.
        """
        digest = _check_name(name)
        path = self._path(name)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > max_bytes:
                    raise ProtocolError(413, f"{name} holds {size} bytes, over the cap of {max_bytes}", field="name")
                data = f.read()
                identity = _identity(os.fstat(f.fileno()))
        except FileNotFoundError:
            raise ProtocolError(404, f"no payload {name} in {self.root}", field="name") from None
        if hashlib.sha256(data).hexdigest() != digest:
            _remove_if_same(path, identity)
            raise ProtocolError(
                400,
                f"{name} is corrupt or truncated ({len(data)} bytes whose SHA-256 is not the name); deleted",
                "name",
            )
        return data

    def delete(self, name: str) -> None:
        """Remove the payload ``name``; a name with no file is not an error.

        Raises:
            ProtocolError: 400 for a name that is not ``'<kind>/<64 hex>.safetensors'``.
        """
        _check_name(name)
        path = self._own_path(name)
        if path is None:
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def list(self, kind: str) -> List[str]:
        """The names of the payloads of ``kind``, sorted (temporary files are not payloads).

        Raises:
            ProtocolError: 400 for a kind that does not match ``KIND_PATTERN``.
        """
        _check_kind(kind)
        directory = os.path.join(self.root, kind)
        if os.path.islink(directory):  # not ours: a sweep must never delete through it
            return []
        try:
            files = os.listdir(directory)
        except FileNotFoundError:
            return []
        return sorted(f"{kind}/{file}" for file in files if _FILE.fullmatch(file))

    def age(self, name: str) -> Optional[float]:
        """Seconds since ``name`` was written, or None when it has no file."""
        _check_name(name)
        path = self._own_path(name)
        if path is None:
            return None
        try:
            return max(0.0, time.time() - os.stat(path).st_mtime)
        except FileNotFoundError:
            return None

    def touch(self, name: str) -> None:
        """Make ``name`` young again (its ``age`` restarts from 0); a name with no file is not an error."""
        _check_name(name)
        path = self._own_path(name)
        if path is None:
            return
        try:
            os.utime(path)
        except FileNotFoundError:
            pass

    def collect_temp(self, max_age_s: float) -> int:
        """Remove temporary files older than ``max_age_s`` (left by writers killed midway); returns how many.

        ``max_age_s`` must exceed the longest write, or a live writer loses its temporary file (its ``put`` then
        fails; no final name is harmed).
        """
        cutoff = time.time() - max_age_s
        removed = 0
        for kind in os.listdir(self.root):
            directory = os.path.join(self.root, kind)
            if not _KIND.fullmatch(kind) or os.path.islink(directory) or not os.path.isdir(directory):
                continue
            temps = [os.path.join(directory, file) for file in os.listdir(directory) if file.startswith(TEMP_PREFIX)]
            removed += sum(_remove_if_older(temp, cutoff) for temp in temps)
        return removed

    def _path(self, name: str) -> str:
        """The file of ``name``; a 400 when its kind directory is a symbolic link (nothing is read or written through
        one: it could lead out of the root)."""
        path = self._own_path(name)
        if path is None:
            kind = name.split("/")[0]
            raise ProtocolError(
                400,
                f"the storage directory {os.path.join(self.root, kind)} is a symbolic link; nervex reads and writes "
                f"only real directories under {self.root} (make it one, or point system.storage.root elsewhere)",
                field="name",
            )
        return path

    def _own_path(self, name: str) -> Optional[str]:
        """The file of ``name``, or None when its kind directory is a symbolic link (then it holds no payload)."""
        kind, file = name.split("/")
        if os.path.islink(os.path.join(self.root, kind)):
            return None
        return os.path.join(self.root, kind, file)

    def _make_kind_dir(self, kind: str) -> None:
        directory = os.path.join(self.root, kind)
        if not os.path.isdir(directory):
            os.makedirs(directory, exist_ok=True)
            _fsync_dir(self.root)

    def _write_atomically(self, path: str, data: bytes) -> None:
        """Write to a temporary file next to ``path``, fsync it, rename it onto ``path``, fsync the directory."""
        directory = os.path.dirname(path)
        temp = os.path.join(directory, f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, path)
        except BaseException:
            _unlink_quietly(temp)
            raise
        _fsync_dir(directory)


def _check_kind(kind: str) -> None:
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        raise ProtocolError(400, f"payload kind {kind!r} does not match {KIND_PATTERN}", field="kind")


def _check_name(name: str) -> str:
    """The SHA-256 hex digest in a valid name."""
    match = _NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None:
        raise ProtocolError(400, f"payload name {name!r:.200} is not '<kind>/<64 lowercase hex>{SUFFIX}'", field="name")
    return match.group(2)


def _holds(path: str, digest: str) -> bool:
    """Whether ``path`` exists with content of SHA-256 ``digest`` (a damaged copy is overwritten by the put)."""
    try:
        with open(path, "rb") as f:
            sha = hashlib.sha256()
            for block in iter(lambda: f.read(1 << 20), b""):
                sha.update(block)
        return sha.hexdigest() == digest
    except FileNotFoundError:
        return False


def _identity(stat: os.stat_result) -> tuple:
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _remove_if_same(path: str, identity: tuple) -> None:
    """Delete ``path`` unless another writer has replaced it since it was read (its new content may be sound)."""
    try:
        if _identity(os.stat(path)) == identity:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _remove_if_older(path: str, cutoff: float) -> bool:
    try:
        if os.stat(path).st_mtime >= cutoff:
            return False
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_dir(directory: str) -> None:
    """Make a rename or a new entry in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        # Some file systems (several network ones) refuse fsync on a directory; the rename is still atomic there.
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)
