"""What the commands share: exit statuses, the one-line error and interrupt endings, argument types, and turning the
parsed arguments into settings, an engine spec, the --server options and a loader. Imports nothing slow: torch and
transformers come in only when a loader runs."""

from __future__ import annotations

import argparse
import re
import signal
import sys

from tokentui.core.errors import EXIT_BAD_INPUT
from tokentui.core.interrupts import interrupt

DEFAULT_PROMPT = "Is OpenAI open?"


class TextArgumentParser(argparse.ArgumentParser):
    """The parser of every tokentui command: its text arguments must be UTF-8. On POSIX Python decodes the command
    line with surrogateescape, so a byte that is not UTF-8 arrives as a lone surrogate (U+DC80..U+DCFF) that would
    fail later, wherever the text is encoded; here each text value is checked once, as the arguments are parsed:
    one line, exit status 2. File names (type=Path) are not text: the system takes any bytes."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            value = getattr(namespace, action.dest, None)
            problem = not_utf8(value) if isinstance(value, str) else None
            if problem is not None:
                flag = max(action.option_strings, key=len) if action.option_strings else action.dest
                self.exit(EXIT_BAD_INPUT, say(f"{flag} is not UTF-8 text ({problem}); pass it as UTF-8 (check the "
                                              "encoding of the terminal or script that gave it)") + "\n")
        return namespace, extras


def not_utf8(text: str) -> str | None:
    """Why `text` (a command-line argument) is not UTF-8, in words; None when it is."""
    try:
        text.encode("utf-8", "surrogateescape").decode("utf-8")
    except UnicodeEncodeError as err:  # a surrogate that no byte became (a caller's own string)
        return f"a lone surrogate U+{ord(text[err.start]):04X} at character {err.start}"
    except UnicodeDecodeError as err:
        return f"bad byte 0x{err.object[err.start]:02x} at offset {err.start}"
    return None


def number(name: str):
    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
    return parse


def integer(name: str):
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
    return parse


def _flag_value(p):
    """A flag's argument as parameter `p`'s value: its own parse (text, a logit bias's ID=BIAS), else its kind;
    a SettingsError becomes argparse's one-line error."""
    if p.parse is None:
        return integer(p.label) if p.kind is int else number(p.label)

    def parse(text: str):
        from tokentui.core.errors import SettingsError

        try:
            return p.parse(text)
        except SettingsError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return parse


def add_sampler_flags(group, defaults: bool = True) -> None:
    """One flag per parameter of the sampler chain (core/samplers.py PARAMS: --temperature, --top-k, ...,
    --repeat-penalty, --dry-multiplier, ..., --samplers, --greedy, --seed), parsed as its kind (a repeatable one,
    --logit-bias / --dry-sequence-breaker, collects a list: None when not given); the range is checked where the
    settings are built (one SettingsError line). `defaults` False: every flag defaults to None ("keep the
    record's", for branch / fanout / score)."""
    from tokentui.core.samplers import PARAMS  # light: no torch

    for p in PARAMS:
        if p.kind is bool:
            if defaults:
                group.add_argument(p.flag, action="store_true", help=p.help)
            else:
                group.add_argument(p.flag, action="store_const", const=True, default=None, help=p.help)
            continue
        if p.repeat:
            group.add_argument(p.flag, type=_flag_value(p), action="append", default=None, dest=p.name,
                               help=p.help)
            continue
        group.add_argument(p.flag, type=_flag_value(p), default=p.default if defaults else None, dest=p.name,
                           help=f"{p.help} ({p.default})" if defaults else p.help)


def sampler_values(args) -> dict:
    """The sampler settings the arguments give, by field name (a repeatable flag not given: its default)."""
    from tokentui.core.samplers import PARAMS

    return {p.name: p.default if p.repeat and getattr(args, p.name, None) is None else getattr(args, p.name)
            for p in PARAMS}


MAX_PROMPT_FILE_BYTES = 8 * 1024 * 1024  # --prompt-file: far past any model's context, and read without hanging


def read_prompt(args) -> str:
    from tokentui.core.errors import PromptError

    if args.prompt is not None and args.prompt_file is not None:
        raise PromptError("--prompt and --prompt-file both give the prompt: pass one of them")
    if args.prompt_file is not None:
        try:
            with open(args.prompt_file, "rb") as fh:  # at most the cap and a byte: /dev/zero is not read forever
                data = fh.read(MAX_PROMPT_FILE_BYTES + 1)
            if len(data) > MAX_PROMPT_FILE_BYTES:
                raise PromptError(f"--prompt-file {args.prompt_file}: larger than {MAX_PROMPT_FILE_BYTES // 2**20} "
                                  "MiB, the most a prompt file may be (far past any model's context)")
            text = data.decode("utf-8")
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


def add_turn_flags(p) -> None:
    """--follow-up (a conversation's later turns, headless) and --raw (no chat template): core/runs/turns.py."""
    p.add_argument("--follow-up", action="append", default=[], metavar="TEXT", dest="follow_up",
                   help="with --headless: after the answer, ask TEXT in the same conversation (the earlier turns' "
                        "KV cache reused); repeat it for more turns")
    p.add_argument("--raw", action="store_true",
                   help="a plain completion: the prompt tokenized as is (with the tokenizer's BOS where it adds one), "
                        "no chat template, as llama.cpp's /completion does")


def check_turn_flags(args) -> None:
    """--follow-up and --raw checked before anything is loaded: one line (PromptError, exit 2) for an empty
    follow-up, a follow-up outside --headless (the dashboard's key asks one), a system prompt in a raw run."""
    from tokentui.core.errors import PromptError

    follow_ups = getattr(args, "follow_up", None) or []
    if follow_ups and not getattr(args, "headless", False):
        raise PromptError("--follow-up needs --headless (in the dashboard, u asks a follow-up after an answer)")
    for n, text in enumerate(follow_ups, start=1):
        if not text.strip():
            raise PromptError(f"--follow-up {n} is empty: pass the message to ask (--follow-up TEXT)")
    if getattr(args, "raw", False) and args.system is not None:
        raise PromptError("--system has no place in a --raw prompt (no chat template): put it in the prompt's text")


def check_record_dir(args) -> None:
    """--record-dir must be a folder (or not exist yet): a file there is one line now, not a note after loading."""
    from tokentui.core.errors import TokentuiError

    folder = getattr(args, "record_dir", None)
    if folder is not None and not getattr(args, "no_record", False) and folder.exists() and not folder.is_dir():
        raise TokentuiError(f"--record-dir {folder} is a file, not a folder: name a folder (it is made if missing)")


def settings_from_args(args):
    """The sampler settings and run options of the arguments, checked (and --threads, which the engine spec takes)."""
    from tokentui.core.settings import RunOptions, SamplerSettings, check_threads

    check_threads(getattr(args, "threads", None))
    sampler = SamplerSettings(**sampler_values(args))
    options = RunOptions(max_new_tokens=args.max_new_tokens, ignore_eos=args.ignore_eos,
                         top_candidates=args.top_candidates, logit_lens=getattr(args, "logit_lens", False),
                         attention=getattr(args, "attention", False) or getattr(args, "attention_heads", False),
                         attention_heads=getattr(args, "attention_heads", False),
                         sublayers=getattr(args, "sublayers", False))
    return sampler, options


def engine_spec(args):
    from tokentui.core.link.protocol import EngineSpec

    sampler, options = settings_from_args(args)
    return EngineSpec(model=args.model, device=args.device, dtype=args.dtype, device_map=args.device_map,
                      trust_remote_code=args.trust_remote_code, allow_pickle=args.allow_pickle,
                      compile=args.compile, threads=args.threads, weight_layout=args.weight_layout,
                      kv_shapes=args.kv_shapes, quantize=getattr(args, "quantize", "none"),
                      sampler=sampler, options=options)


def server_options(args):
    """The --server flags, checked (a bad URL or value: one line, before anything connects); None without
    --server. Flags that only a model loaded here uses are refused with it."""
    if getattr(args, "server", None) is None:  # `tokentui branch` builds its own arguments, without --server
        return None
    from tokentui.core.errors import TokentuiError
    from tokentui.core.server.engine import ServerOptions

    for flag, given in (("--model", args.model is not None), ("--logit-lens", args.logit_lens),
                        ("--attention", getattr(args, "attention", False) or getattr(args, "attention_heads", False)),
                        ("--sublayers", getattr(args, "sublayers", False)),
                        ("--compile", args.compile), ("--device-map", args.device_map is not None),
                        ("--trust-remote-code", args.trust_remote_code),
                        ("--quantize", getattr(args, "quantize", "none") != "none")):
        if given:
            raise TokentuiError(f"{flag} is for a model tokentui loads itself; with --server the server runs the "
                                "model (drop one of them)")
    return ServerOptions(url=args.server, model=args.server_model, key_env=args.api_key_env,
                         probs=args.server_probs, timeout=args.server_timeout,
                         send_key=getattr(args, "server_send_key", True),  # False: a URL a record named
                         allow_plain_http_key=getattr(args, "allow_plain_http_key", False))


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
        from tokentui.core.model.load.build import load_engine

        return load_engine(spec, progress)

    return load


def bad_input(err) -> int:
    """The one line for bad input (every command's), and its exit status."""
    print(say(str(err)), file=sys.stderr)
    return EXIT_BAD_INPUT


def say(message: str) -> str:
    """A `tokentui: ...` line for the terminal: the message may quote a server, a record or a file, so every control
    character in it is shown escaped (core/steps/display.py's printable_line), never acted on."""
    from tokentui.core.steps.display import printable_line

    return f"tokentui: {printable_line(message)}"


def recorded_line(run, what: str = "run") -> str:
    """The last line of a recorded run: where its record is, and whether recording stopped before the end (a full
    disk: the record is cut there, and says so when read back)."""
    if run.cut_short:
        return say(f"the {what}'s record was cut (recording stopped; see above): {run.path} holds it up to there")
    return say(f"{what} recorded in {run.path}")


def answer_text(text: str) -> str:
    """The answer's text as headless mode prints it: newlines and tabs kept, other control characters escaped."""
    from tokentui.core.steps.display import printable_text

    return printable_text(text)


# DEL and the C1 controls, which json.dumps(ensure_ascii=False) writes raw (it escapes only U+0000..U+001F); a
# terminal can take U+009B for a CSI. Escaped as \u00XX, the line stays the same JSON. Looked for before translating:
# `translate` builds the line again character by character, and a line rarely holds one.
_JSON_CONTROLS = {c: f"\\u{c:04x}" for c in range(0x7F, 0xA0)}
_JSON_CONTROL = re.compile("[\x7f-\x9f]")


def json_line(event) -> str:
    """One `--json` output line of an event (or a dict), safe to print on a terminal, with its newline."""
    import json

    data = event if isinstance(event, dict) else event.to_dict()
    text = json.dumps(data, ensure_ascii=False)
    return (text.translate(_JSON_CONTROLS) if _JSON_CONTROL.search(text) else text) + "\n"


class SignalStop:
    """Ctrl-C, SIGHUP and SIGTERM during a command's run (every streaming command's, one policy): a signal while
    decoding stops `engine` at its next step boundary, so the record ends with a `done` event (reason "stopped");
    before the first step (a long prompt's prefill is one model run that cannot be stopped half-way) or on a second
    signal it interrupts at once (KeyboardInterrupt), and the caller's record still ends with `done`.

    Use as a context manager around the run: the previous handlers come back on the way out. `decoding()` is called
    when the first step arrives; `stopped_by` lists the signals received, first first."""

    SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)

    def __init__(self, engine) -> None:
        self.engine = engine
        self.stopped_by: list[int] = []
        self._decoding = False
        self._previous: dict = {}

    def decoding(self) -> None:
        self._decoding = True

    def note_interrupt(self) -> None:
        """A KeyboardInterrupt reached the caller: stop the engine, and count it as a Ctrl-C if no signal came."""
        self.engine.stop()
        if not self.stopped_by:
            self.stopped_by.append(signal.SIGINT)

    def _on_signal(self, signum, frame) -> None:
        first = not self.stopped_by
        self.stopped_by.append(signum)
        self.engine.stop()
        if not first or not self._decoding:
            interrupt()  # (not inside an event being recorded: core/interrupts.py)

    def __enter__(self) -> "SignalStop":
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def interrupted(signum: int) -> int:
    """The line for a run interrupted by signal `signum` (every command's), and its exit status 128 + signum."""
    try:
        print("\ntokentui: interrupted", file=sys.stderr)
    except OSError:  # the terminal is gone (SIGHUP)
        silence_stdio()
    return 128 + signum


def silence_stdio() -> None:
    """The terminal or pipe is gone: send further output (and Python's exit-time flush) to /dev/null."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):
            pass
    os.close(devnull)
