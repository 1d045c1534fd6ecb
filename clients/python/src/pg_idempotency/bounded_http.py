"""An HTTP POST bounded in total time: connecting, sending and reading the whole answer end
by one deadline, whatever the other side does (a receiver that answers a byte at a time never
makes a socket read wait long enough for a per-read timeout to fire).

httpcore (the `sender` extra) does the HTTP; every socket operation it makes goes through a
network backend here that gives it only the time left until the attempt's deadline, and one
that starts past the deadline fails at once, so nothing is sent after it. Connections are
kept between attempts (a pool); one that timed out is closed by httpcore. Name resolution
is the one step the deadline cannot cut short, but nothing is sent after it if it ran past.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import httpcore

# A write is made in pieces so that each socket send is bounded by the time left.
_WRITE_PIECE = 16 * 1024


class NoAnswer(Exception):
    """No HTTP answer: refused, reset, timed out. The message says which."""


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # names in lower case
    body: str


class _Deadline(threading.local):
    """The deadline of the attempt this thread runs (time.monotonic()), or None."""

    at: float | None = None

    def left(self, timeout: float | None, late: type[Exception]) -> float | None:
        if self.at is None:
            return timeout
        left = self.at - time.monotonic()
        if left <= 0:
            raise late("the attempt's time is up")
        return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, deadline: _Deadline):
        self._inner, self._deadline = inner, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._deadline.left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), _WRITE_PIECE):
            self._inner.write(buffer[start:start + _WRITE_PIECE], self._deadline.left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        left = self._deadline.left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, left), self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, deadline: _Deadline):
        self._inner, self._deadline = httpcore.SyncBackend(), deadline

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options=None) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, self._deadline.left(timeout, httpcore.ConnectTimeout),
                                         local_address, socket_options)
        return _Stream(stream, self._deadline)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options=None) -> httpcore.NetworkStream:
        stream = self._inner.connect_unix_socket(path, self._deadline.left(timeout, httpcore.ConnectTimeout),
                                                 socket_options)
        return _Stream(stream, self._deadline)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class BoundedClient:
    """POSTs, each bounded in total by its `timeout` (seconds). Safe to share between threads:
    each thread's attempt has its own deadline."""

    def __init__(self, max_connections: int = 10):
        self._deadline = _Deadline()
        self._pool = httpcore.ConnectionPool(network_backend=_Backend(self._deadline),
                                             max_connections=max_connections,
                                             max_keepalive_connections=max_connections)

    def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> Reply:
        """The whole answer within `timeout` seconds of the call, or NoAnswer."""
        self._deadline.at = time.monotonic() + timeout
        each = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
        try:
            r = self._pool.request("POST", url, headers=list(headers.items()), content=body,
                                   extensions={"timeout": each})
        except httpcore.TimeoutException as e:
            raise NoAnswer("timed out") from e
        except httpcore.ConnectError as e:
            raise NoAnswer(f"connection failed: {e}") from e
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol,
                httpcore.ProxyError) as e:
            raise NoAnswer(f"no answer: {e}") from e
        finally:
            self._deadline.at = None
        answer_headers: dict[str, str] = {}
        for k, v in r.headers:  # a name that comes more than once: its values joined, as HTTP allows
            name, value = k.decode("latin-1").lower(), v.decode("latin-1")
            answer_headers[name] = f"{answer_headers[name]}, {value}" if name in answer_headers else value
        return Reply(r.status, answer_headers, r.content.decode("utf-8", errors="replace"))

    def close(self) -> None:
        self._pool.close()
