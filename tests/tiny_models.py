"""Tiny random-weight models built from a config (no downloads), and the oracles the engine is checked against:
`generate`'s greedy ids, with the guard that keeps them from being vacuous (`assert_varies`), and the teacher-forced
logits (`forced_gaps`: every step against one full forward without a cache). `assert_engine_is_the_oracle` runs all
three on an engine run."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# INIT: an init scale (initializer_range) at which a tiny model's output depends on its context. At transformers'
# default (0.02) `generate`'s greedy ids are one repeated id whatever the prompt for most families (24 of 24 ids one
# id on 26 of the matrix's 38): an oracle that a cache never read passes. At 0.2 at least half are distinct
# (tests/arch_matrix.py raises it to 0.4 for the few families that still repeat). Build with
# `tiny_model(kind, tokenizer, initializer_range=INIT)` wherever ids are compared with `generate`'s.
INIT = 0.2
# FORCED_TOL: the largest |log p| difference allowed between the engine's cached decoding and one full forward
# (float32; the two differ only in reduction order: attention over a cache vs one pass, a chunked scan vs a
# step-by-step one). Measured worst over the architecture matrix: 5e-5 (Qwen3-Next's linear attention), ~1e-5
# elsewhere; a cache that is not read moves it by more than 0.1 (tests/unit/test_planted_bugs.py).
FORCED_TOL = 2e-4

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


def generate_ids(model, prompt_ids, n, *, stop_at_eos: bool = True, vary: bool = False):
    """transformers' own greedy continuation of `prompt_ids`: up to n tokens (stop_at_eos=False: exactly n, no early
    stop, like --ignore-eos). The attention mask is explicit: generate would otherwise mask prompt tokens that share
    the pad id (SmolLM2's <|im_end|>). vary=True: `assert_varies` on them (a tiny model's oracle)."""
    import torch

    x = torch.tensor([list(prompt_ids)])
    extra = {} if stop_at_eos else {"eos_token_id": -1}
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, **extra)
    ids = out[0, len(prompt_ids):].tolist()
    if vary:
        assert_varies(ids, f"generate's {n} greedy ids")
    return ids


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


def cache_kwargs(model, cache) -> dict:
    """`cache` under the keyword the installed transformers' forward takes for it, read off the signature here (not
    the engine's reading: core/model/decode/adapter.py's is what the tests check): `cache` (>= 5.24, every family;
    the old names warn there), else `past_key_values`, or `cache_params` (the Mamba family before 5.24)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return {next((k for k in ("cache", "past_key_values", "cache_params") if k in params), "past_key_values"): cache}


def forced_gaps(model, prompt_ids, steps) -> list[tuple[float, bool]]:
    """The teacher-forced oracle: one forward of the prompt and every chosen id but the last, without a cache; per
    step, the largest |log p| difference between the engine's candidates' raw probabilities (softmax of its raw
    logits) and that forward's at the step's position, and whether its first candidate is that forward's argmax.
    Run it on the model as it is, outside anything planted in the engine's calls (tests/planted_bugs.py)."""
    import math

    import torch

    ids = list(prompt_ids) + [s.id for s in steps[:-1]]
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, len(prompt_ids) - 1:]
    full = torch.log_softmax(logits.double(), -1)  # [steps, V]
    out = []
    for step, row in zip(steps, full):
        gap = max(abs(math.log(max(c.raw_prob, 1e-300)) - float(row[c.id])) for c in step.candidates)
        out.append((gap, step.candidates[0].id == int(row.argmax())))
    return out


def forced_ok(gaps) -> bool:
    """Every step within FORCED_TOL of the full forward, with its argmax first."""
    return bool(gaps) and all(gap <= FORCED_TOL and top for gap, top in gaps)


def assert_engine_is_the_oracle(model, prompt_ids, steps) -> None:
    """An engine's greedy run (its StepEvents after `prompt_ids`) against the oracles: its ids are `generate`'s,
    which vary (`assert_varies`), and every step's raw log-probabilities are one full forward's (`forced_gaps`)."""
    assert [s.id for s in steps] == generate_ids(model, prompt_ids, len(steps), stop_at_eos=False, vary=True)
    gaps = forced_gaps(model, prompt_ids, steps)
    assert forced_ok(gaps), f"teacher-forced logits off the full forward (gap, top-1 agrees) per step: {gaps}"
