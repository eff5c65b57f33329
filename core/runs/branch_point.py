"""Where a branch leaves its parent run (core/model/branch.py runs it). Its own module, free of torch: the dashboard's
process builds branch points and sends them to the model process, and never imports torch."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SettingsError

__all__ = ["BranchPoint"]


def _ids(value, name: str) -> tuple[int, ...]:
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
    the engine checks the ids against its vocabulary."""

    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    at: int
    token: int
    parent: str | None = None
    parent_token: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", _ids(self.prompt_ids, "prompt_ids"))
        object.__setattr__(self, "tokens", _ids(self.tokens, "tokens"))
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

    @classmethod
    def of_run(cls, run, at: int, token: int, parent: str | None = None) -> "BranchPoint":
        """The branch point at step index `at` (0-based) of a `Run` (core/runs/run.py), a plain run or itself a branch:
        its prompt, its tokens before `at`, and its own token at `at` when it has one."""
        if run.branch is not None:
            prompt_ids, ids = tuple(run.branch.prompt_ids), tuple(run.branch.tokens) + tuple(run.values("id"))
        elif run.prompt is not None:
            prompt_ids, ids = tuple(run.prompt.ids), tuple(run.values("id"))
        else:
            raise SettingsError("this run has no prompt to branch from")
        if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at <= len(ids):
            raise SettingsError(f"step index {at!r} is not in this run (0..{len(ids)})")
        return cls(prompt_ids, ids[:at], at, token, parent, ids[at] if at < len(ids) else None)
