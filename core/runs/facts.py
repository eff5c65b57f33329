"""What a run says about the model it ran on: the `model` event (`ModelFacts`) and what it nests, the 4-bit
weights' account (`QuantFacts`) and a served model's (`ServerFacts`). One of the engine's events (core/runs/events.py
has the rest), kept apart because it is the largest: everything the model panel shows.

`to_dict()` gives the stable JSON schema documented in docs/headless-json.md; add fields, never rename them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .architecture import BlockGroup, KVGroup, ModelAnatomy  # noqa: F401  (nested in ModelFacts; the reader's table)
from .events import Event
from .pickling import install_fast_pickling
from .truths import ModelTruths  # noqa: F401  (nested in ModelFacts)


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """Where a served model's numbers come from (core/server/): the server watched with `--server URL`.

    `probs` says what the server's per-token probabilities are: "raw" (softmax of the raw logits, before
    temperature / top-k / top-p: llama-server by default, vLLM's default --logprobs-mode raw_logprobs),
    "post-sampler" (after them: llama-server's post_sampling_probs, vLLM's processed_logprobs) or "unknown" (the
    server does not say); tokentui never labels one as the other. None in any other field: not reported by the
    server."""

    url: str  # the base URL, without credentials
    engine: str  # "llama.cpp", "vLLM", "SGLang", or "OpenAI-compatible" when the server does not say
    model: str  # the served model's name, as the server lists it
    probs: str  # "raw" | "post-sampler" | "unknown"
    top_logprobs: int  # alternatives asked for per token
    version: str | None = None
    prefix_caching: bool | None = None  # whether the server reuses a cached prefix (a re-issue's TTFT depends on it)
    kv_source: str | None = None  # the endpoint the KV cache use is read from ("/metrics", "/slots")
    template_source: str | None = None  # the endpoint the chat template was rendered by
    token_ids: bool = True  # the stream names each token's id (else ids are looked up by the server's /tokenize)

    def __post_init__(self) -> None:
        if self.probs not in ("raw", "post-sampler", "unknown"):
            raise ValueError(f"ServerFacts.probs must be raw, post-sampler or unknown, got {self.probs!r}")


SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}  # how QuantFacts.summary() names them


@dataclass(frozen=True, slots=True)
class QuantFacts:
    """Weights run as the file stores them (a 4-bit GGUF on CPU: core/model/quant/gguf_quant.py, core/model/quant/qlinear.py;
    any other GGUF on ggml's kernels: `formats` below):
    what is the file's and what is rounded. `blocks`: the GGUF block types kept (e.g. "Q4_1"); their 4-bit values
    are the file's, in groups of `group` along the input with one scale and one zero each, the scales rounded to
    `scale_dtype`; `activation_dtype`: what the activations are rounded to going into those products (the rest of
    the model computes in ModelFacts.dtype); `head`: how the LM head is computed; `exact_scores`: the highest scores
    of each position recomputed in float32 from the file's de-quantized head (0: none); `matrices`: weight matrices
    kept quantized (a fused q/k/v counts as three); `dequantized`: other matrices, de-quantized to ModelFacts.dtype
    (their block types in `dequantized_blocks`); `weight_bytes`: bytes of weights one decode step reads.
    `quantized_here`: the model's float weights were quantized by tokentui (`--quantize int4`, core/model/quant/quantize.py)
    into the same layout: `blocks` is then "int4", the 4-bit values are tokentui's, and `dequantized` counts the
    matrices kept float."""

    blocks: str
    bits: int
    group: int
    scale_dtype: str
    activation_dtype: str
    head: str
    exact_scores: int
    matrices: int
    dequantized: int = 0
    dequantized_blocks: str = ""
    weight_bytes: int = 0
    quantized_here: bool = False  # float weights quantized by tokentui (--quantize int4), not a file's blocks
    kernel: str = ""  # the 4-bit product: "avx2-int16", "avx2-fp32" or "torch-int4" (core/model/quant/int4_kernel.py)
    # a GGUF run as stored by ggml's kernels (core/model/load/gguf_stored_facts.py): per format the matrices and
    # their bytes, what was de-quantized instead, the float tensors, e.g. "Q4_K ×12 1.6 MB, Q6_K ×3 1.9 MB;
    # float32: 9 norms" ("": a packed 4-bit file or --quantize). `bits` and `group` are then the format holding the
    # most bytes (a K-quant's group: its sub-block under one fp16 super-block scale); `kernel` "ggml's vec_dot,
    # llama.cpp <version>"; `activation_dtype` "int8": a decode step's activations rounded to the format's 8-bit
    # blocks, as llama.cpp does (a prefill's are float32: core/model/quant/ggml_linear.py)
    formats: str = ""

    def stored_words(self) -> str:
        """"Q4_1 as stored" for a file's blocks, "int4 quantized here" for --quantize."""
        return f"{self.blocks} quantized here" if self.quantized_here else f"{self.blocks} as stored"

    def block_words(self) -> str:
        """The blocks' shape in a few words: "4-bit, group 32, bf16 scales"; "16-bit" for float rows, which have no
        group and no scale (a bf16 folder or an F16 GGUF run as stored); a file of several formats (`formats`) says
        its largest's and "most bytes"."""
        if self.scale_dtype == "none":
            words = f"{self.bits}-bit"
        else:
            words = f"{self.bits}-bit, group {self.group}, {SHORT_DTYPES.get(self.scale_dtype, self.scale_dtype)} scales"
        return words + (", most bytes" if "+" in self.blocks else "")

    def summary(self) -> str:
        """One line, e.g. "Q4_1 weights as stored (4-bit, group 32, bf16 scales) · bf16 activations"."""
        words = "weights quantized here" if self.quantized_here else "weights as stored"
        return (f"{self.blocks} {words} ({self.block_words()}) · "
                f"{SHORT_DTYPES.get(self.activation_dtype, self.activation_dtype)} activations")


@dataclass(frozen=True, slots=True)
class ModelFacts(Event):
    """What the dashboard's model panel shows; all numbers read off the loaded model. A served model (`server`
    set) has None for what its server does not report: shown as "not reported by the server", never estimated."""

    event: ClassVar[str] = "model"
    name: str
    source: str  # "embedded", "gguf", "folder", "hub", "in-memory", "server"
    architecture: str  # e.g. "LlamaForCausalLM"
    parameters: int | None
    layers: int | None
    hidden_size: int | None
    vocab_rows: int | None  # rows of the embedding table = scores computed per run
    attention_heads: int | None
    kv_heads: int | None
    head_dim: int | None
    # bytes one more cached position adds while no sliding window is full: the sum over the layers that cache per
    # position (core/runs/architecture.py; 2 * layers * kv_heads * head_dim * kv_bytes_per_value for plain
    # attention; 0 for a model with only a fixed-size recurrent state)
    kv_bytes_per_token: int | None
    max_context: int | None
    device: str
    dtype: str
    chat_template: bool
    trust_remote_code: bool = False
    load_seconds: float = 0.0
    kv_bytes_per_value: int = 0  # element size of the KV cache's dtype (4 for float32); 0 = not known
    # whether the LM head multiplies by the embedding table itself (the same weight tensor, not a copy); None: not
    # known (a model without output embeddings, or a record from before this field)
    tied_lm_head: bool | None = None
    server: ServerFacts | None = None  # a model watched on a server (--server): where its numbers come from
    quantization: QuantFacts | None = None  # weights kept as the file stores them (None: float weights)
    # a GGUF de-quantized at load to `dtype` (the float32 reference, or on a GPU): the block types its weights were
    # stored as, e.g. "Q4_1+Q8_0"; None: the weights run as stored (see `quantization`) or are not a GGUF's
    dequantized_from: str | None = None
    # What the KV cache's layers hold, by kind (core/runs/architecture.py: full, sliding, latent, state...), and the
    # blocks the one-pass panel draws; read off the loaded model. None: not known (a served model, an older record).
    kv_groups: list[KVGroup] | None = None
    anatomy: ModelAnatomy | None = None
    # Which KV cache the engine decodes with and why (core/model/decode/static_cache.py: "bucketed: ..." or "dynamic: ...",
    # with --compile "static: ..." first); None: not an engine's (a served model, an older record)
    kv_cache: str | None = None
    # Which decode step the engine runs and why, in one line (core/model/decode/plan.py, e.g. "native step: Q4_1
    # weights as stored; lens via torch"); None: not known (a served model, an older record)
    decode_plan: str | None = None
    # The embedding table, RoPE and norm figures the one-pass panel shows (core/runs/truths.py), read off the loaded
    # model; None: not known (a served model, an older record)
    truths: ModelTruths | None = None

    def to_dict(self) -> dict:
        data = Event.to_dict(self)
        for name in ("server", "quantization", "dequantized_from", "kv_groups", "anatomy", "kv_cache", "decode_plan",
                     "truths"):
            if data[name] is None:
                del data[name]  # written only where known: a record reads as before these fields existed
        return data


install_fast_pickling(globals())
