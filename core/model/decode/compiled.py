"""The `--compile` fast path: a static KV cache and a torch.compile'd one-token decode step.

Why each piece (the measurements behind it: docs/design-record.md, "--compile"):

* Decode on CPU is bound by reading the weights, and eager PyTorch (MKL's fp32 matrix-vector kernel) reads them well
  below what one core can stream. Inductor with `freezing` (weights become constants) and `max_autotune` over the
  CPP GEMM template packs each weight into a blocked layout and generates a matrix-vector kernel per shape; with
  `cpp.enable_concat_linear` q/k/v and gate/up become one matrix each. That is where the speed comes from. Freezing
  alone (MKL-packed weights, no autotuning) gave less; `cpp_wrapper` (the whole step as one C++ call) compiled
  slower and was not clearly faster.
* A compiled graph needs fixed shapes, hence transformers' StaticCache: one preallocated buffer per layer and an
  attention mask over its whole length. Runs are grouped into buckets of 256 * 2^k cache tokens so that a bucket
  compiles once per process (each compile costs minutes on 2 cores: inductor's FX-graph cache cannot store graphs
  holding mkldnn-packed weights, so every process compiles again). A bucket is sized for the whole run
  (prompt + --max-new-tokens); runs needing more than MAX_COMPILED_TOKENS decode eagerly (a Notice says so), since
  every step attends over the whole static buffer.
* Prefill stays eager (variable length; transformers never compiles it either) and writes into the same static
  cache, chunk by chunk for a long prompt (core/steps/prefill.py), like the eager path.
* The engine compiles the whole step (`top_n` decoders, `step_select`): the forward, step 4's selection
  (core/model/decode/fused_step.py: temperature, top-k, top-p, softmax, the seeded draw, candidates, entropies) and the
  packing of its small result, so the step's one host transfer is that vector. The sampler and the draw's noise
  are inputs filled in place (the sampler only when it changes; the noise from the run's seeded generator, which
  dynamo cannot trace): a sampler change is new data for the same graph, never a recompile (tests/unit/
  test_fused_step.py counts them over 1,000 steps).
* On CUDA the step is compiled with mode="reduce-overhead": CUDA graphs replay the whole step with one launch.
  torch records CUDA graphs per Python thread: a run on another thread than the warm-up (a LocalClient's executor
  thread, core/link/local_client.py) re-records on its first steps: milliseconds, not a recompile. The dashboard's model process warms up and
  runs on its main thread.
* Threads on CPU: the generated kernels bake in the thread count they were compiled with; the engine compiles at
  its decode thread count (1 on 2 cores). Compiled with 2 threads the step collapsed on a busy 2-core box (OpenMP
  barriers on a shared core).
* The cache's token count is kept on the host (the run's RunCache, core/model/decode/run_cache.py, passes it in as
  `tokens`): StaticCache keeps it in a tensor, and reading that every step would be a device sync on CUDA. KV
  bytes are reported for the tokens used (the used prefix of each buffer, read off the tensors); the allocation is
  reported once, as a Notice.

* Dynamo checks its guards on every step, a few percent of it. `set_stance(skip_guard_eval_unsafe=True)` saves about
  that and is not used: for that little, an instrument keeps its correctness checks (the next point shows how
  little those guards already distinguish).
* One decoder per model (and CPU thread count), shared by every Engine on that model: `CompiledDecoder.for_model`.
  Dynamo keeps compiled graphs per code object, and its guards tell two models apart but not two static caches
  (transformers marks their tensors static-address, so a graph holds them the way it holds weights). A second
  decoder on the same model therefore reused the first one's graph, which read and wrote the *first* decoder's
  cache: wrong tokens, silently (tests/unit/test_fastpaths.py). Sharing the decoder shares its caches; `run_lock`
  keeps two engines from running on them at once. The registry holds models weakly, so dropping the last engine
  frees the model object; the frozen weights, though, stay with torch's compiled code for the life of the process
  (even after torch._dynamo.reset()), which is one reason the dashboard runs each model in a process of its own.

* Which models: those whose layers are all full attention (`compile_problem`, core/model/architecture.py). transformers'
  static sliding-window layer keeps its length as a Python int, so a fixed-shape graph recompiled at every step
  (each one a long pause) until dynamo's recompile limit raised; recurrent (linear-attention, SSM, conv)
  layers take another cache path. Such a model decodes eagerly, and each run says so first (a Notice), before any
  compiling. As a guard for what no check foresees, every call after a bucket's first runs under
  `torch.compiler.set_stance("fail_on_recompile")`: a graph that would compile again raises at once instead, and the
  decoder falls back to eager decoding on the same static cache (`failure` says why; the engine's Notice).

The compiled step gives the same token IDs as `generate(do_sample=False)` on the embedded model (checked by
tests/unit/test_fastpaths.py and by the benchmark), but its scores are not bit-identical to eager ones (different
summation order in the generated kernels), so ties at the 6th decimal could in principle pick another token.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
import weakref
from typing import Callable

import torch
from .adapter import (cache_keyword, forward_last_logits, input_device, new_static_cache, static_capacity,
                      synchronize)
from .fused_step import fused_select, sampler_tensor, write_sampler
from ...settings import SamplerSettings
from ...steps.select import draw_noise
from ...runs.events import LoadProgress
from .kvcache import kv_bytes_at, kv_groups

MAX_COMPILED_TOKENS = 4096
_BUCKET_MIN = 256
_WARMUP_PROMPT = 8  # tokens of the throw-away prefill that triggers compilation
_TICK_S = 5.0  # how often compile progress is reported
_WARMUP_SAMPLERS = (SamplerSettings(temperature=0), SamplerSettings(temperature=0.7, top_k=40, min_p=0.05),
                    SamplerSettings(temperature=1.0))  # greedy, every cut on (top-p's default 0.9), none


def static_bytes(model, dtype: torch.dtype, bucket: int) -> int:
    """What a static cache of `bucket` positions allocates for `model`: every position of its full-attention (and
    MLA) layers, and the fixed-size states of its recurrent ones (core/runs/architecture.py's formula)."""
    return kv_bytes_at(kv_groups(model), bucket, torch.empty((), dtype=dtype).element_size())


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def bucket_for(tokens: int, max_context: int = 0) -> int | None:
    """Static cache length for a run needing `tokens` cache slots: the next 256 * 2^k, capped at the context;
    None when that exceeds MAX_COMPILED_TOKENS (the run decodes eagerly)."""
    if tokens > MAX_COMPILED_TOKENS:
        return None
    size = _BUCKET_MIN
    while size < tokens:
        size *= 2
    if max_context:
        size = min(size, max_context)
    return size if size >= tokens else None


@contextlib.contextmanager
def elapsed_reports(stage: str, progress: Callable[[LoadProgress], None] | None):
    """Say `stage` now, then its elapsed seconds every few seconds (from a thread) until the block ends: a compile
    gives no progress of its own."""
    report = progress or (lambda _: None)
    report(LoadProgress(stage, None))
    started = time.perf_counter()
    done = threading.Event()

    def tick() -> None:
        while not done.wait(_TICK_S):
            report(LoadProgress(f"{stage}: {time.perf_counter() - started:.0f} s", None))

    ticker = threading.Thread(target=tick, name="tokentui-compile-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


def compile_settings(device: torch.device) -> tuple[dict, dict]:
    """(torch.compile keyword arguments, inductor config patch) per device (see the module docstring for why).

    The inductor settings are applied with `torch._inductor.config.patch` around the calls that compile: passed as
    torch.compile(options=...) they did not take effect (freezing is decided outside the patched region).
    """
    if device.type == "cuda":
        return dict(mode="reduce-overhead", fullgraph=True, dynamic=False), {}
    options = {
        "freezing": True,
        "max_autotune": True,
        "max_autotune_gemm_backends": "CPP,ATEN",
        "cpp.enable_concat_linear": True,
        # autotuning writes its tables straight to stderr, which would scribble over the dashboard
        "autotune_num_choices_displayed": 0,
        "max_autotune_report_choices_stats": False,
    }
    return dict(fullgraph=True, dynamic=False), options


_SHARED: "weakref.WeakKeyDictionary[object, dict[int, CompiledDecoder]]" = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


class CompiledDecoder:
    """Owns the compiled step and one static cache per bucket for one model. Get it with `for_model` (see the
    module docstring for why it is shared); a run holds `run_lock` from prefill to its last step."""

    @classmethod
    def for_model(cls, model, threads: int, top_n: int | None = None) -> "CompiledDecoder":
        """The decoder for `model` at `threads` CPU threads (generated CPU kernels bake in their thread count).
        `top_n`: a whole-step decoder reporting that many candidates (`step_select`); None: the forward only."""
        with _SHARED_LOCK:
            per_model = _SHARED.setdefault(model, {})
            if (threads, top_n) not in per_model:
                per_model[(threads, top_n)] = cls(model, top_n)
            return per_model[(threads, top_n)]

    def __init__(self, model, top_n: int | None = None):
        self.run_lock = threading.Lock()
        self._model = weakref.ref(model)  # the registry is keyed on the model: a strong reference would keep it
        self.device = input_device(model)
        self._cache_keyword = cache_keyword(model)  # read once, outside the graph (adapter.py: the version's name)
        self._dtype = model.get_input_embeddings().weight.dtype
        self._caches: dict[int, object] = {}  # bucket -> transformers' StaticCache of that length
        self._compiled: set[int] = set()
        self._warm_calls: dict[int, int] = {}
        self._ids = torch.zeros((1, 1), dtype=torch.long, device=self.device)  # reused input: no per-step alloc
        kwargs, self._inductor_config = compile_settings(self.device)
        # The whole step (core/model/decode/fused_step.py): its sampler and noise are inputs filled in place, so a sampler
        # change or a new draw is new data for the same graph, never a new graph.
        self.top_n = top_n
        vocab = model.get_output_embeddings().weight.shape[0] if model.get_output_embeddings() is not None \
            else model.config.vocab_size
        self._sampler = sampler_tensor(self.device) if top_n is not None else None
        self._sampler_in: SamplerSettings | None = None  # what `_sampler` holds
        self._noise = torch.ones(vocab, dtype=torch.float32, device=self.device) if top_n is not None else None
        for tensor in (self._sampler, self._noise):
            # On CUDA fixed addresses, as StaticCache marks its own: the graphs read them in place. Not on CPU:
            # inductor's freezing folds static inputs that the graph only reads into constants, so every step
            # would sample with the warm-up's sampler and noise.
            if tensor is not None and self.device.type == "cuda":
                torch._dynamo.mark_static_address(tensor)
        self._step = torch.compile(self._forward if top_n is None else self._forward_select, **kwargs)
        self.compile_seconds: dict[int, float] = {}
        self.failure: str | None = None  # why compiled decoding stopped (then every step is eager); None: it runs

    @property
    def model(self):
        model = self._model()
        if model is None:  # pragma: no cover - engines hold their model; a decoder outliving it is a bug
            raise RuntimeError("the compiled decoder's model is gone")
        return model

    def _forward(self, ids: torch.Tensor, cache, *_) -> torch.Tensor:
        return self.model(input_ids=ids, use_cache=True, logits_to_keep=1,
                          **{self._cache_keyword: cache}).logits[0, -1]

    def _forward_select(self, ids: torch.Tensor, cache, sampler: torch.Tensor,
                        noise: torch.Tensor) -> torch.Tensor:
        """The whole step: ids [1, 1] -> the step's packed selection [15 + 3 * top_n] (core/steps/select.py's
        layout), forward, selection and packing in one graph."""
        return fused_select(self._forward(ids, cache), sampler, noise, self.top_n)

    # ------------------------------------------------------------------------------------------- caches
    def cache(self, bucket: int):
        """The static cache (transformers' StaticCache) of `bucket` positions, one per bucket, shared by the runs."""
        if bucket not in self._caches:
            self._caches[bucket] = new_static_cache(self.model, bucket)
        return self._caches[bucket]

    def new_cache(self, tokens: int, max_context: int = 0) -> tuple[object | None, str | None]:
        """A static cache for a run needing `tokens` slots and a Notice text, or (None, why) to decode eagerly."""
        bucket = bucket_for(tokens, max_context)
        if bucket is None:
            return None, (f"--compile covers runs of up to {MAX_COMPILED_TOKENS} tokens (prompt + max new tokens); "
                          f"this one may need {tokens}: decoding eagerly")
        cache = self.cache(bucket)
        allocated = static_bytes(self.model, self._dtype, bucket)
        notice = (f"static KV cache: {_size(allocated)} allocated for {bucket} tokens "
                  "(the KV figures shown count the tokens in use)")
        if bucket not in self._compiled:
            notice += "; compiling the decode step for it first (minutes on a small CPU, once per process)"
        return cache, notice

    # ------------------------------------------------------------------------------------------- the run
    def prefill(self, ids: torch.Tensor, cache, first: bool = True) -> torch.Tensor:
        """Eager prefill of one chunk into the static cache (reset first when `first`); ids [1, T] -> logits [V].
        A later chunk lands after the tokens already written (StaticCache counts them per layer)."""
        if first:
            with torch.inference_mode():
                cache.reset()
        return forward_last_logits(self.model, ids, cache)

    def step(self, token_id: int, cache, tokens: int) -> torch.Tensor:
        """One compiled decode step on `cache` holding `tokens` positions; returns logits [V] (a copy: CUDA graphs
        reuse their output buffers). After a
        failure (`failure`), and on a whole-step decoder (whose graph returns a selection), an eager step on the
        same static cache."""
        if self.top_n is not None:
            return self._eager(token_id, cache, tokens)
        return self._run(token_id, cache, tokens)

    def step_select(self, token_id: int, cache, tokens: int, settings: SamplerSettings,
                    generator: torch.Generator | None) -> torch.Tensor:
        """The whole step of a `top_n` decoder: feed `token_id`, select the next token with `settings` (the noise
        drawn from `generator` when sampling); returns the packed selection [15 + 3 * top_n] on the device, for
        `select.unpack` after the one copy to the host. After a failure, the same computation eagerly."""
        if settings != self._sampler_in:  # a host-to-device copy (a wait on CUDA) only when the sampler changes
            write_sampler(self._sampler, settings)
            self._sampler_in = settings
        if not settings.is_greedy:
            draw_noise(generator, self._noise.numel(), self.device, out=self._noise)
        return self._run(token_id, cache, tokens)

    @staticmethod
    def _check_room(cache, tokens: int) -> None:
        capacity = static_capacity(cache)
        if tokens >= capacity:
            raise RuntimeError(f"static KV cache full ({capacity} tokens)")

    def _eager(self, token_id: int, cache, tokens: int) -> torch.Tensor:
        self._check_room(cache, tokens)
        self._ids.fill_(token_id)
        return forward_last_logits(self.model, self._ids, cache)

    def _run(self, token_id: int, cache, tokens: int) -> torch.Tensor:
        self._check_room(cache, tokens)
        self._ids.fill_(token_id)  # a fill kernel: no host-to-device copy, no sync
        if self.failure is None:
            try:
                logits = self._compiled_step(cache)
            except Exception as err:  # a recompile (the guard below) or a compile error: decode eagerly from here
                text = (str(err).strip().splitlines() or [""])[0][:120]
                if "fail_on_recompile" in text:
                    why = "the decode step would compile again at every step"
                else:
                    why = f"the decode step could not be compiled whole: {type(err).__name__}: {text}"
                self.failure = f"--compile stopped ({why}): decoding eagerly"
        if self.failure is not None:
            logits = forward_last_logits(self.model, self._ids, cache)
            if self.top_n is not None:
                with torch.inference_mode():
                    logits = fused_select(logits, self._sampler, self._noise, self.top_n)
        return logits

    def _compiled_step(self, cache) -> torch.Tensor:
        capacity = static_capacity(cache)
        calls = self._warm_calls.get(capacity, 0)
        # Only a bucket's first call may compile: a later one that would compile again raises instead of recompiling
        # at every step (the module docstring)
        stance = torch.compiler.set_stance("fail_on_recompile") if calls or capacity in self._compiled \
            else contextlib.nullcontext()
        if capacity in self._compiled:
            with torch.inference_mode(), stance:
                return self._step(self._ids, cache, self._sampler, self._noise).clone()
        import torch._inductor.config as inductor_config  # this call compiles (or records CUDA graphs)

        with torch.inference_mode(), inductor_config.patch(self._inductor_config), warnings.catch_warnings(), stance:
            warnings.simplefilter("ignore")  # inductor's deprecation chatter would land on the terminal
            logits = self._step(self._ids, cache, self._sampler, self._noise).clone()
        self._warm_calls[capacity] = calls + 1
        if calls + 1 >= 3:  # CUDA graphs record on the third call
            self._compiled.add(capacity)
        return logits

    def warm_up(self, bucket: int, progress: Callable[[LoadProgress], None] | None = None) -> float:
        """Compile the step for `bucket` now (a throw-away 8-token prefill and three steps: CUDA graphs record on
        the third call), reporting elapsed time every few seconds; returns the seconds it took."""
        if bucket in self._compiled:
            return 0.0
        stage = f"compiling the decode step ({bucket}-token static cache; minutes on CPU, once per process)"
        started = time.perf_counter()
        with elapsed_reports(stage, progress):
            cache = self.cache(bucket)
            token = 0
            ids = torch.full((1, _WARMUP_PROMPT), token, dtype=torch.long, device=self.device)
            tokens = _WARMUP_PROMPT
            try:
                self.prefill(ids, cache)
            except Exception as err:  # the model's eager forward does not take a static cache (e.g. Bloom's ALiBi
                # in some transformers releases): decode eagerly, with the regular cache
                text = (str(err).strip().splitlines() or [""])[0][:120]
                self.failure = (f"--compile stopped (this model's forward does not take a static KV cache: "
                                f"{type(err).__name__}: {text}): decoding eagerly")
            for call in range(3 if self.failure is None else 0):
                if self.top_n is None:
                    self.step(token, cache, tokens)
                else:  # greedy, then sampling: the graph is one, whatever the sampler
                    self.step_select(token, cache, tokens, _WARMUP_SAMPLERS[call], None)
                tokens += 1
                if self.failure is not None:
                    break
            synchronize(self.device)
            with torch.inference_mode():
                cache.reset()
        seconds = time.perf_counter() - started
        self.compile_seconds[bucket] = seconds
        if self.failure is None and progress is not None:
            progress(LoadProgress(f"decode step compiled in {seconds:.0f} s", 1.0))
        return seconds
