"""The logit lens turned on or off mid-run (a dashboard toggle sets `engine.options`): the engine reads
`options.logit_lens` before each forward, so the lens shows from the next step and stops likewise; a model without
lens support says so once per run, when the lens is first wanted. Tiny random-weight models: what is checked is the
loop's behaviour (the lens rows themselves are checked against oracles in tests/unit/test_lens.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tiny_models import tiny_gpt2, tiny_model
from tokentui.core.model.branch import BranchPoint
from tokentui.core.model.engine import Engine
from tokentui.core.runs.events import Notice, PromptEvent, StepEvent
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.settings import RunOptions, SamplerSettings

GREEDY = SamplerSettings(temperature=0.0)


def engine_for(model, tokenizer, **options) -> Engine:
    loaded = LoadedModel(model=model, tokenizer=tokenizer, facts=model_facts(model, tokenizer, name="tiny"))
    return Engine(loaded, GREEDY, RunOptions(**{"ignore_eos": True, "max_new_tokens": 8, **options}))


def toggled(engine: Engine, events, flips: dict[int, bool]) -> list:
    """Every event of `events`; after the step with index k in `flips`, the lens is set to flips[k]."""
    out = []
    for event in events:
        out.append(event)
        if isinstance(event, StepEvent) and event.index in flips:
            engine.options = replace(engine.options, logit_lens=flips[event.index])
    return out


def steps_of(events) -> list[StepEvent]:
    return [e for e in events if isinstance(e, StepEvent)]


@pytest.fixture(scope="module")
def llama(smol_tokenizer):
    return tiny_model("llama", smol_tokenizer)


def test_the_lens_follows_the_options_from_the_next_step(llama, smol_tokenizer):
    engine = engine_for(llama, smol_tokenizer)
    plain = [s.id for s in steps_of(engine.run("Is OpenAI open?"))]
    events = toggled(engine, engine.run("Is OpenAI open?"), {2: True, 5: False})
    steps = steps_of(events)
    assert [s.lens is not None for s in steps] == [False] * 3 + [True] * 3 + [False] * 2
    layers = llama.config.num_hidden_layers
    assert all([row.layer for row in s.lens] == list(range(1, layers + 1)) for s in steps[3:6])
    assert all(s.lens[-1].id == s.candidates[0].id for s in steps[3:6])  # the last row is the model's own output
    assert [s.id for s in steps] == plain  # the lens changes what is reported, not what is generated
    assert not any(isinstance(e, Notice) for e in events)


def test_turned_on_before_a_run_it_covers_the_first_step_and_off_mid_run_it_stops(llama, smol_tokenizer):
    engine = engine_for(llama, smol_tokenizer, logit_lens=True)
    steps = steps_of(toggled(engine, engine.run("Hi"), {0: False}))
    assert [s.lens is not None for s in steps] == [True] + [False] * 7


def test_a_branch_follows_the_toggle_too(llama, smol_tokenizer):
    engine = engine_for(llama, smol_tokenizer)
    events = list(engine.run("Is OpenAI open?"))
    prompt_ids = next(e for e in events if isinstance(e, PromptEvent)).ids
    parent = steps_of(events)
    point = BranchPoint(tuple(prompt_ids), tuple(s.id for s in parent[:3]), 3, parent[3].candidates[1].id)
    steps = steps_of(toggled(engine, engine.branch(point), {4: True}))
    assert [s.index for s in steps] == list(range(3, 11))
    assert [s.lens is not None for s in steps] == [False, False] + [True] * 6


def test_an_unsupported_model_says_so_once_when_the_lens_is_first_wanted(smol_tokenizer):
    model = tiny_gpt2(smol_tokenizer)
    model.get_output_embeddings = lambda: None  # an LM head the lens cannot call (GPT-2 itself is supported)
    engine = engine_for(model, smol_tokenizer)
    events = toggled(engine, engine.run("Hi"), {1: True, 3: False, 4: True})
    notices = [e for e in events if isinstance(e, Notice)]
    assert len(notices) == 1 and "GPT2LMHeadModel" in notices[0].message and "\n" not in notices[0].message
    step_1 = next(e for e in events if isinstance(e, StepEvent) and e.index == 1)
    assert events.index(notices[0]) == events.index(step_1) + 1  # said when first wanted, before the next step
    assert all(s.lens is None for s in steps_of(events)) and len(steps_of(events)) == 8
    # the next run says it again (once), at its start, as before
    again = list(engine.run("Hi"))
    assert [type(e) for e in again].count(Notice) == 1
    assert again.index(next(e for e in again if isinstance(e, Notice))) < again.index(
        next(e for e in again if isinstance(e, PromptEvent)))
