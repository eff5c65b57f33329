"""The decode steps, one class per backend, behind one protocol (`DecodeStep`): what prefills a run's cache and
feeds it one token at a time. core/model/decode/plan.py chooses one per engine, once, as the model loads.

    TorchForward   transformers' forward on the eager cache (dynamic, or bucketed: core/model/decode/static_cache.py);
                   every model; the one that gives the logit lens its hidden states
    LeanTorch      a 4-bit Llama-family model's lean step (core/model/decode/lean_step.py): the forward's scores bit
                   for bit, fewer host operations
    CompiledLean   that step compiled whole (--compile, core/model/decode/compiled_lean.py)
    NativeCpp      that step as one C++ call (core/model/native/native_step.py), the default where it serves
    NativeGGML     a model whose matrices are ggml rows (a GGUF kept as stored, core/model/load/gguf_stored.py; an HF
                   folder's weights viewed as them, core/model/quant/hf_stored.py): the Llama / Mistral / Qwen2 / Qwen3
                   step as one C++ call on ggml's kernels (core/model/native/ggml_native.py), each matrix in its format;
                   on a GGUF's later start (`NativeGGML.over`) made from the file, transformers' model built on demand;
                   its runs' caches are tokentui's own (core/model/decode/buffers.py's PlainCache), handed to
                   transformers' when a forward is asked for
    CompiledWhole  --compile's whole step on a static cache (core/model/decode/compiled.py): forward and selection

Each keeps what it knows about a run on the run's RunCache (core/model/decode/run_cache.py), never on transformers'
cache object. Prefill is transformers' forward for all of them (one call a run, a new length each time) but the
native ggml step's, which runs the same modules itself; the lean and native steps feed the same cache, so a step (or
a prefill) that wants the logit lens or a capture goes through the forward instead.

How to add a backend: a class with the protocol's members (usually a TorchForward subclass that overrides `step`),
and a branch in plan.py's `choose_plan` saying when it serves and why.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .adapter import first_capacity, forward_last_logits, input_device
from .buffers import GrowableBuffers, PlainCache
from .run_cache import RunCache
from ..native.ggml_prefill import prefill_hidden
from .static_cache import new_eager_cache
from ..observe.lens import forward_last_states
from ...steps.prefill import continues_chunks

__all__ = ["CompiledLean", "CompiledWhole", "DecodeStep", "LeanTorch", "NativeCpp", "NativeGGML", "TorchForward"]


class DecodeStep(Protocol):
    """What the engine asks of a decode backend.

    `name`: what the model panel calls it; `lens`: whether a run can show the logit lens (its forward then goes
    through transformers', which returns the hidden states); `failure`: why a step that compiles stopped (the plan
    then falls back; None: it runs); `top_n`: the candidates a step that also selects reports (`step_select`; None:
    it returns scores only)."""

    name: str
    lens: bool
    failure: str | None
    top_n: int | None

    def new_cache(self, tokens: int, max_new_tokens: int) -> tuple[RunCache, str | None]:
        """A run's cache for a prompt (or prefix) of `tokens` ids and up to `max_new_tokens` more, and a Notice
        text (None: nothing to say)."""

    def prefill(self, run: RunCache, ids: torch.Tensor, first: bool, states_out: list | None = None) -> torch.Tensor:
        """One prompt chunk, ids [1, T], into `run` (`first`: the prompt's first chunk) -> logits [V] after its last
        position. `states_out`: a list the forward appends the blocks' outputs [L, H] at that position to."""

    def step(self, run: RunCache, token_id: int, states_out: list | None = None) -> torch.Tensor:
        """One token into `run` -> logits [V] for the next. `states_out` as for `prefill`."""

    def crop_problem(self, run: RunCache) -> str | None:
        """Why `run`'s cache cannot be cut back to a prefix (core/model/branch.py); None: it can."""


class TorchForward:
    """transformers' forward, on the eager cache: bucketed attention shapes or the exact length."""

    name = "transformers' forward"
    lens = True
    failure = None
    top_n = None

    def __init__(self, model, max_context: int | None = 0, bucketed: bool = False):
        self._setup(lambda: model, model.config, input_device(model), max_context, bucketed)

    def _setup(self, model_of, config, device, max_context: int | None, bucketed: bool) -> None:
        self._model_of = model_of  # transformers' model (for a GGUF's later start: built when first asked for)
        self.config = config
        self.device = device
        self.max_context = max_context or 0
        self.bucketed = bucketed

    @property
    def model(self):
        """transformers' model, whose forward this step runs."""
        return self._model_of()

    def new_cache(self, tokens: int, max_new_tokens: int) -> tuple[RunCache, str | None]:
        capacity = first_capacity(tokens, max_new_tokens, self.max_context)
        return RunCache(new_eager_cache(self.config, capacity, self.bucketed), self), None

    def prefill(self, run: RunCache, ids: torch.Tensor, first: bool, states_out: list | None = None) -> torch.Tensor:
        # A Mamba-1 model's later chunks go in one token at a time (core/steps/prefill.py's docstring says why); its
        # first chunk starts from zeros, as the scan does, and stays one forward.
        pieces = ids.split(1, dim=1) if not first and not continues_chunks(self.model) else (ids,)
        for piece in pieces[:-1]:
            forward_last_logits(self.model, piece, run.for_forward(self.model))
        logits = self._forward(run, pieces[-1], states_out)
        run.fed += int(ids.shape[1]) - int(pieces[-1].shape[1])
        return logits

    def step(self, run: RunCache, token_id: int, states_out: list | None = None) -> torch.Tensor:
        # torch.full, not torch.tensor: filling on the device needs no host-to-device copy (a sync on CUDA).
        return self._forward(run, torch.full((1, 1), token_id, dtype=torch.long, device=self.device), states_out)

    def _forward(self, run: RunCache, ids: torch.Tensor, states_out: list | None) -> torch.Tensor:
        kv = run.for_forward(self.model)
        if states_out is None:
            logits = forward_last_logits(self.model, ids, kv)  # [V]
        else:
            logits, states = forward_last_states(self.model, ids, kv)  # [V], [L, H]
            states_out.append(states)
        run.fed += int(ids.shape[1])
        return logits

    def crop_problem(self, run: RunCache) -> str | None:
        for layer in run.kv.layers:
            if isinstance(layer, GrowableBuffers):  # the engine's own full-attention layers (a PlainCache's too)
                continue
            from transformers.cache_utils import DynamicLayer

            if type(layer) is not DynamicLayer:  # sliding, linear... layers
                return f"this model's cache has {type(layer).__name__} layers, which cannot be cut back exactly"
        return None


class _KernelStep(TorchForward):
    """A step object with `step(token_id, kv) -> logits [V]` on an unbucketed eager cache (the lean, compiled lean
    and native steps attend over exactly the keys the cache holds); a step that wants the lens goes through the
    forward, which extends the same cache."""

    def __init__(self, model, kernel, max_context: int | None = 0):
        super().__init__(model, max_context, bucketed=False)
        self.kernel = kernel

    def step(self, run: RunCache, token_id: int, states_out: list | None = None) -> torch.Tensor:
        if states_out is not None:
            return super().step(run, token_id, states_out)
        logits = self.kernel.step(token_id, run.kv)  # [V]
        run.fed += 1
        return logits


class LeanTorch(_KernelStep):
    """A 4-bit Llama-family model's lean step (core/model/decode/lean_step.py's LeanDecoder)."""

    name = "lean torch step"


class NativeCpp(_KernelStep):
    """The lean step's arithmetic as one C++ call (core/model/native/native_step.py's NativeStep)."""

    name = "native step"


class NativeGGML(_KernelStep):
    """A model whose matrices are ggml rows (GGMLLinear), its decode step as one C++ call on ggml's kernels
    (core/model/native/ggml_native.py's GGMLStep), its prefill the same modules' rows without transformers' forward
    (core/model/native/ggml_prefill.py) unless a forward's hidden states are asked for (the lens, a capture)."""

    name = "native ggml step"

    @classmethod
    def over(cls, direct, max_context: int | None = 0) -> "NativeGGML":
        """The step of a GGUF's later start (core/model/load/gguf_direct.py's DirectModel): its ggml step made from the
        file, transformers' model built only when a forward is asked for (the lens, a view)."""
        step = cls.__new__(cls)
        step._setup(direct.model, direct.config, torch.device("cpu"), max_context, bucketed=False)
        step.kernel = direct.step
        return step

    def new_cache(self, tokens: int, max_new_tokens: int) -> tuple[RunCache, str | None]:
        # every layer full attention (ggml_native.check_config): a cache of tokentui's own, which a forward asked for
        # takes over as transformers' (RunCache.for_forward)
        capacity = first_capacity(tokens, max_new_tokens, self.max_context)
        return RunCache(PlainCache(int(self.config.num_hidden_layers), capacity), self), None

    def prefill(self, run: RunCache, ids: torch.Tensor, first: bool, states_out: list | None = None) -> torch.Tensor:
        if states_out is not None:
            return super().prefill(run, ids, first, states_out)
        logits = self.kernel.head(prefill_hidden(self.kernel, ids, run.kv))[0]  # [V]
        run.fed += int(ids.shape[1])
        return logits


class CompiledLean(_KernelStep):
    """The lean step compiled whole (core/model/decode/compiled_lean.py's CompiledLeanStep)."""

    name = "compiled lean step"

    @property
    def failure(self) -> str | None:
        return self.kernel.failure


class CompiledWhole:
    """--compile's whole step (core/model/decode/compiled.py's CompiledDecoder) on a static cache of 256 * 2^k
    positions; a run it does not cover (too long) gets `fallback`'s cache and decodes with it."""

    name = "compiled whole step"
    lens = False

    def __init__(self, decoder, fallback: DecodeStep, max_context: int | None = 0):
        self.decoder = decoder
        self.fallback = fallback
        self.max_context = max_context or 0

    @property
    def failure(self) -> str | None:
        return self.decoder.failure

    @property
    def top_n(self) -> int | None:
        return self.decoder.top_n

    def new_cache(self, tokens: int, max_new_tokens: int) -> tuple[RunCache, str | None]:
        kv, notice = self.decoder.new_cache(tokens + max_new_tokens, self.max_context)
        if kv is None:
            return self.fallback.new_cache(tokens, max_new_tokens)[0], notice
        return RunCache(kv, self, static=True), notice

    @staticmethod
    def _no_lens(states_out: list | None, what: str) -> None:
        if states_out is not None:
            raise ValueError(f"{what} returns no hidden states (the logit lens is eager only)")

    def prefill(self, run: RunCache, ids: torch.Tensor, first: bool, states_out: list | None = None) -> torch.Tensor:
        self._no_lens(states_out, "a compiled run's prefill")
        logits = self.decoder.prefill(ids, run.kv, first=first)
        run.fed = (0 if first else run.fed) + int(ids.shape[1])  # the first chunk resets the shared static cache
        return logits

    def step(self, run: RunCache, token_id: int, states_out: list | None = None) -> torch.Tensor:
        self._no_lens(states_out, "the compiled decode step")
        logits = self.decoder.step(token_id, run.kv, run.fed)
        run.fed += 1
        return logits

    def step_select(self, run: RunCache, token_id: int, settings, generator) -> torch.Tensor:
        """Feed `token_id` and select the next token in one call -> the packed selection (core/steps/select.py's
        layout, `unpack`)."""
        packed = self.decoder.step_select(token_id, run.kv, run.fed, settings, generator)
        run.fed += 1
        return packed

    def crop_problem(self, run: RunCache) -> str | None:
        if run.static:
            return ("--compile's static KV cache is shared by the compiled decode step and has no crop "
                    "(transformers' StaticLayer cannot drop positions)")
        return self.fallback.crop_problem(run)
