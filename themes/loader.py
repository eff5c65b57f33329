"""User themes: `<config>/themes/*.toml`, one theme a file.

```toml
name = "solarized-ish"
primary = "#268bd2"
secondary = "#6c71c4"     # optional from here on
accent = "#cb4b16"
background = "#002b36"
surface = "#073642"
panel = "#0b3c49"
foreground = "#eee8d5"
success = "#859900"
warning = "#b58900"
error = "#dc322f"
dark = true

[variables]               # optional: any tokentui or Textual theme variable
heat-low = "#dc322f"
heat-high = "#859900"
```

A file that cannot be used never stops the app: `load_user_themes` returns the good themes and one
`ThemeFileError` per bad file, whose message names the file and the problem.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from textual.color import Color, ColorParseError
from textual.theme import Theme

COLOUR_FIELDS = ("primary", "secondary", "accent", "background", "surface", "panel", "foreground",
                 "success", "warning", "error")
FIELDS = ("name", *COLOUR_FIELDS, "dark", "variables")


class ThemeFileError(Exception):
    """A theme file that cannot be used; `str()` names the file and the problem."""

    def __init__(self, path: Path, problem: str):
        super().__init__(path, problem)
        self.path = Path(path)
        self.problem = problem

    def __str__(self) -> str:
        return f"Theme file {self.path}: {self.problem}; skipped"


def _check_colour(path: Path, key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ThemeFileError(path, f"{key} must be a colour string such as \"#1e88e5\", got {value!r}")
    try:
        Color.parse(value)
    except ColorParseError:
        raise ThemeFileError(
            path, f"{key} = {value!r} is not a colour (use \"#rrggbb\", \"rgb(r,g,b)\" or a name)"
        ) from None
    return value


def theme_from_dict(data: dict, path: Path) -> Theme:
    """Build a Theme from a parsed TOML table, or raise ThemeFileError naming the problem."""
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise ThemeFileError(path, f"unknown field {', '.join(repr(u) for u in unknown)} "
                                   f"(fields: {', '.join(FIELDS)})")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ThemeFileError(path, "missing name = \"...\"")
    if "," in name or any(c.isspace() for c in name):
        raise ThemeFileError(path, f"name {name!r} may not contain spaces or commas")
    if "primary" not in data:
        raise ThemeFileError(path, "missing primary = \"#rrggbb\" (the one colour a theme needs)")
    colours = {key: _check_colour(path, key, data[key]) for key in COLOUR_FIELDS if key in data}
    dark = data.get("dark", True)
    if not isinstance(dark, bool):
        raise ThemeFileError(path, f"dark must be true or false, got {dark!r}")
    variables = data.get("variables", {})
    if not isinstance(variables, dict):
        raise ThemeFileError(path, "variables must be a table: [variables]")
    for key, value in variables.items():
        if not isinstance(value, str):
            raise ThemeFileError(path, f"variables.{key} must be a string, got {value!r}")
    return Theme(name=name, dark=dark, variables=dict(variables), **colours)


def load_theme_file(path: Path) -> Theme:
    """Read one theme file; raise ThemeFileError (never anything else) when it cannot be used."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as err:
        raise ThemeFileError(path, f"not valid TOML ({err})") from None
    except OSError as err:
        raise ThemeFileError(path, f"cannot be read ({err.strerror or err})") from None
    return theme_from_dict(data, path)


def load_user_themes(directory: Path | None) -> tuple[list[Theme], list[ThemeFileError]]:
    """All `*.toml` themes in `directory` (sorted by file name); a missing directory is no error."""
    themes: list[Theme] = []
    errors: list[ThemeFileError] = []
    if directory is None:
        return themes, errors
    directory = Path(directory)
    try:
        paths = sorted(directory.glob("*.toml")) if directory.is_dir() else []
    except OSError as err:
        return themes, [ThemeFileError(directory, f"cannot be listed ({err.strerror or err})")]
    for path in paths:
        try:
            themes.append(load_theme_file(path))
        except ThemeFileError as err:
            errors.append(err)
    return themes, errors
