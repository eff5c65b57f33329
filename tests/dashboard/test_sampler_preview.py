"""The step in view under other sampler settings (issue 38, 4) and the chain as rows with "cut by" (issue 38, 2), in
the dashboard on a real engine (a tiny random-weight Llama, the embedded model's tokenizer), read as text at 80×24,
120×30 and 160×48: a paused run, a key that changes the temperature, and the step's probabilities on screen are
core/steps/select.py's `reference_probs` of that step's scores (one fresh forward of its prefix on a stock copy of
the model) under the new settings — the run not advanced; enter branches there with them, the previewed token
taken, the run still paused."""

from __future__ import annotations

import threading

import pytest
import torch

from fakes import screen_text, wait_for
from snapshot_apps import SnapshotApp
from tiny_models import INIT, tiny_model
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.runs.branch_point import run_ids
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.core.steps.select import reference_probs
from tokentui.tui import DashboardConfig
from tokentui.tui.format import percent
from tokentui.tui.panels import CandidatesPanel, SamplerPanel

SIZES = [(80, 24), (120, 30), (160, 48)]
IDS = [f"{w}x{h}" for w, h in SIZES]


@pytest.fixture(scope="module")
def loaded(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer, initializer_range=INIT)
    return LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name="tiny-llama"))


@pytest.fixture(scope="module")
def stock(smol_tokenizer):
    return tiny_model("llama", smol_tokenizer, initializer_range=INIT)  # the same weights, never an Engine's


class LoadingApp(SnapshotApp):
    """The dashboard whose engine loads only once `loaded` is set (so `space` is pressed while it loads)."""

    loaded: threading.Event


def app_on(loaded, sampler: SamplerSettings) -> LoadingApp:
    options = RunOptions(max_new_tokens=64, ignore_eos=True)
    gate = threading.Event()

    def load(progress):
        gate.wait(60)
        return Engine(loaded, sampler, options)

    app = LoadingApp(DashboardConfig(load=load, sampler=sampler, options=options, user_theme_dir=None,
                                     recorder=None))
    app.loaded = gate
    return app


async def paused_at(pilot, steps: int) -> None:
    """`space` while loading (the run pauses at its first token), then n until `steps` steps."""
    app = pilot.app
    await pilot.press("space")
    app.loaded.set()
    await wait_for(pilot, lambda: app.state.steps == 1 and app.client.paused, what="the first token, paused")
    while app.state.steps < steps:
        before = app.state.steps
        await pilot.press("n")
        await wait_for(pilot, lambda: app.state.steps > before, what="one step")


def fresh_logits(stock, app, index: int) -> torch.Tensor:
    prompt_ids, ids = run_ids(app.state.run)
    with torch.inference_mode():
        return stock(input_ids=torch.tensor([list(prompt_ids + ids[:index])])).logits[0, -1].to(torch.float32)


def candidate_rows(app) -> dict[int, str]:
    """The candidates panel's rows by the id they show (the second-to-last number before the bar)."""
    rows = {}
    for line in app.query_one(CandidatesPanel).last_text.plain.splitlines():
        words = line.split()
        for n, word in enumerate(words):
            if word.isdigit() and n + 2 < len(words) and words[n + 1].endswith("%"):
                rows[int(word)] = line
                break
    return rows


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_a_paused_steps_probabilities_follow_the_temperature_and_enter_branches_with_it(loaded, stock, size):
    before = SamplerSettings(temperature=0.7, top_p=0.9, seed=5)
    app = app_on(loaded, before)
    async with app.run_test(size=size) as pilot:
        await paused_at(pilot, 3)
        step = app.state.view_step
        await pilot.press("T")  # temperature +0.1, on a paused step
        after = app.controller.sampler
        assert after.temperature == pytest.approx(0.8)
        previews = app.controller.previews
        await wait_for(pilot, lambda: previews.for_step(app.state.view_step) is not None and previews.differs,
                       what="the preview")
        await pilot.pause(0.3)  # long enough for a step, were the run going on
        assert app.state.steps == 3 and app.client.paused and app.state.view_step.index == step.index  # not advanced
        preview = previews.shown
        oracle = reference_probs(fresh_logits(stock, app, step.index), after)
        rows = candidate_rows(app)
        assert rows, app.query_one(CandidatesPanel).last_text.plain
        for c in preview.candidates:
            assert abs(c.prob - float(oracle[c.id])) < 1e-5, (c, float(oracle[c.id]))
            if c.id in rows and c.prob > 0:  # on screen: the new probability, as the panel writes it
                assert f" {percent(c.prob)} " in rows[c.id] + " ", rows[c.id]
        assert any(c.prob != pytest.approx(s.prob, abs=1e-4) for c, s in zip(preview.candidates, step.candidates))
        text = screen_text(app)
        assert f"preview of step {step.index + 1}" in text, text
        assert "preview" in app.query_one(SamplerPanel).last_text.plain
        await pilot.press("enter")  # branch here with the new settings: the previewed token taken, still paused
        await wait_for(pilot, lambda: len(app.branch_tree) == 2 and app.state.steps == step.index + 1,
                       what="the branch's first step")
        await pilot.pause(0.3)
        taken = app.state.run.step(step.index)
        assert taken.id == preview.pick and taken.settings == after and taken.forced
        assert app.client.paused and app.state.steps == step.index + 1
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_the_chain_goes_as_rows_and_each_cut_candidate_says_which_stage_cut_it(loaded, size):
    settings = SamplerSettings(temperature=1.0, top_k=3, top_p=0.95, seed=2)
    app = app_on(loaded, settings)
    async with app.run_test(size=size) as pilot:
        await paused_at(pilot, 2)
        previews = app.controller.previews
        await wait_for(pilot, lambda: previews.for_step(app.state.view_step) is not None, what="the step's report")
        app.redraw()
        await pilot.pause()
        panel = app.query_one(CandidatesPanel).last_text.plain
        rows = candidate_rows(app)
        said = [line for line in panel.splitlines() if line not in rows.values()] + \
            [line.split(" cut", 1)[1] for line in rows.values() if " cut" in line]
        assert not any("…" in line for line in said), panel  # nothing it says is cut short (a piece may be)
        report = previews.shown
        cut = [c for c in report.candidates if c.prob == 0]
        assert cut and all(c.cut_by == "top-k" for c in cut[:1]), report.candidates
        shown_cut = [c for c in cut if c.id in rows]
        assert shown_cut, panel
        for c in shown_cut:
            assert f"cut by {c.cut_by}" in " ".join(rows[c.id].split()), rows[c.id]
        if size == (160, 48):  # everything: a row per stage with its setting, kept, mass cut, entropy after
            lines = panel.splitlines()
            header = next(line for line in lines if line.split()[:2] == ["stage", "setting"])
            assert header.split() == ["stage", "setting", "kept", "cut", "p", "H", "bits"], header
            for row in report.stages:
                line = next(line for line in lines if line.startswith(row.label + " "))
                assert f"{row.kept:,}" in line and percent(row.mass_cut) in line, line
                assert f"{row.entropy_bits:.2f}" in line, line
        await pilot.press("q")
