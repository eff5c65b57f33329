"""Command palette (ctrl+p): every action of the key table, one entry per theme (tokentui's and the user's: the
only ones registered, tui/theming.py), and which of Textual's own commands stay (`system_commands`)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from textual.app import SystemCommand

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content

from .keys import KEYS

if TYPE_CHECKING:
    from textual.app import App
    from textual.screen import Screen

DROPPED_SYSTEM_COMMANDS = {
    "Keys",  # Textual's key panel: `?` is the dashboard's help, with every key
    "Theme",  # Textual's theme picker: the themes are listed here, one entry each
    "Screenshot",  # saved to ~/Downloads, which a server rarely has ("Failed to save screenshot"): ours below
}


def system_commands(app: "App", screen: "Screen", inherited: Iterable[SystemCommand]) -> Iterable[SystemCommand]:
    """Textual's commands the dashboard keeps (Quit, Maximize, …), and a screenshot that says where it went."""
    for command in inherited:
        if command.title not in DROPPED_SYSTEM_COMMANDS:
            yield command
    yield SystemCommand("Screenshot", "save an SVG picture of the screen in the working directory",
                        lambda: app.set_timer(0.1, partial(save_screenshot, app)))


def save_screenshot(app: "App", directory: Path | None = None) -> Path | None:
    """The screen as an SVG file in `directory` (default: the working directory); its full path said, or why not."""
    directory = Path.cwd() if directory is None else directory
    try:
        path = Path(app.save_screenshot(path=str(directory)))
    except OSError as err:
        app.notify(f"Screenshot not saved: {err}", severity="error", timeout=8, markup=False)
        return None
    app.notify(f"Screenshot saved: {path.resolve()}", timeout=8, markup=False)
    return path


class TokentuiCommands(Provider):
    def _commands(self) -> list[tuple[str, str, object]]:
        app = self.app
        commands: list[tuple[str, str, object]] = []
        for spec in KEYS:
            if spec.action == "command_palette":
                continue
            commands.append((f"{spec.title} ({spec.display})", spec.help, partial(app.run_action, spec.action)))
        for name in sorted(app.available_themes):
            marker = " (current)" if name == app.theme else ""
            switch = partial(setattr, app, "theme", name)
            commands.append((f"Theme: {name}{marker}", f"switch to the {name} theme", switch))
        return commands

    async def discover(self) -> Hits:
        for title, help_text, command in self._commands():
            yield DiscoveryHit(Content(title), command, text=title, help=help_text)  # Content: no markup

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, command in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), command, text=title, help=help_text)
