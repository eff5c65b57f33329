"""The engine on the real embedded model, each number against an oracle: transformers' generate, the HF
warpers on an independent forward pass, the cache tensors, the tokenizer's one-shot decode."""

from __future__ import annotations

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from tiny_models import cache_kwargs, generate_ids
from tokentui.core.model.engine import Engine
from tokentui.core.runs.events import DoneEvent, PrefillEvent, PromptEvent, StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings

PROMPT = "Is OpenAI open?"


def run_all(engine, prompt=PROMPT, system=None):
    events = list(engine.run(prompt, system))
    steps = [e for e in events if isinstance(e, StepEvent)]
    return events, steps


def test_greedy_128_tokens_identical_to_generate(embedded, embedded_stock):
    engine = Engine(embedded, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=128))
    events, steps = run_all(engine)
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    ours = [s.id for s in steps]
    theirs = generate_ids(embedded_stock.model, prompt.ids, 128)  # the model as transformers loads it
    assert len(ours) >= 20  # a real answer, not an immediate stop
    assert ours == theirs[: len(ours)]
    if len(ours) < 128:
        assert ours[-1] in engine.end_ids and theirs == ours
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.tokens == done.runs == len(ours)
    assert done.scores == len(ours) * embedded.facts.vocab_rows == len(ours) * 49152


def test_greedy_ignore_eos_runs_exactly_max_new_tokens(embedded):
    engine = Engine(embedded, SamplerSettings(greedy=True), RunOptions(max_new_tokens=40, ignore_eos=True))
    events, steps = run_all(engine, "Say hi.")
    assert len(steps) == 40 and events[-1].reason == "length"


def test_cached_model_gives_identical_ids_to_the_gguf_conversion(embedded_cold, embedded):
    cold, stages = embedded_cold
    assert any("de-quantizing" in s.stage and s.fraction == 1.0 for s in stages)
    assert embedded.facts.load_seconds < cold.facts.load_seconds
    a = [s.id for s in run_all(Engine(cold, SamplerSettings(temperature=0), RunOptions(max_new_tokens=48)))[1]]
    b = [s.id for s in run_all(Engine(embedded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=48)))[1]]
    assert a == b
    for p, q in zip(cold.model.state_dict().values(), embedded.model.state_dict().values()):
        assert torch.equal(p, q)


def test_prompt_is_the_chat_template_and_its_tokens(embedded, smol_tokenizer):
    tok = smol_tokenizer  # transformers' tokenizer, the oracle (the engine's may be a FileTokenizer)
    engine = Engine(embedded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=1))
    events, _ = run_all(engine, PROMPT, "Be brief.")
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    assert prompt.text == tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt.ids == tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert prompt.text.endswith("<|im_start|>assistant\n")
    pieces = {p.piece: p for p in prompt.pieces}
    assert "␣Open" in pieces and pieces["<|im_start|>"].special and not pieces["␣Open"].special
    assert [p.id for p in prompt.pieces] == prompt.ids


def warped_probs(logits, s: SamplerSettings):
    scores = logits.float()[None]
    scores = TemperatureLogitsWarper(s.temperature)(None, scores)
    if s.top_k:
        scores = TopKLogitsWarper(s.top_k)(None, scores)
    if s.top_p < 1:
        scores = TopPLogitsWarper(s.top_p)(None, scores)
    return torch.softmax(scores, -1)[0]


def test_step_probabilities_match_hf_warpers_on_an_independent_forward(embedded):
    settings = SamplerSettings(temperature=0.8, top_k=40, top_p=0.9, seed=7)
    engine = Engine(embedded, settings, RunOptions(max_new_tokens=6, top_candidates=10))
    events, steps = run_all(engine)
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    seq = list(prompt.ids)
    for step in steps:
        with torch.inference_mode():  # no cache, whole sequence: an independent path to the same scores
            logits = embedded.model(torch.tensor([seq])).logits[0, -1]
        raw = torch.softmax(logits.float(), -1)
        post = warped_probs(logits, settings)
        for cand in step.candidates:
            assert cand.raw_prob == pytest.approx(raw[cand.id].item(), abs=2e-4)
            assert cand.prob == pytest.approx(post[cand.id].item(), abs=2e-4)
        assert [c.id for c in step.candidates] == torch.topk(logits, 10).indices.tolist()
        assert step.chosen_prob > 0  # never picks a token the sampler cut
        seq.append(step.id)


def test_seeded_sampling_is_reproducible(embedded):
    settings = SamplerSettings(temperature=1.2, top_p=0.95, seed=1234)
    a = [s.id for s in run_all(Engine(embedded, settings, RunOptions(max_new_tokens=24)))[1]]
    b = [s.id for s in run_all(Engine(embedded, settings, RunOptions(max_new_tokens=24)))[1]]
    c = [s.id for s in run_all(Engine(embedded, settings.with_changes(seed=99), RunOptions(max_new_tokens=24)))[1]]
    assert a == b and a != c


def test_kv_bytes_equal_tensor_nbytes_and_the_formula(embedded):
    facts = embedded.facts
    engine = Engine(embedded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=5))
    events, steps = run_all(engine)
    prefill = next(e for e in events if isinstance(e, PrefillEvent))
    layers, kv_heads, head_dim = 30, 3, 64  # SmolLM2-135M, read independently from the GGUF's config below
    cfg = embedded.model.config
    assert (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim) == (layers, kv_heads, head_dim)
    per_token = 2 * layers * kv_heads * head_dim * 4
    assert facts.kv_bytes_per_token == per_token
    assert prefill.kv_tokens == prefill.tokens and prefill.kv_bytes == per_token * prefill.tokens
    for step in steps:
        assert step.kv_tokens == prefill.tokens + step.index
        assert step.kv_bytes == per_token * step.kv_tokens
    # and the tensors themselves, through transformers' own cache object
    from transformers import DynamicCache

    cache = DynamicCache(config=cfg)
    with torch.inference_mode():
        embedded.model(torch.tensor([next(e for e in events if isinstance(e, PromptEvent)).ids]),
                       use_cache=True, **cache_kwargs(embedded.model, cache))
    nbytes = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert nbytes == prefill.kv_bytes


def test_streamed_text_equals_one_shot_decode(embedded, smol_tokenizer):
    engine = Engine(embedded, SamplerSettings(temperature=1.0, top_p=0.98, seed=3),
                    RunOptions(max_new_tokens=80))
    events, steps = run_all(engine, "Write one sentence in Chinese about the moon, then one with emoji.")
    streamed = "".join(s.text for s in steps)
    ids = [s.id for s in steps]
    oneshot = smol_tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert streamed == oneshot == events[-1].text
    assert all("\ufffd" not in s.text for s in steps[:-1])


def test_facts_read_off_the_model(embedded):
    f = embedded.facts
    assert f.parameters == sum(p.numel() for p in embedded.model.parameters())
    assert 130e6 < f.parameters < 140e6
    assert (f.layers, f.hidden_size, f.vocab_rows, f.max_context) == (30, 576, 49152, 8192)
    assert f.device == "cpu" and f.dtype == "float32" and f.chat_template and f.source == "embedded"
