"""The sampler chain: step 4's stages, each one object, in one registry every front end reads.

A stage (core/sampler_params.py `Stage`) is its parameters (SamplerSettings fields, defaults, "off" values, checks
with one-line SettingsErrors), how the command line, the dashboard keys, the panels and a served request spell
them, its reference (the transformers LogitsProcessor that does it, or, where transformers has none, the llama.cpp
function core/steps/penalties.py transcribes), and which fast backends implement it. The stages and their names are
llama.cpp's (src/llama-sampler.cpp: each sampler a struct with an apply, chained in a configurable order):
logit bias, penalties (repeat / presence / frequency over the last --repeat-last-n tokens), DRY, temperature (and
dynamic temperature), top-nσ, top-k, typical-p, top-p, min-p, XTC, and Mirostat 2.0.

The ORDER is a setting, `samplers` (llama.cpp's --samplers: names separated by ";", its aliases accepted); the
default is today's chain (temperature, then top-k, top-p, min-p, as transformers' generate runs them) with the
stages tokentui did not have placed as llama.cpp's default order places them. As in llama.cpp's common_sampler_init,
the logit bias always runs first and Mirostat 2.0, when on, replaces the chain: bias, plain temperature, mirostat.
Greedy (argmax) skips the warpers but, as generate(do_sample=False) and llama.cpp's temperature 0 do, still applies
the logits processors (bias, penalties, DRY).

The whole-vocabulary reference is core/steps/stages.py `chain` (which also says what each stage cut); the fast
backends are core/steps/select.py (torch), the native one on CPU (core/model/native/select.cpp: one C++ call for
the classic stages; select_chain.cpp: one for the whole chain, any order) and core/model/decode/fused_step.py (the
compiled whole step). `Stage.native` / `Stage.fused` say which implement a stage; a step that needs one a backend
lacks, or an order it does not follow, runs on torch (`backend_gaps`). No
torch here: settings, the dashboard and the served-model client import this (pyproject's import-linter contracts).
"""

from __future__ import annotations

import functools
import math

from .errors import SettingsError
from .mirostat import mirostat_mu, mirostat_update
from .sampler_params import (MAX_SEED, MIN_TEMPERATURE, SERVER_KINDS, TOP_K_STEPS, ChainInput, Param, Stage,
                             check_breakers, check_greedy, check_logit_bias, check_mirostat, check_seed,
                             check_temperature, check_top_k, check_top_n_sigma, int_check, next_notch,
                             norm_breakers, norm_logit_bias, number_check, register, stepper)

__all__ = ["MAX_SEED", "MIN_TEMPERATURE", "PARAMS", "STAGES", "ChainInput", "Param", "Stage", "backend_gaps",
           "SERVER_KINDS", "TOP_K_STEPS", "DEFAULT_ORDER", "ORDERABLE", "chain_order", "check", "check_vocab",
           "cut_stage_names", "ignored_by", "mirostat_mu", "mirostat_update", "named_stages", "next_notch", "param", "parse_order",
           "served_sampler", "stage_named", "stage_summary"]

_LLAMA = ("llama.cpp",)
_ALL = SERVER_KINDS


def _served(name: str, kinds=_ALL, **other: str) -> dict[str, str]:
    return {**{kind: name for kind in kinds}, **other}


def _top_k_served(k, kind):
    return k if k > 0 or kind == "llama.cpp" else -1  # vLLM / SGLang / OpenAI-style: -1 is off


def _bias_served(pairs, kind):
    """llama-server reads [[id, bias], ...]; OpenAI-style servers (vLLM, SGLang) an object of id strings."""
    return [[t, b] for t, b in pairs] if kind == "llama.cpp" else {str(t): b for t, b in pairs}


def _penalties_on(s) -> bool:
    return s.repeat_last_n != 0 and (s.repeat_penalty != 1.0 or s.presence_penalty != 0.0
                                     or s.frequency_penalty != 0.0)


def _f(name, default, check, label, help, **kw) -> Param:
    return Param(name, float, default, check, label, help, **kw)


def _i(name, default, check, label, help, **kw) -> Param:
    return Param(name, int, default, check, label, help, **kw)


# The registry, in the default order (`DEFAULT_ORDER`: the orderable ones); logit bias first and mirostat last
# wherever the order puts the others.
STAGES: tuple[Stage, ...] = (
    Stage("logit_bias", Param(
        "logit_bias", tuple, (), check_logit_bias, "logit-bias",
        "add BIAS to token ID's score, ID=BIAS (llama.cpp's ID+BIAS / ID-BIAS too); repeatable", off=(),
        norm=norm_logit_bias, parse=lambda text: _bias_pair(text), repeat=True,
        served=_served("logit_bias"), to_served=_bias_served,
        show=lambda pairs: ", ".join(f"{t}={b:g}" for t, b in pairs) or "off", long=lambda pairs: (
            ", ".join(f"{t}={b:g}" for t, b in pairs) or "none (off)")),
        "SequenceBiasLogitsProcessor", fused=False, llama="llama_sampler_logit_bias_apply",
        orderable=False, cutting=False, warps=False),
    Stage("penalties", _f(
        "repeat_penalty", 1.0, number_check("repeat-penalty", 0, low_open=True, note=" (1 = off)"), "repeat-penalty",
        "divide a repeated token's positive score by this (multiply a negative one), 1 = off", off=1.0,
        short="rep", served=_served("repeat_penalty", _LLAMA, vLLM="repetition_penalty",
                                    SGLang="repetition_penalty")),
        "RepetitionPenaltyLogitsProcessor", fused=False, llama="llama_sampler_penalties_apply",
        title="penalties", cutting=False, warps=False, on_if=_penalties_on, more=(
            _i("repeat_last_n", 64, int_check("repeat-last-n", 0, " (0 = off)"), "repeat-last-n",
               "the penalties look at the last N tokens, prompt included (0 = off)", part_of="penalties",
               served=_served("repeat_last_n", _LLAMA)),
            _f("presence_penalty", 0.0, number_check("presence-penalty"), "presence-penalty",
               "subtract this from the score of every token in the window, 0 = off", off=0.0,
               part_of="penalties", served=_served("presence_penalty")),
            _f("frequency_penalty", 0.0, number_check("frequency-penalty"), "frequency-penalty",
               "subtract this times its count in the window from a token's score, 0 = off", off=0.0,
               part_of="penalties", served=_served("frequency_penalty")))),
    Stage("dry", _f(
        "dry_multiplier", 0.0, number_check("dry-multiplier", 0, note=" (0 = off)"), "dry-multiplier",
        "DRY: penalise a token extending a repeat: multiplier * base^(length - allowed), 0 = off", off=0.0,
        short="dry", served=_served("dry_multiplier", _LLAMA)),
        "", fused=False, llama="llama_sampler_dry_apply", title="DRY", cutting=False, warps=False,
        on_if=lambda s: s.dry_multiplier != 0.0 and s.dry_penalty_last_n != 0, more=(
            _f("dry_base", 1.75, number_check("dry-base", 1), "dry-base", "DRY's base, >= 1",
               part_of="dry", served=_served("dry_base", _LLAMA)),
            _i("dry_allowed_length", 2, int_check("dry-allowed-length", 0), "dry-allowed-length",
               "DRY: repeats up to this long are not penalised", part_of="dry",
               served=_served("dry_allowed_length", _LLAMA)),
            _i("dry_penalty_last_n", 64, int_check("dry-penalty-last-n", 0, " (0 = off)"), "dry-penalty-last-n",
               "DRY scans the last N tokens, prompt included (0 = off)", part_of="dry",
               served=_served("dry_penalty_last_n", _LLAMA)),
            Param("dry_sequence_breakers", tuple, ("\n", ":", "\"", "*"), check_breakers, "dry-sequence-breaker",
                  "a string that ends a repeat for DRY; repeatable, replaces the defaults; 'none' for none",
                  part_of="dry", norm=norm_breakers, parse=str, repeat=True, short="breakers",
                  served=_served("dry_sequence_breakers", _LLAMA), to_served=lambda v, kind: list(v),
                  show=lambda v: " ".join(repr(s)[1:-1] for s in v) or "none"))),
    Stage("temperature", _f(
        "temperature", 0.7, check_temperature, "temperature", "0 = greedy", short="temp",
        nudge=stepper(0.1, 0.0, math.inf),
        keys=("t", "T", "temperature −0.1 (0 = greedy); applies at the next step",
              "temperature +0.1; applies at the next step"),
        served=_served("temperature"), long=lambda t: f"{t:.2f}" + (" (greedy)" if t == 0 else "")),
        "TemperatureLogitsWarper", llama="llama_sampler_temp_ext_apply", cutting=False,
        more=(_f("dynatemp_range", 0.0, number_check("dynatemp-range", 0, note=" (0 = off)"), "dynatemp-range",
                 "dynamic temperature: from temperature - range to temperature + range by the entropy, 0 = off",
                 off=0.0, part_of="temperature", short="dynatemp", served=_served("dynatemp_range", _LLAMA)),
              _f("dynatemp_exp", 1.0, number_check("dynatemp-exp", 0), "dynatemp-exp",
                 "dynamic temperature's exponent on the normalised entropy", part_of="temperature",
                 needs="dynatemp_range",
                 served=_served("dynatemp_exponent", _LLAMA)))),
    Stage("top_n_sigma", _f(
        "top_n_sigma", -1.0, check_top_n_sigma, "top-n-sigma",
        "keep scores within n standard deviations of the top one, -1 = off", off=-1.0, short="nσ",
        served=_served("top_n_sigma", _LLAMA)),
        "", fused=False, llama="llama_sampler_top_n_sigma_apply"),
    Stage("top_k", _i(
        "top_k", 0, check_top_k, "top-k", "keep the k best, 0 = off", off=0, nudge=next_notch, said_off=True,
        keys=("k", "K", "top-k one notch down: 100 → 50 → 20 → 10 → 5 → 2 → 1 → off",
              "top-k one notch up: off → 1 → 2 → 5 → 10 → 20 → 50 → 100"),
        served=_served("top_k"), to_served=_top_k_served),
        "TopKLogitsWarper", kept="top_k_kept", llama="llama_sampler_top_k_apply"),
    Stage("typ_p", _f(
        "typical_p", 1.0, number_check("typical-p", 0, 1, low_open=True, note=" (1 = off)"), "typical-p",
        "locally typical sampling's mass in (0, 1], 1 = off", off=1.0, short="typ",
        served=_served("typical_p", _LLAMA)),
        "TypicalLogitsWarper", fused=False, llama="llama_sampler_typical_apply"),
    Stage("top_p", _f(
        "top_p", 0.9, number_check("top-p", 0, 1, low_open=True, note=" (1 = off)"), "top-p",
        "nucleus mass in (0, 1], 1 = off", off=1.0, said_off=True, nudge=stepper(0.05, 0.05, 1.0),
        keys=("p", "P", "top-p −0.05 (keeps a smaller set; min 0.05)", "top-p +0.05 (1.0 = off)"),
        served=_served("top_p")),
        "TopPLogitsWarper", kept="top_p_kept", llama="llama_sampler_top_p_apply"),
    Stage("min_p", _f(
        "min_p", 0.0, number_check("min-p", 0, 1, note=" (0 = off)"), "min-p",
        "cut tokens below this fraction of the top token's probability, in [0, 1], 0 = off", off=0.0,
        nudge=stepper(0.05, 0.0, 1.0),
        keys=("m", "M", "min-p −0.05 (0 = off)",
              "min-p +0.05 (cuts tokens under min-p × the top one's probability)"),
        served=_served("min_p", ("llama.cpp", "vLLM", "SGLang")), in_bar=False),
        "MinPLogitsWarper", native=False, llama="llama_sampler_min_p_apply"),
    Stage("xtc", _f(
        "xtc_probability", 0.0, number_check("xtc-probability", 0, 1, note=" (0 = off)"), "xtc-probability",
        "XTC: with this probability per step, cut every token above the threshold but the least likely of them",
        off=0.0, short="xtc", served=_served("xtc_probability", _LLAMA)),
        "", fused=False, llama="llama_sample_xtc_apply", title="XTC",
        on_if=lambda s: s.xtc_probability > 0.0 and s.xtc_threshold <= 0.5,
        more=(_f("xtc_threshold", 0.1, number_check("xtc-threshold", 0, 1, note=" (above 0.5: off)"),
                 "xtc-threshold", "XTC's probability threshold (above 0.5 cuts nothing: off)", part_of="xtc",
                 served=_served("xtc_threshold", _LLAMA)),)),
    Stage("mirostat", _i(
        "mirostat", 0, check_mirostat, "mirostat",
        "2 = Mirostat 2.0 (replaces the chain: bias, temperature, mirostat), 0 = off", off=0,
        served=_served("mirostat", _LLAMA)),
        "", fused=False, llama="llama_sampler_mirostat_v2_apply", orderable=False, more=(
            _f("mirostat_tau", 5.0, number_check("mirostat-ent", 0), "mirostat-ent",
               "Mirostat's target entropy (tau), bits", part_of="mirostat", short="tau",
               served=_served("mirostat_tau", _LLAMA)),
            _f("mirostat_eta", 0.1, number_check("mirostat-lr", 0), "mirostat-lr",
               "Mirostat's learning rate (eta)", part_of="mirostat", short="eta",
               served=_served("mirostat_eta", _LLAMA)))),
)

_BY_STAGE = {s.name: s for s in STAGES}
ORDERABLE = tuple(s.name for s in STAGES if s.orderable)  # what --samplers names, in the default order
DEFAULT_ORDER = ";".join(ORDERABLE)
# llama.cpp's aliases (common/sampling.cpp common_sampler_types_from_names): kebab-case, no dash, and a few more
_ALIASES = {**{n.replace("_", "-"): n for n in ORDERABLE}, **{n.replace("_", ""): n for n in ORDERABLE},
            "nucleus": "top_p", "temp": "temperature", "typ": "typ_p", "typical": "typ_p", "typical_p": "typ_p",
            "typical-p": "typ_p", **{n: n for n in ORDERABLE}}


def parse_order(text) -> tuple[str, ...]:
    """--samplers' names, `;`-separated as llama.cpp spells them (its aliases too), as the registry's names;
    SettingsError (one line) for an unknown, repeated or missing name."""
    if not isinstance(text, str):
        raise SettingsError(f"samplers must be stage names separated by ';', got {text!r}")
    names = [n.strip() for n in text.split(";") if n.strip()]
    if not names:
        raise SettingsError(f"samplers must name at least one stage, e.g. {DEFAULT_ORDER}")
    out: list[str] = []
    for n in names:
        stage = _ALIASES.get(n.lower())
        if stage is None:
            raise SettingsError(f"samplers: no stage {n!r}; the stages are {', '.join(ORDERABLE)}")
        if stage in out:
            raise SettingsError(f"samplers names {stage} twice: name each stage once")
        out.append(stage)
    return tuple(out)


def _check_order(text) -> str | None:
    try:
        parse_order(text)
    except SettingsError as err:
        return str(err)
    return None


_ORDER = Param("samplers", str, DEFAULT_ORDER, _check_order, "samplers",
               "the stages, in order, separated by ';' (llama.cpp's names); a stage not named does not run",
               norm=lambda text: ";".join(parse_order(text)), parse=str, short="order", off=DEFAULT_ORDER,
               show=lambda text: text.replace(";", " "), long=lambda text: text.replace(";", " → "),
               served=_served("samplers", _LLAMA), to_served=lambda text, kind: list(parse_order(text)))
# Settings that are not stages: the order, greedy (argmax, the warpers skipped) and the draw's seed.
_GREEDY = Param("greedy", bool, False, check_greedy, "greedy", "always take the most likely token",
                short="mode", row="mode", show=lambda g: "greedy" if g else "sample", read=lambda s: s.is_greedy)
_SEED = Param("seed", int, 0, check_seed, "seed", "sampling seed", served=_served("seed"))

# Today's settings first, as panels list them (temperature, top-k, top-p, min-p, mode, seed), then issue 38's in the
# registry's order, then the order itself: SamplerSettings' fields and a record's keys, in this order.
_FIRST = ("temperature", "top_k", "top_p", "min_p")
PARAMS: tuple[Param, ...] = (tuple(_BY_STAGE[n].param for n in _FIRST) + (_GREEDY, _SEED)
                             + tuple(p for s in STAGES for p in s.params if p.name not in _FIRST) + (_ORDER,))
_BY_NAME = {p.name: p for p in PARAMS}
register(STAGES, PARAMS)  # a parameter finds its stage by name (Param.quiet, Param.matters)


def _bias_pair(text: str) -> tuple[int, float]:
    """One --logit-bias: ID=BIAS, or llama.cpp's ID+BIAS / ID-BIAS; SettingsError for anything else."""
    text = text.strip()
    for sep in ("=", "+", "-"):
        head, mark, tail = text.partition(sep)
        if mark and head.strip().isdigit():
            try:
                bias = float(tail) * (-1.0 if sep == "-" else 1.0)
            except ValueError:
                break
            return int(head), bias
    raise SettingsError(f"logit-bias must be ID=BIAS (e.g. 15043=-2.5, or llama.cpp's 15043-2.5), got {text!r}")


def param(name: str) -> Param:
    return _BY_NAME[name]


def stage_named(name: str) -> Stage:
    return _BY_STAGE[name]


def check(name: str, value):
    """`value` for the field `name`, checked (SettingsError, one line) and normalised (floats stored as float)."""
    p = _BY_NAME[name]
    error = p.check(value)
    if error is not None:
        raise SettingsError(error)
    return p.normalised(value)


def check_vocab(settings, vocab: int) -> None:
    """The settings' token ids (the logit bias's) inside a vocabulary of `vocab` entries; else one SettingsError."""
    past = [t for t, _ in settings.logit_bias if t >= vocab]
    if past:
        raise SettingsError(f"logit-bias names token {past[0]}, past this model's vocabulary of {vocab:,} "
                            f"(ids 0..{vocab - 1})")


def named_stages(settings) -> list[Stage]:
    """The stages `settings` runs in order, on or off: the logit bias, then those --samplers names in its order;
    with Mirostat 2.0 on, llama.cpp's chain instead: the bias, temperature, mirostat."""
    if settings.mirostat:
        return [_BY_STAGE["logit_bias"], _BY_STAGE["temperature"], _BY_STAGE["mirostat"]]
    return [_BY_STAGE["logit_bias"]] + [_BY_STAGE[n] for n in settings.samplers.split(";")]


def chain_order(settings) -> list[Stage]:
    """The stages that run this step, in order (greedy: the logits processors only)."""
    return [s for s in named_stages(settings) if s.active(settings)]


_CLASSIC = [s for s in STAGES if s.name in ("temperature", "top_k", "top_p", "min_p")]


def backend_gaps(settings, backend: str) -> list[str]:
    """What `backend` ("native" or "fused") lacks for this step: the active stages it does not implement, and
    "custom order" when its fixed order (temperature, top-k, top-p, min-p) is not the step's. A step with a gap runs
    on the torch backend (core/steps/select.py) instead."""
    return list(_gaps(settings, backend))


@functools.lru_cache(maxsize=64)
def _gaps(settings, backend: str) -> tuple[str, ...]:
    """backend_gaps, once per settings (every step asks; SamplerSettings is frozen and hashable)."""
    steps = chain_order(settings)
    if backend == "native" and _gaps(settings, "fused"):
        # the whole chain's own C++ call (core/model/native/select_chain.cpp) takes every stage, but sorts nothing
        # as long as the whole vocabulary is in play: typical-p or top-p before a top-k or top-nσ cut runs on torch
        for s in steps:
            if s.name in ("top_k", "top_n_sigma"):
                break
            if s.name in ("typ_p", "top_p"):
                return (f"{s.param.label} over the whole vocabulary",)
        return ()
    gaps = [s.label for s in steps if not getattr(s, backend)]
    if settings.dynatemp_range > 0 and not settings.is_greedy and not settings.mirostat:
        gaps.append("dynatemp")
    classic = [s for s in steps if s in _CLASSIC]
    if classic != [s for s in _CLASSIC if s in classic]:
        gaps.append("custom order")
    return tuple(gaps)


def stage_summary(settings, step=None, exact: bool = False, kept: str = " kept {:,}") -> list[str]:
    """The cutting stages in a few words each, in the chain's order: "top-k off", "top-p 0.90 kept 12" (the count
    from a step's report, when `step` is given and reports it: the stage's own field, or, for a stage without one
    that is the last to cut, the step's kept_count). A stage that is off is said only where its parameter says so
    (`said_off`: the classic ones); `exact` writes values as :g ("0.9"), else as the panel does ("0.90")."""
    named = named_stages(settings)
    cutting = [s for s in named if s.cutting and s.param.off is not None]
    cutting += [s for s in STAGES if s.param.said_off and s not in cutting]  # not named: off, and said so
    last = next((s for s in reversed(cutting) if s in named and s.active(settings)), None)
    parts = []
    for s in cutting:
        value = getattr(settings, s.param.name)
        if not s.on(settings) or s not in named:
            if s.param.said_off:
                parts.append(f"{s.param.label} off")
            continue
        count = None
        if step is not None:  # a stage's own count, or for one without (the last to cut), the step's
            count = getattr(step, s.kept, None) if s.kept else getattr(step, "kept_count", None) if s is last else None
        text = f"{value:g}" if exact else s.param.text(value)
        parts.append(f"{s.param.label} {text}" + (kept.format(count) if count is not None else ""))
    return parts


def cut_stage_names(settings=None) -> str:
    """The cutting stages' names as one label ("top-k / top-p"): those said when off, and any other that is on."""
    return " / ".join(s.param.label for s in STAGES if s.cutting and s.param.off is not None
                      and (s.param.said_off or (settings is not None and s.active(settings))))


def served_sampler(settings, kind: str) -> tuple[dict, list[str]]:
    """The sampler's fields of a served request for server `kind` (SERVER_KINDS), under its own names, and the
    names llama-server's `samplers` list orders them by (the step's order). llama-server is sent every setting it
    has (its defaults are not tokentui's); another server only the settings of the stages that are on, beside
    the classic four and the seed, so a server that has never heard of a stage is not sent it. A setting a server
    has no field for is left out (`ignored_by` says which: the run's notice names them). Greedy is sent as
    temperature 0."""
    body: dict = {}
    for s in STAGES:
        if kind != "llama.cpp" and s not in _CLASSIC and not s.on(settings):
            continue
        for p in s.params:
            name = p.served.get(kind)
            if name is None:
                continue
            value = getattr(settings, p.name)
            if p.name == "temperature" and settings.is_greedy:
                value = 0.0
            body[name] = p.to_served(value, kind) if p.to_served else value
    body[_SEED.served[kind]] = settings.seed
    order = [s.name for s in named_stages(settings) if s.orderable] if kind in _ORDER.served else []
    return body, order


def ignored_by(settings, kind: str) -> list[str]:
    """What a server of `kind` samples without: the active stages it has no request field for, or of a stage it
    has, the settings in force it lacks (vLLM's repetition penalty has no window: "repeat-last-n")."""
    out = []
    for s in chain_order(settings):
        missing = [p for p in s.params if kind not in p.served and p.matters(settings)]
        named = {p.name for p in missing}
        missing = [p for p in missing if p.needs not in named]  # dynatemp-exp goes with dynatemp-range
        if not any(kind in p.served for p in s.params):
            out.append(s.label)
        else:
            out.extend(p.label for p in missing)
    return out
