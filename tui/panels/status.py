"""The status line: what the app is doing, where the run is recorded, and warnings that must stay visible."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.widget import Widget

from ..format import short_path, token_count
from ..served import reissue_forms, server_of
from .base import component_style, forget_styles

REASONS = {
    "eos": "end token",
    "length": "length limit",
    "stopped": "stopped",
    "error": "error",
    "context": "context full",
}


class StatusLine(Widget):
    COMPONENT_CLASSES = {"status--state", "status--busy", "status--ok", "status--error", "status--warning",
                         "status--muted", "status--paused", "status--travel"}

    DEFAULT_CSS = """
    StatusLine {
        height: 1;
        background: $panel;
        color: $foreground;
        padding: 0 1;
        & > .status--state { color: $primary; text-style: bold; }
        & > .status--busy { color: $accent; text-style: bold; }
        & > .status--ok { color: $success; text-style: bold; }
        & > .status--error { color: $error; text-style: bold; }
        & > .status--warning { color: $warning; text-style: bold; }
        & > .status--paused { color: $warning; text-style: bold; }
        & > .status--travel { color: $accent; text-style: bold reverse; }
        & > .status--muted { color: $text-muted; }
    }
    """

    def __init__(self, *args, replaying: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.replaying = replaying  # a record played back: said at every size, first
        self._last = None
        self.last_text = None
        self.paused = False
        self.max_new_tokens: int | None = None
        self.message: str | None = None  # transient app message (e.g. "exported …"), shown on the right

    def notify_style_update(self) -> None:
        super().notify_style_update()
        forget_styles(self)

    def show(self, state) -> None:
        self._last = state
        text = self.build(state)
        if text != self.last_text:
            self.last_text = text
            self.refresh()

    def render(self):
        return self.last_text if self.last_text is not None else ""

    def on_mount(self) -> None:
        self.set_interval(1.0, self._tick)  # the prefill clock moves even when no event comes for a while

    def _tick(self) -> None:
        if self._last is not None and self._last.phase in ("starting", "prefill"):
            self.show(self._last)

    @staticmethod
    def _bar(fraction: float, style) -> Text:
        frac = min(max(fraction, 0.0), 1.0)
        filled = round(frac * 10)
        return Text(f"{frac * 100:.0f}% " + "█" * filled + "░" * (10 - filled), style=style)

    def on_resize(self) -> None:
        if self._last is not None:
            self.show(self._last)

    def build(self, state) -> Text:
        width = max(1, self.content_size.width or 80)
        left = self._left(state, hints=True)
        reissue = reissue_forms(self._step_shown(state), server_of(state.facts))
        if reissue:  # a served model's step that began a request re-issued from the prefix: said, hints first to go
            s = lambda name: component_style(self, f"status--{name}")  # noqa: E731
            forms = [(True, True, reissue[0]), (False, True, reissue[0]), (False, True, reissue[1]),
                     (False, False, reissue[1]), (False, False, reissue[2])]
            for hints, run_word, words in forms:
                base = self._left(state, hints=hints, run_word=run_word)
                if base.cell_len + 3 + len(words) <= width or words == reissue[-1]:
                    left = base
                    left.append("· " if left.plain.endswith(" ") else " · ", s("muted"))
                    left.append(words, s("warning"))
                    break
        return self._with_right(state, left, width)

    @staticmethod
    def _step_shown(state):
        """The step the panels show, once decoding has begun (the cursor's, or the newest)."""
        if not state.live:
            return state.view_step
        return state.last_step if state.phase in ("decoding", "done", "error") else None

    def _left(self, state, hints: bool, run_word: bool = True) -> Text:
        """What the app is doing (hints: the keys that go with it, when there is room; run_word: under a held
        cursor, whether the run goes on)."""
        s = lambda name: component_style(self, f"status--{name}")  # noqa: E731
        left = Text()
        if self.replaying:
            left.append("▶ replay ", s("travel"))
            left.append(" ")
        phase = state.phase
        viewed = state.view_step if not state.live else None
        if viewed is not None:  # the time-travel cursor holds a past step
            if phase == "decoding":
                going = "paused" if self.paused else "live continues"
            elif phase in ("done", "error"):
                going = "run ended"
            else:
                going = phase
            left.append(f" viewing step {viewed.index + 1} of {state.step_total:,} ", s("travel"))
            if run_word:
                left.append(f"— {going}", s("paused" if going == "paused" else "muted"))
            if hints:
                left.append(" · esc back to live", s("muted"))
        elif phase == "loading":
            left.append("◌ loading ", s("busy"))
            stage = (state.load_stage or "").strip()
            if stage.lower().startswith("loading"):  # the stage names itself: never "loading loading"
                stage = stage[len("loading"):].lstrip(" :·")
            left.append(stage, s("muted"))
            if state.load_fraction is not None:  # only where the loader measures one
                left.append(" ")
                left.append_text(self._bar(state.load_fraction, s("busy")))
        elif phase == "load-failed":
            left.append("✗ model not loaded ", s("error"))
            left.append("· r retry · q quit", s("muted"))
        elif phase in ("starting", "prefill"):
            left.append("◐ prefill ", s("busy"))
            elapsed = state.prefill_elapsed()
            progress = state.prefill_progress
            if progress is not None:
                left.append(f"· {progress.tokens_done:,} of {progress.tokens:,} prompt tokens ", s("muted"))
                left.append_text(self._bar(progress.tokens_done / progress.tokens if progress.tokens else 0.0,
                                           s("busy")))
            elif state.prompt is not None and server_of(state.facts) is not None:
                left.append(f"· the server reads {len(state.prompt.ids):,} prompt tokens", s("muted"))
            elif state.prompt is not None:
                left.append(f"· reading {len(state.prompt.ids):,} prompt tokens in one run", s("muted"))
            if elapsed is not None:
                left.append(f" · {elapsed:,.0f} s", s("muted"))
        elif phase == "decoding":
            step = state.last_step.index + 1 if state.last_step else 0  # numbered from 1: step N = N tokens
            if self.paused:
                left.append(f"‖ paused at step {step} ", s("paused"))
                if hints:
                    left.append("· n one step · space resume", s("muted"))
            else:
                left.append("● decoding ", s("state"))
                left.append(f"· step {step}", s("muted"))
        elif phase == "done" and state.done is not None:
            reason = state.done.reason
            words = REASONS.get(reason, reason)
            if reason == "length" and self.max_new_tokens:
                words += f" ({self.max_new_tokens})"
            left.append("✓ done: ", s("ok"))
            left.append(words, s("ok"))
            left.append(f" · {token_count(state)}", s("muted"))
        elif phase == "error":
            left.append("✗ error", s("error"))
            if state.error is not None and state.error.step >= 0:
                left.append(f" at step {state.error.step + 1}", s("error"))
            left.append(f": {state.error_message or ''}", s("error"))
        else:
            left.append(phase, s("state"))
        if state.facts is not None and state.facts.trust_remote_code:
            left.append("  ⚠ trust-remote-code", s("warning"))
        return left

    def _with_right(self, state, left: Text, width: int) -> Text:
        """The transient message or the record's path on the right, where there is room."""
        s = lambda name: component_style(self, f"status--{name}")  # noqa: E731
        room = width - left.cell_len - 2
        right = Text()
        if self.message:
            message = self.message if len(self.message) <= room else self.message[: max(0, room - 1)] + "…"
            right.append(message, s("muted"))
        elif state.record_path is not None:
            right.append("record ", s("muted"))
            right.append(short_path(state.record_path, max(10, room - 7)))
        if right and room > 12:
            gap = width - left.cell_len - right.cell_len
            left.append(" " * max(2, gap))
            left.append_text(right)
        elif cell_len(left.plain) > width:
            left.truncate(width, overflow="ellipsis")
        return left
