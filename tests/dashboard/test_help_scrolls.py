"""Help scrolls with the keys at once (↓, PgDn, End did nothing until Tab was pressed), and at 80 columns the key
bar says that `?` leads to the keys it leaves out."""

from __future__ import annotations

import pytest

from fakes import ScriptedEngine, make_loader, screen_text, wait_for
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.screens import HelpScreen
from tokentui.tui.sizes import size_table


def make_app() -> TokentuiApp:
    return TokentuiApp(DashboardConfig(load=make_loader(ScriptedEngine()), user_theme_dir=None, recorder=None))


async def test_help_scrolls_to_its_end_with_end_at_80x24():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        await pilot.pause(0.1)
        body = app.screen.query_one("#help-body")
        assert body.max_scroll_y > 0  # taller than the terminal
        last_row = size_table()[-1][0][:30]
        assert last_row not in screen_text(app)
        await pilot.press("end")
        await wait_for(pilot, lambda: body.scroll_y == body.max_scroll_y, what="the end of help")
        await pilot.pause(0.1)
        assert last_row in screen_text(app)
        await pilot.press("home")
        await wait_for(pilot, lambda: body.scroll_y == 0, what="the top of help")
        await pilot.press("pagedown")
        await wait_for(pilot, lambda: body.scroll_y > 0, what="a page down")
        top = body.scroll_y
        await pilot.press("down")
        await wait_for(pilot, lambda: body.scroll_y > top, what="a line down")
        assert app.screen.focused is body  # the one scroll area has the keys (no other to Tab into)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), what="help closed")


@pytest.mark.parametrize("width, label", [(80, "? more"), (120, "? all keys"), (160, "? help")])
async def test_the_key_bar_says_where_the_keys_it_leaves_out_are(width, label):
    app = make_app()
    async with app.run_test(size=(width, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.pause(0.1)
        bar = screen_text(app).splitlines()[-1].strip()
        assert bar.startswith(label + "  "), bar
        if width < 160:
            assert "b branch" not in bar and "l lens" not in bar  # left out here: `?` lists them
