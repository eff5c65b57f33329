"""What the CLI hands the dashboard: where the engine comes from, the first prompt, settings, theme, recorder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from tokentui.core.interface import BaseEngine
from tokentui.core.link.client import EngineClient
from tokentui.core.link.local_client import LocalClient
from tokentui.core.runs.events import LoadProgress
from tokentui.core.runs.requests import ScoreRequest
from tokentui.core.runs.tree import RunTree
from tokentui.core.paths import config_dir
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.settings import RunOptions, SamplerSettings

Loader = Callable[[Callable[[LoadProgress], None]], BaseEngine]


class ClientSource(Protocol):
    """Where an engine client comes from when it is not an in-process loader (the model process of the command
    line: `tokentui.commands.dashboard.ProcessSource`)."""

    def client(self, sampler: SamplerSettings, options: RunOptions, recorder: RunRecorder | None) -> EngineClient: ...


Source = Loader | ClientSource


def _default_theme_dir() -> Path:
    return config_dir() / "themes"


@dataclass
class DashboardConfig:
    """Everything `run_dashboard` needs.

    `load` is where the engine comes from: a `ClientSource`, or a `Loader` — `load(progress)` builds an in-process
    engine (core/interface.py's BaseEngine) (slow: runs on a worker thread; may raise TokentuiError; `progress` may be called from any thread).
    `sampler` / `options` are what the engine client starts with; it hands them to the engine once it is loaded.
    """

    load: Source
    prompt: str = "Is OpenAI open?"
    system: str | None = None
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    options: RunOptions = field(default_factory=RunOptions)
    theme: str = "tokentui-dark"
    recorder: RunRecorder | None = None
    user_theme_dir: Path | None = field(default_factory=_default_theme_dir)
    # What the model / device are (shown in the "change model or device" dialog), and how to load another:
    # `relaunch(model, device)` returns a Source for them (None: the dashboard cannot switch models).
    model: str | None = None
    device: str = "auto"
    relaunch: Callable[[str | None, str], Source] | None = None
    # `check(model, device)` raises a one-line TokentuiError when they cannot work (no model needed to tell)
    check: Callable[[str, str], None] | None = None
    # a record (or a tree of runs) played back: what it holds, so the dashboard plays its branches as they were
    # taken and offers nothing a replay cannot do (None: a live model)
    replay: RunTree | None = None
    # `tokentui score`: the first run scores this text instead of generating (core/runs/requests.py)
    score: ScoreRequest | None = None
    # --raw: the prompt runs with no chat template (core/runs/turns.py; ctrl+r in the prompt editor switches)
    raw: bool = False

    def new_client(self, sampler: SamplerSettings) -> EngineClient:
        """An engine client for `self.load`, starting from `sampler` (the settings asked for so far)."""
        source = self.load
        if hasattr(source, "client"):
            return source.client(sampler, self.options, self.recorder)
        return LocalClient(source, sampler, self.options, self.recorder)
