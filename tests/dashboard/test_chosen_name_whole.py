"""The chosen token's name is never cut in the candidates panel (issue 40: `▶ ␣developme…` at 80×24, `▶ ␣beginn…`
at 120×30, `▶ <0xF0><0x9…`): the bar gives way first, the numbers moving right with it; a name longer than the
token column and the bar together goes on a line of its own above its row. The other rows' names are cut with "…"
as before. Driven by a replayed record whose first step chose a candidate renamed to a long name."""

from __future__ import annotations

from dataclasses import replace
from itertools import takewhile

import pytest

from fakes import FACTS, ScriptedEngine, wait_for
from snapshot_apps import SnapshotApp
from tokentui.commands.replay import replay_config
from tokentui.core.runs.events import StepEvent
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.run import Run
from tokentui.core.settings import SamplerSettings
from tokentui.tui.panels import CandidatesPanel

SIZES = [(80, 24), (120, 30), (160, 48)]
NAMES = ["␣development", "␣beginningsbeginnings", "<0xF0><0x9F><0x98><0x80>", "␣" + "x" * 60]


def record_choosing(directory, name: str, rank: int = 0):
    """The scripted run sampled at temperature 1, its first step's candidate of `rank` renamed `name` and chosen."""
    run = Run(FACTS)
    for event in ScriptedEngine(sampler=SamplerSettings(temperature=1.0, top_p=1.0)).run("Is OpenAI open?"):
        if isinstance(event, StepEvent) and event.index == 0:
            cands = list(event.candidates)
            cands[rank] = c = replace(cands[rank], piece=name)
            event = replace(event, candidates=cands, id=c.id, piece=name, text=name.replace("␣", " "),
                            chosen_rank=rank, chosen_raw_prob=c.raw_prob, chosen_prob=c.prob)
        run.apply(event)
    return run.save(directory / "long.jsonl")


async def first_step_panel(path, size):
    app = SnapshotApp(replay_config(ReplayEngine.from_record(path, speed=0), user_theme_dir=None))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the replay to end")
        await pilot.press("less_than_sign")
        await pilot.pause(0.1)
        app.redraw()
        await pilot.pause()
        panel = app.query_one(CandidatesPanel)
        return panel.last_text.plain, panel.content_size


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("name", NAMES, ids=["12", "21", "bytes", "61"])
async def test_the_chosen_name_is_whole_at_every_size(tmp_path, size, name):
    text, box = await first_step_panel(record_choosing(tmp_path, name), size)
    lines = text.splitlines()
    assert all(len(line) <= box.width for line in lines), text
    assert len(lines) <= box.height, text
    assert "".join(lines).replace(" ", "").count(name.replace(" ", "")) >= 1, text  # whole, maybe folded
    marked = [n for n, line in enumerate(lines) if line.startswith("▶ ")]
    assert len(marked) == 1, text
    row = lines[marked[0]]
    if "%" in row:  # on its row: the numbers are there too, right of it
        assert row.startswith(f"▶ {name} ") and "%" in row.split(name, 1)[1], text
    else:  # above its row, folded at the width; the row under it has the numbers and no name
        above = list(takewhile(lambda line: "%" not in line, lines[marked[0]:]))
        assert "".join(above).replace(" ", "").startswith("▶" + name.replace(" ", "")), text
        numbers = lines[marked[0] + len(above)]
        assert numbers.startswith("   ") and "%" in numbers, text
    assert "…" not in row, text


async def test_the_bar_gives_way_before_the_name_at_80x24(tmp_path):
    """`␣development` at 80×24 (an 11-cell token column): on its row, whole, then its id and both numbers."""
    path = record_choosing(tmp_path, "␣development")
    text, _box = await first_step_panel(path, (80, 24))
    row = next(line for line in text.splitlines() if line.startswith("▶ "))
    first = Run.from_record(path).first
    raw, p = f"{first.chosen_raw_prob * 100:.1f}%", f"{first.chosen_prob * 100:.1f}%"
    assert row.split()[1:5] == ["␣development", str(first.id), raw, p], row
