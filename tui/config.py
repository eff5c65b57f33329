"""What the CLI hands the dashboard: how to load the engine, the first prompt, settings, theme, recorder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Protocol

from tokentui.core.events import LoadProgress, ModelFacts
from tokentui.core.paths import config_dir
from tokentui.core.record import RunRecorder
from tokentui.core.settings import RunOptions, SamplerSettings

if TYPE_CHECKING:
    from tokentui.core.events import Event


class EngineLike(Protocol):
    """The part of `tokentui.core.engine.Engine` the dashboard uses (tests drive it with a scripted fake)."""

    facts: ModelFacts
    options: RunOptions

    @property
    def sampler(self) -> SamplerSettings: ...
    def update_sampler(self, **changes) -> SamplerSettings: ...
    def run(self, prompt: str, system: str | None = None) -> Iterator["Event"]: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def step_once(self) -> None: ...
    def stop(self) -> None: ...
    @property
    def paused(self) -> bool: ...


Loader = Callable[[Callable[[LoadProgress], None]], EngineLike]


def _default_theme_dir() -> Path:
    return config_dir() / "themes"


@dataclass
class DashboardConfig:
    """Everything `run_dashboard` needs.

    `load(progress)` builds the engine (slow: runs in a thread; may raise TokentuiError); `progress` may be called
    from any thread. `sampler` / `options` are applied to the engine once it is loaded.
    """

    load: Loader
    prompt: str = "Is OpenAI open?"
    system: str | None = None
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    options: RunOptions = field(default_factory=RunOptions)
    theme: str = "tokentui-dark"
    recorder: RunRecorder | None = None
    user_theme_dir: Path | None = field(default_factory=_default_theme_dir)
    # What the model / device are (shown in the "change model or device" dialog), and how to load another:
    # `relaunch(model, device)` returns a Loader for them (None: the dashboard cannot switch models).
    model: str | None = None
    device: str = "auto"
    relaunch: Callable[[str | None, str], Loader] | None = None
    # `check(model, device)` raises a one-line TokentuiError when they cannot work (no model needed to tell)
    check: Callable[[str, str], None] | None = None
