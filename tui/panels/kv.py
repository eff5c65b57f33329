"""The KV cache: what prefill stored and every decode step adds (keys and values for each layer that caches per
position; a recurrent layer's fixed-size state), with the formula per kind of layer (core/runs/architecture.py)."""

from __future__ import annotations

from rich.text import Text

from tokentui.core.runs.architecture import formula_terms, kv_bytes_at, state_bytes

from ..format import human_bytes
from ..served import DASH, LEGEND, kv_usage_text, server_of
from .base import Panel


def kv_bytes_per_value(facts) -> int:
    """Bytes of one cached number (4 for float32, 2 for bf16), so 2 × layers × kv heads × head dim × this equals the
    per-token size shown. From the model facts; 0 (shown as ?) when they do not say and it cannot be derived exactly."""
    given = getattr(facts, "kv_bytes_per_value", 0)
    if given:
        return given
    values = 2 * facts.layers * facts.kv_heads * facts.head_dim
    return facts.kv_bytes_per_token // values if values and facts.kv_bytes_per_token % values == 0 else 0


def per_token_detail(groups, per_value: int) -> str:
    """After the per-token figure: what it becomes once the windows fill (`, 256 B past 15`), or that the model
    keeps a fixed-size state (` + 12.0 KiB fixed`)."""
    capped = [g for g in groups if g.cap is not None and g.per_position]
    state = state_bytes(groups, per_value) if per_value else None
    if capped and per_value:
        first = min(g.cap for g in capped)
        after = sum(len(g.layers) * g.per_position for g in groups if g.cap is None) * per_value
        return f", {human_bytes(after)} past {first:,}"
    if state:
        return f" + {human_bytes(state)} fixed"
    return ""


def formula_lines(facts, groups, per_value: int, width: int, room: int) -> list[str]:
    """The per-token formula, per kind of layer (core/runs/architecture.py `formula_terms`): one line when the
    terms fit (long words, else short), else a line per term while `room` lines allow."""
    value_part = f"×{per_value} B" if per_value else "×? B"
    if not groups:  # facts from before the layer kinds: plain attention in every layer
        formula = f"= 2×{facts.layers} layers×{facts.kv_heads} heads×{facts.head_dim}{value_part}"
        if len(formula) > width:
            formula = f"= 2×{facts.layers}L×{facts.kv_heads}h×{facts.head_dim}{value_part}"
        return [formula]
    terms = formula_terms(groups, per_value)
    if not terms:
        return ["= nothing cached per position"]
    for which in (0, 1):
        line = "= " + " + ".join(t[which] for t in terms)
        if len(line) <= width:
            return [line]
    lines = [("= " if n == 0 else "+ ") + (t[1] if len(t[1]) + 2 <= width else t[2]) for n, t in enumerate(terms)]
    if len(lines) > room:
        keep = max(1, room - 1)
        lines = lines[:keep] + ([f"+ {len(lines) - keep} more kinds of layer"] if room >= 2 else [])
    return lines


STILL = " (full windows / a fixed state)"  # a step that adds nothing, by the formula


class KVPanel(Panel):
    TITLE = "KV cache"

    COMPONENT_CLASSES = {"kv--label", "kv--value", "kv--muted", "kv--fill", "kv--empty"}

    DEFAULT_CSS = """
    KVPanel {
        & > .kv--label { color: $text-muted; }
        & > .kv--value { color: $accent; text-style: bold; }
        & > .kv--muted { color: $text-muted; }
        & > .kv--fill { color: $bar; }
        & > .kv--empty { color: $bar-raw; }
    }
    """

    def build(self, state) -> Text:
        label = self.style_of("kv--label")
        value = self.style_of("kv--value")
        muted = self.style_of("kv--muted")
        facts = state.facts
        width = max(10, self.content_size.width or 30)
        out = Text()
        if facts is None:
            return Text("filled by prefill, grown by every decode step", style=muted)
        # as of the step shown: the newest, or the one the time-travel cursor holds
        kv_tokens, kv_bytes, growth = state.view_kv
        viewed = state.view_step if not state.live else None
        self.border_subtitle = f"at step {viewed.index + 1}" if viewed is not None else ""
        prompt_tokens = len(state.prompt.ids) if state.prompt else 0
        server = server_of(facts)
        if server is not None:  # a served model: what tokentui counts, and what the server reports of its cache
            if viewed is None:
                self.border_subtitle = "tokens counted by tokentui"
            return self._served(state, facts, server, kv_tokens, prompt_tokens, width)
        self._tokens_row(out, kv_tokens, prompt_tokens, width)
        out.append("\nsize       ", label)
        out.append(human_bytes(kv_bytes), value)
        groups = getattr(facts, "kv_groups", None)
        per_value = kv_bytes_per_value(facts)
        out.append("\nper token  ", label)
        per_token = facts.kv_bytes_per_token
        out.append(human_bytes(per_token) if per_token is not None else "?", value)
        detail = per_token_detail(groups, per_value) if groups else ""
        if detail and 11 + len(human_bytes(per_token or 0)) + len(detail) <= width:
            out.append(detail, muted)
        height = max(1, self.content_size.height or 7)
        formula = formula_lines(facts, groups, per_value, width, room=max(1, height - 6))
        for line in formula:
            out.append("\n" + line, muted)
        if 6 + len(formula) <= height:  # the measured growth goes first when the formula needs the rows
            out.append("\ngrowth     ", label)
            still = bool(groups) and kv_tokens > 0 and per_value and kv_bytes_at(
                groups, kv_tokens, per_value) == kv_bytes_at(groups, kv_tokens - 1, per_value)
            out.append(f"+{human_bytes(growth)}" if growth or still else "—", value)
            out.append(" / step", muted)
            if still and not growth and 22 + len(STILL) <= width:
                out.append(STILL, muted)
        out.append("\ncontext    ", label)
        if not facts.max_context:  # the config sets no limit (ALiBi, a recurrent model): nothing to fill
            out.append("—", value)
            out.append(" no limit in the config", muted)
            return out
        fill = kv_tokens / facts.max_context
        out.append(f"{fill * 100:.2f}%", value)
        out.append(f" of {facts.max_context:,}", muted)
        out.append("\n")
        out.append_text(self.gauge(fill, width))
        return out

    def _tokens_row(self, out: Text, kv_tokens: int, prompt_tokens: int, width: int) -> None:
        """The first row: the tokens in the cache, and how many of them are the prompt's."""
        out.append("tokens     ", self.style_of("kv--label"))
        out.append(f"{kv_tokens:,}", self.style_of("kv--value"))
        if kv_tokens and prompt_tokens:
            rest = max(0, kv_tokens - prompt_tokens)
            detail = f"  ({prompt_tokens:,} prompt + {rest:,})"
            if 11 + len(f"{kv_tokens:,}") + len(detail) > width:
                detail = f" ({prompt_tokens:,}+{rest:,})"
            out.append(detail, self.style_of("kv--muted"))

    def _served(self, state, facts, server, kv_tokens: int, prompt_tokens: int, width: int) -> Text:
        """The tokens in context (the prompt and the tokens so far, counted by tokentui), the bytes "—" (no server
        reports them), the share of the server's KV cache in use where its metrics say it, and the context's fill
        when the server reports its length."""
        label = self.style_of("kv--label")
        value = self.style_of("kv--value")
        muted = self.style_of("kv--muted")
        out = Text()
        self._tokens_row(out, kv_tokens, prompt_tokens, width)
        out.append("\nsize       ", label)
        out.append(DASH, value)
        out.append(" · per token ", label)
        out.append(DASH, value)
        out.append("\nserver KV  ", label)
        usage = state.view_server_kv
        if usage is not None:
            fraction, _at = usage
            source = f" ({server.kv_source})" if server.kv_source else ""
            words = kv_usage_text(fraction)
            if 11 + len(words) + len(source) > width:
                source = ""
            out.append(words, value)
            out.append(source, muted)
        elif server.kv_source and 11 + len(f"{DASH} (none yet from {server.kv_source})") <= width:
            out.append(f"{DASH} (none yet from {server.kv_source})", muted)  # it has one, not reported yet
        else:
            out.append(DASH, value)
        out.append("\ncontext    ", label)
        if facts.max_context:
            fill = kv_tokens / facts.max_context
            out.append(f"{fill * 100:.2f}%", value)
            out.append(f" of {facts.max_context:,}", muted)
            out.append("\n")
            out.append_text(self.gauge(fill, width))
        else:
            out.append(DASH, value)
        out.append("\n")
        out.append(LEGEND, muted)
        return out

    def gauge(self, fill: float, width: int) -> Text:
        cells = width
        filled = fill * cells
        full = int(filled)
        if fill > 0 and full == 0:
            full = 1  # never show a used cache as empty
        text = Text()
        text.append("█" * min(full, cells), self.style_of("kv--fill"))
        text.append("░" * max(0, cells - full), self.style_of("kv--empty"))
        return text
