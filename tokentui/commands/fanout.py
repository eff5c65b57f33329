"""`tokentui fanout RECORD.jsonl --at STEP -n N --tokens M [--seed S] [sampler flags] [--json]`: what else does the
distribution hold from here? N continuations of M tokens each are drawn from one step of a recorded run under the
sampler settings (the record's at that step unless flags override them), in one batched decode that shares the
prefix's KV cache (core/model/fanout.py); sample i draws with seed S + i, so it is reproducible on its own.

Text: the samples sorted by sequence log-probability (sum of the log post-sampler probabilities), where each one
first differs from the run, and the first tokens drawn against the step's post-sampler probabilities. --json: the
headless JSON lines (`fanout`, `fanout_progress` about once a second while a long one decodes, N `sample`, `done`).
On a terminal's stderr (text mode) one line shows the model's loading, then how far the decode has gone (tokens a
sample, tokens drawn, samples ended, seconds), erased before the result (load_progress.py). STEP is numbered from 1
(the JSON's `at` is STEP - 1); STEP may be one past the record's last step (go on from its end). Bad input: one
line, exit status 2.
"""

from __future__ import annotations

import signal
import sys
from .branch import _Parser, _check_model, add_model_arguments, add_record_arguments, prepare
from .common import answer_text, bad_input, integer, interrupted, make_loader, say
from .load_progress import ProgressLine
from tokentui.core.runs.scoring import percent


def build_fanout_parser():
    from tokentui.core.runs.requests import MAX_SAMPLE_TOKENS, MAX_SAMPLES

    p = _Parser(prog="tokentui fanout",
                description="Fan out from one step of a recorded run: N samples of M tokens each, drawn in one "
                            "batched decode that shares the prefix's KV cache.")
    add_record_arguments(p, "fan out from")
    p.add_argument("-n", type=integer("-n"), default=8, metavar="N",
                   help=f"how many samples, 1..{MAX_SAMPLES} (8)")
    p.add_argument("--tokens", type=integer("--tokens"), default=32, metavar="M",
                   help=f"tokens per sample, 1..{MAX_SAMPLE_TOKENS} (32)")
    add_model_arguments(p)
    p.set_defaults(past_end=True)
    return p


def fanout_main(argv: list[str]) -> int:
    from tokentui.core.errors import TokentuiError

    try:
        args = build_fanout_parser().parse_args(argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 2
    try:
        from tokentui.core.runs.requests import FanoutRequest

        plan = prepare(args)  # the record read and the arguments checked, before torch
        run, at = plan["run"], plan["at"]
        seed = args.seed if args.seed is not None else plan["spec_args"].seed
        ids = plan["ids"]
        request = FanoutRequest(tuple(plan["prompt_ids"]), tuple(ids[:at]), at, args.n, args.tokens, seed,
                                plan["parent"], ids[at] if at < len(ids) else None)
        request.check_context(run.facts.max_context)
        loading = ProgressLine(sys.stderr)  # a terminal's stderr only
        if args.json:  # as headless --json: no line on stderr
            loading.shown = False
        loading.update("starting")
        try:
            engine = make_loader(plan["spec_args"])(lambda event: loading.update(event.stage, event.fraction))
        finally:
            loading.finish()
        _check_model(engine, run)
        from .stream import stream_run

        samples: list = []
        served = engine.facts.server is not None  # one request seeded S, not a seed per sample (core/server/fanout.py)
        progress = None if args.json else ProgressLine(sys.stderr, what="fan-out")
        return stream_run(args, engine, lambda: engine.fanout(request),
                          lambda e, emit: _show(e, emit, samples, tuple(ids[at:]), served, progress), "fan-out",
                          progress)
    except TokentuiError as err:
        return bad_input(err)
    except KeyboardInterrupt:
        return interrupted(signal.SIGINT)


def _show(event, emit, samples: list, run_after: tuple[int, ...], served: bool = False, progress=None) -> None:
    from tokentui.core.runs.events import DoneEvent, FanoutProgress, Notice
    from tokentui.core.runs.explore_events import FanoutEvent, SampleEvent

    if isinstance(event, FanoutEvent):
        samples.append(event)
        kv = (f"{event.kv_reused_tokens} cached positions reused" if event.kv_reused_tokens else
              f"the {len(event.prompt_ids) + event.at}-token prefix prefilled once")
        if served:  # the server's notice says what its seed is; what it reuses is its own business
            emit(f"tokentui: fan-out at step {event.at + 1}: {event.n} samples of {event.m} tokens, asked of the "
                 "server as one request\n", sys.stderr)
        else:
            emit(f"tokentui: fan-out at step {event.at + 1}: {event.n} samples of {event.m} tokens, seeds "
                 f"{event.seed}..{event.seed + event.n - 1}; {kv}\n", sys.stderr)
    elif isinstance(event, SampleEvent):
        samples.append(event)
    elif isinstance(event, FanoutProgress) and progress is not None and samples:
        progress.update(progress_text(event, samples[0].n))
    elif isinstance(event, Notice):
        emit(say(event.message) + "\n", sys.stderr)
    elif isinstance(event, DoneEvent) and samples and isinstance(samples[0], FanoutEvent):
        emit(answer_text(fanout_text(samples[0], samples[1:], run_after)))


def progress_text(event, n: int) -> str:
    """How far a fan-out of `n` samples has gone, from its FanoutProgress."""
    return (f"{event.steps_done}/{event.steps} tokens a sample ({event.steps_done / event.steps:.0%}), "
            f"{event.tokens} tokens drawn, {event.samples_ended}/{n} samples ended early")


def fanout_text(fanout, samples, run_after: tuple[int, ...]) -> str:
    """The samples, most likely first; where each leaves the run (`run +k`: its k-th token is the first the run did
    not take; `run_after`: the run's own tokens from the step on) and the other samples (`split +k`; `twin`: another
    is the same throughout); and the first tokens against the step's probabilities."""
    from tokentui.core.runs.fanout_view import first_difference, first_tokens, ranked, split_from_others

    lines = []
    for sample in ranked(samples):
        lp = f"{sample.logprob:9.3f}" if sample.logprob is not None else "        ?"
        run = first_difference(sample.ids, run_after[:len(sample.ids)])
        run = "= run" if run is None else f"run +{run + 1}"
        split = split_from_others(sample, samples)
        split = "twin" if split is None else f"split +{split + 1}"
        lines.append(f"#{sample.n:<3} seed {sample.seed:<6} logprob {lp}  {run:<7} {split:<9} {sample.text!r}")
    counted = first_tokens(samples, fanout.candidates)
    listed = {c.id for c in fanout.candidates}
    total = sum(t.count for t in counted)
    lines.append(f"first tokens of {total} samples (share drawn, and the step's post-sampler probability):")
    for t in counted:
        prob = (percent(t.prob, 1) if t.prob is not None else
                "not reported by the server" if t.id in listed else "below the candidates")
        lines.append(f"  {t.piece!r:<16} {t.count}/{total} = {percent(t.share, 1)}   p {prob}")
    return "\n".join(lines) + "\n"
