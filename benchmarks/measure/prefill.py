"""6: prefill time for 32 / 256 / 1,024 / 2,048-token prompts, the engine against a plain forward."""

from __future__ import annotations

import time
import torch  # noqa: E402
from tokentui.core.model.decode.steps import TorchForward  # noqa: E402
from tokentui.core.steps.prefill import prefill  # noqa: E402
from tokentui.core.model.speed import SpeedOptions, use_threads  # noqa: E402
from measure.common import NEW_TOKENS, ROOT, TORCH_DEFAULT_THREADS, log, med  # noqa: E402


def bench_prefill(loaded, stock, reps: int) -> dict:
    """The engine's prefill (its model re-laid) against a plain forward of the stock copy at torch's defaults."""
    model = loaded.model
    speed = SpeedOptions()
    text = (ROOT / "README.md").read_text(encoding="utf-8") * 4
    pool = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    out = {}
    for n in (32, 256, 1024, 2048):
        ids = pool[:n]
        assert len(ids) == n
        series: dict[str, list[float]] = {"engine": [], "plain": []}
        for _ in range(reps):
            cache, _ = TorchForward(model).new_cache(n, NEW_TOKENS)  # a run's cache, prefilled eagerly
            use_threads(torch.device("cpu"), speed.prefill_thread_count(n))
            _, ms = prefill(model, ids, cache)
            series["engine"].append(ms)
            torch.set_num_threads(TORCH_DEFAULT_THREADS)  # what a plain forward / generate's prefill gets
            from transformers import DynamicCache

            with torch.inference_mode():
                start = time.perf_counter()
                stock.model(input_ids=torch.tensor([ids]), past_key_values=DynamicCache(config=model.config),
                      use_cache=True, logits_to_keep=1)
                series["plain"].append((time.perf_counter() - start) * 1000)
        out[n] = {"engine_ms": med(series["engine"]), "plain_ms": med(series["plain"]),
                  "threads": speed.prefill_thread_count(n)}
        log(f"  prefill {n}: engine {out[n]['engine_ms']:.0f} ms, plain forward {out[n]['plain_ms']:.0f} ms")
    use_threads(torch.device("cpu"), speed.decode_threads())
    return out
