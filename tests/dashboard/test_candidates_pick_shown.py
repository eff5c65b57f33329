"""The candidates panel always shows the token the step chose — its ▶ row, or a "chose" line when its row does not
fit (rank 7–10 at 80×24 used to vanish: seven rows, no ▶, no line) — and its columns and header stay put from step
to step; a token name cut to fit ends with "…". Driven by a replayed record whose steps choose ranks 1–10 in turn."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from fakes import FACTS, ScriptedEngine, wait_for
from snapshot_apps import SnapshotApp
from tokentui.commands.replay import replay_config
from tokentui.core.runs.events import StepEvent
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.run import Run
from tokentui.core.settings import SamplerSettings
from tokentui.tui.panels import CandidatesPanel
from tokentui.tui.panels.candidate_rows import column_widths, rows_that_fit

SIZES = [(80, 24), (100, 30), (160, 48)]


def ranked_record(directory, long_piece: str | None = None):
    """The scripted answer sampled at temperature 1 (nothing cut), each step k taking its candidate of rank
    (k mod 10) + 1 instead of the scripted one; `long_piece` renames the first step's second candidate."""
    run = Run(FACTS)
    for event in ScriptedEngine(sampler=SamplerSettings(temperature=1.0, top_p=1.0)).run("Is OpenAI open?"):
        if isinstance(event, StepEvent) and event.index < 12:
            rank = event.index % 10
            cands = list(event.candidates)
            if long_piece is not None and event.index == 0:
                cands[1] = replace(cands[1], piece=long_piece)
            c = cands[rank]
            event = replace(event, candidates=cands, id=c.id, piece=c.piece, text=c.piece.replace("␣", " "),
                            chosen_rank=rank, chosen_raw_prob=c.raw_prob, chosen_prob=c.prob)
        run.apply(event)
    return run.save(directory / "ranked.jsonl")


def replay_app(path) -> SnapshotApp:
    return SnapshotApp(replay_config(ReplayEngine.from_record(path, speed=0), user_theme_dir=None))


def pick_shown(text: str, step: StepEvent) -> bool:
    """The chosen token is on screen: its ▶ row, or "chose PIECE (rank N, …)"."""
    piece = re.escape(step.piece)
    return bool(re.search(rf"^▶ {piece}\s+{step.id}\s", text, re.M)
                or re.search(rf"^chose {piece} \(rank {step.chosen_rank + 1}, raw", text, re.M))


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_the_chosen_token_is_on_screen_at_every_rank_and_size(tmp_path, size):
    app = replay_app(ranked_record(tmp_path))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the replay to end")
        panel = app.query_one(CandidatesPanel)
        await pilot.press("less_than_sign")
        headers = set()
        for position in range(12):
            await pilot.pause(0.05)
            app.redraw()
            await pilot.pause()
            step = app.state.view_step
            assert step.index == position and step.chosen_rank == position % 10
            text = panel.last_text.plain
            assert pick_shown(text, step), (position, text)
            lines = text.splitlines()
            assert len(lines) <= panel.content_size.height, (position, text)  # nothing below the panel's edge
            headers.add(lines[0])
            await pilot.press("right_square_bracket")
        assert len(headers) == 1, headers  # one header, whatever the step's pieces


async def test_a_pick_of_rank_9_at_80x24_gets_a_chose_line_with_both_probabilities(tmp_path):
    app = replay_app(ranked_record(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the replay to end")
        await pilot.press("less_than_sign", *["right_square_bracket"] * 8)
        await pilot.pause(0.1)
        step = app.state.view_step
        assert step.chosen_rank == 8
        text = app.query_one(CandidatesPanel).last_text.plain
        rows = [line for line in text.splitlines() if re.match(r"^[▶ ] \S", line)]
        assert not any(line.startswith("▶") for line in rows) and len(rows) < 9  # its row does not fit here
        raw, p = f"{step.chosen_raw_prob * 100:.1f}%", f"{step.chosen_prob * 100:.1f}%"
        assert f"chose {step.piece} (rank 9, raw {raw}, p {p})" in text, text


async def test_a_cut_token_name_ends_with_an_ellipsis(tmp_path):
    app = replay_app(ranked_record(tmp_path, long_piece="␣accountability"))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the replay to end")
        await pilot.press("less_than_sign")
        await pilot.pause(0.1)
        text = app.query_one(CandidatesPanel).last_text.plain
        assert "␣accountability" not in text
        assert re.search(r"␣accoun\w*… ", text), text


def test_rows_that_fit_keeps_the_pick_and_the_cut_rule():
    # seven lines: rank 7 fits as a row, rank 8 takes a line of its own
    assert rows_that_fit(10, 7, chosen=6, kept=None) == (7, False, False)
    assert rows_that_fit(10, 7, chosen=7, kept=None) == (6, False, True)
    # not among the candidates: always a line
    assert rows_that_fit(10, 7, chosen=None, kept=None) == (6, False, True)
    # the cut rule after the kept rows takes a line too
    assert rows_that_fit(10, 7, chosen=0, kept=3) == (6, True, False)
    assert rows_that_fit(10, 7, chosen=5, kept=3) == (6, True, False)
    assert rows_that_fit(10, 7, chosen=6, kept=3) == (5, True, True)
    assert rows_that_fit(10, None, chosen=9, kept=3) == (10, True, False)  # not laid out yet: every row


def test_the_columns_depend_on_the_width_only():
    piece_w, bar_w = column_widths(40, 5, 15)
    assert (piece_w, bar_w) == (11, 6)
    assert column_widths(52, 6, 15) == (16, 12)
    assert column_widths(24, 6, 15)[0] == 8  # the token column never goes below 8 cells


def test_a_candidate_piece_is_drawn_like_every_other_panel_draws_it():
    from tokentui.tui.format import fit_piece

    assert fit_piece("␣Open", 8) == "␣Open   "
    assert fit_piece(" Open", 8) == "␣Open   "
    assert fit_piece("␣accountability", 10) == "␣accounta…"


async def test_a_long_chose_line_keeps_its_numbers_and_the_name_whole(tmp_path):
    """At 80×24 "chose ␣benefits (rank 98, raw 0.1%, p 0.1%)" was cut to "… p 0…": the words go before the numbers;
    then the name goes on a line of its own, whole (issue 40: the picked token is always readable in full)."""
    run = Run(FACTS)
    for event in ScriptedEngine(sampler=SamplerSettings(temperature=1.0, top_p=1.0)).run("Is OpenAI open?"):
        if isinstance(event, StepEvent) and event.index == 0:  # a token far down the list, not a candidate
            event = replace(event, id=99_999, piece="␣benefitsbenefits", text=" benefitsbenefits", chosen_rank=97,
                            chosen_raw_prob=0.001, chosen_prob=0.001)
        run.apply(event)
    app = replay_app(run.save(tmp_path / "far.jsonl"))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the replay to end")
        await pilot.press("less_than_sign")
        await pilot.pause(0.1)
        panel = app.query_one(CandidatesPanel)
        name, line = panel.last_text.plain.splitlines()[-2:]
        assert name == "chose ␣benefitsbenefits" and line.strip() == "#98 raw 0.1% p 0.1%", (name, line)
        assert all(len(row) <= panel.content_size.width for row in panel.last_text.plain.splitlines())
