"""`tokentui --headless [--json]`: the run streamed to stdout (the answer's text, or one JSON event per line), with
the same record, signal handling and exit statuses as the dashboard. `tokentui/cli.py` parses the arguments and
calls `run_headless`."""

from __future__ import annotations

import signal
import sys

from tokentui.core.errors import EXIT_RUN_FAILED

from .common import SignalStop, answer_text, json_line, make_loader, recorded_line, say, silence_stdio
from .load_progress import LoadProgressLine


def run_headless(args, prompt: str) -> int:
    from tokentui.core.runs.events import LoadProgress

    out = sys.stdout
    output_ok = True
    engine = None

    def emit(text: str, stream=None) -> None:
        """Write to the terminal; once it is gone (SSH dropped, pipe closed) stop the run but keep recording."""
        nonlocal output_ok
        if not output_ok:
            return
        try:
            (stream or out).write(text)
            (stream or out).flush()
        except OSError:
            output_ok = False
            silence_stdio()
            if engine is not None:
                engine.stop()

    line = LoadProgressLine(sys.stderr, write=lambda text: emit(text, sys.stderr))  # a terminal's stderr only

    def progress(event: LoadProgress) -> None:
        if args.json:
            emit(json_line(event))
        else:
            line.update(event.stage, event.fraction)

    if not args.json:
        line.update("starting")
    try:
        engine = make_loader(args)(progress)
    finally:
        line.finish()  # erased before the answer or the error's one line
    with SignalStop(engine) as stop:  # from here a signal stops the run at its next step (common.py's policy)
        return _headless_run(args, prompt, engine, emit, stop, lambda: output_ok)


def _headless_run(args, prompt, engine, emit, stop: SignalStop, output_ok) -> int:
    from tokentui.core.errors import exit_status
    from tokentui.core.runs.events import DoneEvent, ErrorEvent, Notice, StepEvent
    from tokentui.core.runs.record_writer import RunRecorder
    from tokentui.core.runs.recording import RecordedRun

    def note(message: str) -> None:
        emit(say(message) + "\n", sys.stderr)

    status = 0
    wrote_text = False
    if getattr(args, "logit_lens", False) and not args.json:
        note("--logit-lens: each step's lens goes to --json output and the run record, not to the text stream")
    for flag, asked in (("--attention", getattr(args, "attention", False) or getattr(args, "attention_heads", False)),
                        ("--sublayers", getattr(args, "sublayers", False))):
        if asked and not args.json:
            note(f"{flag}: each step's figures go to --json output and the run record, not to the text stream")
    with RecordedRun(engine.facts, None if args.no_record else RunRecorder(args.record_dir), on_note=note) as run:
        run.open()
        if args.json:
            emit(json_line(engine.facts))
        try:
            for event in run.record(engine.run(prompt, args.system)):
                if stop.stopped_by or not output_ok():
                    engine.stop()  # also when the signal came before the run had started
                if isinstance(event, StepEvent):
                    stop.decoding()
                if args.json:
                    emit(json_line(event))
                elif isinstance(event, StepEvent):
                    if event.text:
                        emit(answer_text(event.text))  # a server's text: printed escaped (the record keeps it)
                        wrote_text = True
                elif isinstance(event, Notice):
                    note(event.message)
                elif isinstance(event, DoneEvent) and event.reason != "error":  # after an error: its line said it
                    emit(answer_text(event.flushed) + "\n")
                    if event.dropped_hex:  # not printed as U+FFFD: said here, once
                        emit(f"tokentui: an incomplete character {_WHERE_DROPPED.get(event.reason, 'at the end')} "
                             f"was dropped (bytes {event.dropped_hex})\n", sys.stderr)
                if isinstance(event, ErrorEvent):
                    if not args.json:
                        if wrote_text:
                            emit("\n")
                        note(event.message)
                    status = exit_status(event.kind)  # core/errors.py's one table
        except KeyboardInterrupt:  # in prefill, or a second signal: interrupted mid-step
            stop.note_interrupt()
    # Interrupted mid-step, or stopped before the first step: the record still ends with "done" (the runner's).
    if run.cut_off is not None and args.json:
        emit(json_line(run.cut_off))
    if stop.stopped_by:
        name = {signal.SIGINT: "interrupted", signal.SIGHUP: "hung up (SIGHUP)",
                signal.SIGTERM: "terminated (SIGTERM)"}.get(stop.stopped_by[0], "stopped")
        if wrote_text and not run.finished:
            emit("\n")
        emit(f"tokentui: {name}; the run stopped\n", sys.stderr)
        status = 128 + stop.stopped_by[0]
    elif not output_ok():
        status = EXIT_RUN_FAILED
    if run.path is not None:
        emit(recorded_line(run, "run") + "\n", sys.stderr)
    return status


_WHERE_DROPPED = {"length": "at the length limit", "context": "at the context limit",
                  "stopped": "when the run stopped", "eos": "before the end token"}
