"""`tokentui` command line: the arguments, checked before any slow import; then the dashboard (tui/), the headless
stream (tokentui/headless.py), `tokentui replay` (tokentui/replay.py) or `tokentui branch` (tokentui/branch.py).

Argument errors and every TokentuiError end with one line on stderr and exit status 2 (bad input) or 1 (a run
that failed); never a traceback. torch/transformers are imported only after the arguments are checked, so a
typo is reported at once.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

DEFAULT_PROMPT = "Is OpenAI open?"
EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the usage block
        self.exit(EXIT_BAD_INPUT, f"tokentui: {message} (see tokentui --help)\n")


def _float(name: str):
    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
    return parse


def _int(name: str):
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tokentui", description="Watch a language model write, one token at a time.",
                epilog="tokentui replay FILE.jsonl [--speed N] [--theme T] [--headless [--json]]: play a run "
                       "record back, no model needed (see tokentui replay --help); tokentui branch FILE.jsonl --at "
                       "STEP --token ID [--json]: force another token at one step of a record and let the model go "
                       "on (see tokentui branch --help)")
    p.add_argument("--model", "-m", default=None,
                   help="embedded (default: SmolLM2-135M-Instruct), a .gguf file, a model folder, or a hub id "
                        "from your local Hugging Face cache")
    p.add_argument("--prompt", default=None, help=f'the question (default: "{DEFAULT_PROMPT}")')
    p.add_argument("--prompt-file", type=Path, default=None, help="read the prompt from a UTF-8 text file")
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--temperature", type=_float("temperature"), default=0.7, help="0 = greedy (default 0.7)")
    p.add_argument("--top-p", type=_float("top-p"), default=0.9, help="nucleus mass in (0, 1], 1 = off (0.9)")
    p.add_argument("--top-k", type=_int("top-k"), default=0, help="keep the k best, 0 = off (0)")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--seed", type=_int("seed"), default=0, help="sampling seed (0)")
    p.add_argument("--max-new-tokens", type=_int("max-new-tokens"), default=256, help="length limit (256)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the end token (benchmarks)")
    p.add_argument("--top-candidates", type=_int("top-candidates"), default=10,
                   help="candidates reported per step (10)")
    p.add_argument("--logit-lens", action="store_true",
                   help="each step also reports every layer's top token and its probability (the logit lens: the "
                        "final norm and LM head applied after each layer; Llama/Qwen2/Qwen3, not with --compile; "
                        "costs time per step; in --json output and the run record)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (auto: CUDA when present)")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16 (auto: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--device-map", default=None, help="accelerate device map for several GPUs, e.g. auto")
    p.add_argument("--threads", type=_int("threads"), default=None,
                   help="CPU threads for the model (default: all cores but one, which the dashboard needs)")
    p.add_argument("--compile", action="store_true",
                   help="static KV cache + torch.compile'd decode step: faster decoding after a one-time compile "
                        "(minutes on a small CPU; CUDA graphs on a GPU)")
    # the choices of core.layout.LAYOUTS, spelled out: importing core here would import torch into the dashboard
    p.add_argument("--weight-layout", choices=("auto", "stock"), default="auto",
                   help="auto: on CPU, store wide float32 weight matrices transposed for a faster decode (same "
                        "values, scores differ by float rounding); stock: leave them as loaded")
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
    p.add_argument("--server-probs", choices=("auto", "raw", "post-sampler"), default="auto",
                   help="with --server: what the server's token probabilities are. auto: llama-server is asked for "
                        "raw ones; for vLLM / SGLang say which their --logprobs-mode gives, else they are shown as "
                        "not known to be either")
    p.add_argument("--server-timeout", type=_float("server-timeout"), default=60.0, metavar="SECONDS",
                   help="with --server: how long the server may stay silent before the run ends (60)")
    p.add_argument("--headless", action="store_true", help="no dashboard: stream the answer to stdout")
    p.add_argument("--json", action="store_true", help="with --headless: one JSON event per line")
    p.add_argument("--theme", default="tokentui-dark", help="dashboard theme (tokentui-dark, -light, -contrast, or yours)")
    p.add_argument("--record-dir", type=Path, default=None, help="where run records go (default: XDG state dir)")
    p.add_argument("--no-record", action="store_true", help="do not write a run record")
    return p


def read_prompt(args) -> str:
    from tokentui.core.errors import PromptError

    if args.prompt is not None and args.prompt_file is not None:
        raise PromptError("--prompt and --prompt-file both give the prompt: pass one of them")
    if args.prompt_file is not None:
        try:
            text = args.prompt_file.read_bytes().decode("utf-8")
        except FileNotFoundError:
            raise PromptError(f"--prompt-file {args.prompt_file}: no such file") from None
        except IsADirectoryError:
            raise PromptError(f"--prompt-file {args.prompt_file}: is a folder, not a text file") from None
        except UnicodeDecodeError as err:
            raise PromptError(f"--prompt-file {args.prompt_file}: not UTF-8 text (bad byte at offset {err.start}); "
                              "save it as UTF-8") from None
        except OSError as err:
            raise PromptError(f"--prompt-file {args.prompt_file}: {err.strerror}") from None
        return text.rstrip("\n")
    prompt = DEFAULT_PROMPT if args.prompt is None else args.prompt
    if not prompt.strip():
        raise PromptError("the prompt is empty: pass --prompt TEXT")
    return prompt


def settings_from_args(args):
    from tokentui.core.settings import RunOptions, SamplerSettings

    sampler = SamplerSettings(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              greedy=args.greedy, seed=args.seed)
    options = RunOptions(max_new_tokens=args.max_new_tokens, ignore_eos=args.ignore_eos,
                         top_candidates=args.top_candidates, logit_lens=getattr(args, "logit_lens", False))
    return sampler, options


def engine_spec(args):
    from tokentui.core.process import EngineSpec

    sampler, options = settings_from_args(args)
    return EngineSpec(model=args.model, device=args.device, dtype=args.dtype, device_map=args.device_map,
                      trust_remote_code=args.trust_remote_code, allow_pickle=args.allow_pickle,
                      compile=args.compile, threads=args.threads, weight_layout=args.weight_layout,
                      sampler=sampler, options=options)


def server_options(args):
    """The --server flags, checked (a bad URL or value: one line, before anything connects); None without
    --server. Flags that only a model loaded here uses are refused with it."""
    if getattr(args, "server", None) is None:  # `tokentui branch` builds its own arguments, without --server
        return None
    from tokentui.core.errors import TokentuiError
    from tokentui.core.server.engine import ServerOptions

    for flag, given in (("--model", args.model is not None), ("--logit-lens", args.logit_lens),
                        ("--compile", args.compile), ("--device-map", args.device_map is not None),
                        ("--trust-remote-code", args.trust_remote_code)):
        if given:
            raise TokentuiError(f"{flag} is for a model tokentui loads itself; with --server the server runs the "
                                "model (drop one of them)")
    return ServerOptions(url=args.server, model=args.server_model, key_env=args.api_key_env,
                         probs=args.server_probs, timeout=args.server_timeout)


def make_loader(args):
    """A callable that loads the model in this process and returns a ready engine (--headless; the dashboard with
    --server, whose engine is a client of the server and needs no process of its own)."""
    server = server_options(args)
    if server is not None:
        sampler, options = settings_from_args(args)

        def connect(progress):
            from tokentui.core.server.engine import ServerEngine

            return ServerEngine.connect(server, sampler, options, progress)

        return connect
    spec = engine_spec(args)

    def load(progress):
        from tokentui.core.process import load_engine

        return load_engine(spec, progress)

    return load


class ProcessSource:
    """The dashboard's engine: the model in a child process (core/process.py says why), started at once so it
    imports torch while the dashboard starts; `client()` makes the dashboard's engine client for it."""

    def __init__(self, args) -> None:
        from tokentui.core.process import start_model_process

        self.args = args
        self.spec = engine_spec(args)
        self._early = [start_model_process(self.spec)]

    def client(self, sampler, options, recorder):
        from tokentui.core.process import ProcessClient

        started = self._early.pop() if self._early else None  # a second client starts its own process
        return ProcessClient(self.spec, sampler, options, recorder, started=started)


def run_dashboard(args, prompt: str) -> int:
    from tokentui.core.record import RunRecorder

    if args.server is not None:  # a served model: its engine is an HTTP client, run in this process
        from tokentui.tui.config import DashboardConfig
        from tokentui.tui.run import run_dashboard as run_app

        sampler, options = settings_from_args(args)
        return run_app(DashboardConfig(load=make_loader(args), prompt=prompt, system=args.system, sampler=sampler,
                                       options=options, theme=args.theme,
                                       recorder=None if args.no_record else RunRecorder(args.record_dir)))

    source = ProcessSource(args)  # the model process starts first: it takes the longest

    from tokentui.tui.run import run_dashboard as run_app
    from tokentui.core.precheck import check_model_and_device
    from tokentui.tui.config import DashboardConfig

    def relaunch(model: str | None, device: str) -> ProcessSource:
        """Another model / device chosen in the dashboard, with every other flag as given."""
        return ProcessSource(argparse.Namespace(**{**vars(args), "model": model, "device": device}))

    sampler, options = settings_from_args(args)
    config = DashboardConfig(load=source, prompt=prompt, system=args.system,
                             sampler=sampler, options=options, theme=args.theme,
                             recorder=None if args.no_record else RunRecorder(args.record_dir),
                             model=args.model, device=args.device, relaunch=relaunch,
                             check=lambda model, device: check_model_and_device(
                                 model, device, allow_pickle=args.allow_pickle))
    return run_app(config)  # non-zero when the app says so (e.g. quit after a load error)


def bad_input(err) -> int:
    """The one line for bad input (every command's), and its exit status."""
    print(f"tokentui: {err}", file=sys.stderr)
    return EXIT_BAD_INPUT


def interrupted(signum: int) -> int:
    """The line for a run interrupted by signal `signum` (every command's), and its exit status 128 + signum."""
    try:
        print("\ntokentui: interrupted", file=sys.stderr)
    except OSError:  # the terminal is gone (SIGHUP)
        from tokentui.headless import silence_stdio

        silence_stdio()
    return 128 + signum


_signal_seen: list[int] = []


def _raise_keyboard_interrupt(signum, frame):
    _signal_seen.append(signum)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    from tokentui.core.errors import TokentuiError

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["replay"]:  # `tokentui replay FILE`: a record played back (tokentui/replay.py), no torch
        from tokentui.replay import replay_main

        return replay_main(argv[1:])
    if argv[:1] == ["branch"]:  # `tokentui branch FILE --at STEP --token ID`: a recorded run branched (tokentui/branch.py)
        from tokentui.branch import branch_main

        return branch_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        prompt = read_prompt(args)
        settings_from_args(args)  # validate before any slow import
        if args.json and not args.headless:
            raise TokentuiError("--json needs --headless")
        if args.threads is not None and args.threads < 1:
            raise TokentuiError(f"--threads must be >= 1, got {args.threads}")
        # A dropped SSH session (SIGHUP) or a kill (SIGTERM) while starting up ends like Ctrl-C. Once running,
        # headless mode stops the run cleanly (record ends with "done"), and the dashboard quits like `q`.
        for sig in (signal.SIGHUP, signal.SIGTERM):
            signal.signal(sig, _raise_keyboard_interrupt)
        server = server_options(args)
        if server is not None:  # --server: the flags checked above
            if args.headless:
                from tokentui.headless import run_headless

                return run_headless(args, prompt)
            from tokentui.core.server.engine import ServerEngine

            ServerEngine.check(server)  # an unreachable server: the same line and status as headless, no dashboard
            return run_dashboard(args, prompt)
        from tokentui.core.precheck import check_model_and_device, parse_device, resolve_model

        if args.headless:
            # A bad --model (or an unreachable hub) is reported before torch is imported, in a fraction of a
            # second; CUDA visibility is left to the loader, which imports torch anyway.
            parse_device(args.device)
            resolve_model(args.model, allow_pickle=args.allow_pickle)
            from tokentui.headless import run_headless

            return run_headless(args, prompt)
        # Bad --model / --device found before the dashboard opens: the same line and status as headless.
        check_model_and_device(args.model, args.device, allow_pickle=args.allow_pickle)
        return run_dashboard(args, prompt)
    except TokentuiError as err:
        return bad_input(err)
    except KeyboardInterrupt:
        return interrupted(_signal_seen[-1] if _signal_seen else signal.SIGINT)


if __name__ == "__main__":
    raise SystemExit(main())
