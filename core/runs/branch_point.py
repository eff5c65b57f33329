"""Where a branch leaves its parent run (core/model/branch.py runs it). Its own module, free of torch: the dashboard's
process builds branch points and sends them to the model process, and never imports torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import SettingsError
from ..samplers import mirostat_mu

__all__ = ["BranchPoint", "check_ids", "run_ids"]


def check_ids(value, name: str) -> tuple[int, ...]:
    """`value` as a tuple of token ids (ints >= 0); SettingsError (one line naming `name`) when it is not one."""
    try:
        ids = tuple(value)
    except TypeError:
        raise SettingsError(f"branch point: {name} must be a sequence of token ids") from None
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise SettingsError(f"branch point: {name} must hold token ids >= 0, got {i!r}")
    return ids


@dataclass(frozen=True)
class BranchPoint:
    """Where a branch leaves its parent: the parent's prompt ids, its tokens before step `at` (so `at` ==
    len(tokens)), and the token forced at step `at`. `parent` names the parent run (for the UI; optional);
    `parent_token` is the parent's own token at step `at` when known. Checked as built (SettingsError, one line);
    the engine checks the ids against its vocabulary.

    A forced phrase (core/model/forcing.py): `phrase` holds all its ids, forced at steps at, at + 1, ... (`token`
    is its first), `phrase_text` what was typed; an adopted fan-out sample is a phrase too, `sample` its number.
    `forced_ids` is what the branch forces: the phrase, or the one token."""

    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    at: int
    token: int
    parent: str | None = None
    parent_token: int | None = None
    phrase: tuple[int, ...] = ()
    phrase_text: str | None = None
    sample: int | None = None
    mirostat_mu: float | None = None  # Mirostat 2.0's state at step `at` (core/samplers.py `mirostat_mu`); None: fresh

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", check_ids(self.prompt_ids, "prompt_ids"))
        object.__setattr__(self, "tokens", check_ids(self.tokens, "tokens"))
        if not self.prompt_ids:
            raise SettingsError("branch point: the prompt has no ids")
        at = self.at
        if isinstance(at, bool) or not isinstance(at, int) or at < 0:
            raise SettingsError(f"branch point: the step must be an index >= 0, got {at!r}")
        if at != len(self.tokens):
            raise SettingsError(f"branch point: step index {at} needs the {at} token(s) before it, "
                                f"got {len(self.tokens)}")
        for name in ("token", "parent_token"):
            value = getattr(self, name)
            if value is None and name == "parent_token":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SettingsError(f"branch point: {name} must be a token id >= 0, got {value!r}")
        if self.parent is not None and not isinstance(self.parent, str):
            raise SettingsError(f"branch point: parent must be a name or None, got {self.parent!r}")
        object.__setattr__(self, "phrase", check_ids(self.phrase, "phrase"))
        if self.phrase and self.phrase[0] != self.token:
            raise SettingsError(f"branch point: a phrase starts with the forced token {self.token}, not "
                                f"{self.phrase[0]}")
        if self.phrase_text is not None and not isinstance(self.phrase_text, str):
            raise SettingsError(f"branch point: phrase_text must be text, got {self.phrase_text!r}")
        if self.sample is not None and (isinstance(self.sample, bool) or not isinstance(self.sample, int)
                                        or self.sample < 0):
            raise SettingsError(f"branch point: sample must be a sample number >= 0, got {self.sample!r}")
        mu = self.mirostat_mu
        if mu is not None and (isinstance(mu, bool) or not isinstance(mu, (int, float)) or not math.isfinite(mu)):
            raise SettingsError(f"branch point: mirostat_mu must be a finite number or None, got {mu!r}")

    @property
    def forced_ids(self) -> tuple[int, ...]:
        """The ids the branch forces, from step `at` on: its phrase, or its one token."""
        return self.phrase or (self.token,)

    @classmethod
    def of_run(cls, run, at: int, token: int, parent: str | None = None, **phrase) -> "BranchPoint":
        """The branch point at step index `at` (0-based) of a `Run` (core/runs/run.py), a plain run or itself a branch:
        its prompt, its tokens before `at`, and its own token at `at` when it has one. `phrase`: the phrase fields
        (phrase, phrase_text, sample) and `mirostat_mu` where the caller knows it (a preview's settings); else
        Mirostat 2.0's state before `at` as the run's own steps give it (`mu_before`), so every branch continues
        the state its parent had there."""
        prompt_ids, ids = run_ids(run)
        if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at <= len(ids):
            raise SettingsError(f"step index {at!r} is not in this run (0..{len(ids)})")
        phrase.setdefault("mirostat_mu", mu_before(run, at))
        return cls(prompt_ids, ids[:at], at, token, parent, ids[at] if at < len(ids) else None, **phrase)


def mu_before(run, at: int) -> float | None:
    """Mirostat 2.0's state before step index `at` of a `Run`, folded from its steps (core/samplers.py
    `mirostat_mu`: the state lives in the steps' own record). None where Mirostat was off at the step before, and
    for a run whose steps start at a branch point (a branch record read back): the steps before it are its
    parent's, in the parent's record, so the state there is not in this run and a fresh start is all it can say."""
    if run.offset:
        return None
    return mirostat_mu([(s.settings, s.chosen_prob) for s in run[:at]])


def run_ids(run) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the prompt's ids, every token of the answer from the first on) of a `Run`, a plain run or a branch (whose
    tokens before its branch point its branch event carries); SettingsError when it has no prompt."""
    if run.branch is not None:
        return tuple(run.branch.prompt_ids), tuple(run.branch.tokens) + tuple(run.values("id"))
    if run.prompt is not None:
        return tuple(run.prompt.ids), tuple(run.values("id"))
    raise SettingsError("this run has no prompt to branch from")
