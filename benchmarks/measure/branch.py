"""8: a branch reusing the parent run's KV cache: time to its first new token / prefill of the same prefix."""

from __future__ import annotations

import time
import torch  # noqa: E402
from tokentui.core.model.decode.steps import TorchForward  # noqa: E402
from tokentui.core.model.engine import Engine  # noqa: E402
from tokentui.core.runs.events import StepEvent  # noqa: E402
from tokentui.core.steps.prefill import prefill  # noqa: E402
from tokentui.core.settings import RunOptions, SamplerSettings  # noqa: E402
from tokentui.core.model.speed import use_threads  # noqa: E402
from measure.common import ROOT, log, med, run_engine  # noqa: E402


BRANCH_PREFIX = 256


def bench_branch(loaded, reps: int) -> dict:
    """A branch at a BRANCH_PREFIX-token prefix (prompt + the parent's tokens before the step), three contenders
    interleaved on one engine: the branch reusing the parent's KV cache (the dashboard's case), the same branch with
    no cache held (`release_cache`: the prefix prefilled, as `tokentui branch` in a fresh process), and the engine's
    prefill of the prefix alone. "First new token" = the first token the branch selects after the forced one
    (forced step: one decode recomputing its scores; then one decode of the forced token); the forced step's own
    time is reported too. The target ratio is reuse / prefill alone."""
    from tokentui.core.model.branch import BranchPoint
    from tokentui.core.runs.events import BranchEvent

    tok = loaded.tokenizer
    pool = tok((ROOT / "README.md").read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    engine = Engine(loaded, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=64, ignore_eos=True))
    prompt = tok.decode(pool[:210])
    parent_ids, _, steps, prompt_ids = run_engine(engine, prompt)
    at = BRANCH_PREFIX - len(prompt_ids)
    assert 1 <= at < len(parent_ids), f"prompt of {len(prompt_ids)} tokens: no branch point at a {BRANCH_PREFIX} prefix"
    point = BranchPoint(tuple(prompt_ids), tuple(parent_ids[:at]), at, steps[at].candidates[1].id)
    engine.options = RunOptions(max_new_tokens=2, ignore_eos=True)  # the forced step and one more
    speed = engine.speed
    series: dict[str, list[float]] = {"reuse": [], "reuse_forced": [], "fresh": [], "prefill": []}
    ids: dict[str, list[int]] = {}
    for _ in range(reps):
        for name in ("reuse", "fresh"):
            if name == "fresh":
                engine.release_cache()
            start = time.perf_counter()
            times, got, reused = [], [], None
            for event in engine.branch(point):
                if isinstance(event, StepEvent):
                    times.append((time.perf_counter() - start) * 1000)
                    got.append(event.id)
                elif isinstance(event, BranchEvent):
                    reused = event.kv_reused_tokens
            assert (reused == BRANCH_PREFIX - 1) == (name == "reuse"), f"{name}: {reused} positions reused"
            assert ids.setdefault("branch", got) == got, "the branch gave other tokens without its cache"
            series[name].append(times[1])
            if name == "reuse":
                series["reuse_forced"].append(times[0])
        cache, _ = TorchForward(loaded.model).new_cache(BRANCH_PREFIX, 2)
        use_threads(torch.device("cpu"), speed.prefill_thread_count(BRANCH_PREFIX))
        _, ms = prefill(loaded.model, list(point.prompt_ids + point.tokens), cache)
        use_threads(torch.device("cpu"), speed.decode_threads())
        series["prefill"].append(ms)
        # the fresh branch left its own cache held, which holds the prefix: the next "reuse" reuses it
    out = {name: med(values) for name, values in series.items()}
    out.update(ratio=out["reuse"] / out["prefill"], forced_ratio=out["reuse_forced"] / out["prefill"],
               fresh_ratio=out["reuse"] / out["fresh"], prompt_tokens=len(prompt_ids), at=at, reps=reps)
    log(f"  branch at a {BRANCH_PREFIX}-token prefix: reuse {out['reuse']:.0f} ms to the first new token "
        f"(forced step {out['reuse_forced']:.0f} ms), no cache {out['fresh']:.0f} ms, prefill alone "
        f"{out['prefill']:.0f} ms: ratio {out['ratio']:.3f}")
    return out
