"""Where tokentui keeps things: the converted-model cache, run records, user themes (XDG, overridable)."""

from __future__ import annotations

import os
from pathlib import Path


def _xdg(var: str, default: str) -> Path:
    value = os.environ.get(var)
    return Path(value) if value else Path.home() / default


def cache_dir() -> Path:
    """Converted GGUF weights; `TOKENTUI_CACHE_DIR` overrides `$XDG_CACHE_HOME/tokentui`."""
    return Path(os.environ.get("TOKENTUI_CACHE_DIR") or _xdg("XDG_CACHE_HOME", ".cache") / "tokentui")


def state_dir() -> Path:
    """Run records; `TOKENTUI_STATE_DIR` overrides `$XDG_STATE_HOME/tokentui`."""
    return Path(os.environ.get("TOKENTUI_STATE_DIR") or _xdg("XDG_STATE_HOME", ".local/state") / "tokentui")


def runs_dir() -> Path:
    return state_dir() / "runs"


def config_dir() -> Path:
    """User themes live in `<config>/themes`; `TOKENTUI_CONFIG_DIR` overrides `$XDG_CONFIG_HOME/tokentui`."""
    return Path(os.environ.get("TOKENTUI_CONFIG_DIR") or _xdg("XDG_CONFIG_HOME", ".config") / "tokentui")
