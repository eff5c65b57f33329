"""The server's KV cache use, read on a thread of its own every quarter second while a run streams, so that no
request sits on the token path (a /metrics read between two tokens would delay the next one's measured arrival).

Sources, as the server reports them: vLLM's and SGLang's /metrics gauge (a fraction), or llama-server's /slots
(the tokens a busy slot holds, its prompt and what it decoded so far, over the slots' context sizes)."""

from __future__ import annotations

import re
import threading

from ..errors import ServerError
from .http import Connection

_QUIET = (400, 401, 403, 404, 405, 422, 501, 503)


def read_metric(conn: Connection, metric: str) -> float | None:
    """The first sample of `metric` in /metrics (0..1), None when absent."""
    try:
        text = conn.get_text("/metrics", quiet_statuses=_QUIET)
    except ServerError:
        return None
    match = re.search(rf"^{re.escape(metric)}(?:{{[^}}]*}})?\s+([0-9.eE+-]+)", text or "", re.M)
    try:
        value = float(match.group(1)) if match else None
    except ValueError:
        return None
    return value if value is not None and 0.0 <= value <= 1.0 else None


def read_slots(conn: Connection) -> float | None:
    """llama-server's /slots: tokens held by busy slots (`n_prompt_tokens`: the slot's cached tokens, prompt and
    decoded so far) over the slots' context sizes (None: not reported). An idle slot reports no token count."""
    try:
        slots = conn.get_json("/slots", quiet_statuses=_QUIET)
    except ServerError:
        return None
    if not isinstance(slots, list) or not slots:
        return None
    used = total = 0
    for slot in slots:
        if not isinstance(slot, dict) or not isinstance(slot.get("n_ctx"), int):
            return None
        total += slot["n_ctx"]
        if slot.get("is_processing"):  # a busy slot's tokens in cache: its prompt, then each token decoded
            used += int(slot.get("n_prompt_tokens") or 0)
    return min(1.0, used / total) if total else None


class KvPoller:
    """`latest`: the last reading (None until one arrives, or when the server reports none)."""

    def __init__(self, conn: Connection, source: str | None, metric: str | None, interval: float = 0.25) -> None:
        self._read = (lambda: read_metric(conn, metric)) if source == "/metrics" and metric else \
            (lambda: read_slots(conn)) if source == "/slots" else None
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.latest: float | None = None

    def __enter__(self) -> "KvPoller":
        if self._read is not None:
            self._thread = threading.Thread(target=self._loop, name="tokentui-kv-poll", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            value = self._read()
            if value is not None:
                self.latest = value
            self._stop.wait(self._interval)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
