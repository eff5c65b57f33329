"""Step 4's knobs: temperature, top-k, top-p, greedy / sample, seed — and which setting changed at which step."""

from __future__ import annotations

from rich.text import Text

from tokentui.core.settings import SamplerSettings

from ..keys import next_top_k
from .base import Panel

SHORT_NAMES = {"temperature": "temp", "top_k": "top-k", "top_p": "top-p", "greedy": "mode", "seed": "seed"}


def describe(s: SamplerSettings) -> dict[str, str]:
    return {
        "temperature": f"{s.temperature:.2f}" + (" (greedy)" if s.temperature == 0 else ""),
        "top-k": f"{s.top_k}" if s.top_k else "off",
        "top-p": f"{s.top_p:.2f}" + (" (off)" if s.top_p >= 1.0 else ""),
        "mode": "greedy" if s.is_greedy else "sample",
        "seed": f"{s.seed}",
    }


def setting_value(name: str, value) -> str:
    """One setting's value as the panel writes it (a step's `settings` dict holds the raw values)."""
    if value is None:
        return "—"
    if name == "temperature":
        return f"{float(value):.2f}"
    if name == "top_k":
        return f"{value}" if value else "off"
    if name == "top_p":
        return "off" if float(value) >= 1.0 else f"{float(value):.2f}"
    if name == "greedy":
        return "greedy" if value else "sample"
    return f"{value}"


def describe_change(change) -> list[str]:
    """`step 12 temp 0.70→0.80`, one string per setting that changed at that step."""
    return [f"step {change.step} {SHORT_NAMES.get(name, name)} {setting_value(name, old)}→{setting_value(name, new)}"
            for name, old, new in change.changes]


class SamplerPanel(Panel):
    TITLE = "4 sampler"

    COMPONENT_CLASSES = {"sampler--label", "sampler--value", "sampler--changed", "sampler--muted"}

    DEFAULT_CSS = """
    SamplerPanel {
        & > .sampler--label { color: $text-muted; }
        & > .sampler--value { color: $accent; text-style: bold; }
        & > .sampler--changed { color: $success; }
        & > .sampler--muted { color: $text-muted; }
    }
    """

    def build(self, state) -> Text:
        # the settings asked for, read from their owner (the engine's client, via the app), never copied here
        settings = getattr(self.app, "sampler_settings", None) or SamplerSettings()
        label = self.style_of("sampler--label")
        value = self.style_of("sampler--value")
        changed = self.style_of("sampler--changed")
        muted = self.style_of("sampler--muted")
        values = describe(settings)
        in_force = state.last_step.settings if state.last_step is not None else None
        differs = bool(in_force) and SamplerSettings(**in_force) != settings
        pending = Text()
        if differs and state.running:
            pending.append("changed: applies at the next step", changed)
        elif differs:  # the run has ended with other settings
            pending.append("changed: applies to the next run (r)", changed)
        history = [line for change in state.settings_changes for line in describe_change(change)]
        width = self.content_size.width or 26
        height = self.content_size.height or 1
        out = Text()
        if height < 4:  # one line: every value, then the latest change
            for n, (key, val) in enumerate(values.items()):
                if n:
                    out.append(" · ", muted)
                out.append(("temp" if key == "temperature" else key) + " ", label)
                out.append(val.replace(" (greedy)", "").replace(" (off)", ""), value)
            if pending:
                out.append(" · ", muted)
                out.append_text(pending)
            elif history:
                out.append(" · ", muted)
                out.append(history[-1], changed)
            return out
        for n, (key, val) in enumerate(values.items()):
            if n:
                out.append("\n")
            out.append(f"{key:<12}", label)
            out.append(val, value)
            if key == "top-k":  # the notches k and K move to, so the ladder is visible
                down = next_top_k(settings.top_k, -1)
                up = next_top_k(settings.top_k, +1)
                hint = f"  k→{down or 'off'} K→{up or 'off'}"
                if 12 + len(val) + len(hint) <= width:
                    out.append(hint, muted)
        rows_left = height - len(values)
        if pending and rows_left > 0:
            out.append("\n")
            out.append_text(pending)
            rows_left -= 1
        if history and rows_left > 0:
            shown = history[-(rows_left - 1):] if rows_left > 1 else history[-1:]
            if rows_left > 1:
                out.append("\n")
                out.append("changed (latest last):" if len(history) > 1 else "changed:", muted)
            for line in shown:
                out.append("\n")
                out.append(line, changed)
        elif not history and not pending and in_force is not None and rows_left > 0:
            out.append("\n")
            out.append("unchanged since step 1", muted)
        return out
