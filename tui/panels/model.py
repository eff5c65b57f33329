"""The model's facts and the run's totals: tokens, model runs and scores computed (vocab rows × runs)."""

from __future__ import annotations

import textwrap

from rich.text import Text

from tokentui.core.runs.facts import SHORT_DTYPES
from ..format import fitting, human_count, shorter_form
from ..served import (CLIENT_MEASURED, DASH, LEGEND, NOT_REPORTED, prefix_caching, prob_detail, prob_name,
                      server_of, wrap)
from .base import Panel

# the model's numbers a server may not report: (field, how the panel names it)
SERVED_NUMBERS = (("parameters", "parameters"), ("layers", "layers"), ("hidden_size", "hidden size"),
                  ("attention_heads", "attention heads"), ("kv_heads", "kv heads"), ("head_dim", "head dim"),
                  ("vocab_rows", "vocab rows"))


def block_rows(facts) -> list[tuple[str, str, str]]:
    """What the blocks are where they are not all alike attention + MLP (core/runs/architecture.py): the kinds of
    mixer (`3 linear attention + 1 attention`), the experts, the windows."""
    anatomy, groups = getattr(facts, "anatomy", None), getattr(facts, "kv_groups", None) or []
    if anatomy is None:
        return []
    rows = []
    counts: dict[str, int] = {}
    for block in anatomy.blocks:
        counts[block.mixer] = counts.get(block.mixer, 0) + len(block.layers)
    if set(counts) != {"attention"}:
        names = {b.mixer: b.mixer_name for b in anatomy.blocks}
        extra = f"({names[next(iter(counts))]})" if len(counts) == 1 and names[next(iter(counts))] else ""
        short = {"linear attention": "linear attn", "latent attention": "MLA attention"}
        rows.append(("blocks", " + ".join(f"{n} {short.get(kind, kind)}" for kind, n in counts.items()), extra))
    moe = [b for b in anatomy.blocks if b.mlp == "MoE"]
    if moe:
        b = moe[0]
        layers = sum(len(m.layers) for m in moe)
        shared = f" + {b.shared_experts} shared" if b.shared_experts else ""
        rows.append(("experts", f"top-{b.top_k} of {b.experts}{shared}",
                     f"in {layers} of {facts.layers} layers" if layers != facts.layers else ""))
    for g in groups:
        if g.window is not None:
            rows.append(("window", f"{g.kind} {g.window:,}",
                         f"in {len(g.layers)} of {facts.layers} layers" if len(g.layers) != facts.layers else ""))
    return rows


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
        muted = self.style_of("model--muted")
        facts = state.facts
        if facts is None:
            if state.phase == "load-failed":
                return Text("no model loaded: see the error\nr retry · m another model or device · q quit",
                            style=self.style_of("model--warning"))
            return Text("loading…", style=muted)

        width = max(20, self.content_size.width or 40)
        height = self.content_size.height or 0  # 0: not laid out yet (everything)
        server = server_of(facts)
        if server is not None:  # a served model: what its server says, and where the numbers come from
            out = Text()
            out.append(facts.name, self.style_of("model--name"))
            self._served(state, facts, server, self._row_writer(out, width), out)
            return out
        # Nothing is cut off the bottom (the totals are last): where the panel is short (a tall prompt panel, the
        # one-pass row), the rows are put closer together, then the model's facts give way — said in a line.
        for compact in (0, 1, 2):
            out = self._local(state, facts, width, compact)
            if not height or len(out.plain.splitlines()) <= height:
                return out
        return self._local(state, facts, width, 2, height)

    def _row_writer(self, out: Text, width: int):
        label = self.style_of("model--label")
        value = self.style_of("model--value")
        muted = self.style_of("model--muted")

        def row(name: str, val: str, extra: str | tuple[str, ...] = "", optional: bool = False) -> None:
            """One row, never cut (issue 40: "model runs 102 (prefill + 101 dec…" at 120×30): `extra` (or the
            first of its shorter wordings that fits) where it fits, else its clauses that fit; an `optional` extra
            that does not goes, any other goes on a line of its own under the value. A value wider than the panel
            goes on as many lines as it needs."""
            if out:
                out.append("\n")
            out.append(f"{name:<13}", label)
            room = max(10, width - 13)
            parts = textwrap.wrap(val, room, break_on_hyphens=False) or [""]
            out.append(parts[0], value)
            for part in parts[1:]:
                out.append("\n" + " " * 13)
                out.append(part, value)
            forms = (extra,) if isinstance(extra, str) else extra
            if not forms[0]:
                return
            left = width - 13 - len(parts[-1]) - 1
            said = fitting(forms, left) or shorter_form(forms[0], left)
            if said:
                out.append(f" {said}", muted)
            elif not optional:
                for part in textwrap.wrap(forms[0].removeprefix("· "), room, break_on_hyphens=False):
                    out.append("\n" + " " * 13)
                    out.append(part, muted)

        return row

    def _local(self, state, facts, width: int, compact: int, height: int = 0) -> Text:
        """The panel of a model loaded here. compact 0: every row, the totals apart; 1: no blank lines, the scores
        on one row; 2: also the context beside the vocabulary and the tokens on one row. height: the facts beyond
        what leaves the totals room are left out, and a line names them."""
        muted = self.style_of("model--muted")
        facts_out = Text()
        row = self._row_writer(facts_out, width)
        self._model_name(facts.name, facts_out, width)
        row("architecture", facts.architecture)
        row("parameters", human_count(facts.parameters), f"({facts.parameters:,})")
        row("layers", f"{facts.layers}", f"· hidden {facts.hidden_size:,}")
        if facts.attention_heads:
            kv = f"· {facts.kv_heads} kv · dim {facts.head_dim}" if facts.kv_heads else "· a latent KV (MLA)"
            row("attention", f"{facts.attention_heads} heads", kv)
        for name, val, extra in block_rows(facts):
            row(name, val, extra, optional=True)
        context = f"{facts.max_context:,}" if facts.max_context else "—"
        if compact >= 2:
            row("vocab rows", f"{facts.vocab_rows:,}", f"· context {context}")
        else:
            row("vocab rows", f"{facts.vocab_rows:,}")
            row("context", context, "tokens" if facts.max_context else "no limit in the config")
        # a 4-bit model's float parts are in facts.dtype; its matrices are 4-bit (issue 40: "cpu · float32" alone
        # for a 4-bit model), their scales and activations said in the border (QuantFacts, one source)
        quant = facts.quantization
        dtype = f"· {facts.dtype}"
        # several formats (a Q4_K_M file) have no one width: "quantized", the formats row says which
        bits = None if quant is None else "quantized" if "+" in quant.blocks else f"{quant.bits}-bit"
        row("device", facts.device, (f"{dtype} + {bits} weights", f"{dtype} + {bits}") if quant is not None else dtype)
        if facts.decode_plan:  # which decode step runs and why (core/model/decode/plan.py): its name, then the why
            step, _, why = facts.decode_plan.partition(": ")
            if 13 + len(step) + 1 + len(why) <= width:
                row("decode", step, why)
            else:  # the why on lines of its own under the value, whole (a cut one would mislead); the most
                row("decode", step)  # compact form leaves it out
                if compact < 2:
                    for line in textwrap.wrap(why, max(10, width - 13)):
                        facts_out.append("\n" + " " * 13 + line, muted)
        dequantized = facts.dequantized_from
        if quant is not None:  # 4-bit weights as the file stores them: what is the file's and what is rounded
            self._weights(quant, row)
        else:
            self.border_subtitle = ""
            if dequantized:  # a GGUF's blocks de-quantized at load to the device row's dtype (float32: the reference)
                row("weights", f"{dequantized} de-quantized")
        row("source", facts.source, (f"· loaded {facts.load_seconds:.1f} s", f"· {facts.load_seconds:.1f} s")
            if facts.load_seconds else "")
        if facts.trust_remote_code:
            facts_out.append("\n")
            facts_out.append("⚠ trust-remote-code: runs the model's own code", self.style_of("model--warning"))

        totals = Text()
        row = self._row_writer(totals, width)
        prompt_tokens = len(state.prompt.ids) if state.prompt else 0
        answer_tokens = state.done.tokens if state.done else state.steps
        runs = state.model_runs
        if compact >= 2:
            row("tokens", f"{prompt_tokens:,}", f"prompt + {answer_tokens:,} answer")
        else:
            row("prompt", f"{prompt_tokens:,}", "token" if prompt_tokens == 1 else "tokens")
            row("answer", f"{answer_tokens:,}", "token" if answer_tokens == 1 else "tokens")
        decodes = max(0, runs - 1)
        row("model runs", f"{runs:,}", (f"(prefill + {decodes:,} decode{'s' if decodes != 1 else ''})",
                                         f"(prefill + {decodes:,})") if runs else "")
        if compact:
            row("scores", f"{state.scores:,}", f"= {runs:,} runs × {facts.vocab_rows:,}", optional=True)
        else:
            totals.append("\n")
            totals.append("scores computed (vocab rows × runs)", self.style_of("model--label"))
            totals.append("\n")
            totals.append(f"{runs:,} run{'s' if runs != 1 else ''} × {facts.vocab_rows:,} = ", muted)
            totals.append(f"{state.scores:,}", self.style_of("model--value"))
            totals.append(" scores", muted)
        if state.runs_started > 1:
            row("answers", f"{state.runs_started:,}", "this session")

        gap = "\n" if compact else "\n\n"
        if height:
            room = height - len(totals.plain.splitlines()) - 1  # a line says what was left out
            lines = facts_out.split("\n")
            if room < len(lines):
                kept = lines[:max(1, room)]
                names = [line.plain[:13].strip() or line.plain.strip()[:12] for line in lines[len(kept):]]
                facts_out = Text("\n").join(kept)
                facts_out.append("\n")
                facts_out.append(f"… no room for: {', '.join(names)}", muted)
        out = facts_out
        out.append(gap)
        out.append_text(totals)
        return out

    def _model_name(self, name: str, out: Text, width: int) -> None:
        """The model's name: whole where it fits; else without its parenthesis (`(Q4_1 GGUF, embedded)`: the
        weights and source rows say it); a name wider than the panel still, on as many lines as it needs."""
        if len(name) > width and " (" in name and name.endswith(")"):
            name = name[:name.index(" (")]
        out.append("\n".join(textwrap.wrap(name, width, break_on_hyphens=False) or [name]),
                   self.style_of("model--name"))

    def _weights(self, quant, row) -> None:
        """The record's QuantFacts.summary() in the panel's width: "weights  Q4_1 as stored · 4-bit g32" (or "int4
        quantized here", --quantize) and, in the
        bottom border, "bf16 scales · bf16 activations"."""
        shape = (f"· {quant.bits}-bit", ) if quant.scale_dtype == "none" else (f"· {quant.bits}-bit g{quant.group}",
                                                                               f"· {quant.bits}-bit")
        row("weights", quant.stored_words(), "" if "+" in quant.blocks else shape)  # several formats: no one shape
        if quant.formats:  # a GGUF run as stored: each format's matrices and bytes, whole, under the row
            row("formats", quant.formats.split(";")[0])
        activations = f"{SHORT_DTYPES.get(quant.activation_dtype, quant.activation_dtype)} activations"
        self.border_subtitle = (activations if quant.scale_dtype == "none" else
                                f"{SHORT_DTYPES.get(quant.scale_dtype, quant.scale_dtype)} scales · {activations}")

    def _served(self, state, facts, server, row, out: Text) -> None:
        """A model watched on a server (`--server`): the engine, its URL, the served model, the context if the
        server says it, what its probabilities are, whether it caches prefixes; the model's numbers the server does
        not report are named as such (never estimated); the answer's totals, with the requests tokentui made."""
        muted = self.style_of("model--muted")
        width = max(20, self.content_size.width or 36)
        row("engine", server.engine, server.version or "")
        row("server", server.url)
        if server.model != facts.name:  # the name the server lists the model by (the title when they agree)
            row("served as", server.model)
        row("context", f"{facts.max_context:,}" if facts.max_context else DASH,
            "tokens" if facts.max_context else "")
        row("probs", prob_name(server))
        out.append("\n")
        out.append("  " + prob_detail(server), muted)
        caching = prefix_caching(server)
        row("prefix cache", caching or DASH)
        missing = [name for name, value in (("architecture", facts.architecture), ("dtype", facts.dtype))
                   if not value or value == NOT_REPORTED]
        if "architecture" not in missing:
            row("architecture", facts.architecture)
        for field, name in SERVED_NUMBERS:  # what the server does report (llama.cpp: parameters, vocabulary...)
            value = getattr(facts, field)
            if value is None:
                missing.append(name)
            elif field == "parameters":
                row(name, human_count(value), f"({value:,})")
            else:
                row(name, f"{value:,}")
        if "dtype" not in missing:
            row("dtype", facts.dtype)
        if missing:
            for line in wrap(f"{NOT_REPORTED}: " + ", ".join(missing), width):
                out.append("\n")
                out.append(line, muted)
        if DASH in out.plain:  # a "—" above: say what it means
            out.append("\n")
            out.append(LEGEND, muted)
        out.append("\n")
        prompt_tokens = len(state.prompt.ids) if state.prompt else 0
        answer_tokens = state.done.tokens if state.done else state.steps
        row("prompt", f"{prompt_tokens:,}", "token" if prompt_tokens == 1 else "tokens")
        row("answer", f"{answer_tokens:,}", "token" if answer_tokens == 1 else "tokens")
        if state.prompt is not None:
            requests = 1 + state.reissues
            extra = f"({state.reissues:,} re-issued from the prefix)" if state.reissues else ""
            if 13 + len(f"{requests:,}") + 1 + len(extra) > width:
                extra = f"({state.reissues:,} re-issued)"
            row("requests", f"{requests:,}", extra)
        row("times", CLIENT_MEASURED, "by tokentui" if 13 + len(CLIENT_MEASURED) + 12 <= width else "")
        if state.runs_started > 1:
            row("answers", f"{state.runs_started:,}", "this session")
