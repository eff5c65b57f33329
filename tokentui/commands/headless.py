"""`tokentui --headless [--json]`: the run streamed to stdout (the answer's text, or one JSON event per line), with
the same record, signal handling and exit statuses as the dashboard; `--follow-up TEXT` (repeated) asks each as a
turn of the same conversation after it, in this process (the KV cache of the turn before reused), and `--raw` runs
a plain completion. `tokentui/cli.py` parses the arguments and calls `run_headless`."""

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
    """The run, and each --follow-up after it as a turn of the same conversation (core/runs/turns.py), one record
    each. With follow-ups, every --json line of a turn's events carries `"turn": N`; a turn that fails or is
    stopped ends the conversation there."""
    from tokentui.core.errors import PromptError
    from tokentui.core.runs.turns import TurnRequest, follow_up

    def note(message: str) -> None:
        emit(say(message) + "\n", sys.stderr)

    if getattr(args, "logit_lens", False) and not args.json:
        note("--logit-lens: each step's lens goes to --json output and the run record, not to the text stream")
    for flag, asked in (("--attention", getattr(args, "attention", False) or getattr(args, "attention_heads", False)),
                        ("--sublayers", getattr(args, "sublayers", False))):
        if asked and not args.json:
            note(f"{flag}: each step's figures go to --json output and the run record, not to the text stream")
    if args.json:
        emit(json_line(engine.facts))
    follow_ups = list(getattr(args, "follow_up", None) or [])
    raw = getattr(args, "raw", False)
    tag = 1 if follow_ups else None  # the turn number each --json line carries (None: one run, lines as before)
    if raw:
        events = lambda: engine.turn(TurnRequest.first(prompt, args.system, raw=True))  # noqa: E731
    else:
        events = lambda: engine.run(prompt, args.system)  # noqa: E731
    status, run, path = _one_turn(args, engine, events, emit, note, stop, output_ok, tag)
    for turn, message in enumerate(follow_ups, start=2):
        done = run.done
        if status or stop.stopped_by or not output_ok() or done is None or done.reason in ("stopped", "error"):
            note(f"the conversation ended at turn {turn - 1}: {len(follow_ups) - turn + 2} follow-up(s) not asked")
            break
        try:
            request = follow_up(run, message, parent=path.name if path is not None else None)
        except PromptError as err:
            note(str(err))
            return 2
        status, run, path = _one_turn(args, engine, lambda: engine.turn(request), emit, note, stop, output_ok,
                                      turn)
    return status


def _one_turn(args, engine, events, emit, note, stop: SignalStop, output_ok, turn: int | None):
    """One run (a turn) streamed, recorded and folded: (exit status, the Run its events made, its record's path)."""
    from tokentui.core.errors import exit_status
    from tokentui.core.runs.events import DoneEvent, ErrorEvent, Notice, PrefillEvent, StepEvent
    from tokentui.core.runs.record_writer import RunRecorder
    from tokentui.core.runs.recording import RecordedRun
    from tokentui.core.runs.run import Run
    from tokentui.core.runs.turns import reuse_line

    def line(event) -> str:
        data = event.to_dict()
        if turn is not None:
            data["turn"] = turn
        return json_line(data)

    status = 0
    wrote_text = False
    folded = Run(engine.facts)
    with RecordedRun(engine.facts, None if args.no_record else RunRecorder(args.record_dir), on_note=note) as run:
        run.open()
        try:
            for event in run.record(events()):
                if stop.stopped_by or not output_ok():
                    engine.stop()  # also when the signal came before the run had started
                folded.apply(event)
                if isinstance(event, StepEvent):
                    stop.decoding()
                if args.json:
                    emit(line(event))
                elif isinstance(event, StepEvent):
                    if event.text:
                        emit(answer_text(event.text))  # a server's text: printed escaped (the record keeps it)
                        wrote_text = True
                elif isinstance(event, Notice):
                    note(event.message)
                elif isinstance(event, PrefillEvent) and folded.turn is not None:
                    note(f"turn {folded.turn.turn}: {reuse_line(folded.turn, event)}")
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
    if run.cut_off is not None:
        folded.apply(run.cut_off)
        if args.json:
            emit(line(run.cut_off))
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
        emit(recorded_line(run, "run" if turn in (None, 1) else f"turn {turn}") + "\n", sys.stderr)
    return status, folded, run.path


_WHERE_DROPPED = {"length": "at the length limit", "context": "at the context limit",
                  "stopped": "when the run stopped", "eos": "before the end token"}
