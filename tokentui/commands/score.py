"""`tokentui score --prompt P --answer A` (or `--answer-file F`): how likely is this answer? The prompt is templated
and prefilled as for a run, then the answer is teacher-forced as a whole in one forward (core/model/scoring.py),
and every token of it becomes a step with its candidates, rank and probability, as if it had been generated.

With --headless, one line per token (its probability, rank, surprisal and what the model preferred) and the
summary (total log-probability, perplexity, the least likely tokens); with --json, the headless JSON lines
(`prompt`, `score`, `prefill`, a forced `step` per token, `score_summary`, `done` with reason "scored"). Without
--headless the dashboard opens on the scored answer, heat-coloured by probability (time travel, the lens, the
one-pass panel and branching work over it as over a run). Every argument of `tokentui` applies (model, device,
sampler: the settings the candidates are shown under). Bad input: one line, exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .common import answer_text, bad_input, interrupted, make_loader, read_prompt, say, settings_from_args


def build_score_parser(build_parser):
    """`tokentui`'s own parser (`build_parser`, handed in by tokentui/cli.py: every flag of a run applies) with the
    answer's flags."""
    p = build_parser()
    p.prog = "tokentui score"
    p.description = ("Score a text: the answer is teacher-forced after the prompt, and each of its tokens is shown "
                     "with the probability and rank the model gave it.")
    p.epilog = None
    p.add_argument("--answer", default=None, help="the answer to score (the text the model is made to say)")
    p.add_argument("--answer-file", type=Path, default=None, help="read the answer from a UTF-8 text file")
    return p


def read_answer(args) -> str:
    from tokentui.core.errors import PromptError

    if args.answer is not None and args.answer_file is not None:
        raise PromptError("--answer and --answer-file both give the answer: pass one of them")
    if args.answer_file is not None:
        try:
            return args.answer_file.read_bytes().decode("utf-8").rstrip("\n")
        except FileNotFoundError:
            raise PromptError(f"--answer-file {args.answer_file}: no such file") from None
        except IsADirectoryError:
            raise PromptError(f"--answer-file {args.answer_file}: is a folder, not a text file") from None
        except UnicodeDecodeError as err:
            raise PromptError(f"--answer-file {args.answer_file}: not UTF-8 text (bad byte at offset "
                              f"{err.start}); save it as UTF-8") from None
        except OSError as err:
            raise PromptError(f"--answer-file {args.answer_file}: {err.strerror}") from None
    if args.answer is None:
        raise PromptError("nothing to score: pass --answer TEXT or --answer-file FILE")
    return args.answer


def score_main(argv: list[str], build_parser) -> int:
    import signal

    from tokentui.core.errors import TokentuiError

    try:
        args = build_score_parser(build_parser).parse_args(argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 2
    try:
        from tokentui.core.runs.requests import ScoreRequest

        prompt = read_prompt(args)
        request = ScoreRequest(prompt=prompt, answer=read_answer(args), system=args.system)
        settings_from_args(args)
        if args.json and not args.headless:
            raise TokentuiError("--json needs --headless")
        if args.server is not None:
            raise TokentuiError("scoring a text needs the local engine: a served model's scores of given tokens "
                                "are not asked for (drop --server)")
        from tokentui.core.model.load.precheck import check_model_and_device, parse_device, resolve_model

        if not args.headless:
            check_model_and_device(args.model, args.device, allow_pickle=args.allow_pickle)
            from tokentui.commands.dashboard import check_terminal, run_dashboard

            check_terminal()  # before the model process starts
            return run_dashboard(args, prompt, score=request)
        parse_device(args.device)
        resolve_model(args.model, allow_pickle=args.allow_pickle)
        engine = make_loader(args)(lambda progress: None)
        from .stream import stream_run

        return stream_run(args, engine, lambda: engine.score(request), _show, "scored text")
    except TokentuiError as err:
        return bad_input(err)
    except KeyboardInterrupt:
        return interrupted(signal.SIGINT)


def _show(event, emit) -> None:
    from tokentui.core.runs.events import Notice, StepEvent
    from tokentui.core.runs.explore_events import ScoreSummary

    from .stream import forced_line

    if isinstance(event, StepEvent):
        emit(forced_line(event) + "\n")
    elif isinstance(event, Notice):
        emit(say(event.message) + "\n", sys.stderr)
    elif isinstance(event, ScoreSummary):
        emit(answer_text(summary_text(event)))


def summary_text(summary) -> str:
    from tokentui.core.runs.scoring import percent

    least = ", ".join(f"{t.piece!r} at step {t.index + 1} ({percent(t.raw_prob)})" for t in summary.least_likely[:5])
    return (f"{summary.tokens} tokens: log-probability {summary.logprob:.3f} nats, perplexity "
            f"{summary.perplexity:.3f}\nleast likely: {least}\n")
