"""The dashboard watching a served model (`--server URL`, issue 15): a scripted served run — ModelFacts with a
ServerFacts and None for what the server does not report, candidates with one probability (raw, post-sampler, or
not said which), a chosen token outside the server's top N, a request re-issued from the prefix, the server's KV
cache use on some steps — drawn at 80×24 and 160×48. What is asserted is what the user sees: every unknown says
"not reported by the server" (or "—" with that legend), the probability is labelled as the server gives it and never
as the other, the re-issue is marked with its TTFT, the one-pass and lens panels say they are not available, and
"None" is never on screen."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from fakes import ScriptedEngine, make_loader, screen_text, wait_for
from noting_app import NotingApp

from tokentui.core.runs.events import Candidate, DoneEvent, PrefillEvent, StepEvent
from tokentui.core.runs.facts import ModelFacts, ServerFacts
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.tui import DashboardConfig
from tokentui.tui.panels import (
    AnatomyPanel,
    CandidatesPanel,
    KVPanel,
    LensPanel,
    ModelPanel,
    ReadingsStrip,
    SpeedPanel,
    StatusLine,
)
from tokentui.tui.panels.speed import REISSUE_FLAG
from tokentui.tui.state import RunState

TOP_N = 5  # alternatives the server reports per token
NOT_IN_TOP = 3  # the step (0-based) whose chosen token the server leaves out of its top N
REISSUE_AT = 6  # the step (0-based) that began a request re-issued from the prefix
REISSUE_TTFT = 12.3
KV_USAGE = {2: 0.07, 8: 0.12}  # the server's KV cache use, reported on these steps only
SMALL, LARGE = (80, 24), (160, 48)
LABELS = {"raw": "raw p", "post-sampler": "post p", "unknown": "p"}


def served_facts(probs: str, prefix_caching: bool | None = False, kv_source: str | None = "/metrics",
                 **numbers) -> ModelFacts:
    """As core/server/probe.py reports a server: None for every number it does not report (`numbers`: the ones
    it does), the architecture and dtype "not reported by the server" unless given."""
    server = ServerFacts(url="http://127.0.0.1:8080", engine="llama.cpp", model="qwen3-0.6b-q8_0.gguf", probs=probs,
                         top_logprobs=TOP_N, version="b5460", prefix_caching=prefix_caching, kv_source=kv_source)
    fields = dict(parameters=None, layers=None, hidden_size=None, vocab_rows=None, attention_heads=None,
                  kv_heads=None, head_dim=None, architecture="not reported by the server",
                  dtype="not reported by the server") | numbers
    return ModelFacts(name="qwen3-0.6b-q8_0.gguf", source="server", kv_bytes_per_token=None, max_context=4096,
                      device="llama.cpp server", chat_template=True, server=server, **fields)


class ServedEngine(ScriptedEngine):
    """The scripted engine's run as a server would report it (tests/fakes.py plays it; this reshapes its events):
    one probability per candidate (`probs` says which), the top TOP_N only, nothing the server does not measure."""

    def __init__(self, probs: str, prefix_caching: bool | None = False, delay: float = 0.0,
                 options: RunOptions | None = None, **facts) -> None:
        super().__init__(delay=delay, options=options, sampler=SamplerSettings(temperature=0.7),
                         facts=served_facts(probs, prefix_caching, **facts))
        self.probs = probs

    def _run(self, prompt: str, system: str | None, run_id: int):
        for event in super()._run(prompt, system, run_id):
            if isinstance(event, PrefillEvent):
                event = replace(event, kv_bytes=None)
            elif isinstance(event, StepEvent):
                event = self._served(event)
            elif isinstance(event, DoneEvent):
                event = replace(event, kv_bytes=None, scores=None)
            yield event

    def _one(self, raw: float, post: float) -> tuple[float | None, float | None]:
        return (raw, None) if self.probs == "raw" else (None, post)

    def _served(self, step: StepEvent) -> StepEvent:
        cands = [Candidate(c.id, c.piece, *self._one(c.raw_prob, c.prob), special=c.special)
                 for c in step.candidates[:TOP_N]]
        rank = step.chosen_rank if step.chosen_rank < TOP_N else None
        if step.index == NOT_IN_TOP:  # the server's top N leaves the chosen token out
            cands = [c for c in step.candidates if c.id != step.id][:TOP_N]
            cands = [Candidate(c.id, c.piece, *self._one(c.raw_prob, c.prob), special=c.special) for c in cands]
            rank = None
        raw, post = self._one(step.chosen_raw_prob, step.chosen_prob)
        return replace(step, candidates=cands, chosen_rank=rank, chosen_raw_prob=raw, chosen_prob=post,
                       kept_count=None, kept_mass=None, entropy_bits=None, sampled_entropy_bits=None,
                       forward_ms=None, kv_bytes=None, timing=None, lens=None, temp_entropy_bits=None,
                       top_k_kept=None, top_p_kept=None,
                       reissue_ttft_ms=REISSUE_TTFT if step.index == REISSUE_AT else None,
                       server_kv_usage=KV_USAGE.get(step.index) if self.facts.server.kv_source else None)


class ServedApp(NotingApp):
    CURSOR_BLINK = False


def served_app(probs: str, prefix_caching: bool | None = False, **engine) -> ServedApp:
    """The dashboard on a ServedEngine (`engine`: its keyword arguments, the facts' too)."""
    engine = ServedEngine(probs, prefix_caching, **engine)
    config = DashboardConfig(load=make_loader(engine), sampler=engine.sampler, options=engine.options,
                             user_theme_dir=None, recorder=None)
    app = ServedApp(config)
    app.engine = engine
    return app


async def finished(pilot) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the served run to finish")
    await pilot.pause(0.1)
    app.redraw()
    await pilot.pause(0.3)  # the plot's throttled redraw


async def view(pilot, position: int) -> None:
    """Hold the time-travel cursor at `position` (0-based), by keys: < to the first step, then ]."""
    await pilot.press("less_than_sign", *["right_square_bracket"] * position)
    await pilot.pause(0.1)
    pilot.app.redraw()
    await pilot.pause(0.3)


def plain(app, panel) -> str:
    return app.query_one(panel).last_text.plain


def assert_no_none(text: str) -> None:
    assert not re.search(r"\bNone\b", text), text


# ---- one test per probability the server gives ---------------------------------------------------------------

@pytest.mark.parametrize("probs", ["raw", "post-sampler", "unknown"])
async def test_served_run_at_80x24(probs):
    app = served_app(probs)
    async with app.run_test(size=SMALL) as pilot:
        await finished(pilot)
        screen = screen_text(app)
        assert_no_none(screen)
        cands = plain(app, CandidatesPanel)
        header = cands.splitlines()[0]
        assert header.split()[-1] == LABELS[probs].split()[-1] and LABELS[probs] in header
        assert "not reported by the server" in cands  # the legend of its "—"
        assert "entropy —" in cands and "kept —" in cands
        if probs == "raw":
            assert "post p" not in cands and "post-sampler p —" in cands  # the other one: not reported
        elif probs == "post-sampler":
            assert "raw p —" in cands and "raw p " not in header
        else:  # never called raw or post-sampler: it says it does not know which
            assert "raw p" not in cands and "post p" not in cands
            assert "does not say whether raw or post-sampler" in " ".join(cands.split())
        # the strip: tokens counted, times client-measured, the legend under it
        strip = app.query_one(ReadingsStrip)
        assert "KV 26 tok" in strip.last_text.plain  # 13 prompt tokens + 13 fed back (the 14th was never fed)
        assert "12% in use" in strip.last_text.plain
        assert "not reported by the server" in str(strip.border_subtitle)
        assert "client-measured" in str(strip.border_subtitle)
        assert "None" not in str(strip.border_subtitle)


@pytest.mark.parametrize("probs", ["raw", "post-sampler", "unknown"])
async def test_served_run_at_160x48(probs):
    app = served_app(probs, prefix_caching=None)
    async with app.run_test(size=LARGE) as pilot:
        await finished(pilot)
        screen = screen_text(app)
        assert_no_none(screen)
        model = plain(app, ModelPanel)
        assert "llama.cpp" in model and "b5460" in model and "http://127.0.0.1:8080" in model
        assert "qwen3-0.6b-q8_0.gguf" in model and "4,096" in model
        words = " ".join(model.split())
        assert "not reported by the server: architecture, dtype, parameters, layers, hidden size" in words
        assert "vocab rows" in words
        assert "client-measured" in model
        said = {"raw": "raw", "post-sampler": "post-sampler", "unknown": "not said"}[probs]
        assert f"probs        {said}\n" in model  # the row names what the server gives, and only that
        if probs == "raw":
            assert "before the sampler chain" in model and "post-sampler" not in model
        elif probs == "post-sampler":
            assert "after the sampler chain" in model and "raw" not in model
        else:
            assert "raw or post-sampler: not said" in model and "temperature" not in model
        speed = app.query_one(SpeedPanel)
        assert "client-measured" in speed.last_text.plain + str(speed.border_subtitle)
        kv = plain(app, KVPanel)
        assert "26" in kv and "12% in use" in kv and "not reported by the server" in kv
        assert "size       —" in kv
        # the one-pass row, on by default at this size for a local model, is off for a served one; `a` shows it
        assert not app.query_one("#anatomy").display and "not available for a served model" not in screen
        await pilot.press("a")
        await pilot.pause(0.2)
        anatomy = plain(app, AnatomyPanel)
        assert "not available for a served model" in anatomy


# ---- the re-issued request ---------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [SMALL, LARGE])
async def test_reissued_step_is_marked_with_its_ttft(size):
    app = served_app("raw", prefix_caching=False)
    async with app.run_test(size=size) as pilot:
        await finished(pilot)
        speed = app.query_one(SpeedPanel)
        if size == LARGE:
            assert speed.plot.flags == [REISSUE_AT + 1]  # flagged over its step in the plot
            assert REISSUE_FLAG in str(speed.border_subtitle)
        await view(pilot, REISSUE_AT)
        status = app.query_one(StatusLine).last_text.plain
        assert f"TTFT {REISSUE_TTFT} ms" in status and "re-issued" in status
        assert "(prefix caching off)" in status
        if size == LARGE:
            assert "re-issued from the prefix: TTFT 12.3 ms (prefix caching off)" in screen_text(app)
            assert "re-issued" in speed.last_text.plain and "12.3 ms" in speed.last_text.plain
            assert "requests" in plain(app, ModelPanel) and "1 re-issued from the prefix" in plain(app, ModelPanel)
        assert_no_none(screen_text(app))
        await view(pilot, REISSUE_AT + 1)  # the step after it: no longer said
        assert "re-issued" not in app.query_one(StatusLine).last_text.plain


async def test_reissue_without_a_word_on_prefix_caching():
    app = served_app("post-sampler", prefix_caching=None)
    async with app.run_test(size=LARGE) as pilot:
        await finished(pilot)
        await view(pilot, REISSUE_AT)
        assert "(prefix caching not reported)" in app.query_one(StatusLine).last_text.plain
        assert "prefix cache —" in plain(app, ModelPanel)


async def test_reissue_with_prefix_caching_on_names_no_caveat():
    app = served_app("raw", prefix_caching=True)
    async with app.run_test(size=LARGE) as pilot:
        await finished(pilot)
        await view(pilot, REISSUE_AT)
        status = app.query_one(StatusLine).last_text.plain
        assert "TTFT 12.3 ms" in status and "prefix caching" not in status
        assert "prefix cache on" in plain(app, ModelPanel)


# ---- the chosen token outside the server's top N, KV cache use as of a past step ---------------------------

@pytest.mark.parametrize("probs", ["raw", "post-sampler", "unknown"])
async def test_chosen_token_outside_the_top_n(probs):
    app = served_app(probs)
    async with app.run_test(size=SMALL) as pilot:
        await finished(pilot)
        await view(pilot, NOT_IN_TOP)
        cands = plain(app, CandidatesPanel)
        assert f"not in the server's top {TOP_N}" in cands
        assert "▶" not in cands  # not among the rows
        assert_no_none(screen_text(app))


async def test_server_kv_use_as_of_the_step_in_view():
    app = served_app("raw")
    async with app.run_test(size=LARGE) as pilot:
        await finished(pilot)
        await view(pilot, 1)  # before any report
        kv = plain(app, KVPanel)
        assert "server KV  —" in kv and "in use" not in kv
        await view(pilot, 5)  # the report of step 3 still holds
        assert "7% in use" in plain(app, KVPanel)
        assert_no_none(screen_text(app))


# ---- the lens and branching ------------------------------------------------------------------------------------

async def test_lens_says_it_is_not_available_and_asks_nothing_of_the_server():
    app = served_app("raw")
    async with app.run_test(size=SMALL) as pilot:
        await finished(pilot)
        await pilot.press("l")
        await pilot.pause(0.2)
        assert "not available for a served model" in plain(app, LensPanel)
        assert "hidden states" in plain(app, LensPanel)
        assert app.client.options.logit_lens is False
        assert not [n for n in app.toasts if n.severity == "error"]


async def test_heat_map_colours_by_the_probability_the_server_gives():
    app = served_app("post-sampler")
    async with app.run_test(size=LARGE) as pilot:
        await finished(pilot)
        await pilot.press("h")
        await pilot.pause(0.2)
        from tokentui.tui.panels import OutputPanel

        assert "heat: post p" in str(app.query_one(OutputPanel).border_subtitle)
        assert_no_none(screen_text(app))


# ---- what a server does report, and the rest ----------------------------------------------------------------

async def test_model_panel_shows_the_numbers_a_server_reports():
    app = served_app("raw", prefix_caching=True, parameters=596_049_920, hidden_size=1024, vocab_rows=151_936,
                     architecture="qwen3")
    async with app.run_test(size=LARGE) as pilot:
        await finished(pilot)
        model = plain(app, ModelPanel)
        assert "architecture qwen3" in model and "596M (596,049,920)" in model
        assert "hidden size  1,024" in model and "vocab rows   151,936" in model
        assert "not reported by the server: dtype, layers, attention heads, kv heads, head dim" in " ".join(
            model.split())
        assert "prefix cache on" in model and "engine       llama.cpp b5460" in model
        assert_no_none(screen_text(app))


async def test_kv_panel_says_when_the_server_reports_no_kv_figure():
    app = served_app("raw", kv_source=None)
    async with app.run_test(size=LARGE) as pilot:
        await finished(pilot)
        kv = plain(app, KVPanel)
        assert "server KV  —" in kv and "— not reported by the server" in kv and "/metrics" not in kv
        assert str(app.query_one(KVPanel).border_subtitle) == "tokens counted by tokentui"


async def test_merged_step_says_the_server_gave_no_probabilities():
    engine = ServedEngine("raw")
    state = RunState()
    state.apply(engine.facts)
    state.start_run()
    for event in engine.run("Is OpenAI open?"):
        if isinstance(event, StepEvent) and event.index == 2:
            event = replace(event, candidates=[], chosen_raw_prob=None, chosen_rank=None, latency_ms=0.0, merged=True)
        state.apply(event)
    app = served_app("raw")
    async with app.run_test(size=SMALL) as pilot:
        await finished(pilot)
        app.branch_tree.shown_branch.state = state
        state.cursor_go(2)
        app.redraw()
        await pilot.pause(0.2)
        cands = " ".join(plain(app, CandidatesPanel).split())
        assert "merged" in cands and "no probabilities" in cands
        assert_no_none(screen_text(app))


# ---- the state under the panels ---------------------------------------------------------------------------

def served_state(until: int | None = None) -> RunState:
    engine = ServedEngine("raw")
    state = RunState()
    state.apply(engine.facts)
    state.start_run()
    for event in engine.run("Is OpenAI open?"):
        state.apply(event)
        if until is not None and getattr(event, "index", None) == until:
            break
    return state


def test_state_skips_what_the_server_does_not_report():
    state = served_state()
    assert state.kv_bytes is None and state.kv_growth == 0 and state.kv_tokens == 26
    assert state.scores is None  # no vocabulary size: no count of scores
    assert state.reissues == 1 and state.reissue_steps(0, len(state.run)) == [REISSUE_AT + 1]
    assert state.server_kv == (KV_USAGE[8], 8)
    assert [t.heat_prob is not None for t in state.tokens] == [True] * len(state.run)
    state.cursor_go(5)
    assert state.view_kv == (18, None, 0)
    assert state.view_server_kv == (KV_USAGE[2], 2)
    state.cursor_go(1)
    assert state.view_server_kv is None
    assert state.latency_stats()["tok_s"] is not None


def test_status_line_names_a_reissue_while_paused_at_80_columns():
    state = served_state(until=REISSUE_AT)
    line = StatusLine()
    line.paused = True
    text = line.build(state).plain  # not mounted: 80 columns
    assert text.startswith("‖ paused at step 7") and "TTFT 12.3 ms (prefix caching off)" in text
    line.paused = False
    assert "re-issued" in line.build(state).plain
