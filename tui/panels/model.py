"""The model's facts and the run's totals: tokens, model runs and scores computed (vocab rows × runs)."""

from __future__ import annotations

from rich.text import Text

from ..format import human_count
from .base import Panel


class ModelPanel(Panel):
    TITLE = "model · totals"

    COMPONENT_CLASSES = {"model--label", "model--value", "model--muted", "model--name", "model--warning"}

    DEFAULT_CSS = """
    ModelPanel {
        & > .model--label { color: $text-muted; }
        & > .model--value { color: $foreground; text-style: bold; }
        & > .model--muted { color: $text-muted; }
        & > .model--name { color: $accent; text-style: bold; }
        & > .model--warning { color: $warning; text-style: bold; }
    }
    """

    def build(self, state) -> Text:
        label = self.style_of("model--label")
        value = self.style_of("model--value")
        muted = self.style_of("model--muted")
        facts = state.facts
        out = Text()
        if facts is None:
            if state.phase == "load-failed":
                return Text("no model loaded: see the error\nr retry · m another model or device · q quit",
                            style=self.style_of("model--warning"))
            return Text("loading…", style=muted)

        def row(name: str, val: str, extra: str = "") -> None:
            if out:
                out.append("\n")
            out.append(f"{name:<13}", label)
            out.append(val, value)
            if extra:
                out.append(f" {extra}", muted)

        out.append(facts.name, self.style_of("model--name"))
        row("architecture", facts.architecture)
        row("parameters", human_count(facts.parameters), f"({facts.parameters:,})")
        row("layers", f"{facts.layers}", f"· hidden {facts.hidden_size:,}")
        row("attention", f"{facts.attention_heads} heads", f"· {facts.kv_heads} kv · dim {facts.head_dim}")
        row("vocab rows", f"{facts.vocab_rows:,}")
        row("context", f"{facts.max_context:,}", "tokens")
        row("device", facts.device, f"· {facts.dtype}")
        row("source", facts.source, f"· loaded {facts.load_seconds:.1f} s" if facts.load_seconds else "")
        if facts.trust_remote_code:
            out.append("\n")
            out.append("⚠ trust-remote-code: runs the model's own code", self.style_of("model--warning"))
        out.append("\n")
        prompt_tokens = len(state.prompt.ids) if state.prompt else 0
        answer_tokens = state.done.tokens if state.done else state.steps
        runs = state.model_runs
        row("prompt", f"{prompt_tokens:,}", "tokens")
        row("answer", f"{answer_tokens:,}", "tokens")
        decodes = max(0, runs - 1)
        row("model runs", f"{runs:,}", f"(prefill + {decodes:,} decode{'s' if decodes != 1 else ''})" if runs else "")
        out.append("\n")
        out.append("scores computed (vocab rows × runs)", label)
        out.append("\n")
        out.append(f"{runs:,} run{'s' if runs != 1 else ''} × {facts.vocab_rows:,} = ", muted)
        out.append(f"{state.scores:,}", value)
        out.append(" scores", muted)
        if state.runs_started > 1:
            row("answers", f"{state.runs_started:,}", "this session")
        return out
