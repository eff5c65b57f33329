"""Command palette (ctrl+p): every action of the key table, and one entry per theme."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content

from .keys import KEYS


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
            user_themes = getattr(self.app, "user_theme_names", set())
            if title.startswith("Theme: ") and not (title.startswith("Theme: tokentui")
                                                     or title.split()[1] in user_themes):
                continue  # Textual's own themes are searchable, not listed up front
            yield DiscoveryHit(Content(title), command, text=title, help=help_text)  # Content: no markup

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, command in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), command, text=title, help=help_text)
