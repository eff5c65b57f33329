"""A served model's streamed answer (server-sent events), read with bounds: each line at most MAX_LINE_BYTES (a server
that never sends a newline is refused, not buffered), each `data:` value strict JSON, and a `Deadline` between
tokens rather than between bytes (a server dripping a byte at a time cannot keep a run going past it). The
connection that opens the stream is core/server/http.py's; the stream reads of it only what `StreamOwner` names (so
this module does not import the one that imports it).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterator, Protocol

import httpx

from ..errors import ServerError
from ..strict_json import loads as parse_json

MAX_LINE_BYTES = 4 * 1024 * 1024  # one streamed line (a chunk with its alternatives is a few KiB)


class Deadline:
    """A time limit for one request, watched on a thread of its own: when it passes, `expire` is called (it shuts
    the request's sockets, which wakes a read blocked on them) and `expired` says that is why the read ended.

    Only time spent waiting for the server counts: a stream `hold()`s the clock while its consumer has an event in
    hand (a slow reader of tokentui's output is not a slow server) and `resume()`s it when asked for the next one;
    `renew()` starts the limit again (a token arrived). `seconds` None: no limit, no thread."""

    def __init__(self, seconds: float | None, expire) -> None:
        self.seconds = seconds
        self.expired = False
        self._expire = expire
        self._cond = threading.Condition()
        self._spent = 0.0  # waited so far (since the start or the last renew), not counting the time running now
        self._since: float | None = time.monotonic()  # waiting since then (None: held)
        self._done = False
        if seconds is not None:
            threading.Thread(target=self._watch, name="tokentui-server-deadline", daemon=True).start()

    def renew(self) -> None:
        with self._cond:
            self._spent = 0.0
            if self._since is not None:
                self._since = time.monotonic()

    def hold(self) -> None:
        with self._cond:
            if self._since is not None:
                self._spent += time.monotonic() - self._since
                self._since = None

    def resume(self) -> None:
        with self._cond:
            if self._since is None:
                self._since = time.monotonic()
                self._cond.notify_all()

    def _watch(self) -> None:
        with self._cond:
            while not self._done:
                if self._since is None:
                    self._cond.wait()
                    continue
                left = self.seconds - self._spent - (time.monotonic() - self._since)
                if left <= 0:
                    self.expired = True
                    break
                self._cond.wait(left)
        if self.expired:
            self._expire()

    def close(self) -> None:
        with self._cond:
            self._done = True
            self._cond.notify_all()


class _Address(Protocol):
    url: str


class StreamOwner(Protocol):
    """What a stream reads of the connection that opened it (core/server/http.py's Connection)."""

    address: _Address

    @property
    def cancelled(self) -> bool:
        """cancel() was called: a stream that ends now ends without an error."""

    def shown(self, text: str, limit: int = ...) -> str:
        """`text` as an error may show it (the key scrubbed, printable, cut)."""

    def failure(self, path: str, err: Exception, deadline: Deadline | None = None, what: str = ...) -> ServerError:
        """The one line of a request to `path` that ended with `err`."""


class NoEvents:
    """The events of a stream cancelled before its answer came: none."""

    def token_arrived(self) -> None:
        pass

    def __iter__(self):
        return iter(())


NO_EVENTS = NoEvents()


class EventStream:
    """The `data:` values of one streamed answer, each parsed as strict JSON (any JSON value: core/server/wire.py
    checks its shape). The consumer calls `token_arrived()` for each token: the deadline is the time between
    tokens, not between bytes."""

    def __init__(self, conn: StreamOwner, path: str, response: httpx.Response, deadline: Deadline) -> None:
        self._conn = conn
        self._path = path
        self._response = response
        self._deadline = deadline
        self._got_token = False

    def token_arrived(self) -> None:
        self._got_token = True
        self._deadline.renew()

    def __iter__(self):
        conn, path = self._conn, self._path
        where = f"{conn.address.url}{path}"
        try:
            for line in _lines(self._response.iter_raw(), where):
                if not line.startswith(b"data:"):
                    continue  # comments, event names, keep-alives
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                try:
                    obj = parse_json(data)
                except ValueError as err:
                    text = data.decode("utf-8", errors="replace")
                    raise ServerError(f"{where}: a streamed line is not JSON ({err}): "
                                      f"{conn.shown(text, 60)!r}") from None
                if isinstance(obj, dict) and "error" in obj and not obj.get("choices"):
                    raise ServerError(f"{where}: the server reported an error mid-stream: "
                                      f"{conn.shown(message_of(obj) or 'no message')}")
                self._deadline.hold()  # the consumer's time with the event is not the server's
                yield obj
                self._deadline.resume()
            if self._deadline.expired:  # its sockets were shut: the answer "ended" there
                raise conn.failure(path, httpx.ReadTimeout("deadline"), self._deadline, self._what())
        except httpx.HTTPError as err:
            if conn.cancelled and not self._deadline.expired:
                return
            raise conn.failure(path, err, self._deadline, self._what()) from None
        except (OSError, RuntimeError, AttributeError):  # the response was closed under us by cancel()
            if self._deadline.expired:
                raise conn.failure(path, httpx.ReadTimeout("deadline"), self._deadline, self._what()) from None
            if conn.cancelled:
                return
            raise

    def _what(self) -> str:
        return "no further token" if self._got_token else "no token"


def _lines(parts: Iterator[bytes], where: str) -> Iterator[bytes]:
    """The lines (without their \\n or \\r\\n) of a byte stream, none longer than MAX_LINE_BYTES: a server that never
    sends a newline is refused, not buffered. Hand-written: httpx's iter_lines has no length limit."""
    buffer = bytearray()
    for part in parts:
        buffer += part
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = bytes(buffer[start:end])
            yield line[:-1] if line.endswith(b"\r") else line
            start = end + 1
        del buffer[:start]
        if len(buffer) > MAX_LINE_BYTES:
            raise ServerError(f"{where}: a streamed line is longer than {MAX_LINE_BYTES // 2**20} MiB (no newline): "
                              "not read")
    if buffer:
        yield bytes(buffer)


def shutdown_stream(stream) -> None:
    """Shut a network stream's socket down: closing a response alone does not wake a thread blocked reading its
    socket; a shutdown ends that read at once (httpcore exposes the socket as the stream's "socket")."""
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def message_of(obj) -> str | None:
    """The message in a server's JSON error ({"error": {"message": ...}}, {"error": "..."}, {"detail": ...},
    {"message": ...}); None when it has none."""
    if not isinstance(obj, dict):
        return None
    message = None
    error = obj.get("error")
    if isinstance(error, dict):
        message = error.get("message")
    elif isinstance(error, str):
        message = error
    message = message or obj.get("message") or obj.get("detail")
    if isinstance(message, list):  # FastAPI's validation errors
        message = "; ".join(str(m.get("msg", m)) if isinstance(m, dict) else str(m) for m in message[:8])
    return str(message) if message else None
