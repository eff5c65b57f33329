"""Sampler and run settings, validated once, as they are built, so every front end gives the same one-line errors
and an invalid value cannot exist."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, make_dataclass, replace

from .errors import SettingsError
from .samplers import MAX_SEED, MIN_TEMPERATURE, PARAMS, check  # noqa: F401 (the first two lived here)

# --threads: at most this many per CPU (os.cpu_count(), hyper-threads counted). Past the core count more threads only
# wait on each other at OpenMP's barriers (core/model/speed.py, BENCHMARKS.md), so 4x is already room to spare for
# experiments with oversubscription; far past it the thread pools themselves fail as the threads are made, and
# --threads 100000 killed the process with a segfault and nothing said.
THREADS_PER_CPU = 4


def max_threads() -> int:
    """The most CPU threads a model may be given on this machine (THREADS_PER_CPU per CPU)."""
    return THREADS_PER_CPU * (os.cpu_count() or 1)


def check_threads(value, name: str = "threads") -> None:
    """A thread count (None: the default policy) must be an integer in 1..max_threads(); else one SettingsError
    line. Every front end and SpeedOptions check it here."""
    if value is None:
        return
    top = max_threads()
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        got = f"a {len(str(value))}-digit number" if isinstance(value, int) and abs(value) > 10**30 else repr(value)
        raise SettingsError(f"{name} must be an integer from 1 to {top} ({THREADS_PER_CPU} per CPU, "
                            f"{os.cpu_count() or 1} CPUs here), got {got}")


class _SamplerBase:
    """What step 4 (selection) does with the logits: one field per parameter of the sampler chain's registry
    (core/samplers.py PARAMS: today's four knobs, greedy and seed, then issue 38's stages' and their order), in that
    order, with the registry's defaults.

    temperature 0 means greedy; `greedy=True` forces argmax whatever the temperature (of the scores after the logits
    processors, bias, penalties and DRY, which greedy still applies, as generate(do_sample=False) and llama.cpp do).
    A stage's "off" value (top-k 0, top-p 1.0, min-p 0, repeat-penalty 1 ...) leaves it out, as in transformers'
    generate; `samplers` is the order (llama.cpp's --samplers spelling, core/samplers.py `parse_order`).
    """

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0

    def __post_init__(self) -> None:
        """Checked here, once, by each parameter's own check in the registry: an invalid SamplerSettings cannot
        exist (every front end gets the same one-line SettingsError), and floats are stored as floats whatever
        type they came in."""
        for p in PARAMS:
            object.__setattr__(self, p.name, check(p.name, getattr(self, p.name)))  # frozen: normalised here only

    def with_changes(self, **changes) -> "SamplerSettings":
        return replace(self, **changes)  # the new settings are checked as they are built

    def to_dict(self) -> dict:
        return asdict(self)


# Annotations as strings ("float"), as `from __future__ import annotations` leaves every other dataclass's: the record
# reader (core/runs/record_reader.py) checks values against them.
SamplerSettings = make_dataclass(
    "SamplerSettings", [(p.name, p.kind.__name__, field(default=p.default)) for p in PARAMS], bases=(_SamplerBase,),
    frozen=True, namespace={"__module__": __name__, "__doc__": _SamplerBase.__doc__})


PREFILL_CHUNK = 512  # prompt tokens per prefill forward pass (core/steps/prefill.py says why prompts are chunked)


@dataclass(frozen=True)
class RunOptions:
    """What bounds a run: length, end tokens, how many candidates each step reports, the prefill chunk; whether
    each step carries the logit lens, and how exactly its stages are timed on a GPU."""

    max_new_tokens: int = 256
    ignore_eos: bool = False
    top_candidates: int = 10
    prefill_chunk: int = PREFILL_CHUNK  # a prompt longer than this is prefilled in chunks, with progress events
    logit_lens: bool = False  # each step also reports every layer's top token (core/model/observe/lens.py); costs time per step
    # On CUDA, time each step's stages exactly, at the cost of a device sync after the forward and before the copy
    # (core/model/observe/timing.py); off, CUDA events time them with no sync added. No effect on CPU, which is always exact.
    time_stages: bool = False
    # Inside the blocks (issue 39; core/runs/attention.py, core/model/observe/attention.py and sublayers.py): each
    # step also reports every attention layer's top `attention_top` source positions (head mean; per head too with
    # attention_heads), and every layer's sublayer norms. Switchable mid-run (set_options): shown from the next step.
    attention: bool = False
    attention_heads: bool = False
    attention_top: int = 8
    sublayers: bool = False

    def __post_init__(self) -> None:
        """Checked here, once: an invalid RunOptions cannot exist."""
        n = self.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SettingsError(f"max-new-tokens must be an integer >= 1, got {n!r}")
        c = self.top_candidates
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise SettingsError(f"top-candidates must be an integer >= 1, got {c!r}")
        k = self.prefill_chunk
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise SettingsError(f"prefill chunk must be an integer >= 1 token, got {k!r}")
        if not isinstance(self.ignore_eos, bool):
            raise SettingsError(f"ignore-eos must be true or false, got {self.ignore_eos!r}")
        if not isinstance(self.logit_lens, bool):
            raise SettingsError(f"logit-lens must be true or false, got {self.logit_lens!r}")
        if not isinstance(self.time_stages, bool):
            raise SettingsError(f"time-stages must be true or false, got {self.time_stages!r}")
        for name in ("attention", "attention_heads", "sublayers"):
            if not isinstance(getattr(self, name), bool):
                raise SettingsError(f"{name.replace('_', '-')} must be true or false, got {getattr(self, name)!r}")
        t = self.attention_top
        if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= 4096:
            raise SettingsError(f"attention-top must be an integer from 1 to 4096, got {t!r}")

