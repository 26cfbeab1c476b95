"""Limits on connections before a request reaches the app: header time and size, and open connections.

uvicorn bounds none of these by itself: its keep-alive timer stops at the first byte a client
sends, so a client that sends headers a byte at a time (or never finishes them) holds its
connection forever; httptools accepts headers of any size; and `limit_concurrency` answers 503 only
once a request's headers are complete, so idle connections can take every file descriptor. This
subclass of uvicorn's own HTTP protocol adds, per connection:

- a deadline for the request line and headers (`header_timeout_s`), armed when the connection
  opens and again after each answer: a client that has sent part of its headers gets 408, an idle
  one is closed;
- a cap on the bytes received before the headers are complete (`max_header_bytes`): 431, closed;
- a cap on open connections (`max_connections`): a new connection beyond it closes the one that
  has waited longest for its headers (an idle or slow client), or, when every connection is
  working on a request, answers 503 with Retry-After and closes;
- a lingering close: when the app answers before the request's body has arrived (413, 503, 408)
  and closes, the rest of the body is read and dropped for at most `header_timeout_s` first.
  Closing a socket with unread data sends a reset, and a client still sending its body would
  lose the answer with it (nginx's `lingering_close` does the same).

What a connection does once its headers are complete is the app's business (body limits, read
timeout); the protocol's parsing and flow control stay uvicorn's.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.auto import AutoHTTPProtocol

REASONS = {
    400: "Bad Request",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    max_header_bytes: int
    max_connections: int


def refusal(status: int, message: str) -> bytes:
    """A complete HTTP/1.1 answer that closes the connection, written before any request exists."""
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status} {REASONS[status]}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\nx-content-type-options: nosniff\r\n"
        + ("retry-after: 1\r\n" if status == 503 else "")
        + "\r\n"
    )
    return head.encode() + body


class GuardedProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol with `_limits` applied to each connection; `guarded_protocol` sets them."""

    _limits: ClassVar[ConnectionLimits]
    _waiting: ClassVar[dict[Any, None]]  # connections waiting for headers, longest-waiting first
    _timer: asyncio.TimerHandle | None = None
    _cycle: Any = None  # the request cycle when the wait began: a new one means headers arrived
    _received = 0
    _lingering = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._raw = transport
        super().connection_made(Lingering(transport, self))  # type: ignore[arg-type]
        if len(self.connections) > self._limits.max_connections and not self._evict_one():
            message = (
                f"The service has {self._limits.max_connections} open connections, all busy. "
                "Fix: retry after a second."
            )
            self._refuse(503, message)
            return
        self._wait_for_headers()

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # the rest of a refused body
            return None
        if self._timer is None:
            return super().data_received(data)
        self._received += len(data)
        super().data_received(data)  # at most one read (256 kB) past the limit is ever parsed
        if self.cycle is not self._cycle:
            self._stop_waiting()
        elif self._received > self._limits.max_header_bytes and not self.transport.is_closing():
            self._refuse(
                431,
                f"The request line and headers exceed {self._limits.max_header_bytes} bytes. "
                "Fix: send shorter headers (an image goes in the body).",
            )

    def on_response_complete(self) -> None:
        super().on_response_complete()
        idle = self.cycle is None or self.cycle.response_complete  # no pipelined request started
        if idle and not self.transport.is_closing():
            self._wait_for_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        self._lingering = False
        super().connection_lost(exc)

    def close_or_linger(self) -> None:
        """Close; first read and drop the rest of a body the app answered without reading."""
        cycle = self.cycle
        if self._lingering or self._raw.is_closing():
            return
        if cycle is None or not cycle.more_body or cycle.disconnected:
            self._stop_waiting()
            self._raw.close()
            return
        self._stop_waiting()
        self._lingering = True
        self._timer = self.loop.call_later(self._limits.header_timeout_s, self._raw.close)
        self._waiting[self] = None  # the first to go when the connections run out
        self._raw.resume_reading()  # flow control may have paused it while the body queued

    def _wait_for_headers(self) -> None:
        self._stop_waiting()
        self._cycle, self._received = self.cycle, 0
        self._timer = self.loop.call_later(self._limits.header_timeout_s, self._headers_late)
        self._waiting[self] = None

    def _stop_waiting(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._waiting.pop(self, None)

    def _headers_late(self) -> None:
        self._timer = None
        if self._raw.is_closing():
            return
        if self._received:  # part of a request: say why it ends
            seconds = f"{self._limits.header_timeout_s:g}"
            message = f"The request headers did not arrive within {seconds} s."
            self._refuse(408, f"{message} Fix: send the request at once, or raise --header_timeout.")
        else:  # idle: nobody waits for an answer
            self._stop_waiting()
            self._raw.close()

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest for its headers; False when none waits."""
        oldest = next((c for c in self._waiting if c is not self), None)
        if oldest is None:
            return False
        oldest._stop_waiting()
        oldest._raw.close()
        return True

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request it cannot parse, as JSON with nosniff like every other."""
        self._refuse(400, f"{msg} Fix: send a well-formed HTTP/1.1 request.")

    def _refuse(self, status: int, message: str) -> None:
        self._stop_waiting()
        self._raw.write(refusal(status, message))
        self._raw.close()


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (httptools, else h11) with `limits` applied to every connection.

    A class of its own per server: uvicorn makes one protocol object per connection from it, and
    they share the limits and the connections waiting for headers.
    """
    return type("Guarded", (GuardedProtocol,), {"_limits": limits, "_waiting": {}})


class Lingering:
    """The transport uvicorn's protocol and request cycles see: close() may linger (see above)."""

    def __init__(self, transport: asyncio.Transport, protocol: Any) -> None:
        self._transport = transport
        self._protocol = protocol

    def close(self) -> None:
        self._protocol.close_or_linger()

    def is_closing(self) -> bool:
        return self._protocol._lingering or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
