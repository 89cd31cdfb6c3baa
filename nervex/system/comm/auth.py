"""The run's shared secret and the HMAC signature every control-plane request carries.

A request is signed over a canonical string of five lines: the method (upper case), the path (no query string: a
query string is refused, because URLs end up in logs), the timestamp and nonce headers exactly as sent, and the
SHA-256 hex digest of the body bytes exactly as sent. The server checks the signature, a timestamp window and that the
nonce was not seen before, so a captured request can be neither altered nor replayed.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import re
import secrets
import stat
import threading
import time
from collections import OrderedDict
from typing import Callable, Dict, Mapping, Optional, Tuple

from .errors import ProtocolError

TOKEN_ENV = "NERVEX_RUN_TOKEN"
TOKEN_FILE = "run_token"
TOKEN_BYTES = 32
TIMESTAMP_HEADER = "X-Nervex-Timestamp"
NONCE_HEADER = "X-Nervex-Nonce"
SIGNATURE_HEADER = "X-Nervex-Signature"

_TOKEN_HINT = "python -c 'import secrets; print(secrets.token_hex(32))'"
# Strict forms: float() would also take 'nan', '1e9', ' 1' and '1_000'.
_TIMESTAMP_RE = re.compile(r"\d{1,12}(\.\d{1,9})?")
_NONCE_RE = re.compile(r"[0-9a-f]{32}")
_SIGNATURE_RE = re.compile(r"[0-9a-f]{64}")
# Characters that mean the same before and after percent-decoding, so client and server sign the same path.
_PATH_RE = re.compile(r"/[A-Za-z0-9\-._~!$&'()*+,;=:@/]*")
# A writer that created the file but has not written it yet: how long a racing reader waits for the full token.
_PARTIAL_WAIT_S = 2.0


def load_or_create_token(run_dir: str) -> bytes:
    """The run's secret: ``$NERVEX_RUN_TOKEN`` (hex) if set, else ``run_dir/run_token``, created on first use.

    The file holds 32 random bytes and is created with ``O_CREAT | O_EXCL`` and mode 0600, so processes racing to
    create it all end up with the first creator's token. The token is never printed or logged.

    Args:
        run_dir: The run directory every process of the run can reach (created if missing).

    Returns:
        The token bytes.

    Raises:
        ValueError: the environment variable is not hex of at least 32 bytes, or the file has the wrong length.
        PermissionError: the file is readable or writable by group or others.
    """
    env_value = os.environ.get(TOKEN_ENV)
    if env_value is not None:
        return _token_from_env(env_value)
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, TOKEN_FILE)
    try:
        _create_token_file(path)
    except FileExistsError:
        pass  # another process (or an earlier run) made it: use theirs
    return _read_token_file(path)


def _token_from_env(value: str) -> bytes:
    try:
        token = bytes.fromhex(value.strip())
    except ValueError:
        token = b""
    if len(token) < TOKEN_BYTES:
        raise ValueError(
            f"{TOKEN_ENV} must be a hex string of at least {TOKEN_BYTES} bytes ({2 * TOKEN_BYTES} hex digits), "
            f"e.g. from `{_TOKEN_HINT}`; the value set ({len(value)} characters) is not"
        )
    return token


def _create_token_file(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.write(fd, secrets.token_bytes(TOKEN_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_token_file(path: str) -> bytes:
    deadline = time.monotonic() + _PARTIAL_WAIT_S
    while True:
        token = _read_private_file(path)
        if len(token) == TOKEN_BYTES:
            return token
        if len(token) > TOKEN_BYTES or time.monotonic() >= deadline:
            raise ValueError(
                f"run token file {path} holds {len(token)} bytes, expected {TOKEN_BYTES}; delete it so a new one is "
                f"created (every process of the run must then read the new one), or set {TOKEN_ENV}"
            )
        time.sleep(0.01)  # a racing creator has made the file but not yet written it


def _read_private_file(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        info = os.fstat(fd)
        mode = info.st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"run token file {path} is not a regular file; delete it so a new one is created")
        if mode & 0o077:
            raise PermissionError(
                f"run token file {path} is accessible by group or others (mode {stat.S_IMODE(mode):04o}); "
                f"fix it with `chmod 600 {path}` (and check who may have read it)"
            )
        return os.read(fd, min(info.st_size, 1 << 16))  # the whole file, so an error can say how long it is
    finally:
        os.close(fd)


def sign_request(
    token: bytes,
    method: str,
    path: str,
    body: bytes,
    timestamp: Optional[float] = None,
    nonce: Optional[str] = None,
) -> Dict[str, str]:
    """The signature headers for one request.

    Args:
        token: The run's secret (at least 32 bytes).
        method: HTTP method; signed upper case.
        path: The request path exactly as sent, without a query string.
        body: The body bytes exactly as sent (``b""`` for none).
        timestamp: Unix seconds; now if None. Sent with three decimals.
        nonce: 32 lowercase hex digits; 16 fresh random bytes if None.

    Returns:
        ``{X-Nervex-Timestamp, X-Nervex-Nonce, X-Nervex-Signature}``.

    Raises:
        ValueError: a query string in ``path``, or a path with characters that percent-decoding would change.
    """
    _check_token(token)
    _check_path(path)
    timestamp_text = f"{time.time() if timestamp is None else float(timestamp):.3f}"
    nonce = secrets.token_hex(16) if nonce is None else nonce
    signature = compute_signature(token, method, path, timestamp_text, nonce, body)
    return {TIMESTAMP_HEADER: timestamp_text, NONCE_HEADER: nonce, SIGNATURE_HEADER: signature}


def compute_signature(token: bytes, method: str, path: str, timestamp: str, nonce: str, body: bytes) -> str:
    """Hex HMAC-SHA256 over ``method\\npath\\ntimestamp\\nnonce\\nsha256(body)``."""
    canonical = "\n".join([method.upper(), path, timestamp, nonce, hashlib.sha256(body).hexdigest()])
    return hmac.new(token, canonical.encode("utf-8"), hashlib.sha256).hexdigest()


def _check_token(token: bytes) -> None:
    if not isinstance(token, bytes) or len(token) < TOKEN_BYTES:
        raise ValueError(f"the run token must be bytes of at least {TOKEN_BYTES} bytes (see load_or_create_token)")


def _check_path(path: str) -> None:
    if "?" in path:
        raise ValueError(f"path {path.split('?', 1)[0]!r} has a query string; put parameters in the signed JSON body")
    if not _PATH_RE.fullmatch(path):
        raise ValueError(f"path {path!r} must start with '/' and use only unreserved characters (no '%', no spaces)")


TIMESTAMP_RESOLUTION_S = 0.001
"""Signatures carry milliseconds: a request signed as a verifier starts may be stamped up to this much before it."""


class RequestVerifier:
    """Checks a request's signature, timestamp window and nonce; thread-safe.

    Nonces are remembered for twice the window after they arrive: a request stamped up to ``window_s`` in the future
    stays acceptable that long. Memory is bounded by ``max_nonces``: when the cache is full of unexpired nonces the
    oldest is dropped and its request timestamp becomes a floor; requests stamped at or below the floor are refused
    with a retryable 503 (a fresh signature passes), so a dropped nonce can still never be replayed.

    A second floor, ``not_before``, is the verifier's creation: the nonces a previous server of the same run (a coordinator before its
    restart) accepted are not in this cache, so a request stamped before this server existed is refused the same way
    (503; the client signs again, with a fresh timestamp) and a captured request can never be replayed after a
    restart. A client whose clock is behind the server's by ``d`` retries for about ``d`` after a restart.

    Args:
        token: The run's secret.
        window_s: Accepted distance between the request's timestamp and this host's clock, in seconds.
        max_nonces: Most nonces kept.
        clock: Unix time source (injectable for tests).
        not_before: Requests stamped before this time are refused (503); None: the clock at creation.
    """

    def __init__(
        self,
        token: bytes,
        window_s: float = 60.0,
        max_nonces: int = 100_000,
        clock: Callable[[], float] = time.time,
        not_before: Optional[float] = None,
    ) -> None:
        _check_token(token)
        if window_s <= 0 or max_nonces < 1:
            raise ValueError(f"window_s must be > 0 and max_nonces >= 1, got {window_s} and {max_nonces}")
        self._token = token
        self.window_s = float(window_s)
        self.max_nonces = int(max_nonces)
        self._clock = clock
        self._lock = threading.Lock()
        self._nonces: OrderedDict[str, Tuple[float, float]] = OrderedDict()  # nonce -> (arrival, request timestamp)
        self._floor = -math.inf
        self.not_before = float(clock()) if not_before is None else float(not_before)

    @property
    def cached_nonces(self) -> int:
        """How many nonces are remembered now."""
        with self._lock:
            return len(self._nonces)

    def verify(self, method: str, path: str, query_string: str, headers: Mapping[str, str], body: bytes) -> None:
        """Accept the request or raise.

        Args:
            method: HTTP method as received.
            path: Request path as routed.
            query_string: The raw query string ("" for none).
            headers: Request headers (looked up case-insensitively).
            body: The body bytes as received.

        Raises:
            ProtocolError: 400 for a query string; 401 for a missing or malformed header, a bad signature, a
                timestamp outside the window or a replayed nonce; 503 (retryable) for a timestamp below the floor.
        """
        if query_string:
            raise ProtocolError(
                400,
                "query strings are not accepted (URLs leak into logs); send parameters in the signed JSON body",
                field="query_string",
            )
        timestamp_text, nonce, signature = _signature_headers(headers)
        now = self._clock()
        timestamp = float(timestamp_text)
        if abs(now - timestamp) > self.window_s:
            raise ProtocolError(
                401,
                f"request timestamp is {timestamp - now:+.1f} s from this server's clock, outside ±{self.window_s:g} s:"
                " expired or clock skew (resend with a fresh signature; check both hosts' clocks)",
                field=f"header.{TIMESTAMP_HEADER}",
            )
        expected = compute_signature(self._token, method, path, timestamp_text, nonce, body)
        if not hmac.compare_digest(expected, signature):
            raise ProtocolError(
                401,
                f"bad signature for {method.upper()} {path}: wrong run token, or method, path or body altered",
                field=f"header.{SIGNATURE_HEADER}",
            )
        self._remember(nonce, timestamp, now)

    def _remember(self, nonce: str, timestamp: float, now: float) -> None:
        with self._lock:
            self._evict_expired(now)
            if nonce in self._nonces:
                raise ProtocolError(
                    401, "replayed nonce: this request was already accepted", field=f"header.{NONCE_HEADER}"
                )
            if timestamp <= self._floor or timestamp < self.not_before - TIMESTAMP_RESOLUTION_S:
                raise ProtocolError(
                    503,
                    "request stamped before this server started (or its replay cache's floor): resend with a fresh "
                    "signature",
                    field=f"header.{NONCE_HEADER}",
                )
            if len(self._nonces) >= self.max_nonces:
                _, (_, dropped_timestamp) = self._nonces.popitem(last=False)
                self._floor = max(self._floor, dropped_timestamp)
            self._nonces[nonce] = (now, timestamp)

    def _evict_expired(self, now: float) -> None:
        horizon = now - 2 * self.window_s
        while self._nonces:
            arrival, _ = next(iter(self._nonces.values()))
            if arrival >= horizon:
                break
            self._nonces.popitem(last=False)


def _signature_headers(headers: Mapping[str, str]) -> Tuple[str, str, str]:
    lowered = {key.lower(): value for key, value in headers.items()}
    values = []
    for name, pattern in (
        (TIMESTAMP_HEADER, _TIMESTAMP_RE),
        (NONCE_HEADER, _NONCE_RE),
        (SIGNATURE_HEADER, _SIGNATURE_RE),
    ):
        value = lowered.get(name.lower())
        if value is None:
            raise ProtocolError(401, f"missing header {name}: every request must be signed", field=f"header.{name}")
        if not pattern.fullmatch(value):
            raise ProtocolError(401, f"malformed header {name}", field=f"header.{name}")
        values.append(value)
    return values[0], values[1], values[2]
