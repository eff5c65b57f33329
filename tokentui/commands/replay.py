"""`tokentui replay FILE.jsonl`: play a run record back in the dashboard (or, `--headless`, as text / JSON lines).

Torch and transformers are never imported: a replay needs the record alone. A file that is not a record this
version can read ends with one line on stderr and exit status 2; a record cut short plays up to its last whole
line with a notice.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from .common import EXIT_BAD_INPUT, EXIT_RUN_FAILED, answer_text, bad_input, interrupted, json_line, say


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the usage block
        self.exit(EXIT_BAD_INPUT, f"tokentui replay: {message} (see tokentui replay --help)\n")


def _speed(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--speed must be a number, got {text!r}") from None


def build_replay_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tokentui replay",
                description="Play a run record back: the dashboard as the run was recorded, no model needed.")
    p.add_argument("file", type=Path, help="a run record (.jsonl): from the dashboard, --record-dir, or "
                                           "--headless --json output")
    p.add_argument("--speed", type=_speed, default=1.0,
                   help="N times the recorded speed (1 = as recorded, 0 = as fast as possible)")
    p.add_argument("--theme", default="tokentui-dark", help="dashboard theme")
    p.add_argument("--headless", action="store_true", help="no dashboard: the answer's text to stdout")
    p.add_argument("--json", action="store_true", help="with --headless: one JSON event per line")
    return p


def replay_main(argv: list[str]) -> int:
    from tokentui.core.errors import TokentuiError
    from tokentui.core.runs.replay import ReplayEngine

    args = build_replay_parser().parse_args(argv)
    try:
        if args.json and not args.headless:
            raise TokentuiError("--json needs --headless")
        engine = ReplayEngine.from_record(args.file, speed=args.speed)
        if args.headless:
            return replay_headless(engine, args.json)
        return replay_dashboard(engine, args.theme)
    except TokentuiError as err:
        return bad_input(err)
    except KeyboardInterrupt:
        return interrupted(signal.SIGINT)


def replay_headless(engine, as_json: bool) -> int:
    """The run's answer as it was written (or its events as JSON lines, the `model` event first, as recorded)."""
    from tokentui.core.errors import exit_status
    from tokentui.core.runs.events import BranchEvent, DoneEvent, ErrorEvent, Notice, StepEvent

    out, err = sys.stdout, sys.stderr
    status = 0
    # a record is outside input: what it holds is printed escaped (answer_text, say, json_line)
    if as_json:
        out.write(json_line(engine.source.facts))
    try:
        for event in engine.run():
            if as_json:
                out.write(json_line(event))
            elif isinstance(event, StepEvent) and event.text:
                out.write(answer_text(event.text))
            elif isinstance(event, BranchEvent):  # a branch's record: its answer starts with its parent's prefix
                out.write(answer_text(event.prefix_text))
            elif isinstance(event, DoneEvent):
                out.write(answer_text(event.flushed) + "\n")
                if event.dropped_hex:
                    err.write(say(f"an incomplete character was dropped at the end (bytes {event.dropped_hex})") + "\n")
            elif isinstance(event, (Notice, ErrorEvent)):
                out.flush()
                err.write(say(event.message) + "\n")
            if isinstance(event, ErrorEvent):
                status = exit_status(event.kind)
            out.flush()
    except BrokenPipeError:  # `tokentui replay … --headless | head`: the reader has gone
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_RUN_FAILED
    return status


def replay_dashboard(engine, theme: str) -> int:
    from tokentui.tui.program import run_dashboard

    return run_dashboard(replay_config(engine, theme))


def replay_config(engine, theme: str = "tokentui-dark", **overrides):
    """The dashboard's configuration for a replay: the recorded prompt and settings, no new record written."""
    from tokentui.tui.config import DashboardConfig

    prompt = engine.source.prompt
    return DashboardConfig(load=lambda progress: engine,
                           prompt=prompt.user_prompt if prompt is not None else "",
                           system=prompt.system_prompt if prompt is not None else None,
                           sampler=engine.sampler, options=engine.options, theme=theme, recorder=None,
                           **overrides)
