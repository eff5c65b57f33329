"""`Served`: what one run (core/server/completions.py's ServerRun) or one fan-out (core/server/fanout.py's
ServerFanout) of a served model reads of its engine. core/server/engine.py's ServerEngine keeps it and hands
itself to each; they name this protocol, not the engine, so neither imports the module that imports them (no import
cycle, TYPE_CHECKING imports counted)."""

from __future__ import annotations

from typing import ContextManager, Protocol

from ..runs.facts import ModelFacts
from ..settings import RunOptions, SamplerSettings
from .http import Connection
from .probe import Dialect
from .vocab import ServerVocab


class Served(Protocol):
    conn: Connection
    dialect: Dialect
    vocab: ServerVocab
    facts: ModelFacts
    options: RunOptions
    model_id: str  # the model as the server names it

    @property
    def paused(self) -> bool: ...

    def request_body(self, prefix: list[int], settings: SamplerSettings, max_tokens: int) -> tuple[str, dict]:
        """The streamed request (its path and JSON body) for `max_tokens` more tokens after `prefix`."""

    def fanning_out(self) -> ContextManager[None]:
        """While a fan-out's one request streams: a settings change does not close it."""

    # the controls of core/controls.py that a run's loop calls at its step boundaries
    def stopping(self, run_id: int) -> bool: ...

    def wait_at_gate(self, run_id: int) -> bool: ...

    def timed_gate(self, run_id: int) -> tuple[bool, float]: ...

    def take_settings(self) -> tuple[SamplerSettings, bool]: ...

    def settings_pending(self) -> bool: ...
