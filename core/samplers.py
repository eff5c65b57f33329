"""The sampler chain: step 4's stages, in order, each one object, and the one registry every front end reads.

A stage is its name, its parameter (the SamplerSettings field, default, "off" value, validation with a one-line
SettingsError), how the command line, the dashboard keys, the panels and a served request spell it, the transformers
warper that is its whole-vocabulary reference (`Stage.oracle`, run by core/steps/stages.py, which also says what
each stage cut; here no torch is imported at all, so settings, the dashboard and the served-model client stay
torch-free, as pyproject's import-linter contracts require), and which fast backends implement it. The fast
backends are core/steps/select.py (torch, a prefix of the vocabulary), core/model/native/select.cpp (one C++ call
on CPU) and core/model/decode/fused_step.py (the compiled whole step); `Stage.native` / `Stage.fused` say which of
them implement the stage, and a step that needs a stage a backend lacks runs on the torch backend
(`backend_gaps`), never silently without it.

SamplerSettings (core/settings.py), the CLI flags (tokentui/commands/common.py `add_sampler_flags`), the
dashboard keys (tui/keys.py), the sampler panel's rows, the record's fields and the served request
(core/server/engine.py `served_sampler`) all come from `PARAMS`; adding a stage is one entry here and its step in
core/steps/select.py (a torch function in core/steps/stages.py where transformers has no warper for it; the native
and fused backends optional).

Today's chain is transformers' generate order: temperature, top-k, top-p, min-p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .errors import SettingsError

__all__ = ["MAX_SEED", "MIN_TEMPERATURE", "PARAMS", "STAGES", "Param", "Stage", "backend_gaps",
           "SERVER_KINDS", "TOP_K_STEPS", "check", "cut_stage_names", "ignored_by", "next_notch", "param",
           "served_sampler", "stage_summary"]

# The smallest temperature that works: step 4 divides the scores by it in float32 (core/steps/select.py), and below
# this, scores of any model (|logit| up to 3e8) can overflow float32's 3.4e38 to inf, which no distribution comes
# from. 0 (greedy) is what the user wants there.
MIN_TEMPERATURE = 1e-30
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes a 64-bit seed

# Server kinds as core/server/probe.py's Dialect.engine names them; "OpenAI" is any other OpenAI-style server.
SERVER_KINDS = ("llama.cpp", "vLLM", "SGLang", "OpenAI")


def _got(value) -> str:
    return f"a {len(str(value))}-digit number" if isinstance(value, int) and abs(value) > 10**30 else repr(value)


def _is_number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and not math.isnan(v)


def _check_temperature(t) -> str | None:
    if not _is_number(t) or math.isinf(t) or t < 0:
        return f"temperature must be a number >= 0 (0 = greedy), got {t!r}"
    if 0 < t < MIN_TEMPERATURE:
        return (f"temperature {t!r} is below {MIN_TEMPERATURE:g}, the smallest that works (the scores divided by it "
                "overflow float32): use 0 for greedy")
    return None


def _check_top_k(k) -> str | None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        return f"top-k must be an integer >= 0 (0 = off), got {_got(k)}"
    return None


def _check_top_p(p) -> str | None:
    if not _is_number(p) or not 0 < p <= 1:
        return f"top-p must be in (0, 1] (1 = off), got {p!r}"
    return None


def _check_min_p(p) -> str | None:
    if not _is_number(p) or not 0 <= p <= 1:
        return f"min-p must be in [0, 1] (0 = off), got {p!r}"
    return None


def _check_greedy(g) -> str | None:
    return None if isinstance(g, bool) else f"greedy must be true or false, got {g!r}"


def _check_seed(s) -> str | None:
    if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_SEED:
        return f"seed must be an integer in 0..{MAX_SEED} (64 bits), got {_got(s)}"
    return None


TOP_K_STEPS = (0, 1, 2, 5, 10, 20, 50, 100)  # top-k's key notches, in the order K walks them; 0 = off (first)


def next_notch(current: int, direction: int) -> int:
    """One notch along TOP_K_STEPS: up walks off → 1 → 2 → … → 100 and stops there; down walks back to off. A
    value between notches (from --top-k) moves to the neighbouring notch."""
    if direction > 0:
        return next((k for k in TOP_K_STEPS if k > current), TOP_K_STEPS[-1] if current <= TOP_K_STEPS[-1]
                    else current)
    return next((k for k in reversed(TOP_K_STEPS) if k < current), TOP_K_STEPS[0])


def _stepper(step: float, low: float, high: float) -> Callable[[float, int], float]:
    def nudge(value: float, direction: int) -> float:
        return round(min(high, max(low, value + step * direction)), 2)
    return nudge


@dataclass(frozen=True)
class Param:
    """One setting of the sampler: a SamplerSettings field, a record key, a flag, maybe a pair of keys."""

    name: str  # the SamplerSettings field and the record's key, e.g. "min_p"
    kind: type  # int, float or bool (floats are stored as float whatever number came in)
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
        """Off, and one of the stages a one-line summary leaves out when off (not `said_off`)."""
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


@dataclass(frozen=True)
class Stage:
    """One stage of the chain: its parameter, the transformers warper that is its reference, which fast backends
    have it. `kept` is the Selection / StepEvent field that says how many entries were left after it (None: the
    stage cuts nothing, or, the last to cut, the step's kept_count says it)."""

    name: str
    param: Param
    oracle: str  # the transformers LogitsProcessor (generation.logits_process) that does it: the reference
    native: bool = True  # core/model/native/select.cpp implements it
    fused: bool = True  # core/model/decode/fused_step.py implements it
    kept: str | None = None

    def active(self, settings) -> bool:
        return not settings.is_greedy and not self.param.is_off(getattr(settings, self.param.name))


def _top_k_served(k, kind):
    return k if k > 0 or kind == "llama.cpp" else -1  # vLLM / SGLang / OpenAI-style: -1 is off


STAGES: tuple[Stage, ...] = (
    Stage("temperature", Param(
        "temperature", float, 0.7, _check_temperature, "temperature", "0 = greedy", short="temp",
        nudge=_stepper(0.1, 0.0, math.inf),
        keys=("t", "T", "temperature −0.1 (0 = greedy); applies at the next step",
              "temperature +0.1; applies at the next step"),
        served={kind: "temperature" for kind in SERVER_KINDS},
        long=lambda t: f"{t:.2f}" + (" (greedy)" if t == 0 else "")),
        "TemperatureLogitsWarper"),
    Stage("top_k", Param(
        "top_k", int, 0, _check_top_k, "top-k", "keep the k best, 0 = off", off=0, nudge=next_notch, said_off=True,
        keys=("k", "K", "top-k one notch down: 100 → 50 → 20 → 10 → 5 → 2 → 1 → off",
              "top-k one notch up: off → 1 → 2 → 5 → 10 → 20 → 50 → 100"),
        served={kind: "top_k" for kind in SERVER_KINDS}, to_served=_top_k_served),
        "TopKLogitsWarper", kept="top_k_kept"),
    Stage("top_p", Param(
        "top_p", float, 0.9, _check_top_p, "top-p", "nucleus mass in (0, 1], 1 = off", off=1.0, said_off=True,
        nudge=_stepper(0.05, 0.05, 1.0),
        keys=("p", "P", "top-p −0.05 (keeps a smaller set; min 0.05)", "top-p +0.05 (1.0 = off)"),
        served={kind: "top_p" for kind in SERVER_KINDS}),
        "TopPLogitsWarper", kept="top_p_kept"),
    Stage("min_p", Param(
        "min_p", float, 0.0, _check_min_p, "min-p",
        "cut tokens below this fraction of the top token's probability, in [0, 1], 0 = off", off=0.0,
        nudge=_stepper(0.05, 0.0, 1.0),
        keys=("m", "M", "min-p −0.05 (0 = off)",
              "min-p +0.05 (cuts tokens under min-p × the top one's probability)"),
        served={"llama.cpp": "min_p", "vLLM": "min_p", "SGLang": "min_p"}, in_bar=False),
        "MinPLogitsWarper", native=False),
)

# Settings that are not stages: greedy (argmax, the chain skipped) and the draw's seed.
_GREEDY = Param("greedy", bool, False, _check_greedy, "greedy", "always take the most likely token",
                short="mode", row="mode", show=lambda g: "greedy" if g else "sample", read=lambda s: s.is_greedy)
_SEED = Param("seed", int, 0, _check_seed, "seed", "sampling seed", served={kind: "seed" for kind in SERVER_KINDS})

PARAMS: tuple[Param, ...] = tuple(s.param for s in STAGES) + (_GREEDY, _SEED)
_BY_NAME = {p.name: p for p in PARAMS}


def param(name: str) -> Param:
    return _BY_NAME[name]


def check(name: str, value):
    """`value` for the field `name`, checked (SettingsError, one line) and normalised (floats stored as float)."""
    p = _BY_NAME[name]
    error = p.check(value)
    if error is not None:
        raise SettingsError(error)
    return float(value) if p.kind is float else value


def backend_gaps(settings, backend: str) -> list[str]:
    """The active stages `backend` ("native" or "fused") does not implement: a step that needs one runs on the
    torch backend (core/steps/select.py) instead."""
    return [s.param.label for s in STAGES if s.active(settings) and not getattr(s, backend)]


def stage_summary(settings, step=None, exact: bool = False, kept: str = " kept {:,}") -> list[str]:
    """The cutting stages in a few words each, in the chain's order: "top-k off", "top-p 0.90 kept 12" (the count
    from a step's report, when `step` is given and reports it: the stage's own field, or, for a stage without one
    that is the last to cut, the step's kept_count). A stage that is off is said only where its parameter says so
    (`said_off`: the classic ones); `exact` writes values as :g ("0.9"), else as the panel does ("0.90")."""
    cutting = [s for s in STAGES if s.param.off is not None]
    last = next((s for s in reversed(cutting) if s.active(settings)), None)
    parts = []
    for s in cutting:
        value = getattr(settings, s.param.name)
        if s.param.is_off(value):
            if s.param.said_off:
                parts.append(f"{s.param.label} off")
            continue
        count = None
        if step is not None:  # a stage's own count, or for one without (min-p: always the last), the step's
            count = getattr(step, s.kept, None) if s.kept else getattr(step, "kept_count", None) if s is last else None
        text = f"{value:g}" if exact else s.param.text(value)
        parts.append(f"{s.param.label} {text}" + (kept.format(count) if count is not None else ""))
    return parts


def cut_stage_names(settings=None) -> str:
    """The cutting stages' names as one label ("top-k / top-p"): those said when off, and any other that is on."""
    return " / ".join(s.param.label for s in STAGES if s.param.off is not None
                      and (s.param.said_off or (settings is not None and s.active(settings))))


def served_sampler(settings, kind: str) -> tuple[dict, list[str]]:
    """The sampler's fields of a served request for server `kind` (SERVER_KINDS), and the names llama-server's
    `samplers` list orders them by; a stage the server has no field for is left out (`ignored_by` says which:
    the run's notice names them). Greedy is sent as temperature 0."""
    greedy = settings.is_greedy
    body: dict = {}
    for p in PARAMS:
        name = p.served.get(kind)
        if name is None:
            continue
        value = getattr(settings, p.name)
        if p.name == "temperature" and greedy:
            value = 0.0
        body[name] = p.to_served(value, kind) if p.to_served else value
    order = [s.param.served[kind] for s in STAGES if kind in s.param.served]
    return body, order


def ignored_by(settings, kind: str) -> list[str]:
    """The active stages a server of `kind` has no request field for (it samples without them)."""
    return [s.param.label for s in STAGES if s.active(settings) and kind not in s.param.served]
