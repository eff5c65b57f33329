"""The real llama-server as a second oracle for issue 38's chain: with the same stages, settings and order (sent
under llama-server's own names by core/samplers.py `served_sampler`), its post-sampler probabilities
(`n_probs` with `post_sampling_probs: true`) equal tokentui's for every candidate it shows, on the embedded model.

The scores both chains start from are the server's own: its raw next-token distribution over the whole vocabulary
(`n_probs` = the vocabulary, `post_sampling_probs: false`), whose logarithm is the scores up to one constant, which
every stage here ignores (the repeat penalty does not: it divides positive scores and multiplies negative ones, so
it is held to transformers' processor instead, tests/unit/test_sampler_stages.py). So the comparison is of the
chains alone, in float32, not of two forwards of the model. One server for the module: the session's
(tests/llama_server_fixture.py).
"""

from __future__ import annotations

import httpx
import pytest
import torch

from tokentui.core.model.sampler_input import RunHistory
from tokentui.core.samplers import served_sampler
from tokentui.core.settings import SamplerSettings
from tokentui.core.steps.stages import chain
from tokentui.core.steps.token_bytes import token_bytes

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # a descheduled 2nd thread stalls O(V) ops

PROMPT = "one two three, one two three, one two three, one two"
CHAINS = {
    "penalties, DRY, temperature, top-k, top-p, min-p": SamplerSettings(
        presence_penalty=0.6, frequency_penalty=0.4, repeat_last_n=64, dry_multiplier=0.8, dry_allowed_length=1,
        temperature=0.8, top_k=40, top_p=0.9, min_p=0.02),
    # not typical-p after top-n-sigma: llama.cpp's top-n-sigma leaves its cuts in the array as -inf, and typical's
    # entropy then sums 0 * log 0 = NaN (llama_sampler_typical_apply), so it keeps a top-p-like set instead
    "dynamic temperature, typical-p": SamplerSettings(
        temperature=1.0, dynatemp_range=0.4, dynatemp_exp=1.5, typical_p=0.9, top_p=1.0),
    "top-n-sigma": SamplerSettings(temperature=0.7, top_n_sigma=1.0, top_p=1.0),
    "logit bias, XTC (always), top-k": SamplerSettings(
        logit_bias=[(1, 3.0), (30, -2.0)], xtc_probability=1.0, xtc_threshold=0.02, top_k=50, top_p=1.0,
        temperature=0.9),
    "another order": SamplerSettings(temperature=1.3, top_k=30, top_p=0.5, samplers="top_p;top_k;temperature"),
    "Mirostat 2.0": SamplerSettings(mirostat=2, mirostat_tau=4.0, mirostat_eta=0.1, temperature=0.9),
}


def _completion(server, body: dict) -> dict:
    answer = httpx.post(server.url + "/completion", json={"n_predict": 1, "stream": False, "cache_prompt": False,
                                                          "return_tokens": True, **body}, timeout=120)
    answer.raise_for_status()
    return answer.json()["completion_probabilities"][0]


@pytest.fixture(scope="module")
def start(llama_server, embedded):
    """The prompt's ids, the server's raw scores (log of its whole raw distribution), the tokenizer's history."""
    tokenizer = embedded.tokenizer
    ids = tokenizer.encode(PROMPT)
    vocab = len(tokenizer)
    raw = _completion(llama_server, {"prompt": ids, "n_probs": vocab, "post_sampling_probs": False,
                                     "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0})
    scores = torch.full((vocab,), float("-inf"))
    for entry in raw["top_logprobs"]:
        scores[entry["id"]] = entry["logprob"]
    assert torch.isfinite(scores).all(), "the server gave the whole raw distribution"
    return ids, scores, RunHistory(tokenizer, token_bytes(tokenizer), list(ids))


@pytest.mark.parametrize("name", list(CHAINS))
def test_llama_servers_post_sampler_probabilities_are_tokentuis(llama_server, start, name):
    settings = CHAINS[name]
    ids, scores, history = start
    body, order = served_sampler(settings, "llama.cpp")
    post = _completion(llama_server, {"prompt": ids, "n_probs": 20, "post_sampling_probs": True, **body,
                                      "samplers": order})
    shown = {entry["id"]: entry["prob"] for entry in post["top_probs"]}
    given = history.given(settings)
    probs, _ = chain(scores, settings, given=given)
    kept = int((probs > 0).sum())
    assert kept < scores.numel()  # the chain cut something: the comparison is of a chain, not of a softmax
    assert len(shown) == min(20, kept), (name, len(shown), kept)
    for token_id, p in shown.items():
        assert abs(float(probs[token_id]) - p) <= 2e-5, (name, token_id, float(probs[token_id]), p)
