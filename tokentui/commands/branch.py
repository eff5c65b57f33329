"""`tokentui branch RECORD.jsonl --at STEP --token ID` (or `--text PHRASE`): go back to one step of a recorded run,
force another token (or every token of a phrase, core/model/forcing.py) there, and stream how the model goes on from it (core/model/branch.py), as text or, with --json, as the headless JSON
lines (the parent's `prompt` event, then `branch`, `prefill`, `step`... `done`).

STEP is numbered from 1, as the dashboard numbers steps; in the JSON the branch's first step has `index` STEP - 1
(and `forced: true`), and the branch event's `at` is STEP - 1 too. The model is the record's (embedded, or a hub
id) unless --model is given; the sampler settings are the record's at that step unless flags override them. The
branch is recorded like any headless run (--record-dir, --no-record); its record reads back with
`Run.from_record` and plays with `tokentui replay`.

The record is read and every argument checked before torch is imported: bad input ends with one line on stderr
and exit status 2, never a traceback; a run that fails exits 1.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from tokentui.core.errors import EXIT_BAD_INPUT
from tokentui.core.interrupts import interrupt
from tokentui.core.samplers import PARAMS

from .common import (TextArgumentParser, add_sampler_flags, answer_text, bad_input, check_record_dir, integer,
                     interrupted, json_line, make_loader, number, recorded_line, say)

_DTYPES = ("float32", "bfloat16", "float16")
_SAMPLER_FLAGS = tuple(p.name for p in PARAMS)  # the sampler chain's settings (core/samplers.py), one flag each


class _Parser(TextArgumentParser):  # text arguments checked for UTF-8 (common.py)
    def error(self, message: str):  # one line, not the usage block
        self.exit(EXIT_BAD_INPUT, f"tokentui branch: {message} (see tokentui branch --help)\n")


def build_branch_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tokentui branch",
                description="Branch a recorded run: force another token (or a phrase) at one step and let the "
                            "model go on from there, into a record of its own. The model reads the prompt and the "
                            "recorded tokens before STEP once, then writes on from what you forced (in the "
                            "dashboard, b does the same without reading them again).")
    add_record_arguments(p, "branch at")
    forced = p.add_mutually_exclusive_group(required=True)
    forced.add_argument("--token", type=integer("--token"), default=None, metavar="ID",
                        help="the token id forced at that step (ids are listed in the record's candidates)")
    forced.add_argument("--text", default=None, metavar="PHRASE",
                        help="a phrase forced from that step on, token by token (tokenized on its own, no special "
                             "tokens): each forced step shows the model's probability and rank for its token and "
                             "what it preferred; then the model goes on under the sampler settings")
    add_model_arguments(p)
    p.add_argument("--max-new-tokens", type=integer("max-new-tokens"), default=256,
                   help="length limit of the branch, its forced steps included (256)")
    return p


def add_record_arguments(p: argparse.ArgumentParser, verb: str) -> None:
    """The record and the step (`tokentui branch`, `tokentui fanout`)."""
    p.add_argument("file", type=Path, help="a run record (.jsonl): from the dashboard, --record-dir, --headless "
                                           "--json output, or an earlier branch")
    p.add_argument("--at", type=integer("--at"), required=True, metavar="STEP",
                   help=f"the step to {verb}, numbered from 1 as the dashboard shows steps (its JSON `index` is "
                        "STEP - 1); the record's steps before it are kept")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The model, the sampler and the output of a command that goes on from a record's step."""
    p.add_argument("--name", default=None, help="what the branch's record calls the run it left "
                                                "(default: the record's file name)")
    p.add_argument("--model", "-m", default=None,
                   help="the model (default: the record's, when it is the embedded model or a hub id; a record of "
                        "a local folder or .gguf needs it)")
    g = p.add_argument_group("sampling (default: the record's settings at STEP)")
    add_sampler_flags(g, defaults=False)  # one per parameter of the sampler chain (core/samplers.py)
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the end token")
    p.add_argument("--top-candidates", type=integer("top-candidates"), default=10, help="candidates per step (10)")
    p.add_argument("--logit-lens", action="store_true", help="each step also reports the logit lens (as tokentui)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 | auto (default: the record's)")
    p.add_argument("--device-map", default=None, help="accelerate device map for several GPUs")
    p.add_argument("--threads", type=integer("threads"), default=None, help="CPU threads for the model")
    p.add_argument("--compile", action="store_true", help="static KV cache + compiled decode step (as tokentui)")
    p.add_argument("--weight-layout", choices=("auto", "stock"), default="auto", help="as for tokentui")
    p.add_argument("--kv-shapes", choices=("auto", "dynamic", "bucketed"), default="auto", help="as for tokentui")
    p.add_argument("--trust-remote-code", action="store_true", help="allow a model's own Python code (off)")
    p.add_argument("--allow-pickle", action="store_true", help="allow pickle weight files (off)")
    p.add_argument("--server", default=None, metavar="URL",
                   help="a served model's record: the server to branch it on (default: the one it was recorded from)")
    p.add_argument("--api-key-env", default="TOKENTUI_API_KEY", metavar="VAR",
                   help="with a served model's record: the variable holding the server's API key")
    p.add_argument("--allow-plain-http-key", action="store_true",
                   help="with --server: send the API key over plain http:// to another host, unencrypted (refused "
                        "without this flag)")
    p.add_argument("--server-probs", choices=("auto", "raw", "post-sampler"), default=None,
                   help="with a served model's record: as tokentui --server-probs (default: the record's)")
    p.add_argument("--server-timeout", type=number("server-timeout"), default=60.0, metavar="SECONDS",
                   help="with a served model's record: as tokentui --server-timeout (60)")
    p.add_argument("--json", action="store_true", help="one JSON event per line (the --headless --json schema)")
    p.add_argument("--record-dir", type=Path, default=None, help="where the new run's record goes")
    p.add_argument("--no-record", action="store_true", help="do not write a record of the new run")


def branch_main(argv: list[str]) -> int:
    from tokentui.core.errors import TokentuiError

    try:
        args = build_branch_parser().parse_args(argv)
    except SystemExit as done:  # --help, or a bad argument (one line already written)
        return done.code if isinstance(done.code, int) else EXIT_BAD_INPUT
    stopped_by: list[int] = []
    state: dict = {"engine": None, "decoding": False}

    def on_signal(signum, frame):  # as headless: stop at the next step; before the first step, interrupt
        first = not stopped_by
        stopped_by.append(signum)
        if state["engine"] is not None:
            state["engine"].stop()
        if not first or not state["decoding"]:
            interrupt()  # (not inside an event being recorded: core/interrupts.py)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)}
    try:
        check_record_dir(args)
        plan = prepare(args)
        return run_branch(args, plan, state, stopped_by)
    except TokentuiError as err:
        return bad_input(err)
    except KeyboardInterrupt:
        return interrupted(stopped_by[0] if stopped_by else signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def prepare(args) -> dict:
    """The record read and every argument checked, without torch: the prefix, the model, the settings."""
    from tokentui.core.errors import TokentuiError
    from tokentui.core.model.load.precheck import parse_device, resolve_model
    from tokentui.core.runs.run import Run
    from tokentui.core.settings import RunOptions, SamplerSettings, check_threads

    run = Run.from_record(args.file)
    facts = run.facts
    if run.branch is not None:
        prompt_ids, ids = list(run.branch.prompt_ids), list(run.branch.tokens) + run.values("id")
    elif run.prompt is not None:
        prompt_ids, ids = list(run.prompt.ids), run.values("id")
    else:
        raise TokentuiError(f"{args.file}: the record has no prompt to branch from")
    if not ids:
        raise TokentuiError(f"{args.file}: the record has no steps to branch at")
    last = len(ids) + 1 if getattr(args, "past_end", False) else len(ids)  # a fan-out may go on from the end
    if not 1 <= args.at <= last:
        raise TokentuiError(f"--at {args.at}: the record's steps are numbered 1..{last}")
    at = args.at - 1
    if getattr(args, "text", None) is not None and not args.text.strip():
        raise TokentuiError("--text: the phrase is empty; pass the text the model is to say")
    rows = facts.vocab_rows if facts.vocab_rows is not None and facts.vocab_rows > 0 else None  # 0: not a size
    token = getattr(args, "token", None)
    if token is not None and token < 0:
        raise TokentuiError(f"--token {token}: not a token id (token ids are integers >= 0)")
    if token is not None and rows is not None and token >= rows:
        raise TokentuiError(f"--token {token}: not a token id of the record's model (ids 0..{rows - 1})")
    model = args.model
    server = {"server": None}
    if facts.server is not None and model is None:  # a served model's record: branched on its server
        from tokentui.core.server.http import api_key

        server = {"server": args.server or facts.server.url, "server_model": facts.server.model,
                  "server_probs": args.server_probs or ("auto" if facts.server.probs == "unknown"
                                                        else facts.server.probs),
                  "api_key_env": args.api_key_env, "server_timeout": args.server_timeout,
                  # the key goes only to a server named on this command line, never to one a file names
                  "server_send_key": args.server is not None,
                  "allow_plain_http_key": args.allow_plain_http_key}
        if args.server is None and api_key(args.api_key_env):
            raise TokentuiError(f"{args.file} was recorded on {facts.server.url}: the API key in ${args.api_key_env} "
                                "goes only to a server named on the command line; to branch there with it, add "
                                f"--server {facts.server.url}")
    elif args.server is not None:
        raise TokentuiError(f"--server: {args.file} is the record of a model tokentui ran itself, not of a server's")
    if model is None and server["server"] is None:
        if facts.source == "embedded":
            model = None
        elif facts.source == "hub":
            model = facts.name
        else:
            raise TokentuiError(f"{args.file}: the record's model {facts.name!r} ({facts.source}) cannot be located "
                                "from the record; pass --model with its folder or .gguf file")
    check_threads(args.threads)  # 1..a few per CPU: far more crashed the thread pools
    parse_device(args.device)
    if server["server"] is None:
        resolve_model(model, allow_pickle=args.allow_pickle)  # a bad --model: one line, before torch is imported
    # the sampler: the record's settings at the step (its first own step for one before a branch record's offset)
    sampler = run.step(min(max(at - run.offset, 0), len(run) - 1)).settings if len(run) else SamplerSettings()
    sampler = sampler.with_changes(**{k: getattr(args, k) for k in _SAMPLER_FLAGS if getattr(args, k) is not None})
    options = RunOptions(max_new_tokens=getattr(args, "max_new_tokens", 256), ignore_eos=args.ignore_eos,
                         top_candidates=args.top_candidates, logit_lens=args.logit_lens)
    dtype = args.dtype or (facts.dtype if facts.dtype in _DTYPES else "auto")
    spec_args = argparse.Namespace(**{**vars(args), **server, "model": model, "dtype": dtype,
                                      **{k: getattr(sampler, k) for k in _SAMPLER_FLAGS},
                                      "max_new_tokens": options.max_new_tokens})
    return {"run": run, "prompt_ids": prompt_ids, "ids": ids, "at": at, "spec_args": spec_args,
            "parent": args.name or args.file.name}


def _branch_events(engine, point, prompt):
    """What the branch's record holds: the parent's prompt event (when the record has one: a branch's record then
    says what was asked and replays on its own), then the engine's branch."""
    if prompt is not None:
        yield prompt
    yield from engine.branch(point)


def _check_model(engine, run) -> None:
    """The loaded model must be the record's: the ids mean nothing in another vocabulary."""
    from tokentui.core.errors import TokentuiError

    mine, theirs = engine.facts, run.facts
    for name in ("vocab_rows", "architecture", "layers", "hidden_size"):
        if getattr(mine, name) != getattr(theirs, name):
            raise TokentuiError(f"the model loaded is not the record's ({name} {getattr(mine, name)} here, "
                                f"{getattr(theirs, name)} in the record): pass the record's model with --model")


def branch_point(engine, args, plan: dict):
    """The branch point of the arguments: the token given, or the phrase's tokens (tokenized by the model loaded,
    on its own: no special tokens)."""
    from tokentui.core.errors import SettingsError
    from tokentui.core.runs.branch_point import BranchPoint

    ids, at = plan["ids"], plan["at"]
    mu = _mirostat_state(plan)
    if args.text is None:
        return BranchPoint(tuple(plan["prompt_ids"]), tuple(ids[:at]), at, args.token, plan["parent"], ids[at],
                           mirostat_mu=mu)
    phrase = tuple(piece.id for piece in engine.phrase_pieces(args.text))
    if not phrase:
        raise SettingsError(f"--text {args.text!r}: the phrase has no tokens; pass the text the model is to say")
    return BranchPoint(tuple(plan["prompt_ids"]), tuple(ids[:at]), at, phrase[0], plan["parent"], ids[at],
                       phrase=phrase, phrase_text=args.text, mirostat_mu=mu)


def _mirostat_state(plan: dict) -> float | None:
    """Mirostat 2.0's state at the branch's step, folded from the record's steps before it (core/samplers.py
    `mirostat_mu`); None where mirostat was off there, or a step's post-sampler probability is not known."""
    from tokentui.core.samplers import mirostat_mu

    run, at = plan["run"], plan["at"]
    steps = [run.step(i) for i in range(max(0, min(at - run.offset, len(run))))]
    if any(s.chosen_prob is None for s in steps):
        return None
    return mirostat_mu([(s.settings, s.chosen_prob) for s in steps])


def run_branch(args, plan: dict, state: dict, stopped_by: list[int]) -> int:
    from tokentui.core.errors import exit_status
    from tokentui.core.runs.events import BranchEvent, DoneEvent, ErrorEvent, Notice, StepEvent
    from tokentui.core.runs.record_writer import RunRecorder
    from tokentui.core.runs.recording import RecordedRun

    from .stream import forced_line

    out, err = sys.stdout, sys.stderr

    def emit(text: str, stream=None) -> None:
        stream = stream or out
        try:
            stream.write(text)
            stream.flush()
        except OSError:  # the reader has gone: stop the run, keep recording
            if state["engine"] is not None:
                state["engine"].stop()

    def line(event) -> None:
        emit(json_line(event))

    engine = make_loader(plan["spec_args"])(line if args.json else (lambda _: None))
    state["engine"] = engine
    run = plan["run"]
    _check_model(engine, run)
    point = branch_point(engine, args, plan)
    status = 0
    wrote_text = False
    recorder = None if args.no_record else RunRecorder(args.record_dir)
    with RecordedRun(engine.facts, recorder, on_note=lambda message: emit(say(message) + "\n", err)) as recorded:
        recorded.open()
        if args.json:
            line(engine.facts)
        try:
            for event in recorded.record(_branch_events(engine, point, run.prompt)):
                if stopped_by:
                    engine.stop()
                if isinstance(event, StepEvent):
                    state["decoding"] = True
                if args.json:
                    line(event)
                elif isinstance(event, BranchEvent):
                    was = f" instead of {event.parent_piece!r} (id {event.parent_id})" if event.parent_id is not None \
                        else ""
                    kv = (f"{event.kv_reused_tokens} cached positions reused" if event.kv_reused_tokens else
                          f"the {len(event.prompt_ids) + event.at}-token prefix is prefilled")
                    emit(say(f"branch at step {event.at + 1}: {event.piece!r} (id {event.id}){was}; {kv}") + "\n", err)
                    emit(answer_text(event.prefix_text))
                    wrote_text = bool(event.prefix_text)
                elif isinstance(event, StepEvent) and event.forced and point.phrase:  # each forced token
                    emit(forced_line(event) + "\n", err)
                    emit(answer_text(event.text))
                    wrote_text = wrote_text or bool(event.text)
                elif isinstance(event, StepEvent) and event.text:
                    emit(answer_text(event.text))
                    wrote_text = True
                elif isinstance(event, Notice):
                    emit(say(event.message) + "\n", err)
                elif isinstance(event, DoneEvent) and event.reason != "error":  # after an error: its line said it
                    emit(answer_text(event.flushed) + "\n")
                if isinstance(event, ErrorEvent):
                    if not args.json:
                        emit(("\n" if wrote_text else "") + say(event.message) + "\n", err)
                    status = exit_status(event.kind)  # core/errors.py's one table
        except KeyboardInterrupt:  # in prefill, or a second signal
            engine.stop()
            if not stopped_by:
                stopped_by.append(signal.SIGINT)
    if recorded.cut_off is not None and args.json:
        line(recorded.cut_off)
    if stopped_by:
        emit("tokentui: stopped; the branch ended early\n", err)
        status = 128 + stopped_by[0]
    if recorded.path is not None:
        emit(recorded_line(recorded, "branch") + "\n", err)
    return status
