"""One formatting rule for probabilities (issue 40: `p 5.0e-06%` in a step line and `its raw probability is 0.00%`
in the notice, for one probability): core/runs/scoring.py's `percent`, with the dashboard's columns at 1 decimal and
text at 2 — a probability too small for its decimals keeps its leading digits (exponent form), never reads 0."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fakes import FACTS, ScriptedEngine, wait_for
from snapshot_apps import SnapshotApp
from tokentui.commands.replay import replay_config
from tokentui.core.runs import scoring
from tokentui.core.runs.events import StepEvent
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.run import Run
from tokentui.core.settings import SamplerSettings
from tokentui.tui import format as tui_format
from tokentui.tui.panels import CandidatesPanel

TINY = 5e-8  # 5.0e-06 %


@pytest.mark.parametrize("p, digits, shown", [
    (0.419, 1, "41.9%"), (0.419, 2, "41.90%"), (0.0, 1, "0.0%"), (0.0, 2, "0.00%"), (1.0, 1, "100.0%"),
    (0.00099, 1, "0.1%"),  # rounds to a digit it can show
    (0.0004, 1, "4e-02%"), (0.0004, 2, "0.04%"), (TINY, 1, "5e-06%"), (TINY, 2, "5.0e-06%"),
])
def test_the_rule(p, digits, shown):
    assert scoring.percent(p, digits) == shown
    assert tui_format.percent(p, digits) == shown  # the dashboard's is the same function


def test_a_probability_never_reads_zero_unless_it_is():
    for exponent in range(1, 46, 3):  # float32 probabilities reach 1e-45
        p = 10.0 ** -exponent
        for digits in (1, 2):
            text = scoring.percent(p, digits)
            assert float(text.rstrip("%")) > 0 and len(text) <= max(6, 6 + digits), text


@pytest.mark.parametrize("size", [(80, 24), (120, 30), (160, 48)], ids=["80x24", "120x30", "160x48"])
async def test_the_candidates_panel_writes_a_tiny_probability_by_the_rule(tmp_path, size):
    run = Run(FACTS)
    for event in ScriptedEngine(sampler=SamplerSettings(temperature=1.0, top_p=1.0)).run("Is OpenAI open?"):
        if isinstance(event, StepEvent) and event.index == 0:
            cands = list(event.candidates)
            cands[2] = replace(cands[2], raw_prob=TINY, prob=TINY)
            event = replace(event, candidates=cands)
        run.apply(event)
    app = SnapshotApp(replay_config(ReplayEngine.from_record(run.save(tmp_path / "tiny.jsonl"), speed=0),
                                    user_theme_dir=None))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the replay's end")
        await pilot.press("less_than_sign")
        await pilot.pause(0.1)
        text = app.query_one(CandidatesPanel).last_text.plain
        third = app.state.view_step.candidates[2]
        row = next(line for line in text.splitlines() if f" {third.id} " in line)
        assert row.split()[2:4] == ["5e-06%", "5e-06%"], row  # raw, then p: never "0.0%"
