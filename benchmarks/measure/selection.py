"""3: selection + reporting (select()) as a share of a decode step, on random and on the model's own scores."""

from __future__ import annotations

import statistics
import time
import torch  # noqa: E402
from tokentui.core.model.engine import Engine  # noqa: E402
from tokentui.core.steps.select import native_op, select  # noqa: E402
from tokentui.core.samplers import ChainInput  # noqa: E402
from tokentui.core.settings import SamplerSettings  # noqa: E402
from measure.common import med, run_engine  # noqa: E402


SELECT_CASES = {
    "greedy": SamplerSettings(temperature=0.0),
    "T=0.7, top-p 0.9": SamplerSettings(temperature=0.7, top_p=0.9),
    "T=0.7, top-p off": SamplerSettings(temperature=0.7, top_p=1.0),
    "T=0.7, top-k 50, top-p 0.95": SamplerSettings(temperature=0.7, top_k=50, top_p=0.95),
    # issue 38: every stage on (Mirostat 2.0 replaces the chain, so not with it), over a 256-token history
    "every stage on": SamplerSettings(temperature=0.7, dynatemp_range=0.2, top_k=50, top_p=0.95, min_p=0.02,
                                      typical_p=0.95, top_n_sigma=3.0, repeat_penalty=1.1, presence_penalty=0.2,
                                      frequency_penalty=0.1, dry_multiplier=0.8, xtc_probability=0.5,
                                      xtc_threshold=0.1, logit_bias=((13, -2.0), (42, 1.0))),
}
HISTORY = ChainInput(ids=[(i * 7919) % 40_000 for i in range(256)])  # what the penalties and DRY look back at
def real_scores(loaded, prompt_ids: list[int], n: int = 16) -> list[torch.Tensor]:
    """The model's own scores for its first n greedy steps on the benchmark prompt."""
    x = torch.tensor([prompt_ids])
    out = loaded.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                eos_token_id=-1, output_scores=True, return_dict_in_generate=True)
    return [s[0].float() for s in out.scores]


def bench_select(step_ms: float, threads: int, real: list[torch.Tensor], reps: int = 200) -> dict:
    """select() per setting on random N(0, sigma^2) logits, sigma = the model's own score spread, at both vocabulary
    sizes (the targets), and on the model's own scores (V = 49,152; not a target). Gaussian scores are a hard case
    for top-p: their nucleus holds hundreds to thousands of tokens, where real next-token distributions have a
    perplexity of ~10. `ms` is select() as a run calls it (on CPU the one C++ call where tokentui's library
    builds); `torch_ms` the torch operations it runs otherwise (accelerators, no compiler), timed alternately in
    the same loop (absent where the native call is not available: then `ms` is the torch path)."""
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    src = torch.Generator().manual_seed(1)
    sigma = statistics.median(float(s.std()) for s in real)
    out: dict = {"sigma": sigma}
    paths = (None, False) if native_op() is not None else (None,)
    for vocab in (49152, 151936, "real"):
        if vocab == "real":
            logits = real
        else:
            logits = [torch.randn(vocab, generator=src) * sigma for _ in range(16)]
        for name, settings in SELECT_CASES.items():
            times: dict = {path: [] for path in paths}
            for i in range(reps + 20):
                x = logits[i % len(logits)]
                for path in paths:
                    start = time.perf_counter()
                    select(x, settings, gen, 10, native=path, given=HISTORY)
                    times[path].append((time.perf_counter() - start) * 1000)
            ms = med(times[None][20:])
            out[(vocab, name)] = {"ms": ms, "share": ms / (step_ms + ms)}
            if False in times:
                out[(vocab, name)]["torch_ms"] = med(times[False][20:])
    return out


def engine_overhead(engine: Engine) -> dict:
    """In a real run: the step's time outside the model (selection, reporting, detokenizing, the event) as a share."""
    _, done, steps, _ = run_engine(engine)
    decode = steps[1:]
    outside = [s.latency_ms - s.forward_ms for s in decode]
    total = [s.latency_ms for s in decode]
    return {"outside_ms": med(outside), "step_ms": med(total), "share": med(outside) / med(total)}
