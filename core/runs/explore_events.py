"""The events of a scored text (core/model/scoring.py) and of a fan-out (core/model/fanout.py): what else the model
could have said (issue 26). Events as core/runs/events.py's (the same `Event` base, `to_dict()` schema in
docs/headless-json.md and pickling); a fan-out's progress is that module's FanoutProgress, beside the prefill's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .events import Candidate, Event, PromptPiece
from .pickling import install_fast_pickling
from ..settings import SamplerSettings


@dataclass(frozen=True, slots=True)
class ScoreEvent(Event):
    """A text is scored (`tokentui score`): `answer` is teacher-forced after the prompt, as a whole, in one forward,
    and each of its tokens becomes a step (forced, with its candidates, rank and probability as if generated).
    Comes after the prompt event, before the prefill; `ids` / `pieces` are the answer's tokens."""

    event: ClassVar[str] = "score"
    answer: str
    ids: list[int]
    pieces: list[PromptPiece]


@dataclass(frozen=True, slots=True)
class ScoredToken:
    """One token of a scored text (or a forced phrase): its step index, its raw probability and its rank."""

    index: int
    id: int
    piece: str
    raw_prob: float
    rank: int | None


@dataclass(frozen=True, slots=True)
class ScoreSummary(Event):
    """A scored text's figures, from its steps' raw probabilities (core/runs/scoring.py): `logprob` = Σ ln p (nats),
    `perplexity` = exp(−logprob / tokens), the least likely tokens first. Just before the `done`. `forward_ms`: the
    answer's one forward (None for a one-token answer, scored by the prefill alone)."""

    event: ClassVar[str] = "score_summary"
    tokens: int
    logprob: float
    perplexity: float
    least_likely: list[ScoredToken]
    forward_ms: float | None = None


@dataclass(frozen=True, slots=True)
class FanoutEvent(Event):
    """A fan-out starts (`f`, `tokentui fanout`): `n` continuations of `m` tokens each drawn from step `at` (0-based)
    under `settings`, in one batched decode sharing the prefix's KV cache; sample i draws with its own generator
    seeded `seed + i`. `prompt_ids` + `tokens` (the run's tokens before `at`) are the prefix, as a branch's;
    `candidates`: step `at`'s distribution under these settings (what the first tokens are drawn from);
    `parent_id`: the run's own token at `at` (None: not known). Comes first; the `sample` events follow, then
    `done`."""

    event: ClassVar[str] = "fanout"
    at: int
    n: int
    m: int
    seed: int
    prompt_ids: list[int]
    tokens: list[int]
    prefix_text: str
    kv_reused_tokens: int
    settings: SamplerSettings
    candidates: list[Candidate]
    parent: str | None = None
    parent_id: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.settings, SamplerSettings):
            raise TypeError(f"FanoutEvent.settings must be SamplerSettings, got {type(self.settings).__name__}")


@dataclass(frozen=True, slots=True)
class SampleEvent(Event):
    """Sample `n` (0-based) of a fan-out, drawn with seed `seed`: its tokens from the fan-out's step on, each
    token's raw probability and post-sampler probability (None: not reported, a served model's other one), and
    `logprob` = Σ ln(post-sampler probability) (None when those are not known). `reason`: how it ended ("eos",
    "length", "context", "stopped"). `text`: what the tokens write after the prefix."""

    event: ClassVar[str] = "sample"
    n: int
    seed: int
    ids: list[int]
    pieces: list[str]
    text: str
    raw_probs: list[float | None]
    probs: list[float | None]
    logprob: float | None
    reason: str = "length"


install_fast_pickling(globals())
