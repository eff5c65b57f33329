"""The three built-in themes and the app-specific theme variables they set.

App colours beyond Textual's palette are theme `variables`, used from the .tcss as `$heat-low`, `$special-token`
and so on, so a user theme can override each of them.
"""

from __future__ import annotations

from textual.theme import Theme

DEFAULT_THEME = "tokentui-dark"

#: Every app-specific variable, with a fallback that reads on any background (used by themes that do not set it,
#: e.g. Textual's own themes picked from the command palette).
THEME_VARIABLE_DEFAULTS: dict[str, str] = {
    "heat-low": "#e0525e",  # colour of a token chosen with a low probability
    "heat-high": "#4fb870",  # colour of a token chosen with a high probability
    "special-token": "#c678dd",  # <|im_start|>, <|im_end|> and other special tokens
    "pending-bytes": "#e5b65c",  # bytes of an incomplete character
    "chip-background": "#8888882e",  # background of a token chip
    "boundary-a": "#88888812",  # alternating token backgrounds when boundaries are shown
    "boundary-b": "#88888840",
    "chosen-row": "#88888838",  # the chosen candidate's row
    "bar": "#5fb3f0",  # probability bars
    "bar-raw": "#88888866",  # raw-probability part of a bar
    "panel-border": "#8888888c",  # panel borders
    "stage-host": "#5f9fe8",  # one-pass panel: work on the host (Python on the CPU)
    "stage-device": "#4fb870",  # one-pass panel: work on the device (the GPU; the CPU when there is none)
    "attention-heat": "#f0a35f",  # attention view: a source token's shade at full weight (blended into the background)
}

TOKENTUI_DARK = Theme(
    name="tokentui-dark",
    primary="#5fb3f0",
    secondary="#b48ead",
    accent="#f0a35f",
    foreground="#d8dee9",
    background="#0f1218",
    surface="#151a22",
    panel="#1e2531",
    success="#8fcf7a",
    warning="#e5c07b",
    error="#e06c75",
    dark=True,
    variables={
        "heat-low": "#ef6b73",
        "heat-high": "#7fd88f",
        "special-token": "#d38cf0",
        "pending-bytes": "#f2c66d",
        "chip-background": "#27303f",
        "boundary-a": "#1b2230",
        "boundary-b": "#2b3547",
        "chosen-row": "#2a3a52",
        "bar": "#5fb3f0",
        "bar-raw": "#3a4659",
        "panel-border": "#2f4d66",
        "stage-host": "#6cb6ff",
        "stage-device": "#7fd88f",
        "attention-heat": "#f0a35f",
        "footer-key-foreground": "#f0a35f",
    },
)

TOKENTUI_LIGHT = Theme(
    name="tokentui-light",
    primary="#0b63c4",
    secondary="#7a4fb5",
    accent="#b35900",
    foreground="#1f2328",
    background="#f6f5f1",
    surface="#ffffff",
    panel="#e9e6de",
    success="#1a7f37",
    warning="#9a6700",
    error="#cf222e",
    dark=False,
    variables={
        "heat-low": "#c9182b",
        "heat-high": "#1a7f37",
        "special-token": "#8250df",
        "pending-bytes": "#9a6700",
        "chip-background": "#e8e4da",
        "boundary-a": "#f1f4f9",
        "boundary-b": "#d9e2ef",
        "chosen-row": "#dbe7f7",
        "bar": "#0b63c4",
        "bar-raw": "#c9ced6",
        "panel-border": "#9fb8d3",
        "stage-host": "#0b63c4",
        "stage-device": "#1a7f37",
        "attention-heat": "#d9480f",
        "footer-key-foreground": "#b35900",
    },
)

# High contrast: only the 16 standard terminal colours (the values rich maps 16-colour output to), black
# background, no subtle shades, so it stays readable when the terminal has 16 colours.
TOKENTUI_CONTRAST = Theme(
    name="tokentui-contrast",
    primary="#55ffff",
    secondary="#ff55ff",
    accent="#ffff55",
    foreground="#ffffff",
    background="#000000",
    surface="#000000",
    panel="#000000",
    boost="#555555",
    success="#55ff55",
    warning="#ffff55",
    error="#ff5555",
    dark=True,
    luminosity_spread=0.0,
    text_alpha=1.0,
    variables={
        "heat-low": "#ff5555",
        "heat-high": "#55ff55",
        "special-token": "#ff55ff",
        "pending-bytes": "#ffff55",
        "chip-background": "#0000aa",
        "boundary-a": "#000000",
        "boundary-b": "#0000aa",
        "chosen-row": "#0000aa",
        "bar": "#55ffff",
        "bar-raw": "#aaaaaa",
        "panel-border": "#aaaaaa",
        "stage-host": "#5555ff",
        "stage-device": "#55ff55",
        "attention-heat": "#ffff55",
        "border": "#ffffff",
        "border-blurred": "#aaaaaa",
        "text-muted": "#aaaaaa",
        "footer-key-foreground": "#ffff55",
        "footer-background": "#000000",
        "footer-foreground": "#ffffff",
        "footer-description-foreground": "#ffffff",
        "block-cursor-background": "#55ffff",
        "block-cursor-foreground": "#000000",
        "input-cursor-background": "#ffffff",
        "input-cursor-foreground": "#000000",
        "input-selection-background": "#0000aa",
        "scrollbar": "#aaaaaa",
        "scrollbar-background": "#000000",
        "scrollbar-hover": "#ffffff",
        "scrollbar-active": "#ffffff",
    },
)

BUILTIN_THEMES: dict[str, Theme] = {
    theme.name: theme for theme in (TOKENTUI_DARK, TOKENTUI_LIGHT, TOKENTUI_CONTRAST)
}
