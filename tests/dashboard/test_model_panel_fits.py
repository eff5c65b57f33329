"""The model panel never loses its last lines (issue 23 item 8: at 160×48 with a 9-row prompt panel, the Chinese
prompt's, "N runs × 49,152 = …" was cut off): where it is short, its rows close up, then the model's facts give way
in a line that names them; the run's totals are always there."""

from __future__ import annotations

import pytest

from fakes import ScriptedEngine, make_loader, wait_for
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.panels import ModelPanel

TALL_PROMPT = "请用中文回答：\n" + "\n".join(f"第{i}行：开源模型与闭源模型的区别是什么？" for i in range(12))


def model_lines(app) -> tuple[list[str], int]:
    panel = app.query_one(ModelPanel)
    return panel.last_text.plain.splitlines(), panel.content_size.height


@pytest.mark.parametrize("size, prompt", [((160, 48), TALL_PROMPT), ((120, 36), TALL_PROMPT),
                                          ((120, 30), "Is OpenAI open?"), ((160, 48), "Is OpenAI open?")],
                         ids=["160x48-tall-prompt", "120x36-tall-prompt", "120x30", "160x48"])
async def test_the_totals_are_on_screen_whatever_the_prompt_panel_takes(size, prompt):
    app = TokentuiApp(DashboardConfig(load=make_loader(ScriptedEngine()), user_theme_dir=None, recorder=None,
                                      prompt=prompt))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.pause(0.3)
        lines, height = model_lines(app)
        state = app.state
        assert len(lines) <= height, (height, lines)
        assert f"{state.scores:,}" in lines[-1], lines  # the last line, the scores, always shown
        assert any(f"{state.model_runs:,}" in line and line.startswith("model runs") for line in lines)
        assert any(f"{state.done.tokens:,}" in line and ("answer" in line) for line in lines)


async def test_a_tall_panel_keeps_every_row_and_a_short_one_names_what_it_left_out():
    app = TokentuiApp(DashboardConfig(load=make_loader(ScriptedEngine()), user_theme_dir=None, recorder=None,
                                      prompt=TALL_PROMPT))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.pause(0.3)
        short, _ = model_lines(app)
        await pilot.resize_terminal(160, 70)
        await pilot.pause(0.5)
        tall, height = model_lines(app)
    assert len(tall) <= height and not any(line.startswith("…") for line in tall)
    assert any(line.startswith("device") for line in tall) and any(line.startswith("source") for line in tall)
    left_out = [line for line in short if line.startswith("… no room for: ")]
    assert left_out, short
    for name in left_out[0].removeprefix("… no room for: ").split(", "):
        assert not any(line.startswith(name) for line in short) and any(line.startswith(name) for line in tall)
