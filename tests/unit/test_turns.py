"""A follow-up turn and a raw run on the local engine (issue 40, 13: core/runs/turns.py, core/model/turn.py), each
number against an oracle: the follow-up's prompt ids are transformers' `apply_chat_template` over the whole
conversation, the reused count is the common prefix with the ids the first turn's cache held, the greedy answer is
`generate`'s on the whole conversation (and every step's raw probabilities one full forward's), the KV cache after
the turn holds what the KV formula gives for its length, a raw run's ids are `tokenizer(text)`'s. Tiny random-weight
Llama / Qwen2 models with the embedded model's tokenizer (a real chat template), loaded once per module."""

from __future__ import annotations

import pytest

from tiny_models import assert_engine_is_the_oracle, tiny_model
from tokentui.core.errors import PromptError
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.runs.run import Run
from tokentui.core.runs.turns import Message, TurnEvent, TurnRequest, common_prefix, follow_up, reuse_line
from tokentui.core.settings import RunOptions, SamplerSettings

PROMPT = "Is OpenAI open?"
AGAIN = "And is Anthropic?"
N = 8


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, smol_tokenizer):
    model = tiny_model(request.param, smol_tokenizer, initializer_range=0.2)
    return LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name=f"tiny-{request.param}"))


def greedy(loaded, n=N) -> Engine:
    return Engine(loaded, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=n, ignore_eos=True))


def folded(events) -> Run:
    run = Run()
    for event in events:
        run.apply(event)
    return run


def template_ids(tokenizer, messages) -> list[int]:
    """transformers' own ids of a conversation with the generation prompt (the oracle of a follow-up's prompt)."""
    out = tokenizer.apply_chat_template([{"role": m.role, "content": m.content} for m in messages],
                                        add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.fixture(scope="module")
def two_turns(tiny):
    """A first run, then a follow-up on the same engine: (engine, the first run, the follow-up's request, its run)."""
    engine = greedy(tiny)
    first = folded(engine.run(PROMPT))
    request = follow_up(first, AGAIN, parent="first.jsonl")
    second = folded(engine.turn(request))
    return engine, first, request, second


def test_the_follow_ups_prompt_is_the_chat_template_over_the_whole_conversation(two_turns, smol_tokenizer):
    _, first, request, second = two_turns
    roles = [m.role for m in request.messages]
    assert roles == ["user", "assistant", "user"] and request.turn == 2
    assert request.messages[1].content == first.done.text and request.messages[1].ended == first.done.reason
    assert second.prompt.ids == template_ids(smol_tokenizer, request.messages)
    assert second.turn.messages == list(request.messages) and second.turn.parent == "first.jsonl"
    assert second.prompt.user_prompt == AGAIN


def test_the_reused_positions_are_the_common_prefix_with_what_the_first_turn_cached(two_turns):
    _, first, _, second = two_turns
    held = first.prompt.ids + [s.id for s in first][:-1]  # the last answer token was never fed
    shared = common_prefix(held, second.prompt.ids)
    assert shared >= len(first.prompt.ids)  # at least the whole first prompt: its template renders it the same
    assert second.turn.reused_tokens == shared == second.prefill.reused_tokens
    assert second.prefill.tokens == len(second.prompt.ids) - shared  # only the ids past it are computed
    assert second.prefill.kv_tokens == len(second.prompt.ids)
    assert second.turn.reused_kv_bytes > 0


def test_the_follow_ups_answer_is_generate_on_the_whole_conversation(two_turns, tiny):
    _, _, _, second = two_turns
    assert len(second) == N
    assert_engine_is_the_oracle(tiny.model, second.prompt.ids, list(second))


def test_the_kv_cache_after_the_turn_holds_the_formula_for_its_length(two_turns, tiny):
    _, _, _, second = two_turns
    config = tiny.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4  # keys + values, float32
    done = second.done
    assert done.kv_tokens == len(second.prompt.ids) + N - 1  # the last token is not fed
    assert done.kv_bytes == per_token * done.kv_tokens
    assert second.turn.reused_kv_bytes == per_token * second.turn.reused_tokens


def test_a_third_turn_reuses_the_second_and_its_history_holds_every_answer(two_turns, smol_tokenizer):
    engine, first, _, second = two_turns
    third_request = follow_up(second, "Why?")
    assert [m.role for m in third_request.messages] == ["user", "assistant", "user", "assistant", "user"]
    third = folded(engine.turn(third_request))
    held = second.prompt.ids + [s.id for s in second][:-1]
    assert third.turn.turn == 3 and third.turn.reused_tokens == common_prefix(held, third.prompt.ids) > 0
    assert third.prompt.ids == template_ids(smol_tokenizer, third_request.messages)
    assert third.turn.turn_starts[0] == 0 and len(third.turn.turn_starts) == 3
    assert third.turn.turn_starts == sorted(third.turn.turn_starts)
    # the line the dashboard and headless mode show, from the events alone
    line = reuse_line(third.turn, third.prefill)
    assert f"prefill {third.prefill.tokens} new tokens · {third.turn.reused_tokens} reused from turn 2 (KV " in line


def test_a_fresh_engine_prefills_the_whole_conversation(tiny, two_turns):
    _, _, request, second = two_turns
    fresh = folded(greedy(tiny).turn(request))  # no cache held: nothing to reuse, the same prompt and answer
    assert fresh.turn.reused_tokens == 0 and fresh.prefill.tokens == len(fresh.prompt.ids)
    assert fresh.prompt.ids == second.prompt.ids and [s.id for s in fresh] == [s.id for s in second]
    assert "nothing reused from turn 1" in reuse_line(fresh.turn, fresh.prefill)


def test_a_raw_run_tokenizes_the_text_as_is(tiny, smol_tokenizer):
    text = "The capital of France is"
    run = folded(greedy(tiny, 4).turn(TurnRequest.first(text, raw=True)))
    assert run.prompt.ids == smol_tokenizer(text)["input_ids"] and not run.prompt.templated
    assert run.prompt.text == text and run.turn.raw and run.turn.turn == 1
    # llama.cpp's /completion adds the model's BOS to a text prompt where its tokenizer does; SmolLM2's adds none:
    # its raw ids are the text's alone, no <|im_start|> or <|endoftext|> in front
    assert smol_tokenizer.bos_token_id not in run.prompt.ids[:1] and not any(p.special for p in run.prompt.pieces)
    assert any("raw: no chat template" in n.message for n in run.notices)
    assert reuse_line(run.turn, run.prefill) == f"raw: no chat template · prefill {len(run.prompt.ids)} tokens"


def test_a_raw_follow_up_goes_on_with_the_document(tiny, smol_tokenizer):
    engine = greedy(tiny, 4)
    first = folded(engine.turn(TurnRequest.first("Once upon a time", raw=True)))
    request = follow_up(first, " Then")
    assert request.raw
    second = folded(engine.turn(request))
    document = "Once upon a time" + first.done.text + " Then"
    assert second.prompt.text == document and second.prompt.ids == smol_tokenizer(document)["input_ids"]
    assert second.turn.reused_tokens == common_prefix(first.prompt.ids + [s.id for s in first][:-1],
                                                      second.prompt.ids) > 0


def test_a_follow_up_before_any_answer_or_an_empty_one_is_one_line():
    empty = Run()
    with pytest.raises(PromptError, match="no answer yet"):
        follow_up(empty, "more?")
    with pytest.raises(PromptError, match="the follow-up is empty"):
        TurnRequest((Message("user", "hi"), Message("assistant", "hello"), Message("user", "  ")))
    with pytest.raises(PromptError, match="take turns"):
        TurnRequest((Message("user", "hi"), Message("user", "again")))


def test_a_stopped_turn_keeps_the_cut_back_cache_for_the_next_try(tiny, two_turns):
    _, _, request, second = two_turns
    engine = greedy(tiny)
    folded(engine.run(PROMPT))
    events = engine.turn(request)  # its run id is taken now...
    engine.stop()  # ...and stopped: it stops at the gate before prefill, nothing runs
    stopped = folded(events)
    assert stopped.done.reason == "stopped" and len(stopped) == 0 and stopped.prefill is None
    again = folded(engine.turn(request))
    assert again.turn.reused_tokens == second.turn.reused_tokens  # the held cache, cut back, served the retry
    assert [s.id for s in again] == [s.id for s in second]


def test_the_turn_event_and_its_conversation_are_checked_where_built():
    with pytest.raises(ValueError):
        TurnEvent(turn=0, messages=[])
    with pytest.raises(ValueError):
        Message("robot", "x")
    with pytest.raises(ValueError):
        Message("user", "x", ended="eos")  # only an answer says how it ended


def test_a_follow_up_shows_the_attention_over_the_whole_conversation(tiny, two_turns):
    """The attention hook (issue 39) on a follow-up's steps, as on a run's: the first step's query is the
    conversation's last prompt position (positions count from turn 1's first token, the reused ones included), and
    its top sources reach back into the reused turn."""
    _, _, request, _ = two_turns
    engine = Engine(tiny, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=2, ignore_eos=True,
                                                                       attention=True))
    first = folded(engine.run(PROMPT))  # 2 tokens: the cache holds the prompt and the first one
    run = folded(engine.turn(request))
    held = first.prompt.ids + [s.id for s in first][:-1]
    assert run.turn.reused_tokens == common_prefix(held, run.prompt.ids) == len(first.prompt.ids) + 1
    rows = run[0].attention
    assert rows and all(row.query == len(run.prompt.ids) - 1 for row in rows)
    assert [row.query for row in run[1].attention] == [len(run.prompt.ids)] * len(rows)
    assert any(pos < run.turn.reused_tokens for row in rows for pos, _ in row.top)


# A ChatML template that, as Qwen3's does, drops an earlier answer's <think> block when it renders the history
THINK_DROPPING = (
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_template_that_renders_the_history_differently_reuses_only_the_true_common_prefix(tiny, smol_tokenizer):
    """Where the template re-renders an earlier answer differently (its <think> block dropped), the ids past the
    first prompt differ from what the cache holds: only the common prefix is reused, as the ids say, not the turn."""
    import copy

    from tokentui.core.runs.requests import ScoreRequest

    tokenizer = copy.deepcopy(smol_tokenizer)
    tokenizer.chat_template = THINK_DROPPING
    loaded = LoadedModel(tiny.model, tokenizer, model_facts(tiny.model, tokenizer, name="tiny-think"))
    engine = greedy(loaded, 4)
    answer = "<think>It is a company.</think>No."
    scored = folded(engine.score(ScoreRequest(PROMPT, answer)))  # the answer with its think block, in the cache
    held = scored.prompt.ids + scored.score.ids[:-1]
    request = TurnRequest((Message("user", PROMPT), Message("assistant", answer), Message("user", AGAIN)))
    turn = folded(engine.turn(request))
    assert "<think>" not in turn.prompt.text and turn.prompt.ids == template_ids(tokenizer, request.messages)
    shared = common_prefix(held, turn.prompt.ids)
    assert turn.turn.reused_tokens == shared < len(held)  # shorter than the turn: the truth, not a fault
    assert shared >= len(scored.prompt.ids)
