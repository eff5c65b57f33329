"""Apps for the snapshots of exploring a run: a branch comparison and the logit lens, on the scripted engine."""

from __future__ import annotations

from dataclasses import replace

from fakes import ScriptedEngine, make_loader, wait_for
from snapshot_apps import SnapshotApp

from tokentui.core.runs.events import LensRow, StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.tui import DashboardConfig

GREEDY = SamplerSettings(temperature=0.0)


class LensEngine(ScriptedEngine):
    """The scripted engine with a made-up lens on each step while `options.logit_lens` is on: 12 layers; the
    chosen token comes on top at layer 8 and stays (the last layer is the step's own choice, as a model's is)."""

    LAYERS = 12
    FORMS = 8

    def _run(self, prompt, system, run_id):
        for event in super()._run(prompt, system, run_id):
            if isinstance(event, StepEvent) and self.options.logit_lens:
                event = replace(event, lens=self.lens_of(event))
            yield event

    def lens_of(self, step: StepEvent) -> list[LensRow]:
        alt = step.candidates[-1]
        rows = []
        for layer in range(1, self.LAYERS + 1):
            if layer < self.FORMS:
                rows.append(LensRow(layer, alt.id, alt.piece, 0.002 * layer))
            else:
                share = (layer - self.FORMS + 1) / (self.LAYERS - self.FORMS + 1)
                rows.append(LensRow(layer, step.id, step.piece, step.chosen_raw_prob * share))
        return rows


def lens_app() -> SnapshotApp:
    engine = LensEngine(sampler=GREEDY, options=RunOptions(logit_lens=True))
    config = DashboardConfig(load=make_loader(engine), sampler=GREEDY, options=engine.options, user_theme_dir=None,
                             recorder=None)
    return SnapshotApp(config)  # --logit-lens: the lens panel from the start


def branch_app() -> SnapshotApp:
    engine = ScriptedEngine(sampler=GREEDY)
    config = DashboardConfig(load=make_loader(engine), sampler=GREEDY, options=engine.options, user_theme_dir=None,
                             recorder=None)
    return SnapshotApp(config)


async def lens_done(pilot) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the run to finish")
    app.relayout()
    await pilot.pause(0.1)
    app.redraw()
    await pilot.pause()


async def branch_and_compare(pilot) -> None:
    """Run, branch at step 5 ("␣weights" → the first other candidate), then compare the two runs."""
    from tokentui.tui.screens.compare import CompareScreen

    app = pilot.app
    await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the run to finish")
    parent = app.branch_tree.shown_branch
    step = parent.state.run.step(4)
    token = next(c.id for c in step.candidates if c.id != step.id)
    app.controller.branch_at(parent, step, token)
    await wait_for(pilot, lambda: app.state.phase == "done" and len(app.branch_tree) == 2, timeout=10,
                   what="the branch to finish")
    app.push_screen(CompareScreen(app.branch_tree.number(1), app.branch_tree.number(2)))
    await pilot.pause(0.2)
