"""Tiny random-weight models built from a config (no downloads), the `generate` oracle the engine is checked
against, and the guard that keeps that oracle from being vacuous (`assert_varies`)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

def tiny_model(kind: str, tokenizer, **overrides):
    """A random-weight causal LM of a given architecture, sized to run in milliseconds, sharing the
    embedded model's tokenizer (vocab 49,152) so prompts and chat templates are real."""
    import torch
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    common.update(overrides)
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[kind]
    if kind == "qwen3":
        common.setdefault("head_dim", 32)
    model = model_cls(config_cls(**common)).eval()
    model.config.architectures = [model_cls.__name__]
    return model


def tiny_gpt2(tokenizer):
    """A random-weight GPT-2 (LayerNorm, learned positions, `transformer.h` blocks), with the embedded model's
    tokenizer. Every other family: tests/arch_matrix.py."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=len(tokenizer), n_positions=256,
                                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.config.architectures = ["GPT2LMHeadModel"]
    return model


def generate_ids(model, prompt_ids, n, *, stop_at_eos: bool = True):
    """transformers' own greedy continuation of `prompt_ids`: up to n tokens (stop_at_eos=False: exactly n, no early
    stop, like --ignore-eos). The attention mask is explicit: generate would otherwise mask prompt tokens that share
    the pad id (SmolLM2's <|im_end|>)."""
    import torch

    x = torch.tensor([list(prompt_ids)])
    extra = {} if stop_at_eos else {"eos_token_id": -1}
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, **extra)
    return out[0, len(prompt_ids):].tolist()


def assert_varies(ids, what: str = "the reference ids") -> None:
    """The guard every shared oracle helper runs on its reference sequence: at least half its ids distinct. A tiny
    model at the default init (initializer_range 0.02) repeats one id whatever the context, and then "the engine's
    ids == generate's" holds even when the engine never reads its cache. Build it at a larger init scale (0.2:
    `tiny_model(..., initializer_range=0.2)`; tests/arch_matrix.py's INIT)."""
    ids = list(ids)
    distinct = len(set(ids))
    assert ids and 2 * distinct >= len(ids), (
        f"vacuous oracle: {what} hold {distinct} distinct ids out of {len(ids)} ({ids[:12]}...); the model's output "
        "does not depend on its context, so a broken cache would pass. Use a context-dependent tiny model "
        "(a larger initializer_range).")
