"""A step previewed under other sampler settings (issue 38, 4: core/model/preview.py, `Engine.preview_step`, the
PreviewStep operation), each number against an oracle: the step's scores from one fresh forward of its prefix on a
stock copy of the model (no cache), put through core/steps/select.py's `reference_probs` (transformers' warpers, in
the chain's order). And the run it looks at does not move: a paused run goes on afterwards exactly as an unpaused
one does, and a finished run's held cache still serves a branch. A tiny random-weight Llama (the embedded model's
tokenizer)."""

from __future__ import annotations

import pickle
import threading

import pytest
import torch

from tiny_models import INIT, tiny_model
from tokentui.core.errors import ProtocolError, SettingsError
from tokentui.core.link.operations import ASK, operation_of
from tokentui.core.link.protocol import Previewed, PreviewStep
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.runs.events import BranchEvent, PromptEvent, StepEvent
from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.runs.preview import PreviewRequest, StepPreview
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.core.steps.select import reference_probs

PROMPT = "Is OpenAI open?"
STEPS = 8
RUN = SamplerSettings(temperature=0.8, top_p=0.9, seed=3)
OTHER = SamplerSettings(temperature=1.3, top_k=5, top_p=0.8, seed=3)  # temperature, top-k and top-p all move


@pytest.fixture(scope="module")
def loaded(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer, initializer_range=INIT)
    return LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name="tiny-llama"))


@pytest.fixture(scope="module")
def stock(smol_tokenizer):
    """The same weights (tiny_model is seeded), never given to an Engine (which prepares its weights in place)."""
    return tiny_model("llama", smol_tokenizer, initializer_range=INIT)


def engine_of(loaded, n=STEPS, settings=RUN) -> Engine:
    return Engine(loaded, settings, RunOptions(max_new_tokens=n, ignore_eos=True))


def run(engine):
    events = list(engine.run(PROMPT))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    return tuple(prompt.ids), [e for e in events if isinstance(e, StepEvent)]


def fresh_logits(stock, prefix) -> torch.Tensor:
    """The step's scores from one forward of its whole prefix, no cache: the oracle."""
    with torch.inference_mode():
        return stock(input_ids=torch.tensor([list(prefix)])).logits[0, -1].to(torch.float32)


def assert_is_the_oracle(preview: StepPreview, logits: torch.Tensor, settings) -> None:
    probs = reference_probs(logits, settings)
    raw = torch.softmax(logits, dim=-1)
    assert preview.candidates, "no candidates"
    for c in preview.candidates:
        assert abs(c.prob - float(probs[c.id])) < 1e-5, (c, float(probs[c.id]))
        assert abs(c.raw_prob - float(raw[c.id])) < 1e-5, (c, float(raw[c.id]))
    assert [c.id for c in preview.candidates] == torch.topk(logits, len(preview.candidates)).indices.tolist()
    assert preview.kept_count == int((probs > 0).sum())
    assert preview.pick_prob > 0 and abs(preview.pick_prob - float(probs[preview.pick])) < 1e-5


@pytest.mark.parametrize("at", [0, 3, STEPS - 1])
def test_a_finished_runs_step_under_other_settings_is_the_fresh_forward_through_the_chain(loaded, stock, at):
    engine = engine_of(loaded)
    prompt_ids, steps = run(engine)
    ids = tuple(s.id for s in steps)
    held = engine.held_ids
    preview = engine.preview_step(PreviewRequest(prompt_ids, ids[:at], OTHER))[0]
    assert preview.at == at and preview.settings == OTHER and preview.source == "kv"
    assert_is_the_oracle(preview, fresh_logits(stock, prompt_ids + ids[:at]), OTHER)
    assert engine.held_ids == held  # the held cache is only read


def test_under_the_steps_own_settings_the_preview_is_the_step_as_it_ran(loaded):
    engine = engine_of(loaded)
    prompt_ids, steps = run(engine)
    ids = tuple(s.id for s in steps)
    step = steps[4]
    preview = engine.preview_step(PreviewRequest(prompt_ids, ids[:4], step.settings))[0]
    assert [c.id for c in preview.candidates] == [c.id for c in step.candidates]
    for mine, theirs in zip(preview.candidates, step.candidates):
        assert abs(mine.prob - theirs.prob) < 1e-5 and abs(mine.raw_prob - theirs.raw_prob) < 1e-5
    assert preview.kept_count == step.kept_count


def test_each_cut_candidate_names_the_stage_that_cut_it_and_the_rows_add_up(loaded, stock):
    engine = engine_of(loaded)
    prompt_ids, steps = run(engine)
    ids = tuple(s.id for s in steps)
    settings = SamplerSettings(temperature=1.0, top_k=3, top_p=0.5, seed=1)
    preview = engine.preview_step(PreviewRequest(prompt_ids, ids[:2], settings, top_n=12))[0]
    logits = fresh_logits(stock, prompt_ids + ids[:2])
    order = torch.topk(logits, 12).indices.tolist()
    by_rank = {c.id: order.index(c.id) for c in preview.candidates}
    names = [row.label for row in preview.stages]
    assert "top-k" in names and "top-p" in names
    top_k = next(row for row in preview.stages if row.label == "top-k")
    assert top_k.kept == 3 and top_k.cut == logits.numel() - 3
    for c in preview.candidates:
        if by_rank[c.id] >= 3:
            assert c.prob == 0 and c.cut_by == "top-k", c
        elif c.prob == 0:
            assert c.cut_by == "top-p", c
        else:
            assert c.cut_by is None
    last = preview.stages[-1]
    assert last.kept == preview.kept_count
    assert abs(last.entropy_bits - preview.sampled_entropy_bits) < 1e-4


def test_a_prefix_no_cache_holds_is_prefilled_afresh(loaded, stock):
    engine = engine_of(loaded)
    prompt_ids, steps = run(engine)
    other = tuple(reversed(prompt_ids))  # not what the held cache holds
    preview = engine.preview_step(PreviewRequest(other, (), OTHER))[0]
    assert preview.source == "prefill"
    assert_is_the_oracle(preview, fresh_logits(stock, other), OTHER)


def test_a_paused_run_does_not_move_and_goes_on_as_if_never_previewed(loaded, stock):
    reference = engine_of(loaded, n=12)
    _prompt, expected = run(reference)
    engine = engine_of(loaded, n=12)
    engine.pause()
    seen: list[StepEvent] = []
    prompt_ids: list = []

    def consume():
        for event in engine.run(PROMPT):
            if isinstance(event, PromptEvent):
                prompt_ids.extend(event.ids)
            if isinstance(event, StepEvent):
                seen.append(event)

    thread = threading.Thread(target=consume)
    thread.start()
    for _ in range(5):  # the gate before prefill, then four more: steps 1-5 come, and the run waits after step 5
        engine.step_once()
    deadline = 100
    while len(seen) < 5 and deadline:
        threading.Event().wait(0.05)
        deadline -= 1
    threading.Event().wait(0.2)
    assert len(seen) == 5, len(seen)
    ids = tuple(s.id for s in seen)
    for at in (4, 2):  # the step the run waits after, and one before it
        for _try in range(40):  # it reaches its gate a moment after its step's event
            try:
                preview = engine.preview_step(PreviewRequest(tuple(prompt_ids), ids[:at], OTHER))[0]
                break
            except SettingsError:
                threading.Event().wait(0.05)
        assert preview.source == "kv"
        assert_is_the_oracle(preview, fresh_logits(stock, tuple(prompt_ids) + ids[:at]), OTHER)
    assert len(seen) == 5  # nothing advanced
    engine.resume()
    thread.join(timeout=30)
    assert [s.id for s in seen] == [s.id for s in expected]
    for mine, theirs in zip(seen, expected):
        assert [c.prob for c in mine.candidates] == pytest.approx([c.prob for c in theirs.candidates], abs=1e-6)


def test_the_held_cache_still_serves_a_branch_after_previews(loaded):
    engine = engine_of(loaded)
    prompt_ids, steps = run(engine)
    ids = tuple(s.id for s in steps)
    engine.preview_step(PreviewRequest(prompt_ids, ids[:3], OTHER))
    point = BranchPoint(prompt_ids, ids[:3], 3, steps[3].candidates[1].id)
    branch = next(e for e in engine.branch(point) if isinstance(e, BranchEvent))
    assert branch.kv_reused_tokens == len(prompt_ids) + 2


def test_the_operation_is_declared_as_a_question_and_its_messages_are_checked():
    op = operation_of(PreviewStep(1, PreviewRequest((1, 2), (3,), OTHER)))
    assert op.kind is ASK and op.method == "preview_step" and op.answer is Previewed
    with pytest.raises(ProtocolError):
        PreviewStep(1, "not a request")
    with pytest.raises(SettingsError, match="no ids"):
        PreviewRequest((), (), OTHER)
    with pytest.raises(SettingsError, match="top-n"):
        PreviewRequest((1,), (), OTHER, top_n=0)
    answer = Previewed(2, error="the model is generating: pause (space) to preview a step")
    with pytest.raises(SettingsError, match="generating"):
        answer.result()
    message = PreviewStep(7, PreviewRequest((1, 2), (3, 4), OTHER, top_n=4))
    assert pickle.loads(pickle.dumps(message)) == message  # what crosses the process boundary


def test_a_preview_with_xtc_rolls_as_a_run_does_and_shows_the_chain_its_pick_was_drawn_from(loaded):
    """XTC fires on a roll: the preview takes the roll a run's first step with the settings' seed takes (before
    the per-id noise), shows XTC cutting only when it fires, and picks the token that run picks."""
    fired = set()
    for seed in range(1, 9):
        settings = SamplerSettings(temperature=1.5, top_k=5, xtc_probability=0.5, xtc_threshold=0.1, seed=seed)
        engine = engine_of(loaded, n=1, settings=settings)
        prompt_ids, steps = run(engine)
        preview = engine.preview_step(PreviewRequest(prompt_ids, (), settings))[0]
        roll = float(torch.rand(1, generator=torch.Generator().manual_seed(seed)))
        xtc = next(row for row in preview.stages if row.stage == "xtc")
        assert (xtc.cut > 0) == (roll < 0.5), (seed, roll, xtc)
        fired.add(xtc.cut > 0)
        assert preview.pick == steps[0].id, seed  # the run's own first draw
        assert preview.pick_prob > 0  # drawn from the distribution shown
    assert fired == {True, False}  # both cases were seen (the test can fail either way)
