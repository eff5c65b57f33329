"""Apps for the snapshots of the one-pass panel (issue 16): the dashboard on the scripted engine, its steps carrying
a made-up timing split and the sampler's shape (the fields the real engine fills in), `TimedEngine` below."""

from __future__ import annotations

import math
from dataclasses import replace

from fakes import FACTS, ScriptedEngine, make_loader, wait_for
from snapshot_apps import SnapshotApp

from tokentui.core.runs.events import StepEvent, StepTiming
from tokentui.core.settings import SamplerSettings
from tokentui.tui import DashboardConfig

TIED = replace(FACTS, tied_lm_head=True)  # Qwen3-0.6B ties its LM head to the embedding
SAMPLED = SamplerSettings(temperature=0.7, top_p=0.9)


def split_of(step: StepEvent) -> StepTiming:
    """A made-up timing that tiles the scripted step's latency: forward = latency - 2, select 1.2, copy 0.3,
    detok 0.5; the UI held the engine 0.4 ms before it. 8 bytes per id in (the 13 prompt ids for the first step),
    96 out."""
    return StepTiming(forward_ms=step.latency_ms - 2.0, select_ms=1.2, copy_ms=0.3, detok_ms=0.5, wait_ms=0.4,
                      h2d_bytes=8 * (13 if step.index == 0 else 1), d2h_bytes=96)


def temp_entropy(step: StepEvent) -> float | None:
    """Entropy (bits) of the candidates' raw probabilities reshaped by the step's temperature (None: greedy)."""
    t = step.settings.temperature
    if step.greedy or t == 0:
        return None
    weights = [c.raw_prob ** (1 / t) for c in step.candidates]
    total = sum(weights)
    return -sum(w / total * math.log2(w / total) for w in weights if w)


class TimedEngine(ScriptedEngine):
    """The scripted engine with issue 16's fields on each step (the timing split above, the entropy after
    temperature, what top-k and top-p kept) and the facts' `tied_lm_head`; `untimed`: step indexes left without
    timing (as in a record from before it was measured)."""

    def __init__(self, *args, untimed=(), facts=TIED, **kwargs):
        super().__init__(*args, facts=facts, **kwargs)
        self.untimed = set(untimed)

    def _step(self, index, scripted, s, changed, n_prompt, force=None) -> StepEvent:
        step = super()._step(index, scripted, s, changed, n_prompt, force)
        kept = None if step.greedy else step.kept_count
        return replace(step, timing=None if index in self.untimed else split_of(step),
                       temp_entropy_bits=temp_entropy(step),
                       top_k_kept=min(s.top_k, len(step.candidates)) if s.top_k and kept is not None else None,
                       top_p_kept=kept if s.top_p < 1 and kept is not None else None)


def anatomy_app() -> SnapshotApp:
    engine = TimedEngine(sampler=SAMPLED)
    config = DashboardConfig(load=make_loader(engine), sampler=SAMPLED, options=engine.options, user_theme_dir=None,
                             recorder=None)
    return SnapshotApp(config)


async def _repaint(pilot) -> None:
    await pilot.pause(0.1)
    pilot.app.redraw()
    await pilot.pause()


async def view_step_4(pilot) -> None:
    """run_before: the finished run, the cursor at step 4 ("␣Some": three tokens kept) by keys: < then ] ] ]."""
    app = pilot.app
    await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the run to finish")
    await pilot.press("less_than_sign", *["right_square_bracket"] * 3)
    await _repaint(pilot)


async def press_a_at_step_4(pilot) -> None:
    """run_before for a small terminal: `a` shows the panel (in the candidates' place), at step 4."""
    await view_step_4(pilot)
    await pilot.press("a")
    await _repaint(pilot)
