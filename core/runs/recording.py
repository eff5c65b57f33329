"""One run of an engine, recorded as it happens: the bookkeeping `--headless` and the dashboard share.

`RecordedRun` opens the run's record and writes the model's facts first, writes every event the engine yields
before passing it on, and closes the record when the run ends. A record ends with `done` (or `error`): when the
engine's stream stops without one — a signal interrupted it (KeyboardInterrupt), the caller stopped reading, or
the engine returned early — the `done` (reason "stopped") is built from the steps seen so far
(`events.StepTally`), written, and kept in `cut_off` for the caller to report. A crash (any other exception
from the engine) is passed on as is; its record ends with the last event before it.

Recording never ends a run: a record that cannot be opened or written is said once through `on_note` and the
run goes on unrecorded.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

from .events import BranchEvent, DoneEvent, ErrorEvent, Event, PromptEvent, StepEvent, StepTally
from .record_writer import RunRecorder


class RecordedRun:
    """Use as a context manager around `events()` (or `feed()` for events received elsewhere), so the record is
    finished however the caller leaves:

        with RecordedRun(engine, recorder, on_note=say) as run:
            path = run.open()
            for event in run.events(prompt, system):
                ...
        if run.cut_off is not None: ...  # the `done` the engine did not send

    `engine` needs `facts` (a ModelFacts) and `run(prompt, system)`; `recorder` None records nothing.
    """

    def __init__(self, engine, recorder: RunRecorder | None, *, on_note: Callable[[str], None]):
        self.engine = engine
        self._recorder = recorder
        self._on_note = on_note
        self.path: Path | None = None  # the record, once opened
        self.finished = False  # the engine sent `done` or `error`
        self.cut_off: DoneEvent | None = None  # the `done` written for a run that ended without one
        self._steps = StepTally()  # what a "stopped" done needs, not the steps themselves
        self._prompt_tokens = 0
        self._prefix_text = ""  # a branch's answer before its branch point (its `done` text starts with it)
        self._stream: Iterator[Event] | None = None
        self._crashed = False  # the engine raised: passed on, no `done` made up for it

    # ---- the record ----------------------------------------------------------------------------------------
    def open(self) -> Path | None:
        """Open the record and write the model's facts; None when not recording (or the record could not be
        opened: said once through `on_note`)."""
        recorder = self._recorder
        if recorder is None:
            return None
        try:
            self.path = recorder.open_run()
            recorder.write(self.engine.facts)
        except OSError as err:
            self._drop_recorder()
            self.path = None
            self._on_note(f"run not recorded: {err}")
        return self.path

    def _write(self, event: Event) -> None:
        if self._recorder is None:
            return
        try:
            self._recorder.write(event)
        except OSError as err:
            self._drop_recorder()
            self._on_note(f"recording stopped: {err}")

    def _drop_recorder(self) -> None:
        recorder, self._recorder = self._recorder, None
        if recorder is not None:
            try:
                recorder.close()
            except OSError:
                pass

    # ---- the run -------------------------------------------------------------------------------------------
    def events(self, prompt: str, system: str | None) -> Iterator[Event]:
        """The engine's events for one run, each recorded before it is passed on."""
        if self._stream is not None:
            raise RuntimeError("a RecordedRun runs once")
        self._stream = self._run(prompt, system)
        return self._stream

    def _run(self, prompt: str, system: str | None) -> Iterator[Event]:
        try:
            for event in self.engine.run(prompt, system):
                self.feed(event)
                yield event
        except Exception:
            self.crashed()
            raise
        finally:  # also on KeyboardInterrupt and when the caller stops reading (GeneratorExit)
            self._end()

    def feed(self, event: Event) -> None:
        """Record one event of the run (for a caller that receives the events itself: the dashboard's client)."""
        self._write(event)
        if isinstance(event, StepEvent):
            self._steps.add(event)
        elif isinstance(event, PromptEvent):
            self._prompt_tokens = len(event.ids)
        elif isinstance(event, BranchEvent):
            self._prompt_tokens = len(event.prompt_ids)
            self._prefix_text = event.prefix_text
        elif isinstance(event, (DoneEvent, ErrorEvent)):
            self.finished = True

    def crashed(self) -> None:
        """The engine failed (an exception, not an `error` event): the record ends with the last event before it,
        with no `done` made up for it."""
        self._crashed = True

    def _end(self) -> None:
        if not self.finished and not self._crashed and self.cut_off is None:
            done = self._steps.stopped_done(self._prompt_tokens, self.engine.facts.vocab_rows)
            self.cut_off = replace(done, text=self._prefix_text + done.text) if self._prefix_text else done
            self._write(self.cut_off)
        self._drop_recorder()

    def close(self) -> None:
        """Finish the record: a run cut off before its `done` (even before it started) gets one; the file is
        closed."""
        if self._stream is not None:
            self._stream.close()  # runs `_end` in the stream, when it had started
        self._end()

    def __enter__(self) -> "RecordedRun":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
