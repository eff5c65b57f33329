"""One run of an engine, recorded as it happens: the bookkeeping `--headless`, `tokentui branch` and the dashboard
share.

`RecordedRun` opens the run's record and writes the model's facts first, writes every event before passing it on,
and closes the record when the run ends. Every record ends with `done`: an engine's own stream always does
(core/interface.py), and for the ends an engine never reports this writes it, from the steps seen so far
(core/runs/ending.py's StepTally):
- cut off from outside (a signal interrupted it, the caller stopped reading, the model process was closed on
  purpose): a `done` with reason "stopped", kept in `cut_off` for the caller to report;
- a failure outside the engine's own events (an exception in the engine, the model process killed, a message that
  is not the protocol's): `fail(message, kind)` writes an `error` event and a `done` with reason "error" and returns
  them, so the caller shows them as it would an engine's own.

Recording never ends a run: a record that cannot be opened or written is said once through `on_note` and the
run goes on unrecorded (`cut_short` then names the record that stopped early; a record that not even the model's
facts could be written to is removed by the recorder, and the note says the run was not recorded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

from ..errors import ErrorKind, TokentuiError
from ..interrupts import unbroken
from ..paths import why_not
from .ending import StepTally
from .events import DoneEvent, ErrorEvent, Event
from .facts import ModelFacts
from .record_writer import RunRecorder


class RecordedRun:
    """Use as a context manager around `record(events)` (or `feed()` for events received elsewhere), so the record is
    finished however the caller leaves:

        with RecordedRun(engine.facts, recorder, on_note=say) as run:
            path = run.open()
            for event in run.record(engine.run(prompt, system)):
                ...
        if run.cut_off is not None: ...  # the `done` the engine did not send

    `recorder` None records nothing.
    """

    def __init__(self, facts: ModelFacts, recorder: RunRecorder | None, *, on_note: Callable[[str], None]):
        self.facts = facts
        self._recorder = recorder
        self._on_note = on_note
        self.path: Path | None = None  # the record, once opened
        self.cut_short = False  # the record could not be written to the end (said through on_note)
        self.finished = False  # the run's own events ended with their `done`
        self.ended = False  # a `done` has been recorded (the run's own, or one written here)
        self.cut_off: DoneEvent | None = None  # the `done` written for a run cut off from outside
        self.error: ErrorEvent | None = None  # the run's error, when it failed
        self._tally = StepTally()
        self._stream: Iterator[Event] | None = None

    # ---- the record ----------------------------------------------------------------------------------------
    def open(self) -> Path | None:
        """Open the record and write the model's facts; None when not recording (or the record could not be
        opened: said once through `on_note`)."""
        recorder = self._recorder
        if recorder is None:
            return None
        try:
            self.path = recorder.open_run()
        except OSError as err:
            self._drop_recorder()
            self._on_note(f"run not recorded: {why_not(err)}")
            return None
        try:
            recorder.write(self.facts)
        except OSError as err:  # a disk full from the start: the empty record is removed (RunRecorder.close)
            self._drop_recorder()
            self.path = None
            self._on_note(f"run not recorded: {why_not(err)} writing to {recorder.directory}")
        return self.path

    def _write(self, event: Event) -> None:
        if self._recorder is None:
            return
        try:
            self._recorder.write(event)
        except OSError as err:
            self._drop_recorder()
            self.cut_short = self.path is not None
            self._on_note(f"recording stopped: {why_not(err)}" + (f"; {self.path} ends early" if self.path else ""))

    def _drop_recorder(self) -> None:
        recorder, self._recorder = self._recorder, None
        if recorder is not None:
            try:
                recorder.close()
            except OSError:
                pass

    # ---- the run -------------------------------------------------------------------------------------------
    def record(self, events: Iterator[Event]) -> Iterator[Event]:
        """`events` (an engine's run or branch, or any stream of one run's events), each recorded before it is passed
        on."""
        if self._stream is not None:
            raise RuntimeError("a RecordedRun records one run")
        self._stream = self._recorded(events)
        return self._stream

    def _recorded(self, events: Iterator[Event]) -> Iterator[Event]:
        try:
            for event in events:
                self.feed(event)
                yield event
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except TokentuiError as err:  # a stream that raised its error instead of reporting it: recorded as one
            self.fail(str(err), err.kind, err.step)
            raise
        except Exception as err:  # an engine's bug: the record still ends, then the caller sees the exception
            self.fail(f"{type(err).__name__}: {err}", ErrorKind.CRASH)
            raise
        finally:  # also on KeyboardInterrupt and when the caller stops reading (GeneratorExit)
            self._end()

    def feed(self, event: Event) -> None:
        """Record one event of the run (for a caller that receives the events itself: the dashboard's client)."""
        self._add(event)
        if isinstance(event, DoneEvent):
            self.finished = True

    def _add(self, event: Event) -> None:
        if self.ended:
            return  # nothing follows a run's `done`
        with unbroken():  # written and counted together: a signal's interrupt waits (core/interrupts.py)
            self._write(event)
            self._tally.see(event)
            if isinstance(event, ErrorEvent):
                self.error = event
            elif isinstance(event, DoneEvent):
                self.ended = True
        if self.ended:
            self._drop_recorder()

    def fail(self, message: str, kind: ErrorKind, step: int = -1) -> list[Event]:
        """The run failed outside its own events: its `error` and `done` (reason "error"), recorded and returned
        (none when it had ended already)."""
        if self.ended:
            return []
        ending: list[Event] = []
        if self.error is None:
            error = ErrorEvent(message=message, step=step, kind=kind)
            self._add(error)
            ending.append(error)
        done = self._tally.done("error", self.facts.vocab_rows)
        self._add(done)
        return ending + [done]

    def _end(self) -> None:
        if not self.ended:
            if self.error is not None:
                self.fail("", self.error.kind)  # an error without its done: the done follows it
            else:
                self.cut_off = self._tally.done("stopped", self.facts.vocab_rows)
                self._add(self.cut_off)
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


__all__ = ["RecordedRun"]
