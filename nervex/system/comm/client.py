"""The client of the signed JSON server (``nervex.system.comm.server.Server``).

The client signs each attempt afresh and retries transient failures (connection errors, timeouts, 429, 502, 503, 504,
honouring ``Retry-After``) with capped, jittered backoff under a deadline.
"""

from __future__ import annotations

import email.utils
import json
import random
import time
import urllib.parse
from typing import Any, Callable, Optional

import requests

from .auth import sign_request
from .errors import ProtocolError

RETRY_STATUSES = frozenset({429, 502, 503, 504})
STOP_GRACE_S = 1.0
"""How long ``Client`` keeps retrying a call once its ``should_stop`` returns true."""
STOP_POLL_S = 0.05
"""How often ``Client``'s backoff polls ``should_stop``."""


class Client:
    """Signed JSON requests to one server, retried with capped exponential backoff (full jitter) under a deadline.

    Retried: connection errors, timeouts, 429, 502, 503 and 504 (honouring ``Retry-After``). Every other error status
    raises ``ProtocolError`` at once. A call gives up (503) when its deadline passes, after ``max_retries`` retries, or
    as soon as the next wait would reach the deadline. Handlers reached through ``post`` should be idempotent: a
    request whose response was lost is sent again. Use one client per thread (``requests.Session`` is not documented
    as thread-safe).

    Args:
        base_url: ``http://host:port`` of the server.
        token: The run's secret.
        deadline_s: Total time one call may take, retries included.
        max_retries: Most retries after the first try.
        backoff_base_s: First backoff bound; it doubles per retry.
        backoff_cap_s: Largest backoff bound.
        session: A ``requests.Session`` to use (not closed by ``close()``); a private one ignoring proxy settings from
            the environment if None.
        attempt_timeout_s: Connect and read timeout of one try (less when the deadline is nearer).
        should_stop: Polled during the backoff (every ``STOP_POLL_S``): once it returns true, the call's deadline
            becomes ``STOP_GRACE_S`` from then, so a worker asked to stop while its server is unreachable gives up
            within about a second (a transient failure of a last report still gets its quick retries). None: never.
    """

    def __init__(
        self,
        base_url: str,
        token: bytes,
        deadline_s: float = 30.0,
        max_retries: int = 8,
        backoff_base_s: float = 0.05,
        backoff_cap_s: float = 2.0,
        session: Optional[requests.Session] = None,
        attempt_timeout_s: float = 10.0,
        should_stop: Optional[Callable[[], bool]] = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._prefix = urllib.parse.urlsplit(self.base_url).path
        self._token = token
        self.deadline_s = float(deadline_s)
        self.max_retries = int(max_retries)
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_cap_s = float(backoff_cap_s)
        self.attempt_timeout_s = float(attempt_timeout_s)
        self._should_stop = should_stop
        self._owns_session = session is None
        if session is None:
            session = requests.Session()
            session.trust_env = False  # no proxy or .netrc from the environment on the control plane
        self._session = session

    def post(self, path: str, json_body: Any) -> Any:
        """POST ``json_body`` to ``path`` and return the response's JSON.

        Raises:
            ProtocolError: the server's refusal (its status), or 503 when it stays unreachable or busy.
        """
        body = json.dumps(json_body, separators=(",", ":"), allow_nan=False).encode("utf-8")
        return self._call("POST", path, body)

    def get(self, path: str) -> Any:
        """GET ``path`` and return the response's JSON (raises as ``post``)."""
        return self._call("GET", path, b"")

    def close(self) -> None:
        """Close the session if this client made it."""
        if self._owns_session:
            self._session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _call(self, method: str, path: str, body: bytes) -> Any:
        start = time.monotonic()
        deadline = start + self.deadline_s
        tries = 0
        last_error = "deadline passed before the first try"
        retry_after: Optional[float] = None
        while tries <= self.max_retries and time.monotonic() < deadline:
            tries += 1
            try:
                response = self._attempt(method, path, body, deadline)
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as error:
                last_error, retry_after = _short(f"{type(error).__name__}: {error}"), None
            else:
                if response.status_code not in RETRY_STATUSES:
                    return _result(method, self.base_url + path, response)
                refusal = _error_from_response(response)
                last_error, retry_after = str(refusal), refusal.retry_after
            next_deadline = self._wait_before_retry(tries, retry_after, deadline)
            if next_deadline is None:
                break
            deadline = next_deadline
        elapsed = time.monotonic() - start
        stopping = " (stopping)" if self._stopping() else ""
        raise ProtocolError(
            503,
            f"{method} {self.base_url}{path} unreachable after {tries} tries in {elapsed:.1f} s{stopping}: {last_error}",
            retry_after=retry_after,
        )

    def _attempt(self, method: str, path: str, body: bytes, deadline: float) -> requests.Response:
        timeout = max(0.001, min(deadline - time.monotonic(), self.attempt_timeout_s))
        headers = sign_request(self._token, method, self._prefix + path, body)
        if method == "POST":
            headers["Content-Type"] = "application/json"
        return self._session.request(
            method, self.base_url + path, data=body, headers=headers, timeout=timeout, allow_redirects=False
        )

    def _stopping(self) -> bool:
        return self._should_stop is not None and bool(self._should_stop())

    def _stop_deadline(self, deadline: float) -> float:
        """``deadline``, brought to ``STOP_GRACE_S`` from now while ``should_stop`` returns true (never later: polled
        again and again, it stays at the first sighting's)."""
        return min(deadline, time.monotonic() + STOP_GRACE_S) if self._stopping() else deadline

    def _wait_before_retry(self, tries: int, retry_after: Optional[float], deadline: float) -> Optional[float]:
        """Sleep before the next try; returns the call's deadline (shortened once ``should_stop`` returns true), or
        None when no try is left or the wait would reach the deadline."""
        if tries > self.max_retries:
            return None
        bound = min(self.backoff_cap_s, self.backoff_base_s * 2 ** (tries - 1))
        wait = random.uniform(0.0, bound) if retry_after is None else max(0.0, retry_after)
        end = time.monotonic() + wait
        while True:
            deadline = self._stop_deadline(deadline)
            if end >= deadline:
                return None  # sleeping to the deadline would leave no time to try again
            left = end - time.monotonic()
            if left <= 0:
                return deadline
            time.sleep(left if self._should_stop is None else min(left, STOP_POLL_S))


def _result(method: str, url: str, response: requests.Response) -> Any:
    if not 200 <= response.status_code < 300:
        raise _error_from_response(response)
    try:
        return json.loads(response.content.decode("utf-8")) if response.content else None
    except (UnicodeDecodeError, ValueError) as error:
        raise ProtocolError(
            502, f"malformed JSON in the {response.status_code} response to {method} {url}: {error}"
        ) from None


def _error_from_response(response: requests.Response) -> ProtocolError:
    """A ``ProtocolError`` from an error response: the JSON body's error and field, or the first line of text."""
    try:
        payload = json.loads(response.content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        message, field, retry_after = payload["error"], payload.get("field"), payload.get("retry_after")
    else:
        first_line = response.text.strip().splitlines()[0] if response.text.strip() else response.reason
        message, field, retry_after = _short(str(first_line)), None, None
    if not isinstance(retry_after, (int, float)):
        retry_after = _parse_retry_after(response.headers.get("Retry-After"))
    return ProtocolError(response.status_code, message, field if isinstance(field, str) else None, retry_after)


def _parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds from a ``Retry-After`` header: a number of seconds or an HTTP date; None if absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["Client", "RETRY_STATUSES", "STOP_GRACE_S", "STOP_POLL_S"]
