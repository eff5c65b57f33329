"""The dashboard's themes: the three built-in ones and the user's theme files (themes/) registered with the app,
and the theme it starts in. A theme file that cannot be read, or an unknown `--theme` (the default is used), is
one error note, shown once the dashboard is up.

Textual's own themes (nord, gruvbox, …) are taken out: the themes offered are the ones tokentui was drawn and
checked with (the heat map, the panels' colours) and the user's, the same list in `--theme`'s error, the command
palette and docs/dashboard.md, "Themes"."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.app import App

from tokentui.themes import BUILTIN_THEMES, DEFAULT_THEME, load_user_themes


@dataclass(frozen=True, slots=True)
class ThemeSetup:
    initial: str  # the theme to start in: the one asked for when known, else DEFAULT_THEME
    user_names: frozenset[str]  # names of the themes read from the user's theme files
    errors: tuple[str, ...]  # one line each: a theme file that failed, an unknown theme asked for


def register_themes(app: App, wanted: str, user_theme_dir: Path | None) -> ThemeSetup:
    """Register the built-in themes and the user's (from `user_theme_dir`; None: none) with `app`."""
    for theme in BUILTIN_THEMES.values():
        app.register_theme(theme)
    themes, failures = load_user_themes(user_theme_dir)
    for theme in themes:
        app.register_theme(theme)
    user_names = frozenset(theme.name for theme in themes)
    ours = set(BUILTIN_THEMES) | user_names
    if app.theme not in ours:  # Textual's default, before any theme of ours is set: ours, so none of its is in use
        app.set_reactive(App.theme, DEFAULT_THEME)
    for name in list(app.available_themes):
        if name not in ours:
            app.unregister_theme(name)
    errors = [str(failure) for failure in failures]
    initial = wanted
    if wanted not in app.available_themes:
        known = ", ".join(sorted(app.available_themes))
        errors.append(f"Unknown theme {wanted!r}; using {DEFAULT_THEME} (known: {known})")
        initial = DEFAULT_THEME
    return ThemeSetup(initial=initial, user_names=user_names, errors=tuple(errors))
