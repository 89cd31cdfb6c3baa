"""How many connections a server holds, and for how long: waitress's TCP server with a per-peer cap and a deadline
for each request to arrive whole, and a rate-limited log of what it refuses (``nervex.system.comm.server`` uses it).

A peer that opens connections and sends nothing, or trickles a header a byte at a time, or sends refused requests in
a loop, can neither lock the server out of new connections nor fill its disk with log lines.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer

LOG_BURST = 10
"""Refused connections and requests logged per ``LOG_WINDOW_S``; the rest are counted and summed up in one line."""
LOG_WINDOW_S = 60.0


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections a server holds and for how long (waitress's, plus a per-peer cap and a request clock).

    Attributes:
        connections: Open connections in all; over it the server stops accepting until some close.
        per_peer: Open connections from one address; a further one is closed at once (so one peer, idle or
            reconnecting, never takes every slot).
        idle_s: A connection with no request in progress and no byte received for this long is closed.
        request_s: A request must arrive whole (headers and body) within this long of its first byte, or its
            connection is closed (a peer trickling a header a byte at a time keeps no slot).
    """

    connections: int = 1024
    per_peer: int = 256
    idle_s: float = 60.0
    request_s: float = 30.0


class RateLimitedLog:
    """Warnings at most ``burst`` per ``window_s``; the ones over are counted and reported with the next line logged.

    A peer sending refused requests (or connections) in a loop fills no disk: about ``burst`` lines a minute.
    """

    def __init__(self, logger: logging.Logger, burst: int = LOG_BURST, window_s: float = LOG_WINDOW_S) -> None:
        self.logger, self.burst, self.window_s = logger, int(burst), float(window_s)
        self._lock = threading.Lock()
        self._window_start = -math.inf
        self._logged = 0
        self.suppressed = 0
        """Lines not logged since the last one that was."""

    def warning(self, message: str, *args: Any) -> bool:
        """Log ``message % args`` unless the window's burst is spent; whether it was logged."""
        now = time.monotonic()
        with self._lock:
            if now - self._window_start >= self.window_s:
                self._window_start, self._logged = now, 0
            if self._logged >= self.burst:
                self.suppressed += 1
                return False
            self._logged += 1
            suppressed, self.suppressed = self.suppressed, 0
        if suppressed:
            message += f" ({suppressed} similar line(s) not logged in the last {self.window_s:g} s)"
        self.logger.warning(message, *args)
        return True


class _TimedChannel(HTTPChannel):
    """waitress's channel, stamped with when its current request began to arrive."""

    request_started = 0.0

    def received(self, data: bytes) -> bool:
        if self.request is None and data:
            self.request_started = time.time()
        return super().received(data)


class GuardedServer(TcpWSGIServer):
    """waitress's TCP server with a cap on connections per peer and a deadline for each request to arrive."""

    channel_class = _TimedChannel

    def __init__(
        self,
        *args: Any,
        limits: ConnectionLimits,
        refusal_log: RateLimitedLog,
        role_name: str,
        **kwargs: Any,
    ) -> None:
        self.limits, self.refusal_log, self.role_name = limits, refusal_log, role_name
        super().__init__(*args, **kwargs)

    def handle_accept(self) -> None:
        try:
            accepted = self.accept()
        except OSError:
            return
        if accepted is None:
            return
        conn, addr = accepted
        peer = addr[0] if isinstance(addr, tuple) else str(addr)
        open_from_peer = sum(1 for channel in self.active_channels.values() if _peer(channel) == peer)
        if open_from_peer >= self.limits.per_peer:
            conn.close()
            self.refusal_log.warning(
                "server '%s': closed a connection from %s: it holds %d open (the per-peer limit)",
                self.role_name,
                peer,
                open_from_peer,
            )
            return
        self.set_socket_options(conn)  # TCP_NODELAY: without it each answer waits ~40 ms for a delayed ACK
        self.channel_class(self, conn, addr, self.adj, map=self._map)

    def maintenance(self, now: float) -> None:
        super().maintenance(now)  # idle connections
        cutoff = now - self.limits.request_s
        late: Counter = Counter()
        for channel in list(self.active_channels.values()):
            partial = channel.request is not None and not channel.request.completed
            if partial and not channel.requests and channel.request_started < cutoff:
                channel.will_close = True
                late[_peer(channel)] += 1
        for peer, count in late.items():
            self.refusal_log.warning(
                "server '%s': closed %d connection(s) from %s: a request not whole within %g s",
                self.role_name,
                count,
                peer,
                self.limits.request_s,
            )


def allow_open_files(needed: int, logger: logging.Logger) -> None:
    """Raise this process's soft limit on open files to ``needed`` where the hard limit allows (else warn)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        logger.warning(
            "open-file limit %d (hard) is below the %d the connection limit needs; raise it (ulimit -n)", hard, needed
        )


def _peer(channel: Any) -> str:
    addr = getattr(channel, "addr", None)
    return addr[0] if isinstance(addr, tuple) else str(addr)


__all__ = ["LOG_BURST", "LOG_WINDOW_S", "ConnectionLimits", "GuardedServer", "RateLimitedLog", "allow_open_files"]
