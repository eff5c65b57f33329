"""Time travel shows the answer as it stood at the step in view (issue 23 item 13: the ▒ placeholder appeared
beside the character it would become, "ーを▒発行", and the text written after the step was not dimmed)."""

from __future__ import annotations

from fakes import ScriptedEngine, make_loader, wait_for
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.panels import OutputView


def drawn(view) -> list[tuple[str, bool]]:
    """Every drawn cell run of the view's lines: (text, dimmed)."""
    out = []
    for y in range(view.size.height):
        for segment in view.render_line(y):
            if segment.text.strip():
                out.append((segment.text, bool(segment.style and segment.style.dim)))
    return out


async def test_a_past_step_dims_what_came_after_and_holds_its_pending_bytes_at_the_cursor():
    app = TokentuiApp(DashboardConfig(load=make_loader(ScriptedEngine()), user_theme_dir=None, recorder=None))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        run = app.state.run
        held = next(i for i in range(len(run)) if run.step(i).pending_hex)  # 开's first byte(s), held
        app.controller.cursor_go(held)
        await pilot.pause(0.2)
        view = app.query_one(OutputView)
        cells = drawn(view)
        texts = [text for text, _ in cells]
        mark = texts.index("▒")
        before, after = cells[:mark], cells[mark + 1:]
        assert before and not any(dim for _, dim in before), cells  # as written up to that step
        assert "开" in "".join(text for text, _ in after)  # the character it became: after the placeholder
        assert after and all(dim for _, dim in after), cells  # written later: dimmed
        # back to live: nothing dimmed, no placeholder
        await pilot.press("escape")
        await pilot.pause(0.2)
        live = drawn(view)
        assert not any(dim for _, dim in live) and "▒" not in [text for text, _ in live]


async def test_bytes_held_after_a_token_that_has_text_are_drawn_right_after_it():
    from textual.app import App

    from tokentui.themes import THEME_VARIABLE_DEFAULTS

    class OutputApp(App):
        def get_theme_variable_defaults(self):
            return dict(THEME_VARIABLE_DEFAULTS)

        def compose(self):
            yield OutputView(id="view")

    app = OutputApp()
    async with app.run_test(size=(40, 6)) as pilot:
        view = app.query_one(OutputView)
        await pilot.pause()
        view.append([("ー", 0.5), ("を", 0.5), ("発", 0.5), ("行", 0.5)])  # を's step also held 発's first bytes
        view.set_cursor(1, pending=True)
        await pilot.pause()
        texts = [text for text, _ in drawn(view)]
        assert texts[:3] == ["ー", "を", "▒"] and texts[3:] == ["発", "行"], texts


async def test_forward_onto_the_newest_step_of_a_paused_run_rejoins_live():
    """Item 14: `]` onto the newest step said "viewing step 64 of 64 — paused"; it rejoins live."""
    from fakes import slow_engine, screen_text

    engine = slow_engine(delay=0.05, steps=400)
    app = TokentuiApp(DashboardConfig(load=make_loader(engine), user_theme_dir=None, recorder=None,
                                      options=engine.options))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.steps >= 3, what="decoding")
        await pilot.press("space")
        await wait_for(pilot, lambda: app.client.paused, what="paused")
        await pilot.pause(0.3)
        await pilot.press("left_square_bracket")
        await wait_for(pilot, lambda: "viewing step" in screen_text(app), what="a past step in view")
        await pilot.press("right_square_bracket")
        await wait_for(pilot, lambda: app.state.live, what="live again")
        await pilot.pause(0.1)
        assert "viewing step" not in screen_text(app)
        await pilot.press("q")
