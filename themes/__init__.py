"""tokentui's themes: three built-in Textual themes and the loader for user theme files."""

from .builtin import (
    BUILTIN_THEMES,
    DEFAULT_THEME,
    THEME_VARIABLE_DEFAULTS,
    TOKENTUI_CONTRAST,
    TOKENTUI_DARK,
    TOKENTUI_LIGHT,
)
from .loader import ThemeFileError, load_theme_file, load_user_themes, theme_from_dict

__all__ = [
    "BUILTIN_THEMES",
    "DEFAULT_THEME",
    "THEME_VARIABLE_DEFAULTS",
    "TOKENTUI_CONTRAST",
    "TOKENTUI_DARK",
    "TOKENTUI_LIGHT",
    "ThemeFileError",
    "load_theme_file",
    "load_user_themes",
    "theme_from_dict",
]
