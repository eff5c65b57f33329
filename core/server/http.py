"""The HTTP connection to a served model: JSON requests and server-sent-event streams, with one-line errors.

Why httpx: separate connect / read timeouts (a slow server is told apart from an unreachable one) and a streamed
response that another thread can close (`stop()` while a token is awaited).

What a server can do to tokentui is bounded here, since everything it sends is outside input:
- the API key comes from an environment variable and goes only into the Authorization header of requests to the
  address the user named (`ServerAddress`; redirects are never followed), and not over plain http:// to another
  host unless the user says so (`key_for`): never into an error, a record or the screen. Server text shown in an
  error is scrubbed of the key first, then made safe to print, then cut (`shown`); the text a server generates is
  masked by core/server/key_mask.py (`Connection.key_mask`);
- a streamed line may be at most MAX_LINE_BYTES and a JSON answer MAX_BODY_BYTES (an answer without a newline is
  not buffered without end); JSON is parsed strictly (no NaN / Infinity, which are not JSON) and one nested past
  Python's recursion limit is refused in one line;
- the timeout is a deadline (`Deadline`): a JSON answer must be whole, and a stream's next token must arrive, within
  it, however the server drips its bytes (a read timeout alone restarts with every byte);
- answers are asked for uncompressed, and a compressed one is refused (a small body could unpack to gigabytes).
The stream's side of this (its line cap, the Deadline, EventStream) is core/server/stream.py.
"""

from __future__ import annotations

import ipaddress
import math
import os
import threading
from collections import deque
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

import httpx

from ..errors import ServerError
from ..strict_json import loads as parse_json
from ..steps.display import printable_line
from .key_mask import KeyMask, key_forms
from .stream import NO_EVENTS, Deadline, EventStream, message_of, shutdown_stream

DEFAULT_KEY_ENV = "TOKENTUI_API_KEY"
MAX_BODY_BYTES = 64 * 1024 * 1024  # one JSON answer (a long prompt's /tokenize with pieces is a few MiB)
MAX_ERROR_BYTES = 64 * 1024  # of an error answer, read for its message
SHOWN_CHARS = 200  # server text quoted in an error


@dataclass(frozen=True, slots=True)
class ServerAddress:
    """A checked base URL: scheme http(s), a host, no credentials (a key belongs in the environment)."""

    url: str  # without a trailing slash and without a trailing /v1

    @classmethod
    def parse(cls, text: str) -> "ServerAddress":
        raw = text.strip()
        if "://" not in raw:
            raw = "http://" + raw
        try:
            parts = urlsplit(raw)
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError:
            raise ServerError(f"--server {shown(text)!r} is not a URL (e.g. http://127.0.0.1:8080)") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServerError(f"--server {shown(text)!r} is not an http(s) URL (e.g. http://127.0.0.1:8080)")
        if parts.username or parts.password:
            raise ServerError("--server: put the API key in the environment (TOKENTUI_API_KEY, or the variable "
                              "--api-key-env names), not in the URL")
        path = parts.path.rstrip("/")
        if path.endswith("/v1"):
            path = path[:-3]
        return cls(urlunsplit((parts.scheme, parts.netloc, path, "", "")))

    @property
    def loopback(self) -> bool:
        host = urlsplit(self.url).hostname or ""
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    @property
    def plain_http(self) -> bool:
        """Plain http:// to another host: what is sent crosses the network unencrypted."""
        return urlsplit(self.url).scheme == "http" and not self.loopback

    def plain_http_warning(self, key_sent: bool = False) -> str | None:
        """A warning for plain http:// to another host (None for https:// or a loopback address)."""
        if not self.plain_http:
            return None
        what = "the prompt, the answer and the API key" if key_sent else "the prompt and the answer"
        return (f"{self.url} is plain http:// to another host: {what} cross the network unencrypted (use https://, "
                "or an SSH tunnel to 127.0.0.1)")


def api_key(env_name: str) -> str | None:
    """The API key from environment variable `env_name` (None when unset or empty)."""
    value = os.environ.get(env_name, "")
    return value or None


ALLOW_PLAIN_HTTP_KEY = "--allow-plain-http-key"


def key_for(address: ServerAddress, key: str | None, env_name: str = DEFAULT_KEY_ENV,
            allow_plain_http: bool = False) -> str | None:
    """The API key that may go to `address`: `key`, unless it would cross the network unencrypted (plain http://
    to another host) and the user did not say to send it anyway (ALLOW_PLAIN_HTTP_KEY): then a ServerError, raised
    before anything connects, so the key is never sent that way by default."""
    if key and address.plain_http and not allow_plain_http:
        raise ServerError(f"--server {address.url} is plain http:// to another host: the API key in ${env_name} would "
                          "cross the network unencrypted, so tokentui does not send it; use https:// or an SSH "
                          f"tunnel to 127.0.0.1, or pass {ALLOW_PLAIN_HTTP_KEY} to send it anyway")
    return key


_SECRETS: set[str] = set()  # every API key a Connection of this process holds: `shown` scrubs them all


def scrub(text: str, key: str | None = None) -> str:
    """`text` without `key` nor any key a Connection holds, in any of its `key_forms`."""
    for secret in {key, *_SECRETS} - {None, ""}:
        for form in key_forms(secret):
            text = text.replace(form, "<key>")
    return text


def shown(text: str, key: str | None = None, limit: int = SHOWN_CHARS) -> str:
    """Server- or file-supplied text as an error quotes it: the keys scrubbed first (so a cut cannot leave part of
    one), control characters made visible (printable_line), whitespace runs as one space, then cut to `limit`."""
    text = " ".join(printable_line(scrub(text, key)).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def seconds_or_none(timeout: float | None) -> float | None:
    """A timeout a socket accepts: None (wait as long as it takes) for inf, or one longer than the platform's
    longest wait (1e300 s would raise OverflowError in the socket layer)."""
    if timeout is None or math.isinf(timeout) or timeout >= threading.TIMEOUT_MAX:
        return None
    return float(timeout)


class Connection:
    """One server: JSON GET / POST and a streamed POST. Thread-safe `cancel()` closes the stream being read. One
    thread makes the requests (the run's); another thread's requests (the KV poller's) use a `twin()`."""

    def __init__(self, address: ServerAddress, key: str | None = None, *, connect_timeout: float = 5.0,
                 read_timeout: float | None = 60.0) -> None:
        self.address = address
        self.read_timeout = seconds_or_none(read_timeout)  # None: no limit (--server-timeout inf)
        self._connect_timeout = connect_timeout
        headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
            _SECRETS.add(key)
        self._key = key
        self._client = httpx.Client(base_url=address.url, headers=headers, follow_redirects=False,
                                    timeout=httpx.Timeout(self.read_timeout, connect=connect_timeout),
                                    trust_env=False)
        self._lock = threading.Lock()
        self._active: httpx.Response | None = None
        self._cancelled = False
        self._streaming = False  # a stream's request is in flight (cancel() then ends it even before its answer)
        self._sockets: deque = deque(maxlen=4)  # the latest connections' network streams (a deadline shuts them)

    def twin(self) -> "Connection":
        """Another connection to the same server with the same key, for requests made on another thread."""
        return Connection(self.address, self._key, connect_timeout=self._connect_timeout,
                          read_timeout=self.read_timeout)

    def close(self) -> None:
        self._client.close()

    def scrub(self, text: str) -> str:
        """`text` without this connection's key."""
        return scrub(text, self._key)

    @property
    def sends_key(self) -> bool:
        """Whether this connection's requests carry an API key."""
        return bool(self._key)

    def key_mask(self) -> KeyMask:
        """A masker of this connection's key for one run's events: the text a server generates (core/server/
        key_mask.py); it masks nothing when no key is sent."""
        return KeyMask(self._key)

    def shown(self, text: str, limit: int = SHOWN_CHARS) -> str:
        return shown(text, self._key, limit)

    # ---- one-line errors ------------------------------------------------------------------------------------
    def failure(self, path: str, err: Exception, deadline: Deadline | None = None, what: str = "no whole answer"
                 ) -> ServerError:
        """The one line of a request to `path` that ended with `err` (the deadline's, when it had expired)."""
        where = f"{self.address.url}{path}"
        if deadline is not None and deadline.expired or isinstance(err, httpx.ReadTimeout):
            return ServerError(f"{where}: the server sent {what} within {self.read_timeout:g} s "
                               "(slow or stuck; raise --server-timeout)")
        if isinstance(err, httpx.ConnectTimeout):
            return ServerError(f"{where}: no answer to the connection within {self._connect_timeout:g} s "
                               "(is the server up? check --server)")
        if isinstance(err, httpx.ConnectError):
            return ServerError(f"{where}: cannot connect ({self.shown(_reason(err))}); is the server running? "
                               "check --server")
        if isinstance(err, (httpx.RemoteProtocolError, httpx.ReadError)):
            return ServerError(f"{where}: the server closed the connection mid-answer ({self.shown(_reason(err))})")
        return ServerError(f"{where}: {self.shown(_reason(err))}")

    def _refused(self, path: str, response: httpx.Response, body: bytes) -> ServerError:
        message = _server_message(body) or response.reason_phrase or "no message"
        return ServerError(f"{self.address.url}{path}: the server answered {response.status_code}: "
                           f"{self.shown(message)}", status=response.status_code)

    def _redirected(self, path: str, response: httpx.Response) -> ServerError:
        location = response.headers.get("location", "")
        to = f" to {self.shown(location, 120)}" if location else ""
        return ServerError(f"{self.address.url}{path}: the server redirected ({response.status_code}){to}; tokentui "
                           "does not follow redirects (the API key goes only to the address you named): pass the "
                           "final URL with --server", status=response.status_code)

    # ---- requests -------------------------------------------------------------------------------------------
    def get_json(self, path: str, *, quiet_statuses: tuple[int, ...] = ()):
        """GET `path` as JSON (any JSON value: the caller's parser checks its shape); None when the server answers
        with one of `quiet_statuses` (an endpoint it lacks)."""
        return self._json("GET", path, None, quiet_statuses)

    def post_json(self, path: str, body: dict, *, quiet_statuses: tuple[int, ...] = ()):
        return self._json("POST", path, body, quiet_statuses)

    def get_text(self, path: str, *, quiet_statuses: tuple[int, ...] = ()) -> str | None:
        body = self._body("GET", path, None, quiet_statuses)
        return None if body is None else body.decode("utf-8", errors="replace")

    def _json(self, method: str, path: str, body: dict | None, quiet: tuple[int, ...]):
        data = self._body(method, path, body, quiet)
        if data is None:
            return None
        try:
            return parse_json(data)
        except ValueError as err:
            why = f" ({err})" if "JSON" in str(err) or "nested" in str(err) else ""
            raise ServerError(f"{self.address.url}{path}: the answer is not JSON{why} (is this an OpenAI-compatible "
                              "server?)") from None

    def _body(self, method: str, path: str, body: dict | None, quiet: tuple[int, ...]) -> bytes | None:
        """The whole answer to one request, read within the deadline and up to MAX_BODY_BYTES; None for a quiet
        status."""
        with self._response(method, path, body) as (response, deadline):
            if response.status_code in quiet:
                return None
            self._check_status(path, response, deadline)
            try:
                data = bytearray()
                for part in response.iter_raw():
                    data += part
                    if len(data) > MAX_BODY_BYTES:
                        raise ServerError(f"{self.address.url}{path}: the answer is larger than "
                                          f"{MAX_BODY_BYTES // 2**20} MiB: not read")
            except httpx.HTTPError as err:
                raise self.failure(path, err, deadline) from None
            if deadline.expired:  # its sockets were shut: what came is not the whole answer
                raise self.failure(path, httpx.ReadTimeout("deadline"), deadline)
            return bytes(data)

    @contextmanager
    def _response(self, method: str, path: str, body: dict | None, *, quiet_cancel: bool = False):
        """The response to one request (its headers read), with its deadline; one-line errors for what fails.
        `quiet_cancel`: a request cancelled before its answer came yields (None, deadline) instead of an error."""
        deadline = Deadline(self.read_timeout, self._shut_sockets)
        try:
            with ExitStack() as stack:
                try:
                    response = stack.enter_context(
                        self._client.stream(method, path, json=body, extensions={"trace": self._trace}))
                except httpx.HTTPError as err:
                    if not (quiet_cancel and self.cancelled and not deadline.expired):
                        raise self.failure(path, err, deadline, "no answer") from None
                    response = None
                yield response, deadline
        finally:
            deadline.close()

    def _check_status(self, path: str, response: httpx.Response, deadline: Deadline) -> None:
        if 300 <= response.status_code < 400:
            raise self._redirected(path, response)
        if response.status_code >= 400:
            raise self._refused(path, response, self._read_some(response, MAX_ERROR_BYTES))
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise ServerError(f"{self.address.url}{path}: the server compressed its answer ({self.shown(encoding)}) "
                              "though asked not to: not read")

    @staticmethod
    def _read_some(response: httpx.Response, limit: int) -> bytes:
        data = bytearray()
        try:
            for part in response.iter_raw():
                data += part
                if len(data) >= limit:
                    break
        except httpx.HTTPError:
            pass  # what came is the message
        return bytes(data[:limit])

    @contextmanager
    def stream(self, path: str, body: dict) -> Iterator["EventStream"]:
        """POST `path` with `body` and read its server-sent events: yields an EventStream of each `data:` value
        (the stream's `[DONE]` ends it). `cancel()` from another thread ends the iteration early (no error)."""
        with self._lock:
            self._cancelled = False
            self._streaming = True
        try:
            with self._response("POST", path, body, quiet_cancel=True) as (response, deadline):
                if response is not None:
                    self._check_status(path, response, deadline)
                with self._lock:
                    cancelled = self._cancelled or response is None
                    self._active = None if cancelled else response
                try:
                    yield NO_EVENTS if cancelled else EventStream(self, path, response, deadline)
                finally:
                    with self._lock:
                        self._active = None
        finally:
            with self._lock:
                self._streaming = False

    @property
    def cancelled(self) -> bool:
        with self._lock:
            return self._cancelled

    def cancel(self) -> None:
        """Stop reading the stream in progress (from any thread): the server sees the client go and stops."""
        with self._lock:
            self._cancelled = True
            response = self._active
            waiting = self._streaming and response is None
        if response is not None:
            shutdown_stream(response.extensions.get("network_stream"))
        elif waiting:  # the stream's answer has not come yet (a long prefill): its connection is the latest
            for stream in list(self._sockets):
                shutdown_stream(stream)

    # ---- the sockets a deadline shuts ------------------------------------------------------------------------
    def _trace(self, event: str, info: dict) -> None:
        """httpcore's trace hook: each new connection's network stream, so a deadline can shut it even before the
        answer's headers have come (a server dripping its headers)."""
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            self._sockets.append(info.get("return_value"))

    def _shut_sockets(self) -> None:
        for stream in list(self._sockets):
            shutdown_stream(stream)
        with self._lock:
            response = self._active
        if response is not None:
            shutdown_stream(response.extensions.get("network_stream"))


def _reason(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[-1] if text else type(err).__name__


def _server_message(body: bytes) -> str:
    """The error message of a server's answer: its JSON error's message, or its text. Not cut here: `shown` scrubs
    the key before it cuts."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        obj = parse_json(text)
    except ValueError:
        return text
    return message_of(obj) or text
