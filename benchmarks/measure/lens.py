"""7: the logit lens's cost per decode step (--logit-lens off and on, interleaved)."""

from __future__ import annotations

from tokentui.core.model.engine import Engine  # noqa: E402
from tokentui.core.settings import RunOptions, SamplerSettings  # noqa: E402
from measure.common import log, med, run_engine  # noqa: E402


LENS_TOKENS = 64


def bench_lens(loaded, reps: int) -> dict:
    """The logit lens's cost per decode step: the same greedy LENS_TOKENS-token run with it off and on, interleaved,
    on the same model; medians over the decode steps of every repetition. The lens is computed after the forward,
    so it shows in a step's latency_ms; forward_ms shows what asking for the hidden states adds to the forward."""
    greedy = SamplerSettings(temperature=0.0)
    engines = {name: Engine(loaded, greedy, RunOptions(max_new_tokens=LENS_TOKENS, ignore_eos=True, logit_lens=on))
               for name, on in (("off", False), ("on", True))}
    step_ms: dict[str, list[float]] = {"off": [], "on": []}
    forward_ms: dict[str, list[float]] = {"off": [], "on": []}
    ids: dict[str, list[int]] = {}
    for rep in range(reps):
        for name, engine in engines.items():
            got, _, steps, _ = run_engine(engine)
            assert all((s.lens is not None) == (name == "on") for s in steps), "the lens was not where asked for"
            assert ids.setdefault(name, got) == got
            step_ms[name] += [s.latency_ms for s in steps[1:]]
            forward_ms[name] += [s.forward_ms for s in steps[1:]]
        log(f"  lens rep {rep + 1}/{reps}: step off {med(step_ms['off']):.1f} ms, on {med(step_ms['on']):.1f} ms")
    assert ids["on"] == ids["off"], "the logit lens changed the tokens"
    off, on = med(step_ms["off"]), med(step_ms["on"])
    return {"off_ms": off, "on_ms": on, "extra_ms": on - off, "ratio": on / off, "layers": loaded.facts.layers,
            "forward_off_ms": med(forward_ms["off"]), "forward_on_ms": med(forward_ms["on"]), "reps": reps}
