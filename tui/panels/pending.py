"""Step 6's buffer: bytes of a character that is not complete yet, and characters that took several tokens."""

from __future__ import annotations

from rich.text import Text

from .base import Panel


class PendingPanel(Panel):
    TITLE = "6 pending bytes"

    COMPONENT_CLASSES = {"pending--bytes", "pending--label", "pending--muted", "pending--char"}

    DEFAULT_CSS = """
    PendingPanel {
        & > .pending--bytes { color: $pending-bytes; text-style: bold; }
        & > .pending--label { color: $text-muted; }
        & > .pending--muted { color: $text-muted; }
        & > .pending--char { color: $accent; text-style: bold; }
    }
    """

    def build(self, state) -> Text:
        byte_style = self.style_of("pending--bytes")
        label = self.style_of("pending--label")
        muted = self.style_of("pending--muted")
        char_style = self.style_of("pending--char")
        out = Text()
        # as of the step shown: the newest, or the one the time-travel cursor holds
        hex_, needed = state.view_pending
        dropped, why = state.view_dropped
        viewed = state.view_step if not state.live else None
        self.border_subtitle = f"at step {viewed.index + 1}" if viewed is not None else ""
        out.append("held      ", label)
        if dropped:
            out.append(dropped, byte_style)
            out.append(f"  dropped: {why}", muted)
        elif hex_:
            out.append(hex_, byte_style)
            out.append(f"  needs {needed} more byte{'s' if needed != 1 else ''}", muted)
        else:
            out.append("none", muted)
        out.append("\n")
        chars = list(state.view_multi_token_chars)
        if not chars:
            out.append("characters split over several tokens show here, e.g. 开 = e5 bc 80 ← 2 tokens", muted)
            return out
        out.append("split over several tokens:", label)
        height = self.content_size.height or 8
        for c in chars[-max(1, height - 2):]:
            out.append("\n")
            out.append(c.char, char_style)
            out.append(" = ", muted)
            out.append(c.hex, byte_style)
            out.append(f" ← {c.tokens} tokens", muted)
        return out
