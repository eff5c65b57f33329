"""The one engine interface. Every engine keeps it: the local engine (core/model/engine.py), the served-model
engine (core/server/engine.py), the replay (core/runs/replay.py) and the tests' scripted engine (tests/fakes.py).
The dashboard's engine clients (core/link/) and the commands (tokentui/commands/) use nothing else.

    facts      ModelFacts of the model (read off it, or what its server reports)
    options    RunOptions (assignable, or set_options(options): a run reads them at its next step)
    run(prompt, system, run_id=None)   the events of one generation
    branch(point, run_id=None)         the events of a branch of an earlier run (core/runs/branch_point.py); a
                                       point with a phrase forces each of its tokens (core/model/forcing.py)
    score(request, run_id=None)        the events of a scored text (core/runs/requests.py, core/model/scoring.py)
    fanout(request, run_id=None)       the events of a fan-out: many samples at once (core/model/fanout.py)
    turn(request, run_id=None)         the events of a conversation's turn: a follow-up reusing the last turn's KV
                                       cache, or a raw run with no chat template (core/runs/turns.py)
    phrase_pieces(text)                a phrase's tokens, tokenized on its own (PromptPiece list)
    preview_step(request)              a step seen again under other sampler settings, the run unchanged
                                       (core/runs/preview.py; a list of one StepPreview)
    branch_refusal, phrase_refusal, score_refusal, fanout_refusal, turn_refusal, preview_refusal
                                       why this engine cannot do that, one line (None: it can)
    close()                            end the run in progress and free what the engine holds
    + the controls of core/controls.py: sampler / set_sampler, pause, resume, step_once, stop(run_id)

Each of these a dashboard reaches across the model process is declared once, as a message of core/link/protocol.py
that names the method here it calls (core/link/operations.py).

The stream of a run or a branch, whatever the engine: [Notice...], PromptEvent (a branch: BranchEvent first),
[PrefillProgress...], PrefillEvent, StepEvent..., and always a DoneEvent last (a scored text: PromptEvent, ScoreEvent,
PrefillEvent, StepEvent..., ScoreSummary, DoneEvent; a fan-out: FanoutEvent, PrefillEvent, [FanoutProgress...],
SampleEvent..., DoneEvent). A failure is one ErrorEvent (a line and a kind, core/errors.py) followed by that
DoneEvent with reason "error" — the one error path: an engine raises a TokentuiError (or yields an ErrorEvent) and
`run` / `branch` here turn it into those two events.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Iterator

from .controls import RunControls
from .errors import SettingsError
from .runs.ending import finish_run

if TYPE_CHECKING:
    from .runs.branch_point import BranchPoint
    from .runs.events import Event, PromptPiece
    from .runs.facts import ModelFacts
    from .runs.requests import FanoutRequest, ScoreRequest
    from .runs.turns import TurnRequest
    from .settings import RunOptions


class BaseEngine(RunControls, ABC):
    facts: "ModelFacts"
    options: "RunOptions"

    def run(self, prompt: str, system: str | None = None, *, run_id: int | None = None) -> Iterator["Event"]:
        """One generation of `prompt` (see the module docstring for its events), as run `run_id`."""
        run_id = self.begin_run(run_id)
        return finish_run(self._run(prompt, system, run_id), self.facts.vocab_rows)

    def branch(self, point: "BranchPoint", *, run_id: int | None = None) -> Iterator["Event"]:
        """A branch of an earlier run at `point`; an engine that cannot branch ends it with one error line."""
        run_id = self.begin_run(run_id)
        return finish_run(self._branch_or_refuse(point, run_id), self.facts.vocab_rows)

    def score(self, request: "ScoreRequest", *, run_id: int | None = None) -> Iterator["Event"]:
        """A scored text: `request.answer` teacher-forced after its prompt (core/model/scoring.py)."""
        run_id = self.begin_run(run_id)
        return finish_run(self._refusing(self.score_refusal, lambda: self._score(request, run_id)),
                          self.facts.vocab_rows)

    def fanout(self, request: "FanoutRequest", *, run_id: int | None = None) -> Iterator["Event"]:
        """A fan-out: `request.n` samples of `request.m` tokens from one step, in one batched decode."""
        run_id = self.begin_run(run_id)
        return finish_run(self._refusing(self.fanout_refusal, lambda: self._fanout(request, run_id)),
                          self.facts.vocab_rows)

    def turn(self, request: "TurnRequest", *, run_id: int | None = None) -> Iterator["Event"]:
        """A turn of a conversation (core/runs/turns.py): TurnEvent, the prompt of the whole conversation, its
        prefill (what was reused), the answer's steps, done."""
        run_id = self.begin_run(run_id)
        return finish_run(self._refusing(self.turn_refusal, lambda: self._turn(request, run_id)),
                          self.facts.vocab_rows)

    def set_options(self, options: "RunOptions") -> None:
        """The run options from now on (a run reads them at its next step)."""
        self.options = options

    def phrase_pieces(self, text: str) -> list["PromptPiece"]:
        """The tokens of `text` tokenized on its own (no special tokens added), for a phrase to force; SettingsError
        (one line) when this engine cannot."""
        raise SettingsError(self.phrase_refusal or "this engine cannot tokenize a phrase")

    def preview_step(self, request) -> list:
        """Step `request.at` of a run under `request.settings` (core/runs/preview.py): a list of one StepPreview;
        SettingsError (one line) when this engine cannot (`preview_refusal`)."""
        raise SettingsError(self.preview_refusal or "this engine cannot preview a step")

    def _branch_or_refuse(self, point: "BranchPoint", run_id: int) -> Iterator["Event"]:
        refusal = self.branch_refusal
        if refusal is None and point.phrase:
            refusal = self.phrase_refusal
        yield from self._refusing(refusal, lambda: self._branch(point, run_id))

    @staticmethod
    def _refusing(refusal: str | None, events) -> Iterator["Event"]:
        if refusal is not None:
            raise SettingsError(refusal)
        yield from events()

    @property
    def branch_refusal(self) -> str | None:
        """Why `branch` cannot run on this engine, as one line a user can act on (None: it can)."""
        return None

    @property
    def phrase_refusal(self) -> str | None:
        """Why this engine cannot force a phrase (a branch point with `phrase`), one line (None: it can)."""
        return "this engine cannot force a phrase"

    @property
    def score_refusal(self) -> str | None:
        """Why `score` cannot run on this engine, one line (None: it can)."""
        return "this engine cannot score a text"

    @property
    def preview_refusal(self) -> str | None:
        """Why `preview_step` cannot run on this engine, one line (None: it can): it recomputes the step's scores,
        which only a model in this program has (a replay has none; a server sends no logits)."""
        return "no model here to recompute this step under other settings"

    @property
    def fanout_refusal(self) -> str | None:
        """Why `fanout` cannot run on this engine, one line (None: it can)."""
        return "fan-out needs the local engine"

    @property
    def turn_refusal(self) -> str | None:
        """Why `turn` (a follow-up, a raw run) cannot run on this engine, one line (None: it can)."""
        return "this engine cannot run a follow-up turn or a raw prompt"

    def close(self) -> None:
        """End the run in progress (at its next step) and let go of what the engine holds."""
        self.stop()
        if self.paused:
            self.resume()

    # ---- what an engine implements --------------------------------------------------------------------------
    @abstractmethod
    def _run(self, prompt: str, system: str | None, run_id: int) -> Iterator["Event"]:
        """The run's events; may raise TokentuiError (turned into the error and done events)."""

    def _branch(self, point: "BranchPoint", run_id: int) -> Iterator["Event"]:
        raise SettingsError("this engine cannot branch")

    def _score(self, request: "ScoreRequest", run_id: int) -> Iterator["Event"]:
        raise SettingsError(self.score_refusal or "this engine cannot score a text")

    def _fanout(self, request: "FanoutRequest", run_id: int) -> Iterator["Event"]:
        raise SettingsError(self.fanout_refusal or "fan-out needs the local engine")

    def _turn(self, request: "TurnRequest", run_id: int) -> Iterator["Event"]:
        raise SettingsError(self.turn_refusal or "this engine cannot run a follow-up turn or a raw prompt")
