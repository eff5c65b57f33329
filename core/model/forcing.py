"""Forcing tokens: "why didn't it say X?" — the model is made to take given tokens, one step each, and each step
reports what the model itself made of the given token (its raw probability, its rank) next to what it preferred.

`ForcePhrase` is the engine loop's `choose` (core/model/step_loop.py `generate_from`) for a branch that forces a phrase
(core/model/branch.py; a one-token branch is a phrase of one) and for a scored text (core/model/scoring.py): each
call forces the next given id with `forced_selection` (the step's own candidates and distribution, under the
settings in force, with the given id as its choice), and once the ids run out it selects as a run does. While
given ids remain (`pending`), an end token among them does not end the run.

A phrase is tokenized on its own (`phrase_pieces`): no special tokens added (no BOS), so what is forced is the text's
own tokens; a leading space is part of the first token (`␣Paris`), as the pieces shown while typing say.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from ..errors import PromptError, SettingsError
from ..samplers import mirostat_update
from ..runs.events import PromptPiece
from ..steps.display import display_piece
from ..steps.select import Selection, reference_probs, select

__all__ = ["ForcePhrase", "check_phrase", "forced_selection", "phrase_ids", "phrase_pieces"]


def forced_selection(logits: torch.Tensor, settings, generator: torch.Generator | None, top_n: int,
                     token: int, to_host=None, given=None) -> Selection:
    """`select` on these scores with the same settings, its choice replaced by `token`: the candidates and the
    distribution's figures are the step's own; chosen_rank / chosen_raw_prob / chosen_prob are `token`'s
    (chosen_prob 0 when the sampler cut it). Draws from a copy of `generator`, not from it. `to_host`: as
    `select`'s (the engine's timed copy); `given`: the run's history (core/samplers.py ChainInput), as `select`'s.
    Mirostat's mu moves on by the forced token's probability (core/samplers.py `mirostat_update`)."""
    scratch = None
    if generator is not None:
        scratch = torch.Generator(device=generator.device)
        scratch.set_state(generator.get_state())
    sel = select(logits, settings, scratch, top_n, to_host, given=given)  # also the NaN/inf check
    scores = logits.reshape(-1).to(torch.float32)
    rank = int((scores > scores[token]).sum())
    if token in sel.top_ids:
        at = sel.top_ids.index(token)
        raw, prob = sel.top_raw_probs[at], sel.top_sampled_probs[at]
    else:
        p = torch.softmax(scores, dim=-1)
        raw = float(p[token] / p.sum())
        prob = 0.0 if sel.greedy else float(reference_probs(logits, settings, given)[token])
    mu = None if sel.mirostat_mu is None else mirostat_update(given.mu if given else None, settings, prob)
    return replace(sel, token_id=token, chosen_rank=rank, chosen_raw_prob=raw, chosen_prob=prob, mirostat_mu=mu)


class ForcePhrase:
    """The engine's `choose` that forces `ids` in order, then selects (see the module docstring). `forced` counts
    the ids forced so far; `pending` those still to come."""

    def __init__(self, ids) -> None:
        self.ids = tuple(ids)
        self.forced = 0

    @property
    def pending(self) -> int:
        return len(self.ids) - self.forced

    def __call__(self, logits, settings, generator, top_n, to_host=None, given=None) -> Selection:
        if self.forced >= len(self.ids):
            return select(logits, settings, generator, top_n, to_host, given=given)
        token = self.ids[self.forced]
        self.forced += 1
        return forced_selection(logits, settings, generator, top_n, token, to_host, given)


def phrase_ids(tokenizer, text: str) -> list[int]:
    """`text`'s token ids, tokenized on its own with no special tokens added.

    A fast tokenizer is shared with the engine's run, which may be using it on another thread (the dashboard asks
    for a phrase's pieces while a run waits at its step gate); the Rust tokenizer refuses a borrow another call
    holds ("Already borrowed"), so that one case is tried again, briefly."""
    for attempt in range(20):
        try:
            return list(tokenizer(text, add_special_tokens=False)["input_ids"])
        except RuntimeError as err:
            if "borrow" not in str(err).lower() or attempt == 19:
                raise
            time.sleep(0.005)
    raise AssertionError("unreachable")


def phrase_pieces(tokenizer, token_bytes, text: str) -> list[PromptPiece]:
    """The phrase's tokens as the dashboard shows them while it is typed (`␣` for a leading space)."""
    if not isinstance(text, str):
        raise SettingsError(f"a phrase must be text, got {type(text).__name__}")
    return [PromptPiece(id=i, piece=display_piece(token_bytes, i), special=token_bytes.is_special(i))
            for i in phrase_ids(tokenizer, text)]


def check_phrase(facts, options, prompt_tokens: int, at: int, phrase: tuple[int, ...]) -> None:
    """A phrase to force from step `at` after `prompt_tokens` prompt ids: one line when it cannot be (empty, longer
    than the branch's length limit, past the model's context)."""
    if not phrase:
        raise SettingsError("the phrase is empty: type the text the model is to say")
    needed = prompt_tokens + at + len(phrase)
    if facts.max_context and needed > facts.max_context:
        over = needed - facts.max_context
        raise PromptError(f"the phrase's {len(phrase)} tokens from step {at + 1} need {needed} positions, past this "
                          f"model's context of {facts.max_context}; shorten it by at least {over} tokens")
    if len(phrase) > options.max_new_tokens:
        raise SettingsError(f"the phrase is {len(phrase)} tokens, more than the length limit of "
                            f"{options.max_new_tokens} (--max-new-tokens): shorten it or raise the limit")
