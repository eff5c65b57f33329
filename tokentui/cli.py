"""`tokentui` command line: it parses the arguments, checks them before any slow import, and dispatches to a command
of tokentui/commands/: the dashboard (dashboard.py), the headless stream (headless.py), `tokentui replay`
(replay.py), `tokentui branch` (branch.py), `tokentui score` (score.py) or `tokentui fanout` (fanout.py); what they
share is commands/common.py (and stream.py, score's and fanout's run streamed).

Argument errors and every TokentuiError end with one line on stderr and exit status 2 (bad input) or 1 (a run
that failed); never a traceback. torch/transformers are imported only after the arguments are checked, so a
typo is reported at once. The last line of defence (`main`): any other exception ends with one line naming the log
file that holds its traceback (core/crash.py), exit status 1.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from tokentui import __version__
from tokentui.core.errors import EXIT_BAD_INPUT, EXIT_RUN_FAILED
from tokentui.core.interrupts import interrupt
from tokentui.commands.common import (DEFAULT_PROMPT, TextArgumentParser, add_sampler_flags, add_turn_flags,
                                      bad_input, check_record_dir, check_turn_flags, integer, interrupted, number,
                                      read_prompt, server_options, settings_from_args)


class _Parser(TextArgumentParser):  # text arguments checked for UTF-8 (common.py)
    def error(self, message: str):  # one line, not the usage block
        self.exit(EXIT_BAD_INPUT, f"tokentui: {message} (see tokentui --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tokentui", description="Watch a language model write, one token at a time.",
                epilog="tokentui replay FILE.jsonl [--speed N] [--theme T] [--headless [--json]]: play a run "
                       "record back, no model needed (see tokentui replay --help); tokentui branch FILE.jsonl --at "
                       "STEP --token ID | --text PHRASE [--json]: force another token (or a phrase) at one step of "
                       "a record and let the model go on (see tokentui branch --help); tokentui score --prompt P "
                       "--answer A [--headless [--json]]: how likely is this answer, token by token; tokentui "
                       "fanout FILE.jsonl --at STEP -n N --tokens M [--json]: N samples from one step at once")
    p.add_argument("--version", "-V", action="version", version=f"tokentui {__version__}",
                   help="print tokentui's version and exit")
    p.add_argument("--model", "-m", default=None,
                   help="embedded (default: SmolLM2-135M-Instruct), a .gguf file, a model folder, or a hub id "
                        "from your local Hugging Face cache")
    p.add_argument("--prompt", default=None, help=f'the question (default: "{DEFAULT_PROMPT}")')
    p.add_argument("--prompt-file", type=Path, default=None,
                   help="read the prompt from a UTF-8 text file (at most 8 MiB)")
    p.add_argument("--system", default=None, help="system prompt")
    add_turn_flags(p)  # --follow-up, --raw
    add_sampler_flags(p)  # --temperature, --top-k, --top-p, --min-p, --greedy, --seed (core/samplers.py)
    p.add_argument("--max-new-tokens", type=integer("max-new-tokens"), default=256, help="length limit (256)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the end token (benchmarks)")
    p.add_argument("--top-candidates", type=integer("top-candidates"), default=10,
                   help="candidates reported per step (10)")
    p.add_argument("--logit-lens", action="store_true",
                   help="each step also reports every layer's top token and its probability (the logit lens: the "
                        "final norm and LM head applied after each layer; every decoder family, not with --compile; "
                        "costs time per step; in --json output and the run record)")
    p.add_argument("--attention", action="store_true",
                   help="each step also reports, for every attention layer, the 8 earlier positions the new token's "
                        "query weighs most (head mean, as [position, weight]); not with --compile; in --json output "
                        "and the run record")
    p.add_argument("--attention-heads", action="store_true",
                   help="--attention, and the same 8 positions for each head")
    p.add_argument("--sublayers", action="store_true",
                   help="each step also reports, per layer, the residual stream's norm before and after and what the "
                        "attention and MLP sublayers added (their norms); with --logit-lens also the top token after "
                        "each; not with --compile; in --json output and the run record")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (auto: CUDA when present)")
    # the activations' dtype is the kernel's, chosen at load (int16 in the native one, bf16 in torch's): the model
    # panel's border says which (QuantFacts, one source), so the help names no dtype of its own for them
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16 (auto: a 4-bit GGUF on CPU "
                   "runs as stored: 4-bit weights, the activations rounded as the kernel chosen at load takes them "
                   "(int16 in the native one; the model panel says which); a model folder on CPU keeps the "
                   "dtype it is stored in; else bf16 on CUDA, fp32 on CPU; float32: a GGUF de-quantized, the exact "
                   "reference)")
    p.add_argument("--device-map", default=None, help="accelerate device map for several GPUs, e.g. auto")
    p.add_argument("--threads", type=integer("threads"), default=None,
                   help="CPU threads for the model, at most 4 per CPU (default: all cores but one, which the "
                        "dashboard needs)")
    p.add_argument("--compile", action="store_true",
                   help="static KV cache + torch.compile'd decode step: faster decoding after a one-time compile "
                        "(minutes on a small CPU; CUDA graphs on a GPU)")
    # the choices of core.layout.LAYOUTS, spelled out: importing core here would import torch into the dashboard
    p.add_argument("--weight-layout", choices=("auto", "stock"), default="auto",
                   help="auto: on a GPU, q/k/v and gate/up multiplied as one matrix each (eager decode); on CPU, "
                        "wide float32 weight matrices stored transposed; for a faster decode (same values, scores "
                        "differ by float rounding); stock: leave them as loaded")
    # core.model.quantize.QUANTIZE, spelled out for the same reason
    p.add_argument("--quantize", choices=("none", "int4", "int8"), default="none",
                   help="int4: quantize a float model's weight matrices here to 4 bits (group 32; scales and "
                        "activations as the kernel chosen at load takes them, as for a 4-bit GGUF; CPU): ~6x fewer "
                        "bytes a "
                        "step than float32. int8: to Q8_0 blocks of 32 run by ggml's kernels (llama.cpp's; CPU). "
                        "The model panel says so. none (default): the weights as loaded")
    # core.model.static_cache.KV_SHAPES, spelled out for the same reason
    p.add_argument("--kv-shapes", choices=("auto", "dynamic", "bucketed"), default="auto",
                   help="eager decode's attention shapes: bucketed (the KV cache padded to 256-position buckets, "
                        "masked: one shape per bucket), dynamic (the exact length, a new shape every step) or auto "
                        "(bucketed on CUDA, dynamic on CPU)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow a model's own Python code (off)")
    p.add_argument("--allow-pickle", action="store_true", help="allow pickle weight files (off: safetensors/GGUF)")
    p.add_argument("--server", default=None, metavar="URL",
                   help="watch a model served by llama.cpp's llama-server, vLLM, SGLang or another OpenAI-compatible "
                        "server at URL (e.g. http://127.0.0.1:8080) instead of loading one; its API key, if it "
                        "needs one, from $TOKENTUI_API_KEY (see --api-key-env)")
    p.add_argument("--server-model", default=None, metavar="NAME",
                   help="with --server: the served model to watch, where the server hosts several")
    p.add_argument("--api-key-env", default="TOKENTUI_API_KEY", metavar="VAR",
                   help="with --server: the environment variable holding the API key (TOKENTUI_API_KEY)")
    p.add_argument("--allow-plain-http-key", action="store_true",
                   help="with --server: send the API key over plain http:// to another host, unencrypted (refused "
                        "without this flag; https:// and 127.0.0.1 need no flag)")
    p.add_argument("--server-probs", choices=("auto", "raw", "post-sampler"), default="auto",
                   help="with --server: what the server's token probabilities are. auto: llama-server is asked for "
                        "raw ones; for vLLM / SGLang say which their --logprobs-mode gives, else they are shown as "
                        "not known to be either")
    p.add_argument("--server-timeout", type=number("server-timeout"), default=60.0, metavar="SECONDS",
                   help="with --server: how long the server may take to the first token, between two tokens or for "
                        "any other answer before the run ends (60; inf: no limit)")
    p.add_argument("--headless", action="store_true", help="no dashboard: stream the answer to stdout")
    p.add_argument("--json", action="store_true", help="with --headless: one JSON event per line")
    p.add_argument("--theme", default="tokentui-dark", help="dashboard theme (tokentui-dark, -light, -contrast, or yours)")
    p.add_argument("--record-dir", type=Path, default=None, help="where run records go (default: XDG state dir)")
    p.add_argument("--no-record", action="store_true", help="do not write a run record")
    return p


_signal_seen: list[int] = []


def _raise_keyboard_interrupt(signum, frame):
    _signal_seen.append(signum)
    interrupt()  # (not inside an event being recorded: core/interrupts.py)


def main(argv: list[str] | None = None) -> int:
    """The command line; whatever it raises that nobody turned into a one-line error ends here, with one line naming
    the log of its traceback (exit 1), never a traceback on the terminal."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return interrupted(_signal_seen[-1] if _signal_seen else signal.SIGINT)
    except Exception as err:  # noqa: BLE001 - the last line of defence
        from tokentui.core.crash import crash_line, write_crash_log

        line = crash_line(err, write_crash_log(err, argv), argv)
        try:
            print(line, file=sys.stderr)
        except OSError:
            pass
        return EXIT_RUN_FAILED


def _main(argv: list[str]) -> int:
    from tokentui.core.errors import TokentuiError

    if argv[:1] == ["replay"]:  # `tokentui replay FILE`: a record played back (tokentui/commands/replay.py), no torch
        from tokentui.commands.replay import replay_main

        return replay_main(argv[1:])
    if argv[:1] == ["branch"]:  # `tokentui branch FILE --at STEP --token ID`: a recorded run branched (tokentui/commands/branch.py)
        from tokentui.commands.branch import branch_main

        return branch_main(argv[1:])
    if argv[:1] == ["score"]:  # `tokentui score --prompt P --answer A`: a text scored (tokentui/commands/score.py)
        from tokentui.commands.score import score_main

        return score_main(argv[1:], build_parser)
    if argv[:1] == ["fanout"]:  # `tokentui fanout FILE --at STEP -n N`: samples from a step (commands/fanout.py)
        from tokentui.commands.fanout import fanout_main

        return fanout_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        prompt = read_prompt(args)
        check_turn_flags(args)
        settings_from_args(args)  # validate before any slow import (--threads too)
        if args.json and not args.headless:
            raise TokentuiError("--json needs --headless")
        check_record_dir(args)
        # A dropped SSH session (SIGHUP) or a kill (SIGTERM) while starting up ends like Ctrl-C. Once running,
        # headless mode stops the run cleanly (record ends with "done"), and the dashboard quits like `q`.
        for sig in (signal.SIGHUP, signal.SIGTERM):
            signal.signal(sig, _raise_keyboard_interrupt)
        server = server_options(args)
        if server is not None:  # --server: the flags checked above
            if args.headless:
                from tokentui.commands.headless import run_headless

                return run_headless(args, prompt)
            from tokentui.core.server.engine import ServerEngine

            ServerEngine.check(server)  # an unreachable server: the same line and status as headless, no dashboard
            from tokentui.commands.dashboard import check_terminal, run_dashboard

            check_terminal()  # no terminal: one line, not a dashboard drawn into a file
            return run_dashboard(args, prompt)
        from tokentui.core.model.load.precheck import check_model_and_device, parse_device, resolve_model

        if args.headless:
            # A bad --model (or an unreachable hub) is reported before torch is imported, in a fraction of a
            # second; CUDA visibility is left to the loader, which imports torch anyway.
            parse_device(args.device)
            resolve_model(args.model, allow_pickle=args.allow_pickle)
            from tokentui.commands.headless import run_headless

            return run_headless(args, prompt)
        # Bad --model / --device found before the dashboard opens: the same line and status as headless.
        check_model_and_device(args.model, args.device, allow_pickle=args.allow_pickle)
        from tokentui.commands.dashboard import check_terminal, run_dashboard

        check_terminal()  # before the model process starts
        return run_dashboard(args, prompt)
    except TokentuiError as err:
        return bad_input(err)
    except KeyboardInterrupt:
        return interrupted(_signal_seen[-1] if _signal_seen else signal.SIGINT)


if __name__ == "__main__":
    raise SystemExit(main())
