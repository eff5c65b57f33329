"""What a scored text and a fan-out ask the engine for (core/model/scoring.py, core/model/fanout.py): frozen
dataclasses checked as built, so an invalid one cannot exist, and free of torch, so the dashboard's process builds
them and sends them to the model process (core/link/protocol.py) as it does branch points.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PromptError, SettingsError
from .branch_point import check_ids, run_ids

__all__ = ["FanoutRequest", "MAX_SAMPLES", "MAX_SAMPLE_TOKENS", "ScoreRequest"]

MAX_SAMPLES = 64  # a fan-out's N: rows of one batched decode (each holds its own copy of the prefix's KV cache)
MAX_SAMPLE_TOKENS = 1024  # a fan-out's M


def _count(value, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SettingsError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
    return value


@dataclass(frozen=True)
class ScoreRequest:
    """Score `answer` as the reply to `prompt` (with `system`): the chat template around the prompt as for a run,
    then the answer's tokens teacher-forced. `answer_ids`: the answer's ids when the caller has them (a run's own
    tokens, to score them exactly); None: the engine tokenizes `answer` on its own, with no special tokens added."""

    prompt: str
    answer: str
    system: str | None = None
    answer_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("prompt", "answer"):
            if not isinstance(getattr(self, name), str):
                raise PromptError(f"the {name} to score must be text, got {type(getattr(self, name)).__name__}")
        if self.system is not None and not isinstance(self.system, str):
            raise PromptError(f"the system prompt must be text, got {type(self.system).__name__}")
        if not self.prompt.strip():
            raise PromptError("the prompt is empty: pass --prompt TEXT")
        if self.answer_ids is not None:
            object.__setattr__(self, "answer_ids", check_ids(self.answer_ids, "the answer's ids"))
        if not self.answer and not self.answer_ids:
            raise PromptError("the answer to score is empty: pass --answer TEXT or --answer-file FILE")


@dataclass(frozen=True)
class FanoutRequest:
    """`n` samples of `m` tokens each, drawn from step `at` (0-based) of a run whose prompt ids are `prompt_ids` and
    whose tokens before `at` are `tokens`; sample i with seed `seed + i`. `parent` names the run, `parent_token` is
    its own token at `at` (None: not known, or past its end)."""

    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    at: int
    n: int = 8
    m: int = 32
    seed: int = 0
    parent: str | None = None
    parent_token: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", check_ids(self.prompt_ids, "fan-out: prompt_ids"))
        object.__setattr__(self, "tokens", check_ids(self.tokens, "fan-out: tokens"))
        if not self.prompt_ids:
            raise SettingsError("fan-out: the prompt has no ids")
        if isinstance(self.at, bool) or not isinstance(self.at, int) or self.at != len(self.tokens):
            raise SettingsError(f"fan-out: step index {self.at!r} needs the {len(self.tokens)} token(s) before it")
        _count(self.n, "the number of samples (-n)", 1, MAX_SAMPLES)
        _count(self.m, "the tokens per sample (--tokens)", 1, MAX_SAMPLE_TOKENS)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0 \
                or self.seed + self.n > 2**63 - 1:
            raise SettingsError(f"fan-out: the seed must be a whole number >= 0, got {self.seed!r}")
        if self.parent is not None and not isinstance(self.parent, str):
            raise SettingsError(f"fan-out: parent must be a name or None, got {self.parent!r}")
        if self.parent_token is not None:
            check_ids((self.parent_token,), "fan-out: parent_token")

    def seed_of(self, sample: int) -> int:
        """The seed sample `sample` (0-based) draws with."""
        return self.seed + sample

    def check_vocabulary(self, rows: int | None) -> None:
        """SettingsError (one line) when an id of the prefix is past a model of `rows` tokens (None: not known)."""
        for name, ids in (("prompt", self.prompt_ids), ("prefix", self.tokens)):
            bad = next((i for i in ids if rows and i >= rows), None)
            if bad is not None:
                raise SettingsError(f"the fan-out's {name} id {bad} is not in this model's vocabulary "
                                    f"(ids 0..{rows - 1})")

    def check_context(self, max_context: int | None) -> None:
        """PromptError (one line) when the prefix and `m` tokens do not fit in a context of `max_context`."""
        needed = len(self.prompt_ids) + self.at + self.m
        if max_context and needed > max_context:
            room = max_context - len(self.prompt_ids) - self.at
            raise PromptError(f"a fan-out of {self.m} tokens from step {self.at + 1} needs {needed} positions, past "
                              f"this model's context of {max_context}; ask for at most {max(room, 0)} tokens")

    @classmethod
    def of_run(cls, run, at: int, n: int, m: int, seed: int, parent: str | None = None) -> "FanoutRequest":
        """The fan-out at step index `at` of a `Run` (a plain run or a branch)."""
        prompt_ids, ids = run_ids(run)
        if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at <= len(ids):
            raise SettingsError(f"step index {at!r} is not in this run (0..{len(ids)})")
        return cls(prompt_ids, ids[:at], at, n, m, seed, parent, ids[at] if at < len(ids) else None)
