"""What `tokentui score` and `tokentui fanout` share: the engine's events of one run streamed and recorded, with
the headless command's signal handling and exit statuses, and the lines that describe a forced step (also
`tokentui branch --text`'s).

`stream_run(args, engine, events, show)`: each event recorded (--record-dir, --no-record), written as one JSON line
with --json, else handed to `show(event, emit)` which writes what a person reads; an error event's line on stderr
and its kind's exit status (core/errors.py's one table); a signal stops the run at its next step (a second one, or
one before anything ran, interrupts at once; the record still ends with `done`). `progress`: a ProgressLine
(load_progress.py) that `show` draws, erased before anything else is written and at the end.
"""

from __future__ import annotations

import signal
import sys
from typing import Callable, Iterator

from .common import SignalStop, interrupted, json_line, say, silence_stdio

Emit = Callable[..., None]


def stream_run(args, engine, events: Callable[[], Iterator], show: Callable, what: str, progress=None) -> int:
    from tokentui.core.errors import exit_status
    from tokentui.core.runs.events import ErrorEvent, FanoutProgress, StepEvent
    from tokentui.core.runs.explore_events import SampleEvent
    from tokentui.core.runs.record_writer import RunRecorder
    from tokentui.core.runs.recording import RecordedRun

    out, err = sys.stdout, sys.stderr
    gone: list[bool] = []

    def emit(text: str, stream=None) -> None:
        if gone:
            return
        if progress is not None:
            progress.clear()
        try:
            (stream or out).write(text)
            (stream or out).flush()
        except OSError:  # the reader has gone: stop the run, keep recording
            gone.append(True)
            silence_stdio()
            engine.stop()

    status = 0
    with SignalStop(engine) as stop:  # a signal stops the run at its next step (common.py's policy)
        stopped_by = stop.stopped_by
        try:
            recorder = None if args.no_record else RunRecorder(args.record_dir)
            with RecordedRun(engine.facts, recorder, on_note=lambda m: emit(say(m) + "\n", err)) as recorded:
                recorded.open()
                if args.json:
                    emit(json_line(engine.facts))
                try:
                    for event in recorded.record(events()):
                        if stopped_by:
                            engine.stop()
                        if isinstance(event, (StepEvent, SampleEvent, FanoutProgress)):  # decoding: stop at a step
                            stop.decoding()
                        if args.json:
                            emit(json_line(event))
                        else:
                            show(event, emit)
                        if isinstance(event, ErrorEvent):
                            if not args.json:
                                emit(say(event.message) + "\n", err)
                            status = exit_status(event.kind)
                except KeyboardInterrupt:
                    stop.note_interrupt()
                finally:
                    if progress is not None:
                        progress.finish()
            if recorded.cut_off is not None and args.json:
                emit(json_line(recorded.cut_off))
            if stopped_by:
                emit(f"tokentui: stopped; the {what} ended early\n", err)
                status = 128 + stopped_by[0]
            if recorded.path is not None:
                emit(f"tokentui: {what} recorded in {recorded.path}\n", err)
            return status
        except KeyboardInterrupt:
            return interrupted(stopped_by[0] if stopped_by else signal.SIGINT)


def forced_line(step) -> str:
    """One forced step as a person reads it: the token given, the model's raw probability and rank for it, its
    surprisal, and the token the model itself preferred there."""
    import math

    from tokentui.core.runs.scoring import percent, surprisal_bits

    bits = surprisal_bits(step.chosen_raw_prob)
    top = max(step.candidates, key=lambda c: c.raw_prob) if step.candidates else None
    said = f"{bits:5.1f} bits" if bits is not None and bits != math.inf else "  inf bits"
    rank = f"rank {step.chosen_rank + 1}" if step.chosen_rank is not None else "rank ?"
    line = f"step {step.index + 1:>4}  {step.piece!r:<16} p {percent(step.chosen_raw_prob):>9}  {rank:<9} {said}"
    if top is not None and top.id != step.id:
        line += f"   the model preferred {top.piece!r} ({top.raw_prob:.1%})"
    elif top is not None:
        line += "   its own first choice"
    return line
