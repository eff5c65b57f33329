"""The readings strip: the KV cache size, the per-step latency and the pending bytes on one line, for terminals
too small for their own panels (tui/sizes.py says which). Numbers come from `RunState`, exactly as the full panels
show them; its bottom border says which panels a larger terminal would add."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from ..format import human_bytes
from ..served import CLIENT_MEASURED, LEGEND, kv_usage_text, server_of
from .base import component_style, forget_styles


def readings(state) -> dict[str, str | None]:
    """The strip's numbers as text (None: not known yet), from the same state the full panels read, all as of the
    step shown: the newest (the last decode step's latency, the run's tokens/s so far), or the one the time-travel
    cursor holds (that step's latency, the rate up to it). A step scored by a prefill gives its time as the TTFT
    ("ttft"), never as a decode step's ms/step."""
    stats = state.latency_stats()
    hex_, needed = state.view_pending
    dropped, _why = state.view_dropped
    kv_tokens, kv_bytes, _growth = state.view_kv
    prefill_step = state.view_scored_by_prefill
    last = None if prefill_step else stats["last"] if state.live else state.view_latency
    ttft = state.view_latency if prefill_step else None
    tok_s = state.view_tok_s
    viewed = state.view_step if not state.live else None
    server_kv = state.view_server_kv if server_of(state.facts) is not None else None
    return {
        "step": str(viewed.index + 1) if viewed is not None else None,  # the cursor's step, when not live
        "kv_size": human_bytes(kv_bytes) if kv_tokens and kv_bytes is not None else None,
        # a served model: the share of its server's KV cache in use, as the server reported it (None: not reported)
        "server_kv": kv_usage_text(server_kv[0]) if server_kv is not None else None,
        "kv_tokens": f"{kv_tokens:,}" if kv_tokens else None,
        "ms_step": f"{last:.1f}" if last is not None else None,
        "ttft": f"{ttft:.1f}" if ttft is not None else None,
        "tok_s": f"{tok_s:.1f}" if tok_s is not None else None,
        "pending": hex_ or None,
        "needed": str(needed) if hex_ else None,
        "dropped": dropped or None,  # bytes the run ended on, never completed (the pending panel says why)
    }


class ReadingsStrip(Widget):
    """`5 decode KV 5.4 MiB · 124 tok │ last 74.0 ms/step · 13.5 tok/s avg │ pending e5 bc needs 1 more byte` —
    shorter forms when narrow; the prompt panel's border names step 3 (prefill) where this strip stands in. Which
    reading is which is said: the last step's latency beside the run's average rate, a past step's own latency
    beside the rate up to it, a prefill's step as its TTFT (and the strip then starts `3 prefill`)."""

    COMPONENT_CLASSES = {"readings--label", "readings--value", "readings--muted", "readings--bytes",
                         "readings--step", "readings--step-name"}

    DEFAULT_CSS = """
    ReadingsStrip {
        height: 1;
        background: $surface;
        padding: 0 1;
        border-subtitle-color: $text-muted;
        & > .readings--label { color: $text-muted; }
        & > .readings--value { color: $accent; text-style: bold; }
        & > .readings--muted { color: $text-muted; }
        & > .readings--bytes { color: $pending-bytes; text-style: bold; }
        & > .readings--step { color: $warning; text-style: bold; }
        & > .readings--step-name { color: $primary; text-style: bold; }
    }
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._state = None
        self.last_text: Text | None = None
        self.note = ""  # what a bigger terminal would add (the app sets it): the bottom border says it

    def set_note(self, note: str) -> None:
        self.note = note
        self._subtitle()

    def _subtitle(self) -> None:
        """The bottom border: what a bigger terminal would add; for a served model first what "—" means and that
        the times are tokentui's (the note after them where it fits)."""
        served = self._state is not None and server_of(self._state.facts) is not None
        if not served or not self.note:
            subtitle = f"{LEGEND} · times {CLIENT_MEASURED}" if served else self.note
        else:
            width = self.size.width or 80
            subtitle = f"{LEGEND} · times {CLIENT_MEASURED}"
            if len(subtitle) + 3 + len(self.note) <= width - 4:
                subtitle += " · " + self.note
        if subtitle != self.border_subtitle:
            self.border_subtitle = subtitle

    def notify_style_update(self) -> None:
        super().notify_style_update()
        forget_styles(self)

    def show(self, state, force: bool = False) -> None:
        self._state = state
        if not self.display:
            return
        self._subtitle()
        text = self.build(state)
        if force or text != self.last_text:
            self.last_text = text
            self.refresh()

    def render(self):
        return self.last_text if self.last_text is not None else ""

    def on_resize(self) -> None:
        if self._state is not None:
            self.show(self._state, force=True)

    def build(self, state) -> Text:
        width = max(1, self.content_size.width or 78)
        forms = [self._line(state, level) for level in range(4)]
        for text in forms:
            if text.cell_len <= width:
                return text
        text = forms[-1]
        text.truncate(width, overflow="ellipsis")
        return text

    def _line(self, state, form: int) -> Text:
        """form 0: in words; 1: shorter words; 2: those, the bars unspaced (what says which reading is which kept);
        3: shortest."""
        s = lambda name: component_style(self, f"readings--{name}")  # noqa: E731
        r = readings(state)
        dash = "—"
        level = (0, 1, 1, 2)[form]  # the words' form
        sep = (" │ ", " │ ", "│", "│")[form]
        dot = (" · ", " · ", " · ", "·")[form]
        out = Text(no_wrap=True, overflow="ellipsis")
        if r["step"]:  # the time-travel cursor holds a past step: these readings are that step's
            out.append(("at step " if form < 2 else "@") + r["step"], s("step"))
            out.append(sep, s("muted"))
        # the step these readings are (issue 40: all six named at every size): a step the prefill scored, its own
        out.append("3 prefill " if r["ttft"] else "5 decode ", s("step-name"))
        out.append("KV ", s("label"))
        if server_of(state.facts) is not None:  # a served model: tokens counted by tokentui, the server's share
            out.append(r["kv_tokens"] or dash, s("value"))
            out.append(" tok", s("muted"))
            out.append(dot, s("muted"))
            if r["server_kv"]:
                out.append(("server " if form < 2 else ""), s("label"))
                out.append(r["server_kv"] if level < 2 else r["server_kv"].replace(" in use", ""), s("value"))
            else:
                out.append("size ", s("label"))
                out.append(dash, s("value"))
        else:
            out.append(r["kv_size"] or dash, s("value"))
            out.append(dot, s("muted"))
            out.append(r["kv_tokens"] or dash, s("value"))
            out.append(" tok", s("muted"))
        out.append(sep, s("muted"))
        self._speed(out, r, level, state.live, s)
        out.append(sep, s("muted"))
        out.append("pending ", s("label"))
        if r["dropped"]:
            out.append(r["dropped"], s("bytes"))
            out.append(" dropped at the end" if level == 0 else " dropped", s("muted"))
        elif r["pending"]:
            out.append(r["pending"], s("bytes"))
            needed = int(r["needed"])
            if level == 0:
                out.append(f" needs {needed} more byte{'s' if needed != 1 else ''}", s("muted"))
            else:
                out.append(f" +{needed}", s("muted"))
        else:
            out.append("none", s("muted"))
        return out

    @staticmethod
    def _speed(out: Text, r: dict, level: int, live: bool, s) -> None:
        """The latency and the rate, each said for what it is: live, the last step's latency and the run's average
        rate; at a past step, that step's own latency and the rate up to it; a step scored by a prefill, its time
        as the TTFT."""
        dash = "—"
        if r["ttft"]:
            out.append("TTFT ", s("label"))
            out.append(r["ttft"], s("value"))
            out.append(" ms (prefill)" if level == 0 else " ms", s("muted"))
            return
        if level < 2:
            out.append("last " if live else ("this step " if level == 0 else ""), s("label"))
        out.append(r["ms_step"] or dash, s("value"))
        out.append((" ms/step" if level == 0 else " ms"), s("muted"))
        out.append(" · " if level < 2 else "·", s("muted"))
        out.append(r["tok_s"] or dash, s("value"))
        rate = (" tok/s avg" if live else " tok/s to it") if level < 2 else " tok/s"
        out.append(rate, s("muted"))
