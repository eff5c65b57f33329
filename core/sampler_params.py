"""The pieces core/samplers.py's registry is made of: `Param` (one setting), `Stage` (one stage of the chain),
`ChainInput` (what the stages that look back read besides the scores), and each setting's check.

Every check returns the one-line error for a bad value (None when it is good); SamplerSettings runs them as it is
built (core/settings.py), so every front end (flags, dashboard, records, served runs) refuses a bad value with the
same line. The ranges are llama.cpp's where it has the setting (common/arg.cpp, tools/server/server-schema.cpp),
tightened where its own behaviour is "silently off" (e.g. mirostat 1, which tokentui does not implement, is refused
rather than ignored). No torch here: settings, the dashboard and the served-model client import this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

__all__ = ["MAX_SEED", "MIN_TEMPERATURE", "SERVER_KINDS", "TOP_K_STEPS", "ChainInput", "Param", "Stage",
           "next_notch", "stepper"]

# The smallest temperature that works: step 4 divides the scores by it in float32 (core/steps/select.py), and below
# this, scores of any model (|logit| up to 3e8) can overflow float32's 3.4e38 to inf, which no distribution comes
# from. 0 (greedy) is what the user wants there.
MIN_TEMPERATURE = 1e-30
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes a 64-bit seed
MAX_TOKEN_ID = 2**31 - 1  # a logit bias's id, before the vocabulary is known (as records check ids)
MAX_BIAS = 1e6  # a logit bias past this only overflows float32 once added (-100 already bans a token in practice)
MAX_BREAKER_CHARS = 40  # llama.cpp's MAX_CHAR_LEN for a DRY sequence breaker (llama_sampler_init_dry)

# Server kinds as core/server/probe.py's Dialect.engine names them; "OpenAI" is any other OpenAI-style server.
SERVER_KINDS = ("llama.cpp", "vLLM", "SGLang", "OpenAI")


def got(value) -> str:
    return f"a {len(str(value))}-digit number" if isinstance(value, int) and abs(value) > 10**30 else repr(value)


def is_number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and not math.isnan(v)


def is_int(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, int)


def number_check(label: str, low: float | None = None, high: float | None = None, low_open: bool = False,
                 note: str = "") -> Callable[[object], str | None]:
    """A finite number in [low, high] ((low, high] when `low_open`); the error names the range and `note`."""
    if low is not None and high is not None:
        span = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
    elif low is not None:
        span = f"a number {'>' if low_open else '>='} {low:g}"
    else:
        span = "a finite number"

    def check(v) -> str | None:
        bad = (not is_number(v) or math.isinf(v) or (low is not None and (v <= low if low_open else v < low))
               or (high is not None and v > high))
        return f"{label} must be {span}{note}, got {v!r}" if bad else None
    return check


def int_check(label: str, low: int, note: str = "") -> Callable[[object], str | None]:
    def check(v) -> str | None:
        return None if is_int(v) and low <= v <= 2**31 - 1 else (
            f"{label} must be an integer >= {low}{note}, got {got(v)}")
    return check


def check_temperature(t) -> str | None:
    if not is_number(t) or math.isinf(t) or t < 0:
        return f"temperature must be a number >= 0 (0 = greedy), got {t!r}"
    if 0 < t < MIN_TEMPERATURE:
        return (f"temperature {t!r} is below {MIN_TEMPERATURE:g}, the smallest that works (the scores divided by it "
                "overflow float32): use 0 for greedy")
    return None


def check_top_k(k) -> str | None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        return f"top-k must be an integer >= 0 (0 = off), got {got(k)}"
    return None


def check_greedy(g) -> str | None:
    return None if isinstance(g, bool) else f"greedy must be true or false, got {g!r}"


def check_seed(s) -> str | None:
    if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_SEED:
        return f"seed must be an integer in 0..{MAX_SEED} (64 bits), got {got(s)}"
    return None


def check_top_n_sigma(n) -> str | None:
    if not is_number(n) or math.isinf(n) or not (n > 0 or n == -1):
        return f"top-n-sigma must be a number > 0, or -1 for off, got {n!r}"
    return None


def check_mirostat(m) -> str | None:
    if is_int(m) and m == 1:
        return "mirostat 1 (the first version) is not implemented here: use --mirostat 2 (Mirostat 2.0) or 0 (off)"
    return None if is_int(m) and m in (0, 2) else f"mirostat must be 0 (off) or 2 (Mirostat 2.0), got {got(m)}"


def check_logit_bias(pairs) -> str | None:
    if not isinstance(pairs, (list, tuple)):
        return f"logit-bias must be a list of token id and bias pairs, got {pairs!r}"
    seen = set()
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            return f"logit-bias must be pairs of a token id and a bias (ID=BIAS), got {pair!r}"
        token, bias = pair
        if not is_int(token) or not 0 <= token <= MAX_TOKEN_ID:
            return f"logit-bias: a token id must be an integer in 0..{MAX_TOKEN_ID}, got {got(token)}"
        if not is_number(bias) or not abs(bias) <= MAX_BIAS:
            return (f"logit-bias: token {token}'s bias must be a finite number in [-{MAX_BIAS:g}, {MAX_BIAS:g}] "
                    f"(-100 bans a token in practice), got {bias!r}")
        if token in seen:
            return f"logit-bias gives token {token} twice: give each id once"
        seen.add(token)
    return None


def norm_logit_bias(pairs) -> tuple[tuple[int, float], ...]:
    return tuple(sorted((int(t), float(b)) for t, b in pairs))


def check_breakers(items) -> str | None:
    if not isinstance(items, (list, tuple)):
        return f"dry-sequence-breaker must be a list of strings, got {items!r}"
    for s in items:
        if not isinstance(s, str) or not s:
            return f"dry-sequence-breaker must be a non-empty string, got {s!r}"
        if len(s) > MAX_BREAKER_CHARS:
            return (f"dry-sequence-breaker {s[:12]!r}... is {len(s)} characters, over llama.cpp's "
                    f"{MAX_BREAKER_CHARS}: shorten it")
    return None


def norm_breakers(items) -> tuple[str, ...]:
    """llama.cpp's --dry-sequence-breaker: "none" clears the list (what follows it is added)."""
    out: list[str] = []
    for s in items:
        out = [] if s == "none" else out + [s]
    return tuple(out)


# The registry's stages and parameters by name, as core/samplers.py registers them once it has built them (a
# parameter names its stage, `part_of`, or the setting it `needs`; this module cannot import the registry, which
# is built from it).
_STAGES: dict[str, "Stage"] = {}
_PARAMS: dict[str, "Param"] = {}


def register(stages, params) -> None:
    """core/samplers.py's registry, by name: each stage under its name, each parameter under its field's."""
    _STAGES.update({s.name: s for s in stages})
    _PARAMS.update({p.name: p for p in params})


TOP_K_STEPS = (0, 1, 2, 5, 10, 20, 50, 100)  # top-k's key notches, in the order K walks them; 0 = off (first)


def next_notch(current: int, direction: int) -> int:
    """One notch along TOP_K_STEPS: up walks off → 1 → 2 → … → 100 and stops there; down walks back to off. A
    value between notches (from --top-k) moves to the neighbouring notch."""
    if direction > 0:
        return next((k for k in TOP_K_STEPS if k > current), TOP_K_STEPS[-1] if current <= TOP_K_STEPS[-1]
                    else current)
    return next((k for k in reversed(TOP_K_STEPS) if k < current), TOP_K_STEPS[0])


def stepper(step: float, low: float, high: float) -> Callable[[float, int], float]:
    def nudge(value: float, direction: int) -> float:
        return round(min(high, max(low, value + step * direction)), 2)
    return nudge


@dataclass(frozen=True)
class Param:
    """One setting of the sampler: a SamplerSettings field, a record key, a flag, maybe a pair of keys."""

    name: str  # the SamplerSettings field and the record's key, e.g. "min_p"
    kind: type  # int, float, bool, str or tuple (floats are stored as float whatever number came in)
    default: object
    check: Callable[[object], str | None]  # the one-line error for a bad value, None when it is good
    label: str  # how people read it: the flag is --<label>, the panel row and the summaries say <label>
    help: str  # the flag's help
    off: object = None  # the value that turns its stage off (None: no such value)
    short: str = ""  # the panel's short name (default: the label)
    nudge: Callable[[object, int], object] | None = None  # one key press: the value after (direction +1 / -1)
    keys: tuple[str, str, str, str] | None = None  # (down key, up key, down help, up help)
    served: dict[str, str] = field(default_factory=dict)  # server kind -> the request's field name (absent: not sent)
    to_served: Callable[[object, str], object] | None = None  # the value a server kind is sent (default: as is)
    show: Callable[[object], str] | None = None  # the panel's text for a value (default: f"{value}", "off")
    long: Callable[[object], str] | None = None  # the panel's full row (default: the text, "0.00 (off)" for floats)
    row: str = ""  # the panel's row name (default: the label)
    in_bar: bool = True  # its keys in the dashboard's key bar (else the help screen and the palette only)
    said_off: bool = False  # summaries of the chain say "<label> off" when it is off (else they leave it out)
    read: Callable[[object], object] | None = None  # what panels show for settings (default: the field's value)
    part_of: str = ""  # a stage's further setting (not the one that turns it on): that stage's name
    norm: Callable[[object], object] | None = None  # the stored form of a good value (default: float for floats)
    parse: Callable[[str], object] | None = None  # a flag's one argument (str, tuple kinds; numbers: as the kind)
    repeat: bool = False  # the flag may be given more than once, each adding one item (tuple kinds)
    needs: str = ""  # the setting that must be on for this one to matter (dynatemp-exp: dynatemp-range)

    @property
    def flag(self) -> str:
        return f"--{self.label}"

    @property
    def row_name(self) -> str:
        return self.row or self.label

    @property
    def short_name(self) -> str:
        return self.short or self.label

    def shown(self, settings):
        """The value panels show for `settings` (greedy: whether the step is greedy, temperature 0 included)."""
        return self.read(settings) if self.read is not None else getattr(settings, self.name)

    def quiet(self, settings) -> bool:
        """Off, and one of the stages a one-line summary leaves out when off (not `said_off`); a stage's further
        setting is quiet while that stage is off (repeat-last-n while no penalty is on)."""
        if self.part_of and not _STAGES[self.part_of].on(settings) and not _STAGES[self.part_of].param.said_off:
            return True
        if self.needs and _PARAMS[self.needs].is_off(getattr(settings, self.needs)):
            return True
        return self.off is not None and not self.said_off and self.is_off(getattr(settings, self.name))

    def long_text(self, value) -> str:
        """The value as the sampler panel's full row writes it ("0.90", "1.00 (off)", "0.00 (greedy)")."""
        if self.long is not None:
            return self.long(value)
        if self.kind is float and self.is_off(value):
            return f"{value:.2f} (off)"
        return self.text(value)

    def is_off(self, value) -> bool:
        return self.off is not None and value == self.off

    def text(self, value) -> str:
        """The value as panels write it (None: not known)."""
        if value is None:
            return "—"
        if self.show is not None:
            return self.show(value)
        if self.is_off(value):
            return "off"
        return f"{value:.2f}" if self.kind is float else f"{value}"

    def matters(self, settings) -> bool:
        """Its value changes what the chain does (it is not off, nor waiting on an `needs` that is off)."""
        if self.needs and _PARAMS[self.needs].is_off(getattr(settings, self.needs)):
            return False
        return not self.is_off(getattr(settings, self.name))

    def normalised(self, value):
        return self.norm(value) if self.norm is not None else float(value) if self.kind is float else value


@dataclass(frozen=True)
class Stage:
    """One stage of the chain: its parameters, its reference (the transformers LogitsProcessor that does it, or,
    where transformers has none, the llama.cpp function core/steps/penalties.py transcribes), which fast backends
    have it. `kept` is the Selection / StepEvent field that says how many entries were left after it (None: the
    stage cuts nothing, or, the last to cut, the step's kept_count says it)."""

    name: str  # llama.cpp's --samplers name ("top_k", "typ_p", "penalties"), or "logit_bias" / "mirostat"
    param: Param  # the setting that turns it on or off (its first)
    oracle: str  # the transformers LogitsProcessor (generation.logits_process) that does it: the reference ("": none)
    native: bool = True  # the native selection implements it (select.cpp, or select_chain.cpp for the whole chain)
    fused: bool = True  # core/model/decode/fused_step.py implements it
    kept: str | None = None
    more: tuple[Param, ...] = ()  # its further settings (repeat-last-n, dry-base, ...)
    llama: str = ""  # the llama.cpp function (src/llama-sampler.cpp) whose semantics it has
    title: str = ""  # how panels name it ("penalties", "DRY"; default: its parameter's label)
    orderable: bool = True  # --samplers names it (logit bias always runs first, mirostat last, as in llama.cpp)
    cutting: bool = True  # it can set entries to -inf (penalties, DRY, bias, temperature only move scores)
    warps: bool = True  # a warper, skipped by greedy (False: a logits processor, which greedy also applies)
    on_if: Callable[[object], bool] | None = None  # whether its settings turn it on (default: its param not off)

    @property
    def params(self) -> tuple[Param, ...]:
        return (self.param,) + self.more

    @property
    def label(self) -> str:
        return self.title or self.param.label

    def on(self, settings) -> bool:
        """Its settings turn it on (whatever greedy and the chain's order say)."""
        if self.on_if is not None:
            return self.on_if(settings)
        return not self.param.is_off(getattr(settings, self.param.name))

    def active(self, settings) -> bool:
        """It runs for `settings` (greedy skips the warpers; core/samplers.py `chain_order` also asks the order)."""
        return (not settings.is_greedy or not self.warps) and self.on(settings)


@dataclass(frozen=True)
class ChainInput:
    """What the stages that look back read besides the step's scores: given to core/steps/stages.py `chain` and
    core/steps/select.py `select` by the run (core/model/step_loop.py), never kept in a global.

    `ids`: the tokens so far, oldest first: the prompt's and then those generated (llama-server and llama-cli
    accept the prompt's tokens into the sampler too, so the penalties' and DRY's windows reach into the prompt).
    `breakers`: DRY's sequence breakers as token sequences, head id -> tails (core/steps/penalties.py
    `dry_breakers` makes them from the strings and the tokenizer; None: none). `mu`: Mirostat 2.0's state before
    this step (None: a fresh start, 2 * tau); `Selection.mirostat_mu` is the value after the step, and
    core/samplers.py `mirostat_mu` folds it from a run's recorded steps, so a branch or a step revisited in time
    travel starts from the same state. `xtc_roll`: XTC's uniform draw for this step (None: select draws it from the
    run's seeded generator, so a seeded run replays)."""

    ids: Sequence[int] = ()
    breakers: Mapping[int, tuple[tuple[int, ...], ...]] | None = None
    mu: float | None = None
    xtc_roll: float | None = None
