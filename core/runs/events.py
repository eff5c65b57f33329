"""The engine's events: one dataclass per thing that happens, shared by the dashboard, `--headless --json`,
the run record and the benchmarks: a run's life (load, prompt, prefill, a branch, its end) and its steps. The `model`
event and the facts it nests are in core/runs/facts.py; a scored text's and a fan-out's in core/runs/explore_events.py;
a conversation turn's in core/runs/turns.py.

`to_dict()` gives the stable JSON schema documented in docs/headless-json.md (`{"event": NAME, ...fields}`); add fields,
never rename them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .as_dict import as_dict
from .pickling import install_fast_pickling
from ..errors import ErrorKind
from ..settings import SamplerSettings


@dataclass(frozen=True, slots=True)
class Event:
    event: ClassVar[str] = "event"

    def to_dict(self) -> dict:
        return {"event": self.event, **as_dict(self)}


@dataclass(frozen=True, slots=True)
class LoadProgress(Event):
    """Model loading: `stage` in words, `fraction` 0..1 or None when unknown."""

    event: ClassVar[str] = "load"
    stage: str
    fraction: float | None = None


@dataclass(frozen=True, slots=True)
class Notice(Event):
    """Something the user should know that is not an error (e.g. no chat template: raw prompt used)."""

    event: ClassVar[str] = "notice"
    message: str


@dataclass(frozen=True, slots=True)
class PromptPiece:
    id: int
    piece: str  # display form: leading space as "␣", newline as "↵"
    special: bool


@dataclass(frozen=True, slots=True)
class PromptEvent(Event):
    """Steps 1 and 2: the chat-templated text and its tokens."""

    event: ClassVar[str] = "prompt"
    text: str  # the formatted text the model reads
    ids: list[int]
    pieces: list[PromptPiece]
    templated: bool  # False when the model has no chat template and the raw prompt is used
    user_prompt: str = ""
    system_prompt: str | None = None
    # what the template puts in the system message when the user gives none (None: it adds no system message)
    default_system_prompt: str | None = None


@dataclass(frozen=True, slots=True)
class PrefillProgress(Event):
    """Step 3 under way: a long prompt is prefilled in chunks, and this follows each chunk (short prompts, one
    pass, send none). Between the PromptEvent and the PrefillEvent."""

    event: ClassVar[str] = "prefill_progress"
    tokens_done: int  # prompt tokens in the KV cache so far
    tokens: int  # prompt tokens in all
    elapsed_ms: float  # since prefill began

    def __post_init__(self):
        if not 0 <= self.tokens_done <= self.tokens:
            raise ValueError(f"prefill progress {self.tokens_done} of {self.tokens} tokens is out of range")
        if self.elapsed_ms < 0:
            raise ValueError(f"prefill progress elapsed_ms must be >= 0, got {self.elapsed_ms}")


@dataclass(frozen=True, slots=True)
class FanoutProgress(Event):
    """A fan-out's batched decode under way (core/model/fanout.py; a served model's one request sends none): at
    most one a second, none for a decode that takes less. Between the PrefillEvent and the `sample` events."""

    event: ClassVar[str] = "fanout_progress"
    steps_done: int  # tokens drawn per sample so far
    steps: int  # tokens per sample in all (the fan-out's m)
    samples_ended: int  # samples that have ended before that (an end token), of the fan-out's n
    tokens: int  # tokens drawn so far, every sample's
    elapsed_ms: float  # since the fan-out began, its prefill included

    def __post_init__(self):
        if not 0 <= self.steps_done <= self.steps:
            raise ValueError(f"fan-out progress {self.steps_done} of {self.steps} tokens is out of range")
        if self.samples_ended < 0 or self.tokens < 0 or self.elapsed_ms < 0:
            raise ValueError("fan-out progress counts and elapsed_ms must be >= 0")


@dataclass(frozen=True, slots=True)
class PrefillEvent(Event):
    """Step 3: the whole prompt through the model (in chunks when it is long); `ms` is the whole prefill, i.e.
    the time to the first token's scores. For a branch (core/model/branch.py) that reused a held KV cache, `tokens` is
    what the model computed (1) and `reused_tokens` the cached positions it reused; `kv_tokens` is their sum. A
    follow-up turn (core/model/turn.py) likewise: the ids past the common prefix with the last turn's cache, and
    that prefix. `reused_tokens` None: not known (a served model's follow-up whose server reported no cached
    tokens)."""

    event: ClassVar[str] = "prefill"
    tokens: int
    ms: float  # a served model: the request's time to its first token, measured by tokentui
    kv_tokens: int
    kv_bytes: int | None  # None: not reported (a served model)
    reused_tokens: int | None = 0


@dataclass(frozen=True, slots=True)
class BranchEvent(Event):
    """A branch of an earlier run starts (core/model/branch.py): step `at` (0-based index; the UI shows at + 1) takes
    token `id` instead of the parent's `parent_id`, and the model goes on from there. Comes first, before the
    branch's prefill; its steps start at index `at`. `prompt_ids` + `tokens` (the parent's tokens before `at`) are
    the prefix, so a branch record stands alone; `prefix_text` is the text those tokens showed as they streamed.
    `kv_reused_tokens`: cached positions reused from the parent's KV cache (0: the prefix was prefilled afresh)."""

    event: ClassVar[str] = "branch"
    at: int
    id: int
    piece: str
    parent_id: int | None  # the parent's token at step `at` (None: not known)
    parent_piece: str | None
    kv_reused_tokens: int
    prompt_ids: list[int]
    tokens: list[int]
    prefix_text: str
    parent: str | None = None  # the parent run's name, when the caller gave one
    # A forced phrase (core/model/forcing.py): every id of the phrase, forced at steps at, at + 1, ... (`id` is the
    # first), and the text typed (None: not a phrase, or not typed: an adopted fan-out sample). `sample`: the
    # number of the fan-out sample adopted as this branch (its ids are the phrase). Written only where set.
    phrase_ids: list[int] | None = None
    phrase_text: str | None = None
    sample: int | None = None

    def to_dict(self) -> dict:
        data = Event.to_dict(self)
        for name in ("phrase_ids", "phrase_text", "sample"):
            if data[name] is None:
                del data[name]  # a one-token branch writes the same line as before these fields existed
        return data


@dataclass(frozen=True, slots=True)
class Candidate:
    id: int
    piece: str
    # None: not reported (a served model gives one of the two: ServerFacts.probs says which)
    raw_prob: float | None  # softmax of the raw logits
    prob: float | None  # after temperature / top-k / top-p (0 when cut); equals transformers' warpers
    special: bool = False  # a special token (the tokenizer's own list, as StepEvent.special / PromptPiece.special)
    # the raw score (logit) the sampler chain read for this token, before temperature, as float32 (None: not
    # reported: a served model, the compiled whole step, an older record)
    logit: float | None = None


@dataclass(frozen=True, slots=True)
class LensRow:
    """The logit lens at one layer (core/model/observe/lens.py): the top token when the model's final norm and LM head are
    applied to the residual stream after decoder layer `layer` (1..L; row L is the model's own output)."""

    layer: int
    id: int
    piece: str  # display form, as Candidate.piece
    prob: float  # its probability in that layer's distribution (softmax over the whole vocabulary)


@dataclass(frozen=True, slots=True)
class MultiTokenChar:
    """A character whose UTF-8 bytes arrived over more than one token (e.g. 开 = e5 bc 80 ← 2 tokens)."""

    char: str
    hex: str
    tokens: int


@dataclass(frozen=True, slots=True)
class StepTiming:
    """Where one step's time went (core/model/observe/timing.py measures it; its docstring says how on each device).

    forward: the model run (prefill for a run's first step) plus, with the logit lens on, the lens's readout.
    select: the sampler (temperature, top-k / top-p, softmax, the draw, the reported candidates) up to the
    device-to-host copy, and unpacking what came back. copy: that copy (on CPU, where nothing crosses a bus: the
    `.tolist()` that turns the packed numbers into Python ones). detok: the incremental detokenizer and building the
    event (its pieces, candidates, KV figures). The four add up to StepEvent.latency_ms. wait: not part of the
    step's latency: how long the consumer held the engine after the previous step (in the dashboard: the pipe to the
    UI), paused time left out.
    h2d_bytes: ids sent to the model, 8 per int64 id (a prompt's ids for the first step; one id for a decode step,
    which travels as a fill kernel's argument, its time inside forward). d2h_bytes: the selection's packed numbers.
    """

    forward_ms: float
    select_ms: float
    copy_ms: float
    detok_ms: float
    wait_ms: float
    h2d_bytes: int
    d2h_bytes: int


@dataclass(frozen=True, slots=True)
class StepEvent(Event):
    """Steps 4-6 for one token: the candidates, the choice, the model run's cost and the text it completed."""

    event: ClassVar[str] = "step"
    index: int  # 0 = the token scored by prefill
    id: int
    piece: str
    special: bool
    text: str  # text this token completed ("" while bytes are pending or for special tokens)
    pending_hex: str  # bytes of an incomplete character, e.g. "e5 bc"
    pending_needed: int  # how many more bytes the pending character needs
    completed_chars: list[MultiTokenChar]
    candidates: list[Candidate]
    # None in the fields below: not reported by the source (a served model: core/server/; the dashboard says so)
    chosen_rank: int | None  # 0-based rank of the chosen token among all tokens by raw logit
    chosen_raw_prob: float | None
    chosen_prob: float | None
    kept_count: int | None  # tokens left with non-zero probability after top-k / top-p
    kept_mass: float | None  # raw probability mass of the kept tokens
    entropy_bits: float | None  # of the raw distribution
    sampled_entropy_bits: float | None  # of the post-sampler distribution
    greedy: bool
    settings: SamplerSettings  # in force for this step (written as its dict: to_dict() below, asdict's recursion)
    settings_changed: bool  # True on the first step that used changed settings
    # the engine's work on the step: model run (prefill for index 0) + selection + copy + detokenize (+ the logit
    # lens); = timing's forward + select + copy + detok. Not the time the consumer held the engine before the step
    # (timing.wait_ms) nor time paused.
    # A served model's step: the time from the previous token's arrival (the request's send for its first) to
    # this one's, measured by tokentui, with the server's own work and the network inside it.
    latency_ms: float
    forward_ms: float | None  # the model run alone
    kv_tokens: int
    kv_bytes: int | None
    # the logit lens for this step, one row per decoder layer (None: not asked for, or not available; a Notice
    # said why). Computed after the forward: its time is in latency_ms (and timing.forward_ms), not forward_ms.
    lens: list[LensRow] | None = None
    # the token was given, not selected: a branch's first step (core/model/branch.py), each token of a forced phrase
    # (core/model/forcing.py), each step of a scored text (core/model/scoring.py); chosen_* are the model's figures
    # for the given token
    forced: bool = False
    # The sampler's shape at this step (None for greedy, which applies no temperature and cuts nothing; also None
    # in records from before these fields). temp_entropy_bits: entropy of softmax(logits / T) before top-k / top-p
    # (= entropy_bits at T = 1). top_k_kept: entries top-k alone keeps, ties included (None: top-k off).
    # top_p_kept: entries left after top-p, applied after top-k as transformers does (None: top-p off).
    temp_entropy_bits: float | None = None
    top_k_kept: int | None = None
    top_p_kept: int | None = None
    timing: StepTiming | None = None  # where the step's time went (None: not measured, e.g. an older record)
    # A served model (core/server/): this step was the first of a request re-issued from the current prefix (after
    # a settings change, a pause or a single step); its time to first token, measured by tokentui. None otherwise.
    reissue_ttft_ms: float | None = None
    # the fraction of the server's KV cache in use, as its /metrics reported it at this step (None: not reported)
    server_kv_usage: float | None = None
    # A served model's token the server did not stream on its own: llama-server holds the tokens of an unfinished
    # character and streams them as one entry. Its id and bytes come from the server's own tokenization of the
    # text they made (checked: as many tokens as the server counted, ending with the one it streamed); the server
    # reported no probabilities for it (None), and it arrived with the entry (latency 0).
    merged: bool = False
    # Inside the blocks (issue 39; the types and which query they describe: core/runs/attention.py). attention: one
    # LayerAttention per attention layer (`--attention`, RunOptions.attention); sublayers: one SublayerRow per
    # decoder layer (`--sublayers`). None: not asked for, or not available (a Notice said why). Computed with the
    # forward that scored this token; their time is in latency_ms, like the lens's.
    attention: list[LayerAttention] | None = None
    sublayers: list[SublayerRow] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.settings, SamplerSettings):  # typed in memory; a dict is only the JSON form
            raise TypeError(f"StepEvent.settings must be SamplerSettings, got {type(self.settings).__name__}")

    def to_dict(self) -> dict:
        data = Event.to_dict(self)
        if data["lens"] is None:
            del data["lens"]  # a run without the lens writes the same step lines as before it existed
        if not data["forced"]:
            del data["forced"]  # likewise for the `forced` flag, true only on a step whose token was given
        if data["timing"] is None:
            del data["timing"]  # steps not timed (scripted, or read from an older record) write no `timing`
        for name in ("reissue_ttft_ms", "server_kv_usage"):
            if data[name] is None:
                del data[name]  # only a served model's steps carry these
        if not data["merged"]:
            del data["merged"]
        for name in ("attention", "sublayers"):
            if data[name] is None:
                del data[name]  # written only by a run that asked for them
        for cand in data["candidates"]:
            if cand["logit"] is None:
                del cand["logit"]  # a served model's candidates write the same objects as before the field
        return data


@dataclass(frozen=True, slots=True)
class DoneEvent(Event):
    event: ClassVar[str] = "done"
    reason: str  # "eos", "length", "stopped", "error", "context"; "scored": a scored text's end (its last token)
    tokens: int  # tokens selected, the end token included
    runs: int  # model runs; prefill counts as one
    scores: int | None  # vocab_rows * runs (None: the vocabulary's size is not known)
    # time to the first token: from the prompt going in to the first token chosen (the first step's latency_ms, prefill
    # included; a branch: its forced step's); None when the run ended before its first token
    ttft_ms: float | None
    decode_tok_s: float | None  # tokens after the first / decode time (paused time excluded); None: no decode step
    text: str  # the answer: a one-shot decode of the ids, less what the dropped bytes decode to (U+FFFD)
    prompt_tokens: int = 0
    flushed: str = ""  # stream text released at the end (never U+FFFD for held bytes: those are `dropped_hex`)
    kv_tokens: int = 0
    kv_bytes: int | None = 0  # None: not reported (a served model)
    paused_ms: float = 0.0  # time the run sat paused between steps (not decode time)
    dropped_hex: str = ""  # bytes of an incomplete character still held when the run ended, e.g. "e7 88"
    dropped_needed: int = 0  # bytes that character still needed


@dataclass(frozen=True, slots=True)
class ErrorEvent(Event):
    """A run ended by a fault. `message` is one actionable line; `step` where it happened (-1 before decode);
    `kind` why (core/errors.py's ErrorKind; written as its value, e.g. "prompt", "server", "oom"). A `done` with
    reason "error" always follows it (core/runs/ending.py)."""

    event: ClassVar[str] = "error"
    message: str
    step: int = -1
    kind: ErrorKind = ErrorKind.OTHER

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ErrorKind.of(self.kind))  # a record's string (or an older class name)

    def to_dict(self) -> dict:
        data = Event.to_dict(self)
        data["kind"] = self.kind.value
        return data


install_fast_pickling(globals())
