"""The words the panels use for a model watched on a server (`--server URL`, core/server/): what the server does
not report, which probability it gives, that times are measured by tokentui, and a request re-issued from the
prefix. Plain Python, no Textual; every panel says these things the same way.

A served model's facts carry `server` (core/runs/events.py `ServerFacts`); its numbers the server does not report are
None, and the panels show them as "—" with the legend `LEGEND` (or the whole phrase where it fits), never as 0 and
never as "None". Its candidates have exactly one of `raw_prob` / `prob`: `ServerFacts.probs` says which, and the
panels label that column by it ("raw p", "post-sampler p", or plain "p" when the server does not say).
"""

from __future__ import annotations

import textwrap

NOT_REPORTED = "not reported by the server"
DASH = "—"
LEGEND = f"{DASH} {NOT_REPORTED}"
CLIENT_MEASURED = "client-measured"  # a time tokentui measured between tokens arriving (network included)
NOT_AVAILABLE = "not available for a served model"


def server_of(facts):
    """The facts' `ServerFacts` (None: a local model, a replay of one, or no facts yet)."""
    return getattr(facts, "server", None) if facts is not None else None


# ---- the probability the server gives -----------------------------------------------------------------------
def prob_label(server) -> str:
    """The short label of the candidates' probability column."""
    return {"raw": "raw p", "post-sampler": "post p"}.get(server.probs, "p")


def prob_name(server) -> str:
    """What the probability is, in words (the model panel's value)."""
    return {"raw": "raw", "post-sampler": "post-sampler"}.get(server.probs, "not said")


def prob_detail(server) -> str:
    """The probability's meaning, one short line (≤ 36 cells)."""
    return {"raw": "before the sampler chain",
            "post-sampler": "after the sampler chain"}.get(server.probs, "raw or post-sampler: not said")


def prob_missing(server) -> str | None:
    """The name of the probability the server does not give (None when it does not say which it gives)."""
    return {"raw": "post-sampler p", "post-sampler": "raw p"}.get(server.probs)


def unknown_kind() -> str:
    return "p: the server does not say whether raw or post-sampler"


def value_of(candidate) -> float | None:
    """The one probability a served candidate has (the raw one first: a local candidate has both)."""
    return candidate.raw_prob if candidate.raw_prob is not None else candidate.prob


def chosen_value(step) -> float | None:
    return step.chosen_raw_prob if step.chosen_raw_prob is not None else step.chosen_prob


# ---- the prefix cache and re-issued requests --------------------------------------------------------------
def prefix_caching(server) -> str:
    """'on', 'off' or None (not reported)."""
    value = server.prefix_caching
    return None if value is None else ("on" if value else "off")


def prefix_note(server) -> str:
    """What a re-issue's TTFT depends on: '' when the server caches the prefix."""
    if server is None or server.prefix_caching:
        return ""
    return "(prefix caching off)" if server.prefix_caching is False else "(prefix caching not reported)"


def ttft_text(value: float) -> str:
    return f"{value:,.1f} ms" if value < 1000 else f"{value:,.0f} ms"


def reissue_forms(step, server) -> list[str]:
    """A step that began a request re-issued from the prefix, in words, longest first (empty: not one)."""
    ttft = getattr(step, "reissue_ttft_ms", None) if step is not None else None
    if ttft is None:
        return []
    note = prefix_note(server)
    tail = f" {note}" if note else ""
    return [f"re-issued from the prefix: TTFT {ttft_text(ttft)}{tail}",
            f"re-issued: TTFT {ttft_text(ttft)}{tail}",
            f"re-issued: TTFT {ttft_text(ttft)}"]


def kv_usage_text(usage: float) -> str:
    """A fraction of the server's KV cache as a percentage ("12% in use"; "<1%" for a little)."""
    pct = usage * 100
    if 0 < pct < 1:
        return "<1% in use"
    return f"{pct:.0f}% in use"


def wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, max(10, width), break_on_hyphens=False) or [""]
