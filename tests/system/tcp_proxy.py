"""A TCP proxy for fault tests: listens on 127.0.0.1, forwards to a target, and delays, drops or resets on demand.

Example::

    with FaultyProxy("127.0.0.1", coordinator_port, seed=1, delay_s=0.2, drop_p=0.1, reset_p=0.1) as proxy:
        start_actor("--url", proxy.url)
        proxy.pause()   # an outage: connections are accepted and held, nothing is forwarded
        proxy.resume()
        assert proxy.counts.dropped > 0

Faults (plain attributes, read for every burst and connection, so they can change while the proxy runs):

* ``delay_s``: each burst (the bytes ready when the previous one was forwarded) waits this long, both ways: a latency.
* ``drop_p``: a new connection is closed before anything is forwarded (``counts.refused``); and, drawn again for each
  response, the response is swallowed and the connection closed (``counts.dropped``): the server acted on the
  request, the client never sees the answer.
* ``reset_p``: a response that is not dropped is cut after half its first burst by an RST (``SO_LINGER`` 0, no FIN)
  (``counts.reset``); the server acted here too.

``faults`` lists each dropped or reset response with the request line it answered. One ``random.Random(seed)`` draws
every fault: the sequence of draws is reproducible, which request meets which draw depends on thread timing.
"""

from __future__ import annotations

import random
import select
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Callable, List, Optional, Set, Tuple

POLL_S = 0.1
"""How often blocked threads look at the proxy's state (stop, outage)."""
CHUNK = 65536


@dataclass
class ProxyCounts:
    connections: int = 0  # accepted from clients
    refused: int = 0  # closed on accept, nothing forwarded
    dropped: int = 0  # responses swallowed after the request was forwarded
    reset: int = 0  # connections reset mid-response


def _drain(sock: socket.socket) -> bytes:
    """The bytes ``sock`` has ready now, without waiting (EOF is left for the next ``recv`` to see)."""
    data = b""
    while select.select([sock], [], [], 0)[0]:
        more = sock.recv(CHUNK)
        if not more:
            break
        data += more
    return data


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.awaiting_response = False  # a request went upstream since the last response began
        self.request_line = ""  # the last request's first line (``POST /v1/task/complete HTTP/1.1``)
        self._lock = threading.Lock()
        self._closed = False

    def close(self, reset: bool = False) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if reset:
            self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        for sock in (self.client, self.upstream):
            if not (reset and sock is self.client):  # a shutdown would send a FIN before the RST
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            sock.close()


class FaultyProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_host:target_port`` with injected faults (see the module docstring).

    Args:
        target_host: Where to forward.
        target_port: Port to forward to.
        seed: Seeds the fault draws.
        delay_s: Latency of each forwarded burst, in seconds.
        drop_p: Probability of a refused connection and, separately, of a swallowed response.
        reset_p: Probability of a response cut by an RST.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        seed: int = 0,
        delay_s: float = 0.0,
        drop_p: float = 0.0,
        reset_p: float = 0.0,
    ) -> None:
        self.target = (target_host, int(target_port))
        self.delay_s, self.drop_p, self.reset_p = float(delay_s), float(drop_p), float(reset_p)
        self.counts = ProxyCounts()
        self.faults: List[Tuple[str, str]] = []  # (``dropped`` or ``reset``, the request line whose answer it hit)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._stopped = threading.Event()
        self._links: Set[_Link] = set()
        self._threads: List[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(POLL_S)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._spawn(self._accept_loop)

    # ---- control ---------------------------------------------------------------------------------------------------
    def set_faults(self, delay_s: float = 0.0, drop_p: float = 0.0, reset_p: float = 0.0) -> None:
        """Replace every fault setting at once (no arguments: a clean pipe)."""
        self.delay_s, self.drop_p, self.reset_p = float(delay_s), float(drop_p), float(reset_p)

    def pause(self) -> None:
        """An outage: connections are accepted and held, nothing is forwarded until ``resume``."""
        self._forwarding.clear()

    def resume(self) -> None:
        self._forwarding.set()

    def close(self) -> None:
        """Stop accepting, close every connection and join every thread; idempotent."""
        self._stopped.set()
        self._forwarding.set()
        self._listener.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()
        for thread in list(self._threads):
            thread.join(timeout=5.0)

    def __enter__(self) -> FaultyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- forwarding ------------------------------------------------------------------------------------------------
    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name="faulty-proxy", daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _chance(self, p: float) -> bool:
        with self._lock:
            return p > 0 and self._rng.random() < p

    def _count(self, name: str, link: Optional[_Link] = None) -> None:
        with self._lock:
            setattr(self.counts, name, getattr(self.counts, name) + 1)
            if link is not None:
                self.faults.append((name, link.request_line))

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            self._count("connections")
            if self._chance(self.drop_p):
                self._count("refused")
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5.0)
            except OSError:
                client.close()  # the target is down: the client sees its connection closed
                continue
            link = _Link(client, upstream)
            for sock in (client, upstream):
                sock.settimeout(POLL_S)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the client does: no Nagle stalls
            with self._lock:
                self._links.add(link)
            self._spawn(self._pump, link, client, upstream, False)
            self._spawn(self._pump, link, upstream, client, True)

    def _hold(self) -> bool:
        """Wait out the delay and any outage; False once the proxy stops."""
        if self.delay_s > 0 and self._stopped.wait(self.delay_s):
            return False
        while not self._forwarding.wait(POLL_S):
            if self._stopped.is_set():
                return False
        return not self._stopped.is_set()

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket, is_response: bool) -> None:
        reset = False
        try:
            while not self._stopped.is_set():
                try:
                    data = src.recv(CHUNK)
                except TimeoutError:
                    continue
                if not data or not self._hold():
                    break
                data += _drain(src)  # what arrived during the delay goes with it: one delay per burst
                if not is_response:
                    link.awaiting_response = True
                    if data[:5] in (b"POST ", b"GET /"):
                        link.request_line = data.split(b"\r\n", 1)[0].decode("latin-1")
                elif link.awaiting_response:
                    link.awaiting_response = False
                    if self._chance(self.drop_p):
                        self._count("dropped", link)
                        break
                    if self._chance(self.reset_p):
                        dst.sendall(data[: len(data) // 2])
                        self._count("reset", link)
                        reset = True
                        break
                dst.sendall(data)
        except (OSError, ValueError):
            pass  # either side went away, or the other direction closed both sockets (select: fd -1)
        finally:
            link.close(reset=reset)
            with self._lock:
                self._links.discard(link)
