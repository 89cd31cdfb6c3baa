"""The signed JSON server every parallel role builds on: Flask routes served by waitress.

Every route but ``GET /healthz`` needs a valid request signature (``auth.py``) before its handler runs; bodies are
capped per route; errors are JSON ``{"error": ..., "field": ...}`` with the status of the ``ProtocolError`` raised
(and ``Retry-After`` when it carries one). Its client is ``nervex.system.comm.client.Client``.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import math
import socket
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Dict, Iterable, List, Optional, Tuple, Union

from flask import Flask, Response, request
from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.task import ThreadedTaskDispatcher
from werkzeug.exceptions import HTTPException

from .auth import RequestVerifier
from .connections import ConnectionLimits, GuardedServer, RateLimitedLog, allow_open_files
from .errors import ProtocolError

HandlerResult = Union[Dict[str, Any], Tuple[int, Any]]
Handler = Callable[[Any], HandlerResult]

HEALTHZ_PATH = "/healthz"
_LOOPBACK_NAMES = ("localhost",)
_INTERNAL_ERROR = "internal server error (details are in the server's log)"

MAX_JSON_DEPTH = 32
"""Objects and lists nest at most this deep in a request body (the protocol's deepest is 4)."""
MAX_JSON_INT = 2**53 - 1
"""The largest integer magnitude a request may carry: JSON's exactly representable integers, far inside SQLite's
64-bit ones, so no stored count, sum or seq can overflow."""


@dataclass(frozen=True)
class _Route:
    path: str
    handler: Handler
    max_body: int


class Server:
    """A Flask app served by waitress on a background thread, with signed JSON routes.

    Example::

        with Server("coordinator", token) as server:   # or server.start() ... server.stop() in a finally
            server.route("/task/ask", ["POST"], ask_for_task)   # routes are registered before start()
            Client(server.url, token).post("/task/ask", {"worker": "actor0"})

    Args:
        name: The role's name, for logs and thread names.
        token: The run's secret (``load_or_create_token``).
        host: Address to bind; anything but loopback logs a warning (no TLS: keep the control plane private).
        port: Port to bind; 0 picks a free one (read ``.port`` after ``start()``).
        threads: waitress worker threads.
        max_body: Default body cap of a route, in bytes.
        logger: Where errors and refused requests are logged (at most ``LOG_BURST`` refusals a minute, the rest
            counted); ``nervex.system.comm.server`` if None.
        verifier: The request verifier; one over ``token`` with default window and cache if None.
        limits: Connection limits; ``ConnectionLimits()`` if None.
    """

    def __init__(
        self,
        name: str,
        token: bytes,
        host: str = "127.0.0.1",
        port: int = 0,
        threads: int = 4,
        max_body: int = 1 << 20,
        logger: Optional[logging.Logger] = None,
        verifier: Optional[RequestVerifier] = None,
        limits: Optional[ConnectionLimits] = None,
    ) -> None:
        self.name = name
        self.logger = logger or logging.getLogger(__name__)
        self.limits = limits or ConnectionLimits()
        self._refusal_log = RateLimitedLog(self.logger)
        self._verifier = verifier or RequestVerifier(token)
        # "localhost" may resolve to ::1 first; the rest of the run expects the IPv4 loopback.
        self._host = "127.0.0.1" if host in _LOOPBACK_NAMES else host
        self._requested_port = int(port)
        self._threads = int(threads)
        self.max_body = int(max_body)
        self.app = Flask(__name__)
        self.app.add_url_rule(HEALTHZ_PATH, "healthz", _healthz, methods=["GET"], provide_automatic_options=False)
        self.app.register_error_handler(HTTPException, _http_error)
        self._routes: Dict[str, _Route] = {}
        self._lock = threading.Lock()
        self._socket_map: Dict[int, Any] = {}
        self._server: Any = None
        self._thread: Optional[threading.Thread] = None
        self._address: Optional[Tuple[str, int]] = None
        if not _is_loopback(self._host):
            self.logger.warning(
                "server '%s' will listen on %s: the control plane has no TLS, keep this network private",
                name,
                self._host,
            )

    def route(self, path: str, methods: Iterable[str], handler: Handler, max_body: Optional[int] = None) -> None:
        """Register a signed JSON route; call before ``start()``.

        Args:
            path: A fixed path (no ``<parameters>``: ids travel in the signed body).
            methods: HTTP methods, e.g. ``["POST"]``.
            handler: ``handler(request_json)`` returning a dict (200) or ``(status, json)``; it may raise
                ``ProtocolError``. ``request_json`` is None for an empty body.
            max_body: Body cap in bytes; the server's ``max_body`` if None.

        Raises:
            RuntimeError: the server is already started.
            ValueError: a duplicate, reserved or parameterised path.
        """
        if self._server is not None:
            raise RuntimeError(f"server '{self.name}': register route {path} before start()")
        if not path.startswith("/") or "<" in path or path == HEALTHZ_PATH or path in self._routes:
            raise ValueError(
                f"server '{self.name}': route path {path!r} must be a new fixed path starting with '/' "
                f"(no '<parameters>', not {HEALTHZ_PATH})"
            )
        entry = _Route(path, handler, self.max_body if max_body is None else int(max_body))
        self._routes[path] = entry
        self.app.add_url_rule(
            path,
            endpoint=path,
            view_func=lambda: self._serve(entry),
            methods=[method.upper() for method in methods],
            provide_automatic_options=False,  # an unsigned OPTIONS would otherwise be answered
        )

    def start(self) -> Server:
        """Bind and serve on a background thread.

        Returns:
            self, for ``with Server(...).start() as server`` or chaining.

        Raises:
            OSError: the address cannot be bound (the message names host:port).
            RuntimeError: already started.
        """
        with self._lock:
            if self._server is not None:
                raise RuntimeError(f"server '{self.name}' is already started")
            sock = self._bind()
            allow_open_files(self.limits.connections + 128, self.logger)
            # waitress buffers a whole body before the app runs; this bounds that buffer (it refuses >= the value).
            largest_cap = max([self.max_body] + [entry.max_body for entry in self._routes.values()])
            self._socket_map = {}
            limits = self.limits
            adjustments = Adjustments(
                sockets=[sock],
                threads=self._threads,
                max_request_body_size=largest_cap + 1,
                ident="",  # no Server header
                expose_tracebacks=False,
                connection_limit=limits.connections,
                channel_timeout=max(1, math.ceil(limits.idle_s)),
                cleanup_interval=max(1, math.ceil(min(limits.idle_s, limits.request_s) / 4)),
            )
            try:
                dispatcher = ThreadedTaskDispatcher()
                dispatcher.set_thread_count(self._threads)
                # "Task queue depth is N" (requests waiting for a thread) once per request under load: rate-limited
                dispatcher.queue_logger = RateLimitedLog(self.logger)
                self._server = GuardedServer(
                    self.app,
                    self._socket_map,
                    _sock=sock,
                    dispatcher=dispatcher,
                    adj=adjustments,
                    bind_socket=False,
                    sockinfo=(sock.family, sock.type, sock.proto, sock.getsockname()),
                    limits=limits,
                    refusal_log=self._refusal_log,
                    role_name=self.name,
                )
            except BaseException:
                sock.close()
                raise
            self._address = sock.getsockname()[:2]
            self._thread = threading.Thread(target=self._server.run, name=f"nervex-http-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close every connection, end the serving thread and wait for running handlers; idempotent.

        Args:
            timeout_s: How long to wait for the serving thread and again for running handlers.
        """
        with self._lock:
            server, thread = self._server, self._thread
            self._server, self._thread = None, None
        if server is None:
            return
        socket_map = self._socket_map
        if thread is not None and thread.is_alive():
            # Close sockets on the loop's own thread, so its select() never sees a descriptor closed under it.
            try:
                server.trigger.pull_trigger(lambda: wasyncore.close_all(socket_map))
            except OSError:  # the loop is ending on its own and has closed its trigger already
                wasyncore.close_all(socket_map)
            thread.join(timeout_s)
            if thread.is_alive():
                self.logger.warning("server '%s': serving thread did not end within %.1f s", self.name, timeout_s)
        else:
            wasyncore.close_all(socket_map)
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=timeout_s)

    def waiting_requests(self) -> int:
        """Requests received whole and waiting for a worker thread (0 when not serving): how far behind it is."""
        server = self._server
        return len(server.task_dispatcher.queue) if server is not None else 0

    def __enter__(self) -> Server:
        return self if self._server is not None else self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    @property
    def host(self) -> str:
        """The bound address (after ``start()``)."""
        return self._bound_address()[0]

    @property
    def port(self) -> int:
        """The bound port (after ``start()``)."""
        return self._bound_address()[1]

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        host, port = self._bound_address()
        if host in ("0.0.0.0", "::"):
            host = socket.getfqdn()  # listening on every address: name this host, not the wildcard
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def _bound_address(self) -> Tuple[str, int]:
        if self._address is None:
            raise RuntimeError(f"server '{self.name}' has no address before start()")
        return self._address

    def _bind(self) -> socket.socket:
        where = (
            f"[{self._host}]:{self._requested_port}" if ":" in self._host else f"{self._host}:{self._requested_port}"
        )
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                self._host, self._requested_port, type=socket.SOCK_STREAM
            )[0]
            sock = socket.socket(family, kind, proto)
        except OSError as error:
            raise OSError(error.errno, f"server '{self.name}' cannot listen on {where}: {error}") from error
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as waitress does: rebind past TIME_WAIT
            sock.bind(address)
        except OSError as error:
            sock.close()
            hint = (
                "address already in use: choose another port or stop what holds it"
                if error.errno == errno.EADDRINUSE
                else error.strerror
            )
            raise OSError(error.errno, f"server '{self.name}' cannot listen on {where}: {hint}") from error
        return sock

    def _serve(self, entry: _Route) -> Response:
        try:
            body = _read_capped_body(entry)
            query = request.query_string.decode("latin-1")
            self._verifier.verify(request.method, request.path, query, request.headers, body)
            status, payload = _normalize_result(entry, entry.handler(_parse_json(body)))
            return _json_response(status, payload)
        except ProtocolError as error:
            return self._error_response(error)
        except HTTPException:
            raise
        except Exception:
            # Never the body or headers: they may hold data the log should not.
            self.logger.exception("server '%s': %s %s failed", self.name, request.method, request.path)
            return _json_response(500, {"error": _INTERNAL_ERROR})

    def _error_response(self, error: ProtocolError) -> Response:
        if error.status in (401, 413):
            self._refusal_log.warning(
                "server '%s': refused %s %s from %s: %s",
                self.name,
                request.method,
                request.path,
                request.remote_addr,
                error,
            )
        payload = error.to_json()
        headers = {}
        if error.retry_after is not None:
            payload["retry_after"] = float(error.retry_after)  # precise; the header is whole seconds (RFC 9110)
            headers["Retry-After"] = str(max(0, math.ceil(error.retry_after)))
        return _json_response(error.status, payload, headers)


def _healthz() -> Response:
    return _json_response(200, {"ok": True})


def _http_error(error: HTTPException) -> Response:
    headers = {key: value for key, value in error.get_headers() if key.lower() == "allow"}  # a 405 keeps Allow
    return _json_response(error.code or 500, {"error": f"{error.code} {error.name}"}, headers)


def _json_response(status: int, payload: Any, headers: Optional[Dict[str, str]] = None) -> Response:
    text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    return Response(text, status=status, mimetype="application/json", headers=headers)


def _read_capped_body(entry: _Route) -> bytes:
    """The body, or a 413 when it is over the route's cap: from Content-Length before reading, else after cap+1."""
    length = request.content_length  # waitress de-chunks chunked bodies and sets it to the decoded length
    if length is not None and length > entry.max_body:
        raise _too_large(entry, f"{length} bytes")
    data = _read_at_most(request.stream, entry.max_body + 1)
    if len(data) > entry.max_body:
        raise _too_large(entry, "more bytes")
    return data


def _too_large(entry: _Route, size: str) -> ProtocolError:
    return ProtocolError(413, f"body of {size} is over the {entry.max_body}-byte cap of {entry.path}", field="body")


def _read_at_most(stream: BinaryIO, limit: int) -> bytes:
    chunks = []
    left = limit
    while left > 0:
        chunk = stream.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _parse_json(body: bytes) -> Any:
    if not body:
        return None
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as error:
        raise ProtocolError(400, f"malformed JSON body: {error}", field="body") from None
    except RecursionError:
        raise ProtocolError(400, "malformed JSON body: nested too deeply", field="body") from None
    check_json_values(value)
    return value


def check_json_values(value: Any) -> None:
    """Refuse what parses as JSON but no handler can store: nesting deeper than ``MAX_JSON_DEPTH``, an integer
    beyond ``MAX_JSON_INT``, a string (or key) that is not valid UTF-8 (a lone surrogate such as ``"\\ud800"``).

    Raises:
        ProtocolError: 400 naming the field (``result.env_steps``; ``body`` at the top).
    """
    stack: List[Tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        node, where, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                raise ProtocolError(400, f"JSON nested deeper than {MAX_JSON_DEPTH} levels", field=where or "body")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, item in items:
                if isinstance(key, str):
                    _check_text(key, where or "body")
                    child = f"{where}.{key}" if where else key
                else:
                    child = f"{where}[{key}]"
                stack.append((item, child, depth + 1))
        elif isinstance(node, str):
            _check_text(node, where or "body")
        elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > MAX_JSON_INT:
            shown = str(node) if len(str(node)) <= 24 else f"an integer of {len(str(node))} digits"
            raise ProtocolError(
                400,
                f"'{where or 'body'}' must be within +-{MAX_JSON_INT} (2**53 - 1), got {shown}",
                field=where or "body",
            )


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(
            400, f"'{where}' holds a string that is not valid UTF-8 (a lone surrogate)", where
        ) from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _normalize_result(entry: _Route, result: HandlerResult) -> Tuple[int, Any]:
    if isinstance(result, dict):
        return 200, result
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], int):
        return result
    raise TypeError(f"handler of {entry.path} returned {type(result).__name__}; return a dict or (status, json)")


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: assume it is reachable from elsewhere


__all__ = [
    "HEALTHZ_PATH",
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT",
    "ConnectionLimits",
    "Handler",
    "HandlerResult",
    "RateLimitedLog",
    "Server",
    "check_json_values",
]
