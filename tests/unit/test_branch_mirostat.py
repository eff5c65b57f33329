"""A branch made from a run's steps (BranchPoint.of_run: the dashboard's `b`, the runs list, fan-out's adopt)
continues Mirostat 2.0's state the parent had at the branch point (issue 38, 5: branch uses the chain), so the step
after the forced one is drawn from the parent's truncation; without the state it would restart from 2 * tau."""

from __future__ import annotations

import pytest
import torch

from tiny_models import tiny_model
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.runs.events import PromptEvent, StepEvent
from tokentui.core.runs.run import Run
from tokentui.core.samplers import mirostat_mu
from tokentui.core.settings import RunOptions, SamplerSettings

MIROSTAT = SamplerSettings(temperature=1.0, mirostat=2, mirostat_tau=2.0, mirostat_eta=0.5, seed=1)


@pytest.fixture(scope="module")
def tiny(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer, initializer_range=0.2)
    return LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name="tiny-llama"))


def _events(loaded, settings, n, point=None):
    engine = Engine(loaded, settings, RunOptions(max_new_tokens=n, ignore_eos=True, top_candidates=20))
    return list(engine.branch(point) if point is not None else engine.run("Say it again and again."))


def test_a_branch_made_from_the_run_carries_mirostats_state_and_draws_as_the_parent_did(tiny):
    events = _events(tiny, MIROSTAT, 10)
    run = Run()
    for event in events:
        run.apply(event)
    steps = [e for e in events if isinstance(e, StepEvent)]
    at = 6
    point = BranchPoint.of_run(run, at, steps[at].id)
    want = mirostat_mu([(s.settings, s.chosen_prob) for s in steps[:at]])
    assert want is not None and point.mirostat_mu == pytest.approx(want)
    branched = [e for e in _events(tiny, MIROSTAT, 4, point) if isinstance(e, StepEvent)]
    after = next(s for s in branched if s.index == at + 1)
    parent = steps[at + 1]
    assert [c.id for c in after.candidates] == [c.id for c in parent.candidates]
    torch.testing.assert_close(torch.tensor([c.prob for c in after.candidates]),
                               torch.tensor([c.prob for c in parent.candidates]), atol=1e-5, rtol=0)
    assert BranchPoint.of_run(run, at, steps[at].id, mirostat_mu=None).mirostat_mu is None  # a caller's own says


def test_without_mirostat_a_branch_point_has_no_state(tiny):
    events = _events(tiny, SamplerSettings(temperature=0.8, seed=2), 5)
    run = Run()
    for event in events:
        run.apply(event)
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    point = BranchPoint.of_run(run, 3, 7)
    assert point.mirostat_mu is None and point.prompt_ids == tuple(prompt.ids)
