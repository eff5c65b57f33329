"""Step 4's knobs: temperature, top-k, top-p, greedy / sample, seed — and the step a change took effect."""

from __future__ import annotations

from rich.text import Text

from tokentui.core.settings import SamplerSettings

from .base import Panel


def describe(s: SamplerSettings) -> dict[str, str]:
    return {
        "temperature": f"{s.temperature:.2f}" + (" (greedy)" if s.temperature == 0 else ""),
        "top-k": f"{s.top_k}" if s.top_k else "off",
        "top-p": f"{s.top_p:.2f}" + (" (off)" if s.top_p >= 1.0 else ""),
        "mode": "greedy" if s.is_greedy else "sample",
        "seed": f"{s.seed}",
    }


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

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.requested: SamplerSettings | None = None
        self.changed_keys: set[str] = set()

    def build(self, state) -> Text:
        settings = self.requested or SamplerSettings()
        label = self.style_of("sampler--label")
        value = self.style_of("sampler--value")
        changed = self.style_of("sampler--changed")
        muted = self.style_of("sampler--muted")
        values = describe(settings)
        in_force = state.last_step.settings if state.last_step is not None else None
        differs = bool(in_force) and SamplerSettings(**in_force) != settings
        note = Text()
        if differs and state.running:
            note.append("changed: applies at the next step", changed)
        elif differs:  # the run has ended with other settings
            note.append("changed: applies to the next run (r)", changed)
        elif state.settings_changed_at is not None:
            note.append(f"changed at step {state.settings_changed_at}", changed)
        compact = (self.content_size.height or 1) < 4
        out = Text()
        if compact:
            for n, (key, val) in enumerate(values.items()):
                if n:
                    out.append(" · ", muted)
                out.append(("temp" if key == "temperature" else key) + " ", label)
                out.append(val.replace(" (greedy)", "").replace(" (off)", ""), value)
            if note:
                out.append(" · ", muted)
                out.append_text(note)
            return out
        for n, (key, val) in enumerate(values.items()):
            if n:
                out.append("\n")
            out.append(f"{key:<12}", label)
            out.append(val, value)
        if not note and in_force is not None:
            note.append("unchanged since step 0", muted)
        if note:
            out.append("\n")
            out.append_text(note)
        return out
