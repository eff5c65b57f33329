"""Issue 38's stages transformers has no processor for, against llama.cpp's own code: each test below holds a
direct Python transcription of the llama.cpp function it names (src/llama-sampler.cpp of the pinned llama.cpp
sdist, core/model/native/llama_sdist.py), working as llama.cpp does on its candidate array (sorted, shrunk by the
stages that cut, softmax over what is left), and tokentui's chain (core/steps/stages.py, core/steps/penalties.py)
must give the same distribution to 1e-6 in float32. The transcriptions keep llama.cpp's float32 arithmetic for
each score they change; their softmax sums in float64 (llama.cpp's float loop sums in order, which only adds
rounding, not semantics).

Stages: the penalties' presence / frequency parts and window (llama_sampler_penalties_accept / _apply), DRY
(llama_sampler_dry_apply, sequence breakers as get_overlapping_token_sequences makes them), top-nσ
(llama_sampler_top_n_sigma_apply), XTC (llama_sample_xtc_apply), dynamic temperature
(llama_sampler_temp_ext_apply) and Mirostat 2.0 (llama_sampler_mirostat_v2_apply, its mu carried step to step).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from tokentui.core.samplers import ChainInput, mirostat_mu
from tokentui.core.settings import SamplerSettings
from tokentui.core.steps.penalties import dry_breakers
from tokentui.core.steps.select import select
from tokentui.core.steps.stages import chain

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # a descheduled 2nd thread stalls O(V) ops

TOL = 1e-6
PLAIN = dict(temperature=1.0, top_p=1.0)
f32 = np.float32


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------- the transcriptions

def candidates(x: torch.Tensor) -> list[list]:
    """llama_token_data_array: [id, logit, p] for every token, in id order, unsorted."""
    return [[i, f32(v), 0.0] for i, v in enumerate(x.tolist())]


def softmax_impl(cur: list[list], do_sort: bool = True) -> None:
    """llama_sampler_softmax_impl: sort by logit, descending; p = exp(logit - max) / sum."""
    if do_sort:
        cur.sort(key=lambda c: -float(c[1]))
    top = max(float(c[1]) for c in cur)
    ps = [math.exp(float(c[1]) - top) for c in cur]
    total = math.fsum(ps)
    for c, p in zip(cur, ps):
        c[2] = p / total


def dense(cur: list[list], vocab: int) -> torch.Tensor:
    """What llama_sampler_dist samples from: the softmax of the candidates left, over the whole vocabulary."""
    softmax_impl(cur)
    out = torch.zeros(vocab, dtype=torch.float64)
    for i, _, p in cur:
        out[i] = p
    return out.float()


def penalties_apply(cur, tokens, last_n, repeat, freq, present):
    """llama_sampler_penalties_accept for each token, then llama_sampler_penalties_apply."""
    token_count, prev = {}, []
    for t in tokens:  # accept
        token_count[t] = token_count.get(t, 0) + 1
        if len(prev) >= last_n:  # the ring buffer is full: the oldest leaves
            old = prev.pop(0)
            token_count[old] -= 1
            if token_count[old] == 0:
                del token_count[old]
        prev.append(t)
    for c in cur:  # apply
        count = token_count.get(c[0])
        if count is None:
            continue
        c[1] = c[1] * f32(repeat) if c[1] <= 0 else c[1] / f32(repeat)
        c[1] = f32(c[1] - (f32(count) * f32(freq) + f32(count > 0) * f32(present)))


def dry_apply(cur, tokens, multiplier, base, allowed, last_n, breakers):
    """llama_sampler_dry_accept for each token (a ring buffer of last_n), then llama_sampler_dry_apply: the
    restart sequences, the reverse Z-algorithm, the longest repeat each next token would extend, the penalty."""
    last_tokens = list(tokens)[-last_n:] if last_n > 0 else []
    rat = lambda i: last_tokens[len(last_tokens) - 1 - i]  # noqa: E731
    last_n_repeat = min(len(last_tokens), last_n)
    if last_n_repeat <= allowed:
        return
    repeat_count = [0] * last_n_repeat
    max_token_repeat = {}
    rep_limit = last_n_repeat
    for i in range(last_n_repeat):  # step 1
        token = rat(i)
        if token not in breakers:
            continue
        longest_match = -1
        for tail in breakers[token]:
            seq_len = len(tail)
            if seq_len > longest_match and seq_len <= i:
                if all(tail[offset] == rat(i - offset - 1) for offset in range(seq_len)):
                    longest_match = seq_len
        if longest_match >= 0:
            rep_limit = i - longest_match
            break
    if rep_limit < allowed:
        return
    last, rt, lt = last_n_repeat - 1, 0, 0  # step 2: the Z-algorithm, reversed
    for k in range(1, last_n_repeat):
        if k > rt:
            n = 0
            while n + k < last_n_repeat and rat(n) == rat(n + k):
                n += 1
            repeat_count[last - k] = min(n, rep_limit)
            if n > 0:
                lt, rt = k, k + n - 1
        else:
            p = k - lt
            right_part_len = rt - k + 1
            if repeat_count[last - p] < right_part_len:
                repeat_count[last - k] = min(repeat_count[last - p], rep_limit)
            else:
                i = rt + 1
                while i < last_n_repeat and rat(i) == rat(i - k):
                    i += 1
                repeat_count[last - k] = min(i - k, rep_limit)
                lt, rt = k, i - 1
    for i in range(last_n_repeat - 1):  # step 3
        repeat_len = repeat_count[i]
        if repeat_len >= allowed:
            token = rat(last_n_repeat - 2 - i)
            if token not in max_token_repeat or max_token_repeat[token] < repeat_len:
                max_token_repeat[token] = repeat_len
    max_exponent = int(f32(88.7228391) / f32(math.log(base))) if base > 1.000001 else 0  # step 4
    for c in cur:
        if c[0] not in max_token_repeat:
            continue
        if any(len(tail) == 0 for tail in breakers.get(c[0], ())):
            continue
        repeat_exp = max_token_repeat[c[0]] - allowed
        if max_exponent > 0 and repeat_exp > max_exponent:
            repeat_exp = max_exponent
        c[1] = f32(c[1] - f32(multiplier) * np.power(f32(base), f32(repeat_exp)))


def top_n_sigma_apply(cur, n):
    """llama_sampler_top_n_sigma_apply (the array llama.cpp hands it: what earlier cuts left)."""
    if n <= 0 or len(cur) <= 1:
        return
    valid = [float(c[1]) for c in cur if c[1] != -np.inf]
    top, mean = max(valid), math.fsum(valid) / len(valid)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in valid) / len(valid))
    for c in cur:
        if c[1] < top - n * std:
            c[1] = f32(-np.inf)


def xtc_apply(cur, probability, threshold, chance):
    """llama_sample_xtc_apply, with the uniform draw `chance` given."""
    if probability <= 0 or threshold > 0.5 or len(cur) < 2:
        return cur
    if chance > probability:
        return cur
    softmax_impl(cur)
    pos_last = 0
    for i, c in enumerate(cur):
        if c[2] >= threshold:
            pos_last = i
        else:
            break
    if len(cur) - pos_last >= 0 and pos_last > 0:
        return cur[pos_last:]
    return cur


def temp_ext_apply(cur, temp, delta, exponent):
    """llama_sampler_temp_ext_apply with a range (delta) > 0."""
    min_temp, max_temp = max(0.0, temp - delta), temp + delta
    if len(cur) <= 1:
        return
    max_entropy = -math.log(1.0 / len(cur))
    softmax_impl(cur)
    entropy = -math.fsum(c[2] * math.log(c[2]) for c in cur if c[2] > 0)
    dyn_temp = min_temp + (max_temp - min_temp) * (entropy / max_entropy) ** exponent
    for c in cur:
        c[1] = f32(c[1] / f32(dyn_temp))


def mirostat_v2_truncate(cur, mu):
    """llama_sampler_mirostat_v2_apply before its draw: sort, cut from the first surprise above mu (keep one)."""
    softmax_impl(cur)
    size = next((i for i, c in enumerate(cur) if -math.log2(c[2]) > mu), len(cur))
    cur[:] = cur[: max(size, 1)]
    softmax_impl(cur)


# ------------------------------------------------------------------------------------- the tests

def test_presence_and_frequency_penalties_and_their_window_are_llama_cpps():
    rng = random.Random(3)
    for trial in range(12):
        x = torch.randn(3_000, generator=_gen(trial)) * 2
        history = [rng.choice(range(40)) for _ in range(rng.randint(1, 90))]
        last_n = rng.choice([1, 8, 64, 200])
        s = SamplerSettings(repeat_penalty=rng.choice([1.0, 1.1, 1.7]), repeat_last_n=last_n,
                            presence_penalty=rng.uniform(-1, 2), frequency_penalty=rng.uniform(0, 1.5), **PLAIN)
        cur = candidates(x)
        penalties_apply(cur, history, last_n, s.repeat_penalty, s.frequency_penalty, s.presence_penalty)
        probs, cuts = chain(x, s, given=ChainInput(ids=history))
        torch.testing.assert_close(probs, dense(cur, 3_000), atol=TOL, rtol=0)
        assert cuts[0].stage == "penalties" and cuts[0].count == 0  # it moves scores, never cuts
        sel = select(x, s, _gen(trial), 10, given=ChainInput(ids=history))
        torch.testing.assert_close(torch.tensor(sel.top_sampled_probs), probs[sel.top_ids], atol=TOL, rtol=0)


def test_dry_is_llama_cpps_with_its_sequence_breakers():
    rng = random.Random(7)
    breakers = {3: ((),), 4: ((5,), (5, 6))}  # 3 breaks alone; 4 breaks when followed by 5 (or 5 6)
    hit = 0
    for trial in range(150):
        x = torch.randn(60, generator=_gen(trial))
        alphabet = rng.choice([range(3), range(8), range(12)])
        motif = [rng.choice(alphabet) for _ in range(rng.randint(2, 6))]
        history = []
        while len(history) < rng.randint(5, 80):
            history += motif if rng.random() < 0.6 else [rng.choice(alphabet)]
        s = SamplerSettings(dry_multiplier=rng.choice([0.3, 0.8, 2.0]), dry_base=rng.choice([1.0, 1.75, 3.0]),
                            dry_allowed_length=rng.choice([0, 1, 2, 4]), dry_penalty_last_n=rng.choice([1, 8, 64]),
                            **PLAIN)
        cur = candidates(x)
        dry_apply(cur, history, s.dry_multiplier, s.dry_base, s.dry_allowed_length, s.dry_penalty_last_n, breakers)
        want = dense(cur, 60)
        probs, _ = chain(x, s, given=ChainInput(ids=history, breakers=breakers))
        torch.testing.assert_close(probs, want, atol=TOL, rtol=0, msg=f"trial {trial}")
        hit += not torch.allclose(want, torch.softmax(x, -1), atol=1e-4)
    assert hit > 50  # most trials really penalise something


def test_dry_breakers_are_made_as_llama_cpp_makes_them():
    """get_overlapping_token_sequences on a small vocabulary: a token holding the breaker breaks alone; a token
    ending in its first characters is a head, with the rest tokenized as its tail."""
    vocab = [b"a", b"b", b"\n", b"x\n", b"ab", b"c:", b"::", b"q", b" *", b"*"]
    tokenize = {":": [5], "b:": [1, 5], ":x": [5, 0], "x": [0]}  # the tails the scan asks for

    def transcription(strings):
        seqs = {}
        for text in strings:
            s = text.encode()
            for tid, word in enumerate(vocab):
                if s in word:
                    seqs.setdefault(tid, [])
                    if () not in seqs[tid]:
                        seqs[tid].append(())
                    continue
                pos = -1
                while (pos := word.find(s[:1], pos + 1)) != -1:
                    match, i = True, 1
                    while i < len(s) and i + pos < len(word):
                        if word[pos + i] != s[i]:
                            match = False
                            break
                        i += 1
                    if match:
                        tail = tuple(tokenize.get(s[i:].decode(), [7]))[:20]
                        if tail not in seqs.setdefault(tid, []):
                            seqs[tid].append(tail)
        return {t: tuple(v) for t, v in seqs.items()}

    for strings in (["\n"], ["ab:"], ["::x"], ["\n", "*", "c::"]):
        got = dry_breakers(lambda i: vocab[i], len(vocab), lambda t: tokenize.get(t, [7]), strings)
        assert got == transcription(strings), strings
    assert dry_breakers(lambda i: vocab[i], len(vocab), lambda t: [7], ["\n"])[2] == ((),)


def test_top_n_sigma_is_llama_cpps_alone_and_after_top_k():
    for trial in range(10):
        x = torch.randn(3_000, generator=_gen(trial)) * (1 + trial % 3)
        for n in (0.5, 1.0, 2.5):
            cur = candidates(x)
            top_n_sigma_apply(cur, n)
            torch.testing.assert_close(chain(x, SamplerSettings(top_n_sigma=n, **PLAIN))[0], dense(cur, 3_000),
                                       atol=TOL, rtol=0)
            cur = candidates(x)  # after top-k 50, which shrinks llama.cpp's array to 50 candidates
            softmax_impl(cur)
            cur = cur[:50]
            top_n_sigma_apply(cur, n)
            s = SamplerSettings(top_k=50, top_n_sigma=n, samplers="top_k;top_n_sigma", **PLAIN)
            torch.testing.assert_close(chain(x, s)[0], dense(cur, 3_000), atol=TOL, rtol=0)


def test_xtc_is_llama_cpps_and_its_roll_comes_from_the_seed():
    for trial in range(20):
        x = torch.randn(80, generator=_gen(trial)) * 2.5
        threshold = [0.02, 0.05, 0.1, 0.3][trial % 4]
        for chance in (0.1, 0.9):
            s = SamplerSettings(xtc_probability=0.5, xtc_threshold=threshold, **PLAIN)
            cur = xtc_apply(candidates(x), 0.5, threshold, chance)
            probs, cuts = chain(x, s, given=ChainInput(xtc_roll=chance))
            torch.testing.assert_close(probs, dense(cur, 80), atol=TOL, rtol=0)
            assert (cuts[-1].count > 0) == (len(cur) < 80)
    s = SamplerSettings(xtc_probability=0.5, xtc_threshold=0.05, **PLAIN)
    x = torch.randn(80, generator=_gen(1)) * 2.5
    runs = [[select(x, s, g, 5).token_id for _ in range(40)] for g in (_gen(11), _gen(11), _gen(12))]
    assert runs[0] == runs[1] != runs[2]  # the same seed, the same ids (XTC's roll included)


def test_dynamic_temperature_is_llama_cpps():
    for trial in range(12):
        x = torch.randn(2_000, generator=_gen(trial)) * (0.5 + trial % 4)
        temp, spread, exponent = [0.8, 1.2, 0.3][trial % 3], [0.5, 1.0, 0.25][trial % 3], [1.0, 2.0, 0.5][trial % 3]
        cur = candidates(x)
        temp_ext_apply(cur, temp, spread, exponent)
        s = SamplerSettings(temperature=temp, dynatemp_range=spread, dynatemp_exp=exponent, top_p=1.0)
        torch.testing.assert_close(chain(x, s)[0], dense(cur, 2_000), atol=TOL, rtol=0)
        sel = select(x, s, _gen(trial), 10)
        torch.testing.assert_close(torch.tensor(sel.top_sampled_probs), dense(cur, 2_000)[sel.top_ids], atol=TOL,
                                   rtol=0)


def test_mirostat_v2_is_llama_cpps_step_after_step_and_its_state_is_the_steps_record():
    """30 steps: each step's distribution is llama.cpp's truncation at the mu it carries, mu moves on by the
    surprise of the token drawn, and folding the recorded steps (core/samplers.py `mirostat_mu`) gives the same mu,
    so a branch or a revisited step starts where the run was."""
    s = SamplerSettings(mirostat=2, mirostat_tau=3.0, mirostat_eta=0.2, temperature=0.9)
    gen, mu, steps = _gen(5), None, []
    llama_mu = 2.0 * 3.0
    for t in range(30):
        x = torch.randn(2_000, generator=_gen(100 + t)) * 2.5
        cur = candidates(x / 0.9)
        mirostat_v2_truncate(cur, llama_mu)
        want = dense(cur, 2_000)
        assert mirostat_mu(steps) == mu
        sel = select(x, s, gen, 10, given=ChainInput(mu=mu))
        assert sel.kept_count == int((want > 0).sum()) and want[sel.token_id] > 0
        torch.testing.assert_close(torch.tensor(sel.top_sampled_probs), want[sel.top_ids], atol=TOL, rtol=0)
        llama_mu -= 0.2 * (-math.log2(float(want[sel.token_id])) - 3.0)  # the update, from the token drawn
        assert math.isclose(sel.mirostat_mu, llama_mu, rel_tol=1e-5)
        mu, steps = sel.mirostat_mu, steps + [(s, sel.chosen_prob)]
    assert mirostat_mu(steps) == mu
    assert mirostat_mu(steps + [(s.with_changes(mirostat=0), 0.5)]) is None  # off: the state ends
