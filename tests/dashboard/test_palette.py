"""The command palette tells one story with docs/dashboard.md, "Themes", and `--theme` (issue 23 item 9): its
Screenshot saves where it says, Textual's "Keys" (a second help) and its theme picker are gone, and the themes
offered everywhere are tokentui's three and the user's."""

from __future__ import annotations

from fakes import ScriptedEngine, make_loader, wait_for
from noting_app import NotingApp
from tokentui.tui import DashboardConfig
from tokentui.tui.commands import TokentuiCommands

OURS = {"tokentui-dark", "tokentui-light", "tokentui-contrast"}
PAPER = 'name = "paper"\nprimary = "#268bd2"\nbackground = "#fdf6e3"\nforeground = "#073642"\ndark = false\n'


def make_app(**config) -> NotingApp:
    config.setdefault("user_theme_dir", None)
    return NotingApp(DashboardConfig(load=make_loader(ScriptedEngine()), recorder=None, **config))


def notes(app) -> list[str]:
    return [str(n.message) for n in app.toasts]


async def test_the_palette_offers_no_second_help_and_only_the_themes_that_are_tokentuis_or_yours(tmp_path):
    (tmp_path / "paper.toml").write_text(PAPER, encoding="utf-8")
    app = make_app(user_theme_dir=tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        system = [command.title for command in app.get_system_commands(app.screen)]
        assert "Keys" not in system and "Theme" not in system and "Quit" in system and "Screenshot" in system
        assert set(app.available_themes) == OURS | {"paper"}
        provider = TokentuiCommands(app.screen)
        themes = {hit.text.split()[1] async for hit in provider.discover() if hit.text.startswith("Theme: ")}
        assert themes == OURS | {"paper"}
        assert not [hit async for hit in provider.search("Theme: nord") if "nord" in hit.text]


async def test_an_unknown_theme_lists_the_same_themes_the_palette_offers():
    app = make_app(theme="nord")  # one of Textual's own: not offered, so not taken either
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        assert app.theme == "tokentui-dark"
        said = [n for n in notes(app) if n.startswith("Unknown theme 'nord'")]
        assert said and said[0].endswith("(known: tokentui-contrast, tokentui-dark, tokentui-light)"), notes(app)


async def test_the_palettes_screenshot_is_saved_where_it_says(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home-without-downloads"))  # where Textual's own failed
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.press("ctrl+p")
        await pilot.press(*"Screenshot")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: any(n.startswith("Screenshot") for n in notes(app)), what="the screenshot")
        saved = [n for n in notes(app) if n.startswith("Screenshot saved: ")]
        assert saved, notes(app)
        path = saved[0].removeprefix("Screenshot saved: ")
        files = list(tmp_path.glob("*.svg"))
        assert [str(f) for f in files] == [path] and files[0].read_text(encoding="utf-8").startswith("<svg")
