"""One display form for a token (core/steps/display.py `display_text`, used by the engine and every panel) and
`Candidate.special`, set by the engine from the tokenizer's special tokens and drawn by the candidates panel."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fakes import ScriptedEngine, make_loader, wait_for
from tokentui.core.steps.display import display_text
from tokentui.core.runs.events import StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.panels import CandidatesPanel


# ---- the one display mapping ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, shown", [
    (" Open", "␣Open"),
    ("  ", "␣␣"),  # every space, not only a leading one
    ("\n", "↵"),
    ("\t", "⇥"),
    ("\r\n", "␍↵"),
    ("\x00", "<0x00>"),
    ("a\x1bb", "a<0x1B>b"),  # an escape would move the terminal's cursor
    ("\x7f", "<0x7F>"),
    ("", "∅"),  # never a blank cell
    ("开放", "开放"),
    ("␣Open", "␣Open"),  # already in display form: unchanged
    ("<0xE5>", "<0xE5>"),
])
def test_display_text(text, shown):
    assert display_text(text) == shown
    assert display_text(shown) == shown  # the engine's pieces are shown by the panels as they are


def test_the_dashboard_has_no_display_mapping_of_its_own():
    import tokentui.tui.format as tui_format

    assert not hasattr(tui_format, "display_piece")


# ---- Candidate.special from the engine -----------------------------------------------------------------------

def test_embedded_first_step_candidates_flag_the_tokenizers_special_tokens(embedded):
    from tokentui.core.model.engine import Engine

    tokenizer = embedded.tokenizer
    vocab = embedded.facts.vocab_rows
    engine = Engine(embedded, SamplerSettings(greedy=True), RunOptions(max_new_tokens=1, top_candidates=vocab))
    step = next(e for e in engine.run("Is OpenAI open?") if isinstance(e, StepEvent))
    by_id = {c.id: c for c in step.candidates}
    assert len(by_id) == vocab  # every token is a candidate: the special ones are among them
    end = by_id[2]
    assert end.piece == "<|im_end|>" and end.special and tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    # the oracle: the tokenizer's own table of special tokens
    special = {i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special}
    special |= set(tokenizer.all_special_ids)
    assert {c.id for c in step.candidates if c.special} == special
    assert 2 in special and len(special) > 3
    # not guessed from the piece: SmolLM2's `<file_sep>` is special, yet does not look like <|…|>
    file_sep = tokenizer.convert_tokens_to_ids("<file_sep>")
    assert by_id[file_sep].special and not by_id[file_sep].piece.startswith("<|")
    top = step.candidates[0]
    words = [c for c in step.candidates[:10] if c.piece.strip("␣").isalpha()]
    assert top.id == step.id and not top.special and len(words) >= 5 and not any(c.special for c in words)


# ---- the candidates panel draws `special`, not a guess --------------------------------------------------------

class RenamedCandidates(ScriptedEngine):
    """The scripted answer, with two of the first step's candidates renamed: a special token whose name does
    not look like <|…|>, and an ordinary token whose text does."""

    RENAMED = {5264: ("<file_sep>", True), 2753: ("<|lookalike|>", False)}

    def _run(self, prompt, system, run_id):
        for event in super()._run(prompt, system, run_id):
            if isinstance(event, StepEvent):
                event = replace(event, candidates=[
                    replace(c, piece=self.RENAMED[c.id][0], special=self.RENAMED[c.id][1]) if c.id in self.RENAMED
                    else c for c in event.candidates])
            yield event


def styles_at(text, needle: str) -> list:
    """The styles of the spans that cover the first occurrence of `needle` in the rich Text `text`."""
    start = text.plain.index(needle)
    end = start + len(needle)
    return [span.style for span in text.spans if span.start <= start and span.end >= end]


async def test_the_candidates_panel_draws_special_candidates_in_the_special_style():
    engine = RenamedCandidates(sampler=SamplerSettings(greedy=True), options=RunOptions(max_new_tokens=1))
    app = TokentuiApp(DashboardConfig(load=make_loader(engine), user_theme_dir=None, recorder=None,
                                      sampler=engine.sampler, options=engine.options))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.pause()
        panel = app.query_one(CandidatesPanel)
        text = panel.last_text
        special_style = panel.style_of("candidates--special")
        assert special_style.color is not None  # the theme's special-token colour
        assert special_style in styles_at(text, "<file_sep>")
        assert special_style not in styles_at(text, "<|lookalike|>")
        assert special_style not in styles_at(text, "Part")
