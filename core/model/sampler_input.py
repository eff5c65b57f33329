"""A run's sampler history: what the stages that look back read at each step (core/samplers.py `ChainInput`), kept
by the run's loop (core/model/step_loop.py `generate_from`) and handed to step 4 with the step's scores.

The tokens so far (the prompt's, then each token as it is chosen: llama-server and llama-cli accept the prompt's
tokens into their samplers too), Mirostat 2.0's mu (from the branch point, or a fresh start, then each step's
`Selection.mirostat_mu`), and DRY's sequence breakers as token sequences, made from the strings the settings name
with this model's tokenizer the first time a step needs them (core/steps/penalties.py `dry_breakers`, cached).
"""

from __future__ import annotations

from ..samplers import ChainInput
from ..steps.penalties import dry_breakers

__all__ = ["RunHistory"]


class RunHistory:
    """The tokens so far and the stages' state for one run of steps."""

    def __init__(self, tokenizer, pieces, ids: list[int], mu: float | None = None) -> None:
        self._tokenizer = tokenizer
        self._pieces = pieces  # core/steps/token_bytes.py TokenBytes: a token's bytes
        self.ids = ids
        self.mu = mu

    def given(self, settings) -> ChainInput:
        """This step's ChainInput (the ids list itself, not a copy: the step reads it before it grows)."""
        return ChainInput(ids=self.ids, breakers=self._breakers(settings), mu=self.mu)

    def push(self, selection) -> None:
        """After a step: its token joins the history, and Mirostat's mu moves on (None: mirostat off)."""
        self.ids.append(selection.token_id)
        self.mu = selection.mirostat_mu

    def _breakers(self, settings):
        if settings.dry_multiplier == 0.0 or not settings.dry_sequence_breakers:
            return None
        tok = self._tokenizer
        return dry_breakers(lambda i: self._pieces[i], len(tok), lambda text: tok.encode(text, add_special_tokens=False),
                            settings.dry_sequence_breakers, key=id(tok))
