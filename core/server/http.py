"""The HTTP connection to a served model: JSON requests and server-sent-event streams, with one-line errors.

Why httpx: separate connect / read timeouts (a slow server is told apart from an unreachable one) and a streamed
response that another thread can close (`stop()` while a token is awaited). The API key comes from an environment
variable and goes only into the Authorization header: never into an error, a record or the screen.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

import httpx

from ..errors import ServerError

DEFAULT_KEY_ENV = "TOKENTUI_API_KEY"


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
            raise ServerError(f"--server {text!r} is not a URL (e.g. http://127.0.0.1:8080)") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServerError(f"--server {text!r} is not an http(s) URL (e.g. http://127.0.0.1:8080)")
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
    def plain_http_warning(self) -> str | None:
        """A warning for plain http:// to another host: the prompt, the answer and any API key cross the network
        unencrypted."""
        if urlsplit(self.url).scheme == "http" and not self.loopback:
            return (f"{self.url} is plain http:// to another host: the prompt, the answer and the API key cross "
                    "the network unencrypted (use https://, or an SSH tunnel to 127.0.0.1)")
        return None


def api_key(env_name: str) -> str | None:
    """The API key from environment variable `env_name` (None when unset or empty)."""
    value = os.environ.get(env_name, "")
    return value or None


class Connection:
    """One server: JSON GET / POST and a streamed POST. Thread-safe `cancel()` closes the stream being read."""

    def __init__(self, address: ServerAddress, key: str | None = None, *, connect_timeout: float = 5.0,
                 read_timeout: float = 60.0) -> None:
        self.address = address
        self.read_timeout = read_timeout
        headers = {"Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._key = key
        self._client = httpx.Client(base_url=address.url, headers=headers, follow_redirects=False,
                                    timeout=httpx.Timeout(read_timeout, connect=connect_timeout), trust_env=False)
        self._lock = threading.Lock()
        self._active: httpx.Response | None = None
        self._cancelled = False

    def close(self) -> None:
        self._client.close()

    # ---- one-line errors ------------------------------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        return text.replace(self._key, "<key>") if self._key else text

    def _failure(self, path: str, err: Exception) -> ServerError:
        where = f"{self.address.url}{path}"
        if isinstance(err, httpx.ConnectTimeout):
            return ServerError(f"{where}: no answer to the connection within {self._client.timeout.connect:g} s "
                               "(is the server up? check --server)")
        if isinstance(err, httpx.ConnectError):
            return ServerError(f"{where}: cannot connect ({_reason(err)}); is the server running? check --server")
        if isinstance(err, httpx.ReadTimeout):
            return ServerError(f"{where}: the server sent nothing for {self.read_timeout:g} s "
                               "(slow or stuck; raise --server-timeout)")
        if isinstance(err, (httpx.RemoteProtocolError, httpx.ReadError)):
            return ServerError(f"{where}: the server closed the connection mid-answer ({_reason(err)})")
        return ServerError(f"{where}: {self._scrub(_reason(err))}")

    def _refused(self, path: str, response: httpx.Response, body: bytes) -> ServerError:
        message = _server_message(body) or response.reason_phrase or "no message"
        return ServerError(f"{self.address.url}{path}: the server answered {response.status_code}: "
                           f"{self._scrub(message)}", status=response.status_code)

    # ---- requests -------------------------------------------------------------------------------------------
    def get_json(self, path: str, *, quiet_statuses: tuple[int, ...] = ()) -> dict | list | None:
        """GET `path` as JSON; None when the server answers with one of `quiet_statuses` (an endpoint it lacks)."""
        return self._json("GET", path, None, quiet_statuses)

    def post_json(self, path: str, body: dict, *, quiet_statuses: tuple[int, ...] = ()) -> dict | list | None:
        return self._json("POST", path, body, quiet_statuses)

    def get_text(self, path: str, *, quiet_statuses: tuple[int, ...] = ()) -> str | None:
        try:
            response = self._client.get(path)
        except httpx.HTTPError as err:
            raise self._failure(path, err) from None
        if response.status_code in quiet_statuses:
            return None
        if response.status_code >= 400:
            raise self._refused(path, response, response.content)
        return response.text

    def _json(self, method: str, path: str, body: dict | None, quiet: tuple[int, ...]):
        try:
            response = self._client.request(method, path, json=body)
        except httpx.HTTPError as err:
            raise self._failure(path, err) from None
        if response.status_code in quiet:
            return None
        if response.status_code >= 400:
            raise self._refused(path, response, response.content)
        try:
            return response.json()
        except ValueError:
            raise ServerError(f"{self.address.url}{path}: the answer is not JSON (is this an OpenAI-compatible "
                              "server?)") from None

    @contextmanager
    def stream(self, path: str, body: dict) -> Iterator[Iterator[dict]]:
        """POST `path` with `body` and read its server-sent events: yields an iterator of each `data:` object
        (the stream's `[DONE]` ends it). `cancel()` from another thread ends the iteration early (no error)."""
        with self._lock:
            self._cancelled = False
        try:
            with self._client.stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    raise self._refused(path, response, response.read())
                with self._lock:
                    if self._cancelled:
                        return
                    self._active = response
                try:
                    yield self._events(path, response)
                finally:
                    with self._lock:
                        self._active = None
        except httpx.HTTPError as err:
            if self.cancelled:
                return
            raise self._failure(path, err) from None

    def _events(self, path: str, response: httpx.Response) -> Iterator[dict]:
        try:
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue  # comments, event names, keep-alives
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    obj = json.loads(data)
                except ValueError:
                    raise ServerError(f"{self.address.url}{path}: a streamed line is not JSON: {data[:60]!r}") from None
                if isinstance(obj, dict) and "error" in obj and not obj.get("choices"):
                    raise ServerError(f"{self.address.url}{path}: the server reported an error mid-stream: "
                                      f"{self._scrub(_server_message(data.encode()) or 'no message')}")
                yield obj
        except httpx.HTTPError as err:
            if self.cancelled:
                return
            raise self._failure(path, err) from None
        except (OSError, RuntimeError, AttributeError):  # the response was closed under us by cancel()
            if self.cancelled:
                return
            raise

    @property
    def cancelled(self) -> bool:
        with self._lock:
            return self._cancelled

    def cancel(self) -> None:
        """Stop reading the stream in progress (from any thread): the server sees the client go and stops."""
        with self._lock:
            self._cancelled = True
            response = self._active
        if response is None:
            return
        # Closing the response alone does not wake a thread blocked reading its socket: shut the socket down
        # (httpcore exposes it as the stream's "socket"), which ends that read at once.
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _reason(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[-1] if text else type(err).__name__


def _server_message(body: bytes) -> str:
    """The error message in a server's JSON error answer ({"error": {"message": ...}}, {"detail": ...},
    {"message": ...}), or the start of its text; one line."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:200]
    message = None
    if isinstance(obj, dict):
        error = obj.get("error")
        if isinstance(error, dict):
            message = error.get("message")
        elif isinstance(error, str):
            message = error
        message = message or obj.get("message") or obj.get("detail")
        if isinstance(message, list):  # FastAPI's validation errors
            message = "; ".join(str(m.get("msg", m)) if isinstance(m, dict) else str(m) for m in message)
    return " ".join(str(message or text).split())[:300]
