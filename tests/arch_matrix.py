"""The architecture matrix: tiny random-weight models of every decoder family tokentui is checked on, built from a
config here (hidden 64, 2-4 layers, no downloads) with the embedded model's tokenizer, and what each one is checked
for. tests/unit/test_architecture_matrix.py asserts the checks; scripts/arch_table.py writes the table of
architectures × features from the same observations (and a test keeps the two equal).

`observe(name, tokenizer)` measures, for one architecture, against oracles that do not use tokentui's own readings:
greedy ids against `model.generate`, on tiny models whose output depends on the context (`build`'s init scale:
`generate`'s ids must vary, `assert_varies`); the teacher-forced logits: at every step, the engine's raw
log-probabilities of its candidates against one full forward of the whole sequence without a cache, at that position
(tests/tiny_models.py's `forced_gaps`: this checks what the cache holds, not only its size, and needs no varied
output); the cache's bytes after each position, summed off a plain transformers cache's tensors, against the KV
figures (per token, the totals' formula, the engine's step figures); each logit-lens row against the model's final
norm, LM head and logit post-processing applied by hand (the modules named here) to the blocks' outputs caught with
this module's own forward hooks, and the last row against the model's own logits; each one-pass stage's shape
against its module's output (forward hooks) or the cache's tensors; whether the MLP reads the attention's output
(zeroing the attention's output by a hook: a parallel block's MLP input does not move); whether the final norm
centres (LayerNorm) or only scales (RMSNorm); and `--compile`: a static cache and the decode step captured whole by
dynamo (the eager backend: seconds, where inductor would take minutes; inductor itself is checked on Llama in
tests/unit/test_fastpaths.py), no recompile, the same ids; or a Notice before the run."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

# FORCED_TOL, INIT, forced_gaps, forced_ok: the tests import them from here too
from tiny_models import FORCED_TOL, INIT, cache_kwargs, forced_gaps, forced_ok  # noqa: F401

# sliding windows and attention chunks: 40, so a 31-token prompt ("Hi" in the chat template) crosses them while
# decoding (the layer keeps 39 positions). Soft-caps, scales and divisors are set where they change the tiny
# models' distributions (Gemma's cap with larger weights), so that a lens without them would not match.
# INIT (tests/tiny_models.py): the weights' init scale, where the output depends on the context. At 0.2 (0.4 where a
# family still repeats: Bloom, Falcon's new decoder, the Mamba family) at least half of `generate`'s 24 ids are
# distinct on every family; Gemma 2/3 also need an untied head (with a tied one the token predicts itself whatever
# the context). FORCED_TOL (tests/tiny_models.py): the teacher-forced oracle's tolerance.
WINDOW = 40
NEW_TOKENS = 24
PROMPT = "Hi"


@dataclass(frozen=True)
class Spec:
    label: str  # the table's name for it (docs/models.md)
    config: str  # transformers' config class
    model: str  # transformers' causal-LM class
    overrides: dict
    norm: str  # the final norm's module path, named here (the lens's hand computation uses it)
    kinds: frozenset  # the KV cache's layer kinds (core/runs/architecture.py)
    order: str = "sequential"  # how a block's sublayers meet the stream
    positions: str = "rotary"  # the first block's
    norm_kind: str = "RMSNorm"  # the final norm: "LayerNorm" centres, "RMSNorm" only scales
    moe: bool = False
    logits_op: tuple = ()  # what the model does to the head's output: ("softcap", c), ("scale", s), ("divide", d)
    compiles: bool = True  # --compile: a static cache and a compiled decode step (else a Notice, eager)
    style: str = "llama"  # which config keys the family takes: "llama" (the Llama names), "gpt2", "mamba", "own"
    init: float = INIT  # initializer_range (INIT's comment)


def _llama(**extra) -> dict:
    return {**dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True), **extra}


def _gpt2(**extra) -> dict:
    return {**dict(n_embd=64, n_layer=2, n_head=4, n_positions=1024), **extra}


def _mamba(**extra) -> dict:
    return {**dict(hidden_size=64, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4), **extra}


FULL, SLIDING, STATE = frozenset({"full"}), frozenset({"sliding", "full"}), frozenset({"state", "full"})
ROPE_LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
ROPE_YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "original_max_position_embeddings": 256,
             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)

SPECS: dict[str, Spec] = {
    "llama": Spec("Llama (rope llama3)", "LlamaConfig", "LlamaForCausalLM", _llama(rope_parameters=ROPE_LLAMA3),
                  "model.norm", FULL),
    "mistral": Spec("Mistral (sliding)", "MistralConfig", "MistralForCausalLM", _llama(sliding_window=WINDOW),
                    "model.norm", frozenset({"sliding"}), compiles=False),
    "mixtral": Spec("Mixtral", "MixtralConfig", "MixtralForCausalLM",
                    _llama(num_local_experts=4, num_experts_per_tok=2), "model.norm", FULL, moe=True),
    "qwen2": Spec("Qwen2", "Qwen2Config", "Qwen2ForCausalLM", _llama(), "model.norm", FULL),
    "qwen2_sliding": Spec("Qwen2 (use_sliding_window)", "Qwen2Config", "Qwen2ForCausalLM",
                          _llama(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
                          "model.norm", SLIDING, compiles=False),
    "qwen2_moe": Spec("Qwen2-MoE", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                      _llama(**MOE, shared_expert_intermediate_size=64), "model.norm", FULL, moe=True),
    "qwen3": Spec("Qwen3", "Qwen3Config", "Qwen3ForCausalLM", _llama(head_dim=32), "model.norm", FULL),
    "qwen3_moe": Spec("Qwen3-MoE", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", _llama(**MOE, head_dim=16),
                      "model.norm", FULL, moe=True),
    "gemma": Spec("Gemma", "GemmaConfig", "GemmaForCausalLM", _llama(head_dim=16), "model.norm", FULL),
    "gemma2": Spec("Gemma 2", "Gemma2Config", "Gemma2ForCausalLM",
                   _llama(head_dim=16, sliding_window=WINDOW, final_logit_softcapping=5.0, tie_word_embeddings=False),
                   "model.norm", SLIDING, order="sandwich", logits_op=("softcap", 5.0), compiles=False),
    "gemma3": Spec("Gemma 3 (text)", "Gemma3TextConfig", "Gemma3ForCausalLM",
                   _llama(head_dim=16, sliding_window=WINDOW, final_logit_softcapping=5.0, tie_word_embeddings=False,
                          layer_types=["sliding_attention", "full_attention"]), "model.norm", SLIDING,
                   order="sandwich", logits_op=("softcap", 5.0), compiles=False),
    "phi": Spec("Phi", "PhiConfig", "PhiForCausalLM", _llama(partial_rotary_factor=0.5), "model.final_layernorm",
                FULL, order="parallel", norm_kind="LayerNorm"),
    "phi3": Spec("Phi-3", "Phi3Config", "Phi3ForCausalLM", _llama(), "model.norm", FULL),
    "gpt_neox": Spec("GPT-NeoX", "GPTNeoXConfig", "GPTNeoXForCausalLM",
                     dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          max_position_embeddings=1024, tie_word_embeddings=False), "gpt_neox.final_layer_norm",
                     FULL, order="parallel", norm_kind="LayerNorm", style="own"),
    "gpt2": Spec("GPT-2", "GPT2Config", "GPT2LMHeadModel", _gpt2(), "transformer.ln_f", FULL, positions="learned",
                 norm_kind="LayerNorm", style="gpt2"),
    "opt": Spec("OPT", "OPTConfig", "OPTForCausalLM",
                dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4, init_std=INIT,
                     max_position_embeddings=1024, word_embed_proj_dim=64), "model.decoder.final_layer_norm", FULL,
                positions="learned", norm_kind="LayerNorm", compiles=False, style="own"),
    "falcon_mqa": Spec("Falcon (multi-query)", "FalconConfig", "FalconForCausalLM",
                       dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, multi_query=True,
                            new_decoder_architecture=False, max_position_embeddings=1024), "transformer.ln_f", FULL,
                       order="parallel", norm_kind="LayerNorm", style="own"),
    "falcon_new": Spec("Falcon (new decoder)", "FalconConfig", "FalconForCausalLM",
                       dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2,
                            new_decoder_architecture=True, max_position_embeddings=1024), "transformer.ln_f", FULL,
                       order="parallel", norm_kind="LayerNorm", style="own", init=0.4),
    "stablelm": Spec("StableLM", "StableLmConfig", "StableLmForCausalLM", _llama(), "model.norm", FULL,
                     norm_kind="LayerNorm"),
    "olmo": Spec("OLMo", "OlmoConfig", "OlmoForCausalLM", _llama(), "model.norm", FULL, norm_kind="LayerNorm"),
    "olmo2": Spec("OLMo 2", "Olmo2Config", "Olmo2ForCausalLM", _llama(), "model.norm", FULL, order="post-norm"),
    "cohere": Spec("Cohere", "CohereConfig", "CohereForCausalLM", _llama(), "model.norm", FULL, order="parallel",
                   norm_kind="LayerNorm", logits_op=("scale", 0.0625)),
    "cohere2": Spec("Cohere2", "Cohere2Config", "Cohere2ForCausalLM", _llama(sliding_window=WINDOW,
                                                                            num_hidden_layers=4),
                    "model.norm", SLIDING, order="parallel", norm_kind="LayerNorm", logits_op=("scale", 0.0625),
                    compiles=False),
    "granite": Spec("Granite", "GraniteConfig", "GraniteForCausalLM",
                    _llama(logits_scaling=4.0, embedding_multiplier=2.0, residual_multiplier=0.5,
                           attention_multiplier=0.25), "model.norm", FULL, logits_op=("divide", 4.0)),
    "smollm3": Spec("SmolLM3 (NoPE layers)", "SmolLM3Config", "SmolLM3ForCausalLM", _llama(no_rope_layer_interval=2),
                    "model.norm", FULL),
    "gpt_oss": Spec("GPT-OSS", "GptOssConfig", "GptOssForCausalLM",
                    _llama(num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=WINDOW,
                           rope_parameters=ROPE_YARN), "model.norm", SLIDING, moe=True, compiles=False),
    "deepseek_v3": Spec("DeepSeek-V3 (MLA)", "DeepseekV3Config", "DeepseekV3ForCausalLM",
                        _llama(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                               qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                               n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1, n_group=1,
                               topk_group=1), "model.norm", frozenset({"latent"}), moe=True),
    "glm4": Spec("GLM-4", "Glm4Config", "Glm4ForCausalLM", _llama(head_dim=16), "model.norm", FULL,
                 order="sandwich"),
    "starcoder2": Spec("Starcoder2", "Starcoder2Config", "Starcoder2ForCausalLM", _llama(), "model.norm", FULL,
                       norm_kind="LayerNorm"),
    "gpt_bigcode": Spec("GPT-BigCode (multi-query)", "GPTBigCodeConfig", "GPTBigCodeForCausalLM",
                        _gpt2(multi_query=True), "transformer.ln_f", FULL, positions="learned",
                        norm_kind="LayerNorm", style="gpt2"),
    "gptj": Spec("GPT-J", "GPTJConfig", "GPTJForCausalLM", _gpt2(rotary_dim=8, tie_word_embeddings=False),
                 "transformer.ln_f", FULL, order="parallel", norm_kind="LayerNorm", style="gpt2"),
    "bloom": Spec("Bloom (ALiBi)", "BloomConfig", "BloomForCausalLM", dict(hidden_size=64, n_layer=2, n_head=4),
                  "transformer.ln_f", FULL, positions="ALiBi", norm_kind="LayerNorm", style="own", init=0.4),
    "llama4": Spec("Llama 4 (text, chunked)", "Llama4TextConfig", "Llama4ForCausalLM",
                   _llama(intermediate_size_mlp=128, num_local_experts=4, num_experts_per_tok=1, head_dim=16,
                          attention_chunk_size=WINDOW, num_hidden_layers=4, interleave_moe_layer_step=2),
                   "model.norm", frozenset({"chunked", "full"}), moe=True, compiles=False),
    "qwen3_next": Spec("Qwen3-Next (hybrid)", "Qwen3NextConfig", "Qwen3NextForCausalLM",
                       _llama(**MOE, head_dim=16, num_hidden_layers=4, shared_expert_intermediate_size=64,
                              linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                              linear_value_head_dim=16), "model.norm", STATE, positions="none", moe=True),
    "lfm2": Spec("LFM2 (hybrid)", "Lfm2Config", "Lfm2ForCausalLM",
                 _llama(num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "full_attention"]),
                 "model.embedding_norm", STATE, positions="none"),
    "mamba": Spec("Mamba", "MambaConfig", "MambaForCausalLM", _mamba(), "backbone.norm_f", frozenset({"state"}),
                  positions="none", compiles=False, style="mamba", init=0.4),
    "mamba2": Spec("Mamba-2", "Mamba2Config", "Mamba2ForCausalLM",
                   _mamba(num_heads=8, head_dim=16, n_groups=1, chunk_size=32), "backbone.norm_f",
                   frozenset({"state"}), positions="none", compiles=False, style="mamba"),
    "falcon_mamba": Spec("FalconMamba", "FalconMambaConfig", "FalconMambaForCausalLM", _mamba(), "backbone.norm_f",
                         frozenset({"state"}), positions="none", compiles=False, style="mamba", init=0.4),
}


def build(name: str, tokenizer, **overrides):
    """A random-weight model of `SPECS[name]` (seeded, at the family's init scale), sharing the embedded model's
    tokenizer."""
    import torch
    import transformers

    spec = SPECS[name]
    torch.manual_seed(0)
    ids = dict(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    if spec.style != "gpt2":
        ids["pad_token_id"] = tokenizer.pad_token_id
    config = getattr(transformers, spec.config)(**{**ids, "initializer_range": spec.init, **spec.overrides,
                                                   **overrides})
    model = getattr(transformers, spec.model)(config).eval()
    model.config.architectures = [spec.model]
    return model


# ---------------------------------------------------------------------------------------------- observing
@dataclass
class Observation:
    """What `observe` measured for one architecture (the test asserts on it; docs/models.md's table shows it)."""

    name: str
    facts: object = None
    prompt_tokens: int = 0
    ids: list = field(default_factory=list)  # the engine's greedy ids
    generated: list = field(default_factory=list)  # model.generate's
    forced: list = field(default_factory=list)  # per step: (worst |log p| gap, top id agrees), `forced_gaps`
    errors: list = field(default_factory=list)  # ErrorEvents (none expected)
    notices: list = field(default_factory=list)
    oracle_bytes: dict = field(default_factory=dict)  # positions -> bytes of a plain transformers cache's tensors
    step_kv: list = field(default_factory=list)  # (kv_tokens, kv_bytes) of the engine's steps
    lens_rows: list = field(default_factory=list)  # per step: [(id, prob)] per layer, from the engine
    hand_rows: list = field(default_factory=list)  # per step: [(id, prob)] per layer, by hand
    model_top: list = field(default_factory=list)  # per step: (id, prob) of the model's own logits
    lens_without_op_kl: float | None = None  # KL(model ‖ the lens without the logits op): > 0 shows the op matters
    stage_shapes: list = field(default_factory=list)  # (stage name, its shape, the real one) for each checked stage
    mlp_moves: bool | None = None  # whether the MLP's input changes when the attention's output is zeroed
    norm_centres: bool | None = None  # whether the final norm ignores a constant added to its input
    compile_notice: str = ""
    compile_ids: list = field(default_factory=list)
    compile_allocated: tuple = ()  # (the notice's bytes, the static cache's real allocation)


def tensor_bytes(cache) -> int:
    """Bytes of every tensor a transformers cache's layers hold (keys, values, conv and recurrent states; not the
    0-d bookkeeping), read off the layer objects: the oracle for tokentui's own counting."""
    import torch

    total = 0
    for layer in cache.layers:
        for value in vars(layer).values():
            tensors = value.values() if isinstance(value, dict) else [value]
            total += sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor) and t.dim() >= 2)
    return total


@contextlib.contextmanager
def _hooks(pairs):
    handles = [module.register_forward_hook(hook) for module, hook in pairs]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def _by_hand(model, spec: Spec, block_outputs):
    """softmax(op(head(norm(h)))) per block output h [H]: the lens computed from the modules named in the spec."""
    import torch

    norm = model.get_submodule(spec.norm)
    head = model.get_output_embeddings()
    with torch.inference_mode():
        logits = head(norm(torch.stack(block_outputs)[None]))[0].float()  # [L, V]
        return _op(spec, logits)


def _op(spec: Spec, logits):
    import torch

    if not spec.logits_op:
        return logits
    kind, value = spec.logits_op
    if kind == "softcap":
        return torch.tanh(logits / value) * value
    return logits * value if kind == "scale" else logits / value


def observe(name: str, tokenizer) -> Observation:
    """Run every check's measurement for one architecture (the module docstring)."""
    import torch

    from tiny_models import generate_ids
    from tokentui.core.model.engine import Engine
    from tokentui.core.model.load.loader import LoadedModel, model_facts
    from tokentui.core.runs.events import ErrorEvent, Notice, PromptEvent, StepEvent
    from tokentui.core.settings import RunOptions, SamplerSettings

    spec = SPECS[name]
    model = build(name, tokenizer)
    facts = model_facts(model, tokenizer, name=f"tiny-{name}")
    seen = Observation(name=name, facts=facts)
    blocks = model.get_submodule(facts.anatomy.layers_module)
    forwards: list[list] = []  # per forward: each block's output at the last position
    logits: list = []  # per forward: the model's own last-position logits

    def block_hook(module, args, output):
        if module is blocks[0]:
            forwards.append([])
        forwards[-1].append(_first(output)[0, -1].detach().clone())

    def model_hook(module, args, output):
        logits.append(output.logits[0, -1].detach().float().clone())

    engine = Engine(LoadedModel(model, tokenizer, facts), SamplerSettings(temperature=0),
                    RunOptions(max_new_tokens=NEW_TOKENS, ignore_eos=True, logit_lens=True))
    with _hooks([(b, block_hook) for b in blocks] + [(model, model_hook)]):
        events = list(engine.run(PROMPT))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    steps = [e for e in events if isinstance(e, StepEvent)]
    seen.prompt_tokens = len(prompt.ids)
    seen.errors = [e for e in events if isinstance(e, ErrorEvent)]
    seen.notices = [e.message for e in events if isinstance(e, Notice)]
    seen.ids = [s.id for s in steps]
    seen.step_kv = [(s.kv_tokens, s.kv_bytes) for s in steps]
    for step, outputs, own in zip(steps, forwards, logits):
        seen.lens_rows.append([(r.id, r.prob) for r in step.lens] if step.lens else [])
        probs = torch.softmax(_by_hand(model, spec, outputs), dim=-1)
        seen.hand_rows.append([(int(p.argmax()), float(p.max())) for p in probs])
        mine = torch.softmax(own, dim=-1)
        seen.model_top.append((int(mine.argmax()), float(mine.max())))
    if spec.logits_op and forwards:
        bare = torch.log_softmax(model.get_output_embeddings()(model.get_submodule(spec.norm)(
            forwards[0][-1][None, None]))[0, 0].float().detach(), -1)
        own = torch.log_softmax(logits[0].double(), -1)
        seen.lens_without_op_kl = float((own.exp() * (own - bare.double())).sum())
    seen.generated = generate_ids(model, prompt.ids, NEW_TOKENS, stop_at_eos=False)
    seen.forced = forced_gaps(model, prompt.ids, steps)
    seen.oracle_bytes = _cache_growth(model, prompt.ids + seen.generated, len(prompt.ids))
    seen.stage_shapes = _stage_shapes(model, facts)
    seen.mlp_moves = _mlp_moves(model, facts)
    seen.norm_centres = _centres(model.get_submodule(spec.norm))
    _observe_compile(seen, model, tokenizer, facts)
    return seen


def sampler_gaps(model, prompt_ids, steps, settings) -> list[float]:
    """The sampler's teacher-forced oracle: per step, the largest |p| difference between the engine's candidates'
    post-sampler probabilities and transformers' warpers (temperature, top-k, top-p) applied to one full forward's
    logits at the step's position. Outside anything planted, as `forced_gaps`."""
    import torch

    from tokentui.core.steps.select import reference_probs

    ids = list(prompt_ids) + [s.id for s in steps[:-1]]
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, len(prompt_ids) - 1:]
    return [max(abs(c.prob - float(ref[c.id])) for c in step.candidates)
            for step, ref in zip(steps, (reference_probs(row, settings) for row in logits))]


def _cache_growth(model, ids, prompt: int) -> dict[int, int]:
    """Bytes of a plain transformers cache (the one `generate` makes) after the prompt and after each id fed one at
    a time: positions -> bytes."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = {}
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids[:prompt]]), use_cache=True, **cache_kwargs(model, cache))
        out[prompt] = tensor_bytes(cache)
        for n in range(prompt, len(ids)):
            model(input_ids=torch.tensor([[ids[n]]]), use_cache=True, **cache_kwargs(model, cache))
            out[n + 1] = tensor_bytes(cache)
    return out


def _step(rows: int, kv_tokens: int):
    """A step whose forward read `rows` ids (a prefill's prompt when more than one): what one_pass reads of it."""
    from tokentui.core.runs.events import StepEvent, StepTiming
    from tokentui.core.settings import SamplerSettings

    return StepEvent(index=0 if rows > 1 else 1, id=1, piece="a", special=False, text="a", pending_hex="",
                     pending_needed=0, completed_chars=[], candidates=[], chosen_rank=0, chosen_raw_prob=0.5,
                     chosen_prob=0.5, kept_count=1, kept_mass=0.5, entropy_bits=1.0, sampled_entropy_bits=0.0,
                     greedy=True, settings=SamplerSettings(temperature=0), settings_changed=False, latency_ms=1.0,
                     forward_ms=1.0, kv_tokens=kv_tokens, kv_bytes=0,
                     timing=StepTiming(1.0, 0.1, 0.01, 0.1, 0.0, 8 * rows, 180))


def _stage_shapes(model, facts) -> list[tuple[str, tuple, tuple]]:
    """(stage, its shape, the real tensor's) for every stage with a module (its output, by a forward hook) or with
    layers (the cache's tensors after the forward), on a prefill of 50 ids (past the windows), then a decode step."""
    import torch

    from tokentui.core.model.decode.adapter import call_model, new_cache
    from tokentui.core.model.observe.anatomy import one_pass

    checks = []
    cache = new_cache(model, 64)
    tokens = 0
    for ids in (list(range(300, 350)), [351]):
        tokens += len(ids)
        stages = one_pass(facts, tokens, _step(len(ids), tokens))
        got: dict[str, tuple] = {}

        def keep(name):
            def hook(module, args, output):
                got[name] = tuple(_first(output).shape)
            return hook

        modules = {s.module for s in stages if s.module}
        with _hooks([(model.get_submodule(m), keep(m)) for m in modules]), torch.inference_mode():
            call_model(model, torch.tensor([ids]), cache)
        for stage in stages:
            if stage.shape is None:
                continue
            if stage.module:
                real = got.get(stage.module)
                if stage.name == "LM head" and real is not None:
                    real = (real[0], real[-1])  # logits_to_keep=1: [1, 1, V]; the sampler reads [1, V]
                checks.append((f"{stage.name} ({len(ids)} ids)", stage.shape, real))
                continue
            for i in stage.layers:
                layer = cache.layers[i]
                if stage.name.endswith("its state"):
                    states = [t for d in (layer.conv_states, layer.recurrent_states) for t in d.values()
                              if t is not None]
                    real = [tuple(t.shape) for t in states]
                else:
                    real = [tuple(layer.keys.shape), tuple(layer.values.shape)]
                ours = [stage.shape] + ([stage.also] if stage.also is not None else
                                        [stage.shape] if not stage.name.endswith("its state") else [])
                for n, (shape, tensor) in enumerate(zip(ours, real)):
                    checks.append((f"{stage.name}, layer {i + 1}, tensor {n + 1} ({len(ids)} ids)", shape,
                                   tensor))
                if len(ours) != len(real):
                    checks.append((f"{stage.name}, layer {i + 1}: tensors", (len(ours),), (len(real),)))
    return checks


def _mlp_moves(model, facts) -> bool | None:
    """Whether the first block's MLP input changes when its mixer's output is zeroed (None: no MLP)."""
    import torch

    block = facts.anatomy.blocks[0]
    if not block.mlp_module or not block.mixer_module:
        return None
    layer = model.get_submodule(block.module)
    mixer, mlp = layer.get_submodule(block.mixer_module), layer.get_submodule(block.mlp_module)
    seen = []

    def take(module, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()))
        seen.append(x.detach().clone())

    def zero(module, args, output):
        if isinstance(output, tuple):
            return (torch.zeros_like(output[0]), *output[1:])
        return torch.zeros_like(output)

    ids = torch.tensor([list(range(400, 410))])
    handle = mlp.register_forward_pre_hook(take, with_kwargs=True)
    try:
        with torch.inference_mode():
            model(input_ids=ids)
            with _hooks([(mixer, zero)]):
                model(input_ids=ids)
    finally:
        handle.remove()
    return not torch.equal(seen[0], seen[1])


def _centres(norm) -> bool:
    """Whether `norm` gives the same output for x and x + 3 (a LayerNorm subtracts the mean; an RMSNorm does not)."""
    import torch

    x = torch.randn(1, 3, norm.weight.shape[0] if getattr(norm, "weight", None) is not None else 64,
                    generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        return bool(torch.allclose(norm(x), norm(x + 3.0), atol=1e-4))


def _observe_compile(seen: Observation, model, tokenizer, facts) -> None:
    """--compile on this model, with dynamo's eager backend (the module docstring): the Notice before the prompt,
    the ids, and the static cache's real allocation against the notice's figure (bucket × per-token bytes)."""
    import torch

    import tokentui.core.model.decode.compiled as compiled
    from tokentui.core.model.decode.adapter import cache_allocated_nbytes
    from tokentui.core.model.engine import Engine
    from tokentui.core.model.load.loader import LoadedModel
    from tokentui.core.model.speed import SpeedOptions
    from tokentui.core.runs.architecture import kv_bytes_at
    from tokentui.core.runs.events import Notice, PromptEvent, StepEvent
    from tokentui.core.settings import RunOptions, SamplerSettings

    settings = compiled.compile_settings
    compiled.compile_settings = lambda device: (dict(fullgraph=True, dynamic=False, backend="eager"), {})
    torch.compiler.reset()  # one code object serves every model here, and dynamo keeps a few graphs per code object
    threads = torch.get_num_threads()
    speed = SpeedOptions(compile=True)
    try:
        engine = Engine(LoadedModel(model, tokenizer, facts), SamplerSettings(temperature=0),
                        RunOptions(max_new_tokens=NEW_TOKENS, ignore_eos=True), speed=speed)
        events = list(engine.run(PROMPT))
    finally:
        compiled.compile_settings = settings
        torch.set_num_threads(threads)
    prompt_at = next(i for i, e in enumerate(events) if isinstance(e, PromptEvent))
    notices = [e.message for e in events[:prompt_at] if isinstance(e, Notice) and "--compile" in e.message]
    notices += [e.message for e in events if isinstance(e, Notice) and e.message.startswith("static KV cache")]
    seen.compile_notice = notices[0] if notices else ""  # why not, before the prompt; or the static cache's size
    seen.compile_ids = [e.id for e in events if isinstance(e, StepEvent)]
    if seen.compile_notice.startswith("static KV cache"):
        bucket = compiled.bucket_for(seen.prompt_tokens + NEW_TOKENS, facts.max_context)
        static = engine.compiled.cache(bucket)
        figure = kv_bytes_at(facts.kv_groups, bucket, facts.kv_bytes_per_value)  # what the notice says
        seen.compile_allocated = (figure, cache_allocated_nbytes(static))


# ------------------------------------------------------------------------------ the table in docs/models.md
BEGIN = "<!-- architecture table: scripts/arch_table.py writes it from tests/arch_matrix.py; do not edit -->"
END = "<!-- end of the architecture table -->"


def _ok(flag: bool) -> str:
    return "✓" if flag else "✗"


def _cache_words(facts) -> str:
    words = []
    for g in facts.kv_groups:
        n = len(g.layers)
        if g.kind == "state":
            what = " + ".join(f"{name} {'×'.join(map(str, shape))}" for name, shape in zip(g.state_names, g.state))
            words.append(f"{n} state ({what})")
        elif g.kind == "latent":
            words.append(f"{n} latent ({g.k[1]} + {g.v[1]} rotary)")
        else:
            cap = f" ≤{g.cap}" if g.cap is not None else ""
            heads = f", {g.k[0]} K/V head{'s' if g.k[0] != 1 else ''}"
            words.append(f"{n} {g.kind}{cap}{heads}")
    return " + ".join(words)


def _blocks_words(facts) -> str:
    anatomy = facts.anatomy
    first = anatomy.blocks[0]
    words = []
    if first.order != "sequential":
        words.append(first.order)
    moe = next((b for b in anatomy.blocks if b.mlp == "MoE"), None)
    if moe is not None:
        words.append(f"MoE top-{moe.top_k}/{moe.experts}" + (f" +{moe.shared_experts} shared" if moe.shared_experts
                                                              else ""))
    positions = {b.positions for b in anatomy.blocks if b.mixer in ("attention", "latent attention")}
    words += sorted(p if p != "none" else "NoPE" for p in positions if p != "rotary")
    words += sorted({b.mixer for b in anatomy.blocks} - {"attention"})
    if anatomy.final_norm == "LayerNorm":
        words.append("LayerNorm")
    return ", ".join(words)


def row(seen: Observation) -> str:
    """One architecture's line of the table, from what `observe` measured (✓: the check held)."""
    spec, facts = SPECS[seen.name], seen.facts
    greedy = seen.ids == seen.generated and not seen.errors and 2 * len(set(seen.generated)) >= len(seen.generated)
    forced = forced_ok(seen.forced)
    totals = all(kv_ok(seen))
    lens = bool(seen.lens_rows) and all(
        [i for i, _ in ours] == [j for j, _ in hand] and hand[-1][0] == own[0]
        for ours, hand, own in zip(seen.lens_rows, seen.hand_rows, seen.model_top))
    op = f" ({spec.logits_op[0]} {spec.logits_op[1]:g})" if spec.logits_op else ""
    shapes = [ours == real for _, ours, real in seen.stage_shapes]
    compiled = seen.compile_ids == seen.generated
    notice = seen.compile_notice
    compile_words = ("compiled, no recompile" if notice.startswith("static KV cache") else
                     "eager: could not be captured whole (said first)" if notice.startswith("--compile stopped") else
                     "eager: no KV cache (said first)" if "recurrent state" in notice else
                     "eager: windowed layers (said first)")
    return (f"| {spec.label} | {_ok(greedy)} {sum(a == b for a, b in zip(seen.ids, seen.generated))}/"
            f"{len(seen.generated)} ({len(set(seen.generated))} distinct) | {_ok(forced)} {len(seen.forced)} steps, "
            f"within {FORCED_TOL:g} | {facts.kv_bytes_per_token:,} B {_ok(totals)} | {_cache_words(facts)} "
            f"| {_ok(lens)}{op} | {_ok(all(shapes))} {len(shapes)} shapes; {_blocks_words(facts) or 'plain'} "
            f"| {_ok(compiled)} {compile_words} |")


def kv_ok(seen: Observation) -> list[bool]:
    from tokentui.core.runs.architecture import kv_bytes_at

    facts = seen.facts
    return [kv_bytes_at(facts.kv_groups, t, facts.kv_bytes_per_value) == b for t, b in seen.oracle_bytes.items()] + \
        [b == seen.oracle_bytes.get(t) for t, b in seen.step_kv]


def render(observations: list[Observation]) -> str:
    head = ("| architecture (tiny config) | greedy ids = `generate`'s (which vary) | teacher-forced "
            "logits = one full forward (log p) | KV per token = the cache's growth, totals = its "
            "nbytes | what each layer caches | logit lens = by hand | one pass: shapes = hooks | `--compile` |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- |")
    return "\n".join([BEGIN, head, *(row(seen) for seen in observations), END])


def table_section(text: str) -> str:
    """The table as `text` (docs/models.md) has it now ("" when it has none)."""
    if BEGIN not in text or END not in text:
        return ""
    return text[text.index(BEGIN):text.index(END) + len(END)]
