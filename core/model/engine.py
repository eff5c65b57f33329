"""The generation loop: the six steps run in order and reported as events.

`Engine` is the local engine: it keeps core/interface.py's interface (`run()` / `branch()` are plain blocking
iterators; headless mode and the benchmarks use them directly, the dashboard through an engine client,
core/link/). Sampler settings, pause, single-step and stop are thread-safe and take effect at the next step
boundary (core/controls.py); each step event carries the settings it actually used (the engine's SamplerSettings
object itself, shared by every step until they change). The latest finished run's KV cache stays with the engine:
`Engine.branch()` goes back to one of its steps with another token and reuses it (core/model/branch.py).
"""

from __future__ import annotations

import re
import threading
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Iterator

import torch

from .decode.adapter import input_device
from .branch import BranchPoint, HeldCache, branch_events
from .fanout import fanout_events
from .forcing import phrase_pieces
from .scoring import score_events
from .preview import preview_step
from ..runs.preview import BUSY
from .step_loop import generate_from
from .turn import turn_events
from ..interface import BaseEngine
from ..steps.token_bytes import token_bytes
from ..errors import ErrorKind, GenerationError, PromptError, SettingsError
from ..runs.ending import stopped_before_first_token
from ..runs.events import Event, Notice, PrefillEvent, PrefillProgress, PromptEvent, StepEvent
from ..runs.facts import ModelFacts
from .decode.kvcache import kv_mismatch
from .decode.plan import DecodePlan, choose_plan, direct_plan
from .quant.fused_linear import FuseReport
from .quant.weight_layout import LayoutReport
from .observe.lens import lens_unavailable
from .observe.inside import Inside, forward_states
from .load.loader import LoadedModel
from ..steps.prefill import prefill_chunks
from ..settings import RunOptions, SamplerSettings
from .speed import SpeedOptions, use_threads
from ..steps.template import apply_template, default_system_prompt
from ..steps.tokenization import tokenize


def end_token_ids(configs, tokenizer) -> set[int]:
    """Every id that ends an answer: the generation config's (often several, e.g. <|im_end|> and <|endoftext|>),
    the model config's, plus the tokenizer's eos. `configs`: the model's generation config (None: none) and config
    (`model_configs`)."""
    ids: set[int] = set()
    for source in configs:
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(i) for i in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def model_configs(loaded: LoadedModel) -> tuple:
    """(generation config, config) of the loaded model. A GGUF's later start has no transformers' model yet: its
    generation config is the one transformers derives from the config (GenerationConfig.from_model_config), whose
    end ids are the config's own, so the config alone gives the same ids."""
    if loaded.direct is not None:
        return (loaded.direct.config,)
    return getattr(loaded.model, "generation_config", None), loaded.model.config


class Engine(BaseEngine):
    def __init__(self, loaded: LoadedModel, sampler: SamplerSettings | None = None,
                 options: RunOptions | None = None, speed: SpeedOptions | None = None, progress=None):
        """`speed`: threads per phase, the weight layout and the --compile fast path (core/model/speed.py). The
        weights are prepared in place and the decode step chosen by core/model/decode/plan.py (`plan`, named in the
        model facts' `decode_plan`); with compile, the decode step is compiled here (minutes on a small CPU),
        reported through `progress`."""
        self._loaded = loaded  # transformers' model: `model` (for a GGUF's later start, built on demand)
        self._direct = loaded.direct  # that start's step made from the file (core/model/load/gguf_direct.py)
        self.tokenizer = loaded.tokenizer
        self.facts: ModelFacts = loaded.facts
        self._load_notice = loaded.notice  # said in the first run (e.g. the model cache is off, and why)
        self.options = options or RunOptions()  # settings are valid by construction (core/settings.py)
        super().__init__(sampler)  # the controls: settings, pause / step, stop (core/controls.py)
        self._model_lock = threading.Lock()  # one run on the model at a time
        self._held: HeldCache | None = None  # the latest finished run's KV cache, for branches (core/model/branch.py)
        self._parked = None  # (cache, the ids so far) of a run waiting at its step gate: `idle_cache` lends it
        self.token_bytes = token_bytes(self.tokenizer)
        self.end_ids = end_token_ids(model_configs(loaded), self.tokenizer)
        # what the chat template puts in an empty system message: a property of the tokenizer, read once
        self.default_system_prompt = default_system_prompt(self.tokenizer)
        self.device = torch.device("cpu") if self._direct is not None else input_device(loaded.model)
        self.speed = speed or SpeedOptions()
        # the weights prepared in place and the decode step chosen (with --compile, compiled and warmed up)
        plan = None if self._direct is None else direct_plan(self._direct, self.speed, self.facts.max_context,
                                                             self.facts.quantization)
        self.plan: DecodePlan = plan or choose_plan(self.model, self.device, self.speed, self.options.top_candidates,
                                                    self.options.max_new_tokens, self.facts.max_context,
                                                    self.facts.quantization, progress)
        self.facts = replace(self.facts, kv_cache=self.plan.kv_cache, decode_plan=self.plan.description)

    @property
    def model(self):
        """transformers' model. A GGUF's later start (core/model/load/gguf_direct.py) builds it here, once, when
        something first asks for its forward (the lens, a view, a fan-out, a score, a preview): its plain runs,
        branches and turns never do."""
        return self._loaded.model

    @property
    def config(self):
        """The model's config (a GGUF's later start: the one its step was made with), without building the model."""
        return self._direct.config if self._direct is not None else self._loaded.model.config

    @property
    def layout(self) -> LayoutReport:
        """The wide matrices this engine stored transposed (core/model/quant/weight_layout.py)."""
        return self.plan.layout

    @property
    def fusion(self) -> FuseReport:
        """The sibling projections this engine fused (core/model/quant/fused_linear.py)."""
        return self.plan.fusion

    def _lens_for(self, states: list | None, said: bool) -> tuple[list | None, str | None]:
        """The logit lens for the next forward, as `self.options.logit_lens` says now (a dashboard toggle shows
        from the next step): (the list that forward appends its hidden states to, None for no lens; the Notice
        text when the lens is wanted, is not available for this model, and was not `said` yet in this run)."""
        if not self.options.logit_lens:
            return None, None
        why = lens_unavailable(self.model, compiled=not self.plan.step.lens)
        if states is not None and why is None:
            return states, None
        return ([], None) if why is None else (None, None if said else why)

    def _inside_for(self, current: Inside | None, said: bool) -> tuple[Inside | None, str | None]:
        """The attention / sublayer capture for the next forward, as `self.options` says now (None: neither), and a
        Notice text as `_lens_for`'s (core/model/observe/inside.py)."""
        return Inside.for_options(lambda: self.model, self.options, not self.plan.step.lens, current, said,
                                  self.plan.step)

    # ------------------------------------------------------------------------------------------- the run
    # `run(prompt, system, run_id=)` and `branch(point, run_id=)` are core/interface.py's: they turn a TokentuiError
    # raised here into the run's error and done events.
    def _run(self, prompt: str, system: str | None, run_id: int) -> Iterator[Event]:
        """One generation, as events: [Notice], PromptEvent, [PrefillProgress... for a long prompt], PrefillEvent,
        StepEvent..., DoneEvent (also when stopped before the first token)."""
        yield from self._locked(lambda: self._generate_run(prompt, system, run_id))

    def _branch(self, point: BranchPoint, run_id: int) -> Iterator[Event]:
        """A branch of an earlier run (core/model/branch.py): the prefix `point` gives, `point.token` forced at step
        `point.at`, then generation as in `run` (same settings, pause, stop, limits). Events: BranchEvent,
        [Notice], [PrefillProgress...], PrefillEvent, StepEvent (index point.at, forced=True), StepEvent...,
        DoneEvent. Reuses the KV cache of this engine's latest run (or branch) when it holds the prefix."""
        yield from self._locked(lambda: branch_events(self, point, run_id))

    def _score(self, request, run_id: int) -> Iterator[Event]:
        """A scored text (core/model/scoring.py): PromptEvent, ScoreEvent, PrefillEvent, forced StepEvents,
        ScoreSummary, DoneEvent. Its KV cache is held afterwards, as a run's, for branches."""
        yield from self._locked(lambda: score_events(self, request, run_id))

    def _fanout(self, request, run_id: int) -> Iterator[Event]:
        """A fan-out (core/model/fanout.py): FanoutEvent, PrefillEvent, [FanoutProgress...], SampleEvent × N,
        DoneEvent. Reuses the held KV cache when it holds the prefix, and holds the prefix's afterwards."""
        yield from self._locked(lambda: fanout_events(self, request, run_id))

    def _turn(self, request, run_id: int) -> Iterator[Event]:
        """A turn of a conversation (core/model/turn.py): a follow-up reuses the held KV cache up to its prompt's
        common prefix with it; a raw run has no chat template."""
        yield from self._locked(lambda: turn_events(self, request, run_id))

    def phrase_pieces(self, text: str) -> list:
        """A phrase's tokens, tokenized on its own with no special tokens (core/model/forcing.py); safe to call
        while a run waits at its step gate."""
        return phrase_pieces(self.tokenizer, self.token_bytes, text)

    phrase_refusal = score_refusal = fanout_refusal = turn_refusal = None  # the local engine does all four
    preview_refusal = None  # and previews a step under other settings (core/model/preview.py)

    def preview_step(self, request) -> list:
        """Step `request.at` of a run under other sampler settings, the run unchanged (core/model/preview.py): a
        list of one StepPreview (an ASK's answer is a sequence). SettingsError (one line) while a run generates."""
        return [preview_step(self, request)]

    @contextmanager
    def idle_cache(self):
        """While the model is idle, its KV cache lent to a preview (core/model/preview.py) as (cache, the ids it
        holds), or None when it holds none: the latest finished run's (no run may start meanwhile), or that of the
        run waiting at its step gate (held there meanwhile: the gate's lock is kept). SettingsError (one line)
        while a run is generating: a forward on another thread must never overlap one of its steps."""
        if self._model_lock.acquire(blocking=False):  # no run on the model
            try:
                held = self._held
                yield (held.cache, held.ids) if held is not None else None
            finally:
                self._model_lock.release()
            return
        with self._cond:
            parked = self._parked
            if parked is None:
                raise SettingsError(BUSY)
            cache, so_far = parked
            yield cache, tuple(so_far[:-1])  # the last token was not fed yet

    @property
    def held_ids(self) -> tuple[int, ...]:
        """The ids whose keys and values the held KV cache of the latest run holds (() when none is held): a branch
        whose prompt + tokens before the step start with these, but the last, reuses them."""
        held = self._held
        return held.ids if held is not None else ()

    def take_held_cache(self) -> HeldCache | None:
        """The KV cache kept from the latest run, handed over to a branch (the engine holds none until that branch
        ends and holds its own)."""
        held, self._held = self._held, None
        return held

    def hold_cache(self, held: HeldCache | None) -> None:
        """Keep `held` as the latest run's cache again (a branch stopped before it used the one it took)."""
        self._held = held

    def release_cache(self) -> None:
        """Drop the KV cache kept from the latest run (its memory is freed once no branch uses it; a later branch
        prefills afresh). Does not wait: a run in progress keeps its own cache, and holds it when it ends."""
        self._held = None

    @property
    def compiled(self):
        """The --compile whole decode step (core/model/decode/compiled.py); None without --compile, on a 4-bit model
        whose lean step is compiled instead, or once it failed."""
        return self.plan.compiled

    def _locked(self, start) -> Iterator[Event]:
        """The events of `start()` as one run on the model: its locks held, and out-of-memory turned into a
        GenerationError of kind oom (the step where it happened, numbered as the events number them)."""
        # A compiled run also holds its decoder's lock: engines on one model share its static caches.
        with self._model_lock, (self.compiled.run_lock if self.compiled is not None else nullcontext()):
            step = -1  # the step being computed: -1 in prefill, then 1 + the last step reported
            events = start()
            try:
                for event in events:
                    if isinstance(event, StepEvent):
                        step = event.index + 1
                    yield event
            except torch.cuda.OutOfMemoryError as err:
                raise GenerationError(oom_message(err, step, self.device, self.facts.dtype), step,
                                      ErrorKind.OOM) from None
            finally:
                events.close()

    def _generate_run(self, prompt: str, system: str | None, run_id: int) -> Iterator[Event]:
        facts, opts, tok = self.facts, self.options, self.tokenizer
        self._held = None  # a new run: the last one's KV cache goes
        self.plan.drop_failed()
        if self.plan.notice:
            yield Notice(self.plan.notice)
        if self._load_notice:
            yield Notice(self._load_notice)
            self._load_notice = None
        # Step 1 — chat template.
        templated = apply_template(tok, prompt, system)
        if not templated.templated:
            yield Notice("this model has no chat template: the raw prompt is used as is")
        # With the logit lens on: a list each forward appends its hidden states to (`_lens_for`: decided again before
        # each forward, so turning it on or off mid-run shows from the next step).
        lens_states, lens_why = self._lens_for(None, said=False)
        lens_said = lens_why is not None
        if lens_why:
            yield Notice(lens_why)
        # Step 2 — tokenize.
        ids, pieces = tokenize(tok, templated, self.token_bytes)
        if facts.max_context and len(ids) >= facts.max_context:
            over = len(ids) - facts.max_context + 1
            raise PromptError(f"the prompt is {len(ids)} tokens, {over} over this model's context of "
                              f"{facts.max_context}; shorten it by at least {over} tokens")
        yield PromptEvent(text=templated.text, ids=ids, pieces=pieces, templated=templated.templated,
                          user_prompt=prompt, system_prompt=system,
                          default_system_prompt=self.default_system_prompt)
        go, paused_s = self.timed_gate(run_id)
        if not go:
            yield stopped_before_first_token(len(ids), paused_ms=paused_s * 1000.0)
            return
        # Step 3 — prefill (a long prompt in chunks, with progress and a chance to stop between them).
        cache, notice = self.plan.new_cache(len(ids), opts.max_new_tokens)
        if notice:
            yield Notice(notice)
        lens_states, lens_why = self._lens_for(lens_states, lens_said)  # the options may have changed while paused
        if lens_why:
            lens_said = True
            yield Notice(lens_why)
        inside, inside_why = self._inside_for(None, said=False)  # attention / sublayers (issue 39), as the lens
        if inside_why:
            yield Notice(inside_why)
        use_threads(self.device, self.speed.prefill_thread_count(len(ids)))
        chunked = len(ids) > opts.prefill_chunk
        logits, forward_ms = None, 0.0
        with inside or nullcontext():
            for tokens_done, logits, forward_ms in prefill_chunks(self.device, ids, cache, opts.prefill_chunk,
                                                                states_out=forward_states(lens_states, inside)):
                if chunked:
                    yield PrefillProgress(tokens_done=tokens_done, tokens=len(ids), elapsed_ms=forward_ms)
                    if logits is None and self.stopping(run_id):
                        yield stopped_before_first_token(len(ids), cache.tokens(), cache.nbytes(),
                                                         paused_s * 1000.0)
                        return
        use_threads(self.device, self.speed.decode_threads())
        kv_tokens, kv_bytes = cache.tokens(), cache.nbytes()
        yield PrefillEvent(tokens=len(ids), ms=forward_ms, kv_tokens=kv_tokens, kv_bytes=kv_bytes)
        mismatch = kv_mismatch(facts, kv_tokens, kv_bytes)
        if mismatch:
            yield Notice(mismatch)
        yield from self.generate_from(run_id, ids, cache, logits, forward_ms, paused_s, lens_states,
                                      lens_said=lens_said, inside=inside, inside_said=inside_why is not None)

    def generate_from(self, run_id: int, ids: list[int], cache, logits, forward_ms: float, paused_s: float,
                      lens_states: list | None = None, **kw) -> Iterator[Event]:
        """Steps 4-6, step after step until the run ends: core/model/step_loop.py `generate_from` (its docstring
        says what each argument is)."""
        return generate_from(self, run_id, ids, cache, logits, forward_ms, paused_s, lens_states, **kw)

def oom_message(err, step: int, device, dtype: str) -> str:
    """Out of memory at `step` (-1: in prefill) on `device` with weights of `dtype`: one line with the numbers (asked
    for, free of total where the device can say) and what to try."""
    numbers = []
    asked = re.search(r"[Tt]ried to allocate ([\d.]+ ?[KMGT]?i?B)", str(err))
    if asked:
        numbers.append(f"tried to allocate {asked.group(1)}")
    if device.type == "cuda":
        try:
            free, total = torch.cuda.mem_get_info(device)
            numbers.append(f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free")
        except Exception:  # a broken CUDA context must not hide the real error
            pass
    where = f" at step {step + 1}" if step >= 0 else " in prefill"  # numbered from 1, as the dashboard shows
    detail = f" ({'; '.join(numbers)})" if numbers else ""
    smaller = "--dtype bfloat16, " if dtype == "float32" else ""
    return (f"out of GPU memory{where}{detail}; try {smaller}fewer --max-new-tokens, a shorter prompt "
            "or a smaller model")
