"""A step of a run seen again under other sampler settings (issue 38, 4): what the dashboard asks the engine and
what comes back, as typed dataclasses that cross the process boundary (core/link/protocol.py's PreviewStep).

Torch-free, like the rest of core/runs: the dashboard's process builds the request and reads the answer; the
engine's side (core/model/preview.py) recomputes the step's scores and runs the sampler chain on them.

    PreviewRequest   the step (the run's prompt ids and its tokens before the step), the settings, how many
                     candidates to report
    StepPreview      the step's distribution under those settings: the candidates (raw and post-sampler
                     probability, the stage that cut each), one StageRow per stage of the chain as it ran, the
                     kept set, the entropies, the token the settings would take, and how the scores were had
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import SettingsError
from ..settings import SamplerSettings
from .branch_point import check_ids

__all__ = ["BUSY", "PreviewCandidate", "PreviewRequest", "StageRow", "StepPreview", "SOURCES"]

# Why a preview cannot be had now: a run is between its steps' forwards (core/model/engine.py `idle_cache`). A
# paused run reaches its step gate within one step, so the dashboard asks again a moment later (tui/preview.py).
BUSY = "the model is generating: pause (space) to preview a step"

# How the engine had the step's scores (StepPreview.source): the latest step's own, kept as it was selected; one
# forward from a copy of the run's KV cache cut back to the step; a prefill of the step's whole prefix.
SOURCES = ("kept", "kv", "prefill")


def _count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SettingsError(f"step preview: {name} must be an integer >= 0, got {value!r}")
    return value


def _probability(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0 + 1e-6:
        raise SettingsError(f"step preview: {name} must be a probability in [0, 1], got {value!r}")
    return float(value)


def _bits(value, name: str, optional: bool = False) -> float | None:
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < -1e-6:
        raise SettingsError(f"step preview: {name} must be a number of bits >= 0, got {value!r}")
    return max(0.0, float(value))


@dataclass(frozen=True)
class PreviewRequest:
    """Step `at` (= len(tokens), 0-based as StepEvent.index) of a run whose prompt is `prompt_ids` and whose tokens
    before it are `tokens`, under `settings`; `top_n` candidates reported; `mu`: Mirostat 2.0's state before the
    step, folded from the run's steps (core/samplers.py `mirostat_mu`; None: a fresh start). Checked as built
    (SettingsError)."""

    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    settings: SamplerSettings
    top_n: int = 10
    mu: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", check_ids(self.prompt_ids, "prompt_ids"))
        object.__setattr__(self, "tokens", check_ids(self.tokens, "tokens"))
        if not self.prompt_ids:
            raise SettingsError("step preview: the prompt has no ids")
        if not isinstance(self.settings, SamplerSettings):
            raise SettingsError(f"step preview: settings must be SamplerSettings, got {type(self.settings).__name__}")
        if isinstance(self.top_n, bool) or not isinstance(self.top_n, int) or self.top_n < 1:
            raise SettingsError(f"step preview: top-n must be an integer >= 1, got {self.top_n!r}")
        if self.mu is not None and (isinstance(self.mu, bool) or not isinstance(self.mu, (int, float))
                                    or math.isnan(self.mu)):
            raise SettingsError(f"step preview: mu must be a number or None, got {self.mu!r}")

    @property
    def at(self) -> int:
        return len(self.tokens)

    @property
    def prefix(self) -> tuple[int, ...]:
        """The ids the model has read when it scores the step: the prompt, then the tokens before it."""
        return self.prompt_ids + self.tokens


@dataclass(frozen=True)
class StageRow:
    """One stage of the chain as it ran on the step, in the chain's order: `stage` its registry name
    (core/samplers.py Stage.name), `label` how people read it ("min-p"), `setting` its value as the panels write it;
    `kept` the entries left after it, `cut` those it removed, `mass_cut` their probability in the distribution the
    stage received, `entropy_bits` the entropy after it (None: not reported)."""

    stage: str
    label: str
    setting: str
    kept: int
    cut: int
    mass_cut: float
    entropy_bits: float | None = None

    def __post_init__(self) -> None:
        for name in ("stage", "label", "setting"):
            if not isinstance(getattr(self, name), str):
                raise SettingsError(f"step preview: a stage's {name} must be text")
        _count(self.kept, "kept")
        _count(self.cut, "cut")
        object.__setattr__(self, "mass_cut", _probability(self.mass_cut, "mass cut"))
        object.__setattr__(self, "entropy_bits", _bits(self.entropy_bits, "entropy", optional=True))


@dataclass(frozen=True)
class PreviewCandidate:
    """One of the step's top candidates by raw score: its raw and post-sampler probability and, where the settings
    cut it (prob 0), the label of the stage that did (`cut_by`; None where it is kept)."""

    id: int
    piece: str
    raw_prob: float
    prob: float
    special: bool = False
    cut_by: str | None = None
    logit: float | None = None  # its raw score (as core/runs/events.py's Candidate.logit)

    def __post_init__(self) -> None:
        _count(self.id, "a candidate's id")
        if not isinstance(self.piece, str):
            raise SettingsError("step preview: a candidate's piece must be text")
        object.__setattr__(self, "raw_prob", _probability(self.raw_prob, "raw probability"))
        object.__setattr__(self, "prob", _probability(self.prob, "probability"))
        if self.cut_by is not None and not isinstance(self.cut_by, str):
            raise SettingsError("step preview: cut_by must be a stage's label or None")


@dataclass(frozen=True)
class StepPreview:
    """Step `at` under `settings` (see the module docstring). `pick` is the token these settings take there: greedy's
    argmax, or the draw a run seeded with `settings.seed` makes at its first step (what a branch from the preview
    takes). `source` (SOURCES) and `forward_ms` say how the scores were had; `total_ms` the engine's whole time."""

    at: int
    settings: SamplerSettings
    candidates: tuple[PreviewCandidate, ...]
    stages: tuple[StageRow, ...]
    kept_count: int
    kept_mass: float
    entropy_bits: float
    sampled_entropy_bits: float
    pick: int
    pick_piece: str
    pick_raw_prob: float
    pick_prob: float
    pick_rank: int
    greedy: bool
    source: str
    forward_ms: float = 0.0
    total_ms: float = 0.0

    def __post_init__(self) -> None:
        _count(self.at, "the step")
        if not isinstance(self.settings, SamplerSettings):
            raise SettingsError("step preview: settings must be SamplerSettings")
        object.__setattr__(self, "candidates", tuple(self.candidates))
        object.__setattr__(self, "stages", tuple(self.stages))
        if not all(isinstance(c, PreviewCandidate) for c in self.candidates):
            raise SettingsError("step preview: candidates must be PreviewCandidate")
        if not all(isinstance(s, StageRow) for s in self.stages):
            raise SettingsError("step preview: stages must be StageRow")
        _count(self.kept_count, "kept count")
        _count(self.pick, "the pick")
        _count(self.pick_rank, "the pick's rank")
        object.__setattr__(self, "kept_mass", _probability(self.kept_mass, "kept mass"))
        object.__setattr__(self, "entropy_bits", _bits(self.entropy_bits, "entropy"))
        object.__setattr__(self, "sampled_entropy_bits", _bits(self.sampled_entropy_bits, "sampled entropy"))
        object.__setattr__(self, "pick_raw_prob", _probability(self.pick_raw_prob, "the pick's raw probability"))
        object.__setattr__(self, "pick_prob", _probability(self.pick_prob, "the pick's probability"))
        if self.source not in SOURCES:
            raise SettingsError(f"step preview: source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        for name in ("forward_ms", "total_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise SettingsError(f"step preview: {name} must be a time >= 0, got {value!r}")

    @property
    def cut_by(self) -> dict[int, str | None]:
        """Candidate id -> the label of the stage that cut it (only the cut ones)."""
        return {c.id: c.cut_by for c in self.candidates if c.prob == 0.0}
