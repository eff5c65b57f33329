"""Bugs planted in the engine's calls, in-process, so that tests can show an oracle fails under each (issue 45: an
oracle that cannot fail checks nothing). `planted(bug)` is a context manager; `generate`, the full forward and
every other oracle must be computed outside it (the patches are class- and module-wide while it is open).

    cache_unread     a decode step's attention sees only the row it has just written, at every cached position (the
                     cache is written, never read back); recurrent layers (linear attention, convolutions, Mamba's
                     scan) read a zeroed state
    chunk_dropped    the prompt's first prefill chunk is never fed: generation starts from the second chunk alone
                     (the engine still counts the whole prompt)
    positions_off    a decode step's position ids are one past the truth (rotary and learned positions)
    temperature_skipped  the sampler leaves out its temperature stage (samples at temperature 1)
    top_p_one_short  top-p keeps one token too few: the last token it keeps is cut, the rest renormalised (in the
                     selection the engine reports and steps on; the token drawn is the sampler's)
"""

from __future__ import annotations

import contextlib

BUGS = ("cache_unread", "chunk_dropped", "positions_off", "temperature_skipped", "top_p_one_short")


def _cache_of(kwargs):
    return next((kwargs[k] for k in ("cache", "past_key_values", "cache_params") if kwargs.get(k) is not None), None)


def _is_decode(kwargs) -> bool:
    ids = kwargs.get("input_ids")
    return ids is not None and ids.shape[-1] == 1 and _cache_of(kwargs) is not None


@contextlib.contextmanager
def planted(bug: str, model):
    """Plant `bug` (BUGS) in the engine's calls on `model` until the block ends."""
    if bug not in BUGS:
        raise ValueError(f"no planted bug {bug!r}: {BUGS}")
    with contextlib.ExitStack() as stack:
        {"cache_unread": _cache_unread, "chunk_dropped": _chunk_dropped, "positions_off": _positions_off,
         "temperature_skipped": _temperature_skipped, "top_p_one_short": _top_p_one_short}[bug](stack, model)
        yield


def _patch(stack, owner, name, value):
    old = getattr(owner, name)
    setattr(owner, name, value)
    stack.callback(setattr, owner, name, old)


def _cache_unread(stack, model):
    import torch
    from transformers.cache_utils import DynamicSlidingWindowLayer, LinearAttentionLayer

    from tokentui.core.model.decode.buffers import GrowableBuffers

    for cls in (GrowableBuffers, DynamicSlidingWindowLayer):
        original = cls.update

        def update(self, key_states, value_states, *args, _original=original, **kwargs):
            keys, values = _original(self, key_states, value_states, *args, **kwargs)
            if key_states.shape[-2] == 1:  # a decode step: written, and only the new row read back (in every
                return key_states.expand_as(keys), value_states.expand_as(values)  # position: the masks' shapes hold)
            return keys, values

        _patch(stack, cls, "update", update)

    def zero_states(module, args, kwargs):
        if not _is_decode(kwargs):
            return None
        for layer in getattr(_cache_of(kwargs), "layers", []):
            if isinstance(layer, LinearAttentionLayer):
                for states in (layer.conv_states, layer.recurrent_states):
                    for t in states.values():
                        if isinstance(t, torch.Tensor):
                            t.zero_()
        return None

    handle = model.register_forward_pre_hook(zero_states, with_kwargs=True)
    stack.callback(handle.remove)


def _chunk_dropped(stack, model):
    import tokentui.core.model.engine as engine

    original = engine.prefill_chunks

    def prefill_chunks(model, prompt_ids, cache, chunk=None, *args, **kwargs):
        skip = chunk if chunk is not None and len(prompt_ids) > chunk else 0
        rest = original(model, list(prompt_ids)[skip:], cache, chunk, *args, **kwargs) if chunk is not None else \
            original(model, prompt_ids, cache, *args, **kwargs)
        for done, logits, ms in rest:
            yield done + skip, logits, ms

    _patch(stack, engine, "prefill_chunks", prefill_chunks)


def _positions_off(stack, model):
    import torch

    def shift(module, args, kwargs):
        if not _is_decode(kwargs):
            return None
        past = _cache_of(kwargs).get_seq_length()
        kwargs = dict(kwargs)
        kwargs["position_ids"] = torch.tensor([[past + 1]], device=kwargs["input_ids"].device)
        return args, kwargs

    handle = model.register_forward_pre_hook(shift, with_kwargs=True)
    stack.callback(handle.remove)


def _temperature_skipped(stack, model):
    from dataclasses import replace

    import tokentui.core.model.step_loop as loop

    original = loop.select  # the engine's loop looks `select` up at each run (core/model/step_loop.py)

    def select(logits, settings, *args, **kwargs):
        return original(logits, replace(settings, temperature=1.0), *args, **kwargs)

    _patch(stack, loop, "select", select)


def _top_p_one_short(stack, model):
    from dataclasses import replace

    import tokentui.core.model.step_loop as loop

    original = loop.select

    def select(logits, settings, *args, **kwargs):
        sel = original(logits, settings, *args, **kwargs)
        kept = [i for i, p in enumerate(sel.top_sampled_probs) if p > 0]
        if settings.top_p >= 1.0 or len(kept) < 2 or sel.kept_count != len(kept):
            return sel  # nothing to cut, or the last kept token is not among those reported
        last = min(kept, key=lambda i: sel.top_sampled_probs[i])
        mass = sum(sel.top_sampled_probs[i] for i in kept if i != last)
        probs = [0.0 if i == last else p / mass for i, p in enumerate(sel.top_sampled_probs)]
        return replace(sel, top_sampled_probs=probs, kept_count=sel.kept_count - 1)

    _patch(stack, loop, "select", select)
