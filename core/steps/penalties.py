"""The sampler stages transformers has no LogitsProcessor for, with llama.cpp's semantics (src/llama-sampler.cpp,
the function each names), as torch over the whole vocabulary: the logit bias, the penalties (repeat, presence,
frequency over a window of the last tokens), DRY, dynamic temperature, top-nσ, XTC and Mirostat 2.0's truncation.

Each takes scores [1, V] float32 (cut entries -inf, as core/steps/stages.py passes them) and returns new scores,
never changing its input. llama.cpp removes cut entries from its candidate array; here they stay as -inf, and
every count, mean and probability below is over the finite entries only, which is the same thing. Hand-written
because no library has these stages with llama.cpp's semantics; tests/unit/test_sampler_stages*.py hold each to a
line-by-line Python transcription of its llama.cpp function.

Also here: `dry_breakers`, DRY's sequence breakers as token sequences (llama.cpp's get_overlapping_token_sequences),
made once per tokenizer and list of strings.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import torch

__all__ = ["bias", "dry", "dry_breakers", "dry_penalties", "dry_repeats", "dynamic_temperature", "mirostat_v2",
           "penalize", "top_n_sigma", "window", "window_counts", "xtc"]

_FLOAT_MAX_LOG = 88.7228391  # log(float32 max), as llama_sampler_dry_apply clamps its exponent


def window(ids: Sequence[int], last_n: int) -> Sequence[int]:
    """The last `last_n` tokens of `ids` (the ring buffer llama.cpp's penalties and DRY keep); 0: none."""
    return ids[-last_n:] if last_n > 0 else ids[:0]


def bias(scores: torch.Tensor, pairs) -> torch.Tensor:
    """llama_sampler_logit_bias_apply: each (id, bias) adds bias to that id's score."""
    ids = torch.tensor([t for t, _ in pairs], dtype=torch.long, device=scores.device)
    add = torch.tensor([b for _, b in pairs], dtype=torch.float32, device=scores.device)
    return scores.index_add(1, ids, add[None])


def penalize(scores: torch.Tensor, recent: Sequence[int], repeat: float, frequency: float,
             presence: float) -> torch.Tensor:
    """llama_sampler_penalties_apply: every id in `recent` (the window) has its score divided by `repeat` when
    > 0, multiplied when <= 0, then `count * frequency + presence` subtracted (count: its occurrences there).
    Only the window's ids are touched (a gather and a scatter of a few entries, not passes over the vocabulary)."""
    found, times = window_counts(recent, scores.shape[-1])
    if not found:
        return scores
    ids = torch.tensor(found, dtype=torch.long, device=scores.device)
    counts = torch.tensor(times, dtype=torch.float32, device=scores.device)
    at = scores[0].index_select(0, ids)
    scaled = torch.where(at <= 0, at * repeat, at / repeat) - (counts * frequency + presence)
    return scores.index_copy(1, ids, scaled[None])


def window_counts(recent: Sequence[int], vocab: int) -> tuple[list[int], list[int]]:
    """The distinct ids of a window inside the vocabulary (ascending) and how often each occurs there."""
    counts: dict[int, int] = {}
    for t in recent:
        if t < vocab:
            counts[t] = counts.get(t, 0) + 1
    ids = sorted(counts)
    return ids, [counts[t] for t in ids]


def dry_repeats(recent: Sequence[int], allowed: int,
                breakers: Mapping[int, tuple[tuple[int, ...], ...]] | None) -> dict[int, int]:
    """DRY's first three steps (llama_sampler_dry_apply): for each token that would extend a repeat of at least
    `allowed` tokens, the longest such repeat. Written from the definition, not llama.cpp's Z-algorithm: for each
    earlier occurrence of the window's last tokens, ending k tokens before the end, the repeat is the length of
    the longest common suffix of the window and the window cut k tokens short (at most the restart limit), and
    the token after that occurrence, window[-k], would extend it."""
    n = len(recent)
    if n <= allowed:
        return {}
    rat = lambda i: recent[n - 1 - i]  # noqa: E731  llama.cpp's ring_buffer.rat: i tokens back from the newest
    limit = n  # the restart limit: a sequence breaker's head this far back ends every repeat there
    for i in range(n):
        tails = (breakers or {}).get(rat(i))
        if not tails:
            continue
        longest = max((len(t) for t in tails if len(t) <= i and all(t[o] == rat(i - o - 1) for o in range(len(t)))),
                      default=-1)
        if longest >= 0:
            limit = i - longest
            break
    if limit < allowed:
        return {}
    longest_for: dict[int, int] = {}
    for k in range(1, n):
        length = 0
        while length + k < n and rat(length) == rat(length + k):
            length += 1
        length = min(length, limit)
        if length >= allowed:
            token = recent[n - k]
            longest_for[token] = max(longest_for.get(token, 0), length)
    return longest_for


def dry(scores: torch.Tensor, recent: Sequence[int], multiplier: float, base: float, allowed: int,
        breakers: Mapping[int, tuple[tuple[int, ...], ...]] | None) -> torch.Tensor:
    """llama_sampler_dry_apply: a token that would extend a repeat of length L >= `allowed` in `recent` (the
    window) loses multiplier * base^(L - allowed) (the exponent clamped so the power stays a finite float32); a
    single-token sequence breaker never does."""
    found, penalty = dry_penalties(recent, multiplier, base, allowed, breakers, scores.shape[-1])
    if not found:
        return scores
    ids = torch.tensor(found, dtype=torch.long, device=scores.device)
    return scores.index_add(1, ids, -penalty.to(scores.device)[None])


def dry_penalties(recent: Sequence[int], multiplier: float, base: float, allowed: int,
                  breakers: Mapping[int, tuple[tuple[int, ...], ...]] | None,
                  vocab: int) -> tuple[list[int], torch.Tensor]:
    """What `dry` subtracts: the ids and their float32 penalties (the native chain, core/model/native/
    select_chain.cpp, subtracts the same values)."""
    repeats = dry_repeats(recent, allowed, breakers)
    single = {head for head, tails in (breakers or {}).items() if () in tails}
    hits = [(t, length) for t, length in repeats.items() if t not in single and t < vocab]
    if not hits:
        return [], torch.zeros(0)
    top = int(_FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    exps = [length - allowed for _, length in hits]
    exps = [min(e, top) if top > 0 else e for e in exps]
    penalty = multiplier * torch.tensor(base, dtype=torch.float32) ** torch.tensor(exps, dtype=torch.float32)
    return [t for t, _ in hits], penalty


def _finite_probs(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    finite = torch.isfinite(scores)
    return torch.softmax(scores, dim=-1), finite


def dynamic_temperature(scores: torch.Tensor, temperature: float, spread: float, exponent: float) -> torch.Tensor:
    """llama_sampler_temp_ext_apply with a range > 0: the temperature is temperature - spread (at least 0) plus
    2 * spread * (H / log n)^exponent, H the entropy (nats) of the candidates' softmax and n their count; at
    temperature <= 0 (llama_sampler_temp_impl) only the first highest score stays."""
    probs = torch.softmax(scores, dim=-1)
    n = scores.numel() if bool(scores.amin() > -math.inf) else int(torch.isfinite(scores).sum())
    if n <= 1:
        return scores
    low, high = max(0.0, temperature - spread), temperature + spread
    logs = torch.where(probs > 0, probs.log(), 0.0)
    entropy = float(-(probs * logs).sum())
    dyn = low + (high - low) * (entropy / math.log(n)) ** exponent
    if dyn <= 0:
        keep = torch.zeros_like(scores, dtype=torch.bool)
        keep[0, int(scores[0].argmax())] = True
        return torch.where(keep, scores, -math.inf)
    return scores / dyn


def top_n_sigma(scores: torch.Tensor, n: float) -> torch.Tensor:
    """llama_sampler_top_n_sigma_apply: cut every score below max - n * sigma, sigma the (population) standard
    deviation of the finite scores."""
    if bool(scores.amin() > -math.inf):  # nothing cut before it (the usual order): no mask to gather through
        if scores.numel() <= 1:
            return scores
        var, _ = torch.var_mean(scores, correction=0)
        top = scores.amax()
    else:
        finite = torch.isfinite(scores)
        count = int(finite.sum())
        if count <= 1:
            return scores
        values = scores[finite]
        var, _ = torch.var_mean(values, correction=0)
        top = values.amax()
    return torch.where(scores < top - n * var.sqrt(), -math.inf, scores)


def xtc(scores: torch.Tensor, probability: float, threshold: float, roll: float) -> torch.Tensor:
    """llama_sample_xtc_apply: when this step's uniform `roll` <= `probability`, and at least two candidates have a
    probability >= `threshold`, cut all of those but the least likely (ties at that probability all stay: the one
    rule that does not depend on a sort's order)."""
    probs, finite = _finite_probs(scores)
    if roll > probability or int(finite.sum()) < 2:
        return scores
    above = probs >= threshold
    if int(above.sum()) < 2:
        return scores
    floor = probs[above].min()
    return torch.where(above & (probs > floor), -math.inf, scores)


def mirostat_v2(scores: torch.Tensor, mu: float) -> torch.Tensor:
    """llama_sampler_mirostat_v2_apply's truncation: keep the candidates whose surprise -log2 p is at most `mu`
    (a run of the most likely; at least the most likely one). The draw and mu's update are select's
    (core/steps/select.py, core/samplers.py `mirostat_mu`)."""
    probs, _ = _finite_probs(scores)
    keep = -torch.log2(probs) <= mu
    if not bool(keep.any()):
        keep = torch.zeros_like(keep)
        keep[0, int(scores[0].argmax())] = True
    return torch.where(keep, scores, -math.inf)


_BREAKERS: dict[tuple, dict[int, tuple[tuple[int, ...], ...]]] = {}
MAX_TAIL_TOKENS = 20  # llama.cpp's MAX_SEQ_LEN: a breaker's tail after its head, in tokens


def dry_breakers(piece: Callable[[int], bytes], vocab: int, tokenize: Callable[[str], list[int]],
                 strings: Sequence[str], key: object = None) -> dict[int, tuple[tuple[int, ...], ...]]:
    """DRY's sequence breakers as token sequences (get_overlapping_token_sequences in llama_sampler_init_dry): a
    token whose bytes contain a breaker is a breaker on its own (tail ()); a token ending in the start of one is
    a head, with the rest of the breaker, tokenized, as its tail (at most MAX_TAIL_TOKENS). `piece(id)`: a token's
    bytes; `tokenize(text)`: ids without special tokens. Cached by `key` (the tokenizer) and the strings: the scan
    reads every token once."""
    cache_key = (key, tuple(strings))
    if key is not None and cache_key in _BREAKERS:
        return _BREAKERS[cache_key]
    found: dict[int, list[tuple[int, ...]]] = {}
    for text in strings:
        needle = text.encode("utf-8")
        for token in range(vocab):
            word = piece(token)
            if needle in word:
                found.setdefault(token, [])
                if () not in found[token]:
                    found[token].append(())
                continue
            pos = word.find(needle[:1])
            while pos != -1:
                i = 1
                while i < len(needle) and pos + i < len(word) and word[pos + i] == needle[i]:
                    i += 1
                if pos + i >= len(word) or i >= len(needle):  # the word's end matched a start of the breaker
                    tail = tuple(tokenize(needle[i:].decode("utf-8", "ignore")))[:MAX_TAIL_TOKENS]
                    if tail not in found.setdefault(token, []):
                        found[token].append(tail)
                pos = word.find(needle[:1], pos + 1)
    out = {token: tuple(tails) for token, tails in found.items()}
    if key is not None:
        _BREAKERS[cache_key] = out
    return out
