"""Issue 38's sampler stages against transformers' logits processors, where transformers has one.

Each stage alone (temperature 1, the other stages off) on random float32 logits and on the embedded model's real
logits: the whole-vocabulary reference (core/steps/stages.py `chain`) and step 4's selection (core/steps/select.py,
whichever path it takes) give the distribution of TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
MinPLogitsWarper, TypicalLogitsWarper, RepetitionPenaltyLogitsProcessor (over llama.cpp's look-back window) and
SequenceBiasLogitsProcessor (single-token biases), to 1e-6. The stages transformers lacks are held to llama.cpp's
own code in test_sampler_stages_llama.py; flags, records, served names and runs in test_sampler_stages_run.py.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from tokentui.core.samplers import STAGES, ChainInput, chain_order
from tokentui.core.settings import SamplerSettings
from tokentui.core.steps.select import reference_probs, select
from tokentui.core.steps.stages import chain, cut_by

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # a descheduled 2nd thread stalls O(V) ops

TOL = 1e-6
N = 12
HISTORY = [5, 17, 17, 230, 5, 999, 17, 4242, 5, 88, 2, 17]  # a run's tokens so far: repeats of 5 and 17
PLAIN = dict(temperature=1.0, top_p=1.0)  # every cut off, temperature 1: one stage at a time


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _cases(history: list[int], vocab: int):
    """(stage name, settings with that stage alone, transformers' processor of [1, V] scores)."""
    window = torch.tensor([history[-8:]])  # repeat-last-n 8: the penalties look at the last 8 tokens only
    bias = [(3, 2.5), (history[0], -4.0), (vocab - 1, 7.0)]
    return [
        ("temperature", SamplerSettings(temperature=0.6, top_p=1.0),
         lambda s: TemperatureLogitsWarper(0.6)(None, s)),
        ("top_k", SamplerSettings(top_k=25, **PLAIN), lambda s: TopKLogitsWarper(25)(None, s)),
        ("top_p", SamplerSettings(temperature=1.0, top_p=0.7), lambda s: TopPLogitsWarper(0.7)(None, s)),
        ("min_p", SamplerSettings(min_p=0.08, **PLAIN), lambda s: MinPLogitsWarper(0.08)(None, s)),
        ("typ_p", SamplerSettings(typical_p=0.6, **PLAIN), lambda s: TypicalLogitsWarper(0.6)(None, s)),
        ("penalties", SamplerSettings(repeat_penalty=1.8, repeat_last_n=8, **PLAIN),
         lambda s: RepetitionPenaltyLogitsProcessor(1.8)(window, s)),
        ("logit_bias", SamplerSettings(logit_bias=bias, **PLAIN),
         lambda s: SequenceBiasLogitsProcessor([[[t], b] for t, b in bias])(torch.tensor([[0]]), s)),
    ]


def _check_stage(x: torch.Tensor, history: list[int], seed: int) -> None:
    given = ChainInput(ids=history)
    for name, settings, processor in _cases(history, x.numel()):
        assert {s.name for s in chain_order(settings)} == {"temperature", name}  # temperature 1 changes nothing
        want = torch.softmax(processor(x[None].clone()), dim=-1)[0]
        probs, cuts = chain(x, settings, given=given)
        torch.testing.assert_close(probs, want, atol=TOL, rtol=0, msg=name)
        assert next(c for c in cuts if c.stage == name).left == int((want > 0).sum())
        for native in (None, False):  # the default backend and the torch one
            sel = select(x, settings, _gen(seed), N, native=native, given=given)
            assert sel.kept_count == int((want > 0).sum()), name
            # the fast paths renormalise a prefix (or run in C++, with a float64 normaliser): float32's rounding,
            # relative; torch's own float32 softmax of a 49,152-entry row (the oracle's) is off by up to ~1.3e-5 of
            # each probability on the embedded model's biased scores, against float64
            torch.testing.assert_close(torch.tensor(sel.top_sampled_probs), want[sel.top_ids], atol=TOL, rtol=3e-5,
                                       msg=name)
            assert want[sel.token_id] > 0
            assert abs(sel.chosen_prob - float(want[sel.token_id])) <= TOL + 3e-5 * float(want[sel.token_id])


@pytest.mark.parametrize("vocab", [3_000, 49_152])
def test_each_stage_alone_is_its_transformers_processor_on_random_logits(vocab):
    for seed in range(3 if vocab < 10_000 else 1):
        x = torch.randn(vocab, generator=_gen(seed)) * (1.5 + seed)
        _check_stage(x, HISTORY, seed)


@pytest.fixture(scope="module")
def real(embedded_stock):
    """Two positions of the embedded model's scores on a real prompt, with the prompt's ids as the history."""
    model, tokenizer = embedded_stock.model, embedded_stock.tokenizer
    ids = tokenizer.encode("The cat sat on the mat. The cat sat on the")
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, -2:].float()
    return ids, logits


def test_each_stage_alone_is_its_transformers_processor_on_the_embedded_models_logits(real):
    ids, logits = real
    for row, x in enumerate(logits):
        _check_stage(x, ids[: len(ids) - 1 + row], row)  # the tokens before that position


def test_every_stage_the_registry_names_with_a_transformers_processor_is_tested_here():
    assert {s.name for s in STAGES if s.oracle} == {name for name, _, _ in _cases(HISTORY, 10)}


def test_the_stages_compose_in_the_order_the_setting_gives():
    """Two cuts in both orders: the chain is their processors in that order, and each candidate's cut is said by
    the stage that took it out."""
    x = torch.randn(5_000, generator=_gen(9)) * 3
    for order, steps in (("top_k;typ_p", (TopKLogitsWarper(40), TypicalLogitsWarper(0.5))),
                         ("typ_p;top_k", (TypicalLogitsWarper(0.5), TopKLogitsWarper(40)))):
        settings = SamplerSettings(top_k=40, typical_p=0.5, samplers=f"temperature;{order}", **PLAIN)
        scores = x[None].clone()
        masks = []
        for step in steps:
            after = step(None, scores)
            masks.append(torch.isinf(after[0]) & ~torch.isinf(scores[0]))
            scores = after
        probs, cuts = chain(x, settings)
        torch.testing.assert_close(probs, torch.softmax(scores, -1)[0], atol=TOL, rtol=0)
        assert [c.stage for c in cuts] == ["temperature"] + order.split(";")
        for i in range(0, 5_000, 97):
            expected = next((name for name, m in zip(order.split(";"), masks) if m[i]), None)
            assert cut_by(cuts, i) == expected
        kept = (probs > 0).nonzero()[:, 0]
        sel = select(x, settings, _gen(1), N)
        assert sel.kept_count == kept.numel() and sel.token_id in kept.tolist()


def test_greedy_applies_the_logits_processors_but_no_warper():
    """As generate(do_sample=False) and llama.cpp at temperature 0: the bias and the penalties move the argmax;
    top-k and the other warpers do not run."""
    x = torch.randn(2_000, generator=_gen(4))
    top = int(x.argmax())
    settings = SamplerSettings(temperature=0.0, top_k=1, logit_bias=[(7, 100.0)])
    assert [s.name for s in chain_order(settings)] == ["logit_bias"]
    assert int(reference_probs(x, settings).argmax()) == 7 == select(x, settings, None, N).token_id
    penalised = SamplerSettings(temperature=0.0, repeat_penalty=1e6, presence_penalty=50.0)
    sel = select(x, penalised, None, N, given=ChainInput(ids=[top]))
    assert sel.token_id != top and sel.token_id == int(x.clone().index_fill_(0, torch.tensor([top]), -1e9).argmax())
    assert select(x, SamplerSettings(temperature=0.0), None, N).token_id == top  # no history: the plain argmax
