"""`tokentui replay FILE`: play a run record — or a tree of runs (the dashboard's `.tree.jsonl`: a prompt's first run
and its branches) — back in the dashboard (or, `--headless`, as text / JSON lines). A replay never connects to
anything: a served model's record plays from the file alone.

Torch and transformers are never imported: a replay needs the record alone. A file that is not a record this
version can read ends with one line on stderr and exit status 2; a record cut short plays up to its last whole
line with a notice.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from tokentui.core.errors import EXIT_BAD_INPUT, EXIT_RUN_FAILED

from .common import TextArgumentParser, answer_text, bad_input, interrupted, json_line, say


class _Parser(TextArgumentParser):  # text arguments checked for UTF-8 (common.py)
    def error(self, message: str):  # one line, not the usage block
        self.exit(EXIT_BAD_INPUT, f"tokentui replay: {message} (see tokentui replay --help)\n")


def _speed(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--speed must be a number, got {text!r}") from None


def build_replay_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tokentui replay",
                description="Play a run back as it was recorded, in the dashboard or as text: no model is loaded "
                            "and nothing is connected to. A tree file plays the first run and then each branch "
                            "as it was taken (B lists them, enter switches, c compares, as live).")
    p.add_argument("file", type=Path, help="a run record (.jsonl: from the dashboard, --record-dir or --headless "
                                           "--json output) or a tree of runs (.tree.jsonl, which the dashboard "
                                           "writes for each prompt)")
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
        engine = ReplayEngine.from_file(args.file, speed=args.speed)
        if args.headless:
            return replay_headless(engine, args.json)
        from .dashboard import check_terminal

        check_terminal()  # no terminal: one line, not a dashboard drawn into a file
        return replay_dashboard(engine, args.theme)
    except TokentuiError as err:
        return bad_input(err)
    except KeyboardInterrupt:
        return interrupted(signal.SIGINT)


def replay_headless(engine, as_json: bool) -> int:
    """The run's answer as it was written (or its events as JSON lines, the `model` event first, as recorded). A
    tree: each run in the order they were made, each after a `tree_run` line (JSON) or a line on stderr (text) that
    says which run it is and where it left its parent."""
    from tokentui.core.errors import exit_status
    from tokentui.core.runs.events import BranchEvent, DoneEvent, ErrorEvent, Notice, StepEvent
    from tokentui.core.runs.replay import ReplayEngine

    out, err = sys.stdout, sys.stderr
    status = 0
    # a record is outside input: what it holds is printed escaped (answer_text, say, json_line)
    tree = engine.as_tree
    if as_json:
        out.write(json_line(engine.source.facts))
    try:
        for node in tree.nodes:
            run = tree.runs.get(node.number)
            if run is None:
                continue
            if len(tree) > 1:
                if as_json:
                    out.write(json_line(node.to_dict()))
                else:
                    out.flush()
                    err.write(say(_describe(node)) + "\n")
            player = engine if node.number == 1 else ReplayEngine(run, speed=engine.speed)
            for event in player.run():
                if as_json:
                    out.write(json_line(event))
                elif isinstance(event, StepEvent) and event.text:
                    out.write(answer_text(event.text))
                elif isinstance(event, BranchEvent):  # a branch's record: its answer starts with its parent's prefix
                    out.write(answer_text(event.prefix_text))
                elif isinstance(event, DoneEvent):
                    if event.reason != "error":
                        out.write(answer_text(event.flushed) + "\n")
                    if event.dropped_hex:
                        err.write(say(f"an incomplete character was dropped at the end (bytes "
                                      f"{event.dropped_hex})") + "\n")
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


def _describe(node) -> str:
    if node.is_turn:
        return f"run {node.number}: turn {node.turn} after run {node.parent}: {node.user!r}"
    if not node.is_branch:
        return f"run {node.number}: the first run"
    was = f" instead of {node.parent_piece!r}" if node.parent_piece else ""
    return f"run {node.number}: a branch of run {node.parent} at step {node.at + 1}: {node.piece!r}{was}"


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
                           replay=engine.as_tree, **overrides)
