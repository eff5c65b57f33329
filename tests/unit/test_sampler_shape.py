"""The sampler's shape at a step (issue 16): `Selection.temp_entropy_bits`, `top_k_kept` and `top_p_kept` against
oracles, never against themselves: transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper
applied in generate's order (the kept counts are the entries they leave above -inf) and a float64 entropy of
softmax(logits / T), on random scores and on the embedded model's real logits."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from tokentui.core.steps.select import select
from tokentui.core.settings import SamplerSettings

GRID = list(itertools.product([0.1, 0.7, 1.0, 1.5], [0, 1, 5, 50], [0.05, 0.5, 0.9, 1.0]))


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def warped(x: torch.Tensor, s: SamplerSettings) -> tuple[torch.Tensor, int | None, int | None]:
    """(the scores after temperature, in float32 as generate has them; the entries top-k leaves; the entries left
    after top-k then top-p), with the warpers themselves. The cuts run in float64 after the float32 temperature,
    the same rules without float32's cumsum error over a long vocabulary (which `select` avoids too)."""
    scaled = TemperatureLogitsWarper(s.temperature)(None, x.reshape(1, -1).float())
    scores, k_kept, p_kept = scaled.double(), None, None
    if s.top_k:
        scores = TopKLogitsWarper(s.top_k)(None, scores)
        k_kept = int(torch.isfinite(scores).sum())
    if s.top_p < 1.0:
        scores = TopPLogitsWarper(s.top_p)(None, scores)
        p_kept = int(torch.isfinite(scores).sum())
    return scaled[0], k_kept, p_kept


def entropy_bits(scores: torch.Tensor) -> float:
    p = torch.softmax(scores.double(), dim=-1)
    p = p[p > 0]
    return float(-(p * torch.log2(p)).sum())


def on_the_edge(scaled: torch.Tensor, s: SamplerSettings, ours: int, theirs: int) -> bool:
    """Two top-p counts that differ only by rounding: every disputed entry has a preceding mass within float error
    of top_p (top-p keeps an entry iff the mass ranked above it is < top_p)."""
    scores = scaled.double()
    if s.top_k:
        scores = TopKLogitsWarper(s.top_k)(None, scores[None])[0]
    probs = torch.sort(torch.softmax(scores, -1), descending=True).values
    preceding = torch.cumsum(probs, 0) - probs
    lo, hi = sorted((ours, theirs))
    return bool(((preceding[lo:hi] - s.top_p).abs() < 1e-6).all())


def check(x: torch.Tensor, s: SamplerSettings, seed: int = 0) -> None:
    sel = select(x, s, torch.Generator().manual_seed(seed), 10)
    scaled, k_kept, p_kept = warped(x, s)
    assert sel.temp_entropy_bits == pytest.approx(entropy_bits(scaled), rel=1e-5, abs=1e-5)
    if s.temperature == 1.0:
        assert sel.temp_entropy_bits == sel.entropy_bits
    assert sel.top_k_kept == k_kept
    if p_kept is None or sel.top_p_kept == p_kept:
        assert sel.top_p_kept == p_kept
    else:
        assert on_the_edge(scaled, s, sel.top_p_kept, p_kept), (s, sel.top_p_kept, p_kept)
    # what is left after both cuts is what can be drawn: the kept count, unless the far tail underflowed to 0
    left = p_kept if p_kept is not None else k_kept if k_kept is not None else x.numel()
    assert sel.kept_count <= (sel.top_p_kept if sel.top_p_kept is not None else left)


def scores(kind: str, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(vocab, generator=g)
    return {"normal": x * 3, "flat": x * 0.01, "peaked": x * 2 + 12.0 * (torch.arange(vocab) == 7)}[kind]


@pytest.mark.parametrize("kind", ["normal", "flat", "peaked"])
def test_the_shape_matches_the_warpers_on_the_full_grid_small_vocab(kind):
    x = scores(kind, 1000, seed=1)
    for i, (t, k, p) in enumerate(GRID):
        check(x, SamplerSettings(temperature=t, top_k=k, top_p=p), seed=i)


def test_the_shape_matches_the_warpers_at_qwen_vocab():
    x = scores("normal", 151_936, seed=3)
    for t, k, p in [(0.7, 0, 0.9), (1.0, 0, 0.9), (0.7, 50, 0.9), (1.5, 50, 1.0), (0.7, 0, 1.0), (1.0, 5, 0.05)]:
        check(x, SamplerSettings(temperature=t, top_k=k, top_p=p))


def test_top_k_ties_are_counted_as_the_warper_keeps_them():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2000, generator=g) - 10.0
    x[:3] = torch.tensor([5.0, 4.5, 4.0])
    x[torch.randperm(1997, generator=g)[:300] + 3] = 1.0  # 300 tied at 4th place: top-k 5 keeps 303
    for t, p in [(1.0, 1.0), (0.7, 0.5), (1.3, 0.999)]:
        s = SamplerSettings(temperature=t, top_k=5, top_p=p)
        check(x, s)
        assert select(x, s, torch.Generator().manual_seed(0), 10).top_k_kept == 303


def test_top_k_of_the_whole_vocabulary_keeps_it_all_and_greedy_reports_no_shape():
    x = scores("normal", 500, seed=4)
    sel = select(x, SamplerSettings(temperature=0.7, top_k=500, top_p=1.0), torch.Generator().manual_seed(0), 10)
    assert sel.top_k_kept == 500 and sel.top_p_kept is None
    assert warped(x, SamplerSettings(temperature=0.7, top_k=500, top_p=1.0))[1] == 500
    for greedy in (SamplerSettings(temperature=0.0), SamplerSettings(temperature=0.7, top_k=5, greedy=True)):
        sel = select(x, greedy, None, 10)
        assert sel.temp_entropy_bits is None and sel.top_k_kept is None and sel.top_p_kept is None


def test_temperature_reshapes_without_reordering():
    """T < 1 sharpens (lower entropy), T > 1 flattens (higher), T = 1 leaves the model's own distribution; the order
    of the candidates never changes."""
    x = scores("normal", 5000, seed=5)
    by_t = {t: select(x, SamplerSettings(temperature=t, top_p=1.0), torch.Generator().manual_seed(0), 10)
            for t in (0.5, 1.0, 2.0)}
    assert by_t[0.5].temp_entropy_bits < by_t[1.0].temp_entropy_bits < by_t[2.0].temp_entropy_bits
    assert by_t[1.0].temp_entropy_bits == by_t[1.0].entropy_bits
    assert by_t[0.5].top_ids == by_t[1.0].top_ids == by_t[2.0].top_ids


def test_the_shape_matches_the_warpers_on_the_embedded_models_logits(embedded_stock, smol_tokenizer):
    model, tokenizer = embedded_stock.model, smol_tokenizer
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Is OpenAI open?"}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    with torch.inference_mode():
        logits = model(torch.tensor([ids + [tokenizer.encode(" No")[0]]])).logits[0, -2:]  # two positions
    for row, x in enumerate(logits):
        for i, (t, k, p) in enumerate(GRID[row::2]):
            check(x, SamplerSettings(temperature=t, top_k=k, top_p=p), seed=i)
