"""`tokentui` command line: the dashboard by default, `--headless [--json]` for a plain stream.

Argument errors and every TokentuiError end with one line on stderr and exit status 2 (bad input) or 1 (a run
that failed); never a traceback. torch/transformers are imported only after the arguments are checked, so a
typo is reported at once.
"""

from __future__ import annotations

import argparse
import json
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
    p = _Parser(prog="tokentui", description="Watch a language model write, one token at a time.")
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
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (auto: CUDA when present)")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16 (auto: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--device-map", default=None, help="accelerate device map for several GPUs, e.g. auto")
    p.add_argument("--threads", type=_int("threads"), default=None, help="CPU threads for torch")
    p.add_argument("--trust-remote-code", action="store_true", help="allow a model's own Python code (off)")
    p.add_argument("--allow-pickle", action="store_true", help="allow pickle weight files (off: safetensors/GGUF)")
    p.add_argument("--headless", action="store_true", help="no dashboard: stream the answer to stdout")
    p.add_argument("--json", action="store_true", help="with --headless: one JSON event per line")
    p.add_argument("--theme", default="tokentui-dark", help="dashboard theme (tokentui-dark, -light, -contrast, or yours)")
    p.add_argument("--record-dir", type=Path, default=None, help="where run records go (default: XDG state dir)")
    p.add_argument("--no-record", action="store_true", help="do not write a run record")
    return p


def read_prompt(args) -> str:
    from tokentui.core.errors import PromptError

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
                              greedy=args.greedy, seed=args.seed).validated()
    options = RunOptions(max_new_tokens=args.max_new_tokens, ignore_eos=args.ignore_eos,
                         top_candidates=args.top_candidates).validated()
    return sampler, options


def make_loader(args):
    """A callable that loads the model and returns a ready Engine (the dashboard runs it on a worker thread)."""

    def load(progress):
        from tokentui.core.engine import Engine
        from tokentui.core.loader import load_model

        if args.threads:
            import torch
            torch.set_num_threads(args.threads)
        loaded = load_model(args.model, device=args.device, dtype=args.dtype, device_map=args.device_map,
                            trust_remote_code=args.trust_remote_code, allow_pickle=args.allow_pickle,
                            progress=progress)
        sampler, options = settings_from_args(args)
        return Engine(loaded, sampler, options)

    return load


def run_headless(args, prompt: str) -> int:
    from tokentui.core.events import DoneEvent, ErrorEvent, LoadProgress, Notice, StepEvent
    from tokentui.core.record import RunRecorder

    out = sys.stdout

    def progress(event: LoadProgress) -> None:
        if args.json:
            print(json.dumps(event.to_dict()), file=out, flush=True)

    engine = make_loader(args)(progress)
    recorder = None if args.no_record else RunRecorder(args.record_dir)
    if recorder is not None:
        recorder.open_run()
        recorder.write(engine.facts)
    if args.json:
        print(json.dumps(engine.facts.to_dict(), ensure_ascii=False), file=out, flush=True)
    status = 0
    wrote_text = False
    events = engine.run(prompt, args.system)
    try:
        for event in (recorder.tee(events) if recorder else events):
            if args.json:
                print(json.dumps(event.to_dict(), ensure_ascii=False), file=out, flush=True)
            elif isinstance(event, StepEvent):
                if event.text:
                    out.write(event.text)
                    out.flush()
                    wrote_text = True
            elif isinstance(event, Notice):
                print(f"tokentui: {event.message}", file=sys.stderr)
            elif isinstance(event, DoneEvent):
                out.write(event.flushed + "\n")
                out.flush()
            if isinstance(event, ErrorEvent):
                if not args.json:
                    if wrote_text:
                        out.write("\n")
                        out.flush()
                    print(f"tokentui: {event.message}", file=sys.stderr)
                status = EXIT_RUN_FAILED if event.kind not in ("PromptError", "SettingsError") else EXIT_BAD_INPUT
    except KeyboardInterrupt:
        engine.stop()
        status = 130
        print("\ntokentui: interrupted", file=sys.stderr)
    finally:
        if recorder is not None:
            recorder.close()
            print(f"tokentui: run recorded in {recorder.path}", file=sys.stderr)
    return status


def run_dashboard(args, prompt: str) -> int:
    from tokentui.core.record import RunRecorder
    from tokentui.tui.app import run_dashboard as run_app
    from tokentui.tui.config import DashboardConfig

    sampler, options = settings_from_args(args)
    config = DashboardConfig(load=make_loader(args), prompt=prompt, system=args.system, sampler=sampler,
                             options=options, theme=args.theme,
                             recorder=None if args.no_record else RunRecorder(args.record_dir))
    return run_app(config)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    from tokentui.core.errors import TokentuiError

    args = build_parser().parse_args(argv)
    try:
        prompt = read_prompt(args)
        settings_from_args(args)  # validate before any slow import
        if args.json and not args.headless:
            raise TokentuiError("--json needs --headless")
        if args.threads is not None and args.threads < 1:
            raise TokentuiError(f"--threads must be >= 1, got {args.threads}")
        if args.headless:
            # A dropped SSH session (SIGHUP) or a kill (SIGTERM) ends the run like Ctrl-C: record closed.
            for sig in (signal.SIGHUP, signal.SIGTERM):
                signal.signal(sig, _raise_keyboard_interrupt)
            return run_headless(args, prompt)
        return run_dashboard(args, prompt)
    except TokentuiError as err:
        print(f"tokentui: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("\ntokentui: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
