"""The words of the one-pass panel (tui/panels/anatomy.py): times, shapes, where a stage runs, the LM head, the
parts' sum against the step's latency, and the entropy's path through the sampler — plain functions of a step."""

from __future__ import annotations

import textwrap

from tokentui.core.samplers import stage_summary

from ..format import human_bytes, percent

PART_FIELD = {"forward": "forward_ms", "select": "select_ms", "copy": "copy_ms", "detok": "detok_ms"}


def fmt_ms(value: float) -> str:
    """1 decimal; 2 below 1 ms (a copy of a few bytes takes hundredths)."""
    return f"{value:.2f}" if 0 < value < 0.995 else f"{value:.1f}"


def shape_text(shape) -> str:
    if shape is None:
        return "—"
    return "[" + ", ".join(str(n) for n in shape) + "]"


def stage_shapes(stage) -> str:
    """A stage's shape column: its tensor's shape, and the second tensor's where it makes two of different shapes
    (V unlike K, MLA's rotary key, a recurrent layer's second state): `[1, 128, 4] + [1, 4, 16, 16]`."""
    also = getattr(stage, "also", None)
    return shape_text(stage.shape) + (f" + {shape_text(also)}" if also is not None else "")


def shown_name(stage) -> str:
    """The name the panel gives a stage: its own, but the copy back to the host's, which is named by where it comes
    from ("host from the device": "host to the host" read like a typo where the CPU is both host and device)."""
    return "from the device" if (stage.where, stage.name) == ("host", "to the host") else stage.name


def device_label(device: str | None) -> str:
    """What the device column says: GPU for CUDA (ROCm too, which torch calls cuda), MPS, else the CPU itself."""
    kind = (device or "cpu").split(":")[0].lower()
    if kind == "cuda":
        return "GPU"
    if kind == "cpu":
        return "CPU"
    return kind.upper()[:4]


def head_words(tied: bool | None) -> str:
    return {True: "LM head tied", False: "LM head untied", None: "LM head tied or not: not known"}[tied]


def timing_sum(step) -> str | None:
    """`forward 41.2 + select 1.3 + copy 0.10 + detok 0.20 = 42.8 of 42.8 ms`: the four parts, which make up the
    step's latency, against it (None: no timing)."""
    t = step.timing
    if t is None:
        return None
    parts = [("forward", t.forward_ms), ("select", t.select_ms), ("copy", t.copy_ms), ("detok", t.detok_ms)]
    total = sum(v for _, v in parts)
    summed = " + ".join(f"{name} {fmt_ms(v)}" for name, v in parts)
    return summed + f" = {fmt_ms(total)} of {fmt_ms(step.latency_ms)} ms"


def waited(step) -> str:
    """How long the consumer held the engine before the step (not part of its latency)."""
    return f"waited {fmt_ms(step.timing.wait_ms)} ms for the UI"


def crossed(step) -> str:
    t = step.timing
    return f"crossed: {human_bytes(t.h2d_bytes)} host → device, {human_bytes(t.d2h_bytes)} device → host"


def bits(value: float) -> str:
    return f"{max(0.0, value):.2f}"  # no "-0.00" from rounding


def _greedy(step) -> bool:
    s = step.settings
    return step.greedy or s.greedy or s.temperature == 0


def _entropy_chain(step, raw_label: str, how: bool) -> str:
    """`entropy 3.43 bits{raw_label} → 2.10 at T 0.7[ (sharper, same order)] → 0.68 after the cut`."""
    s = step.settings
    raw = step.entropy_bits
    out = f"entropy {bits(raw)} bits{raw_label}"
    after_t = step.temp_entropy_bits
    if after_t is not None:
        out += f" → {bits(after_t)} at T {s.temperature:g}"
        if how:
            shape = "sharper" if after_t < raw - 0.005 else "flatter" if after_t > raw + 0.005 else "unchanged"
            out += f" ({shape}, same order)"
    return out + f" → {bits(step.sampled_entropy_bits)} after the cut"


def distribution_line(step) -> str:
    """The distribution's shape at this step in one line: entropy raw → after temperature (same order, reshaped)
    → after the cutting stages (core/samplers.py), what each kept, the kept mass."""
    s = step.settings
    if _greedy(step):
        return (f"distribution: greedy, the top score wins (entropy {bits(step.entropy_bits)} bits raw; nothing "
                "reshaped or cut)")
    cuts = stage_summary(s, step, exact=True)
    return (_entropy_chain(step, " raw", how=True)
            + f" · {', '.join(cuts)} · {step.kept_count:,} kept, {percent(step.kept_mass)} of the raw mass")


def entropy_path(step) -> str:
    """The entropy's path through the sampler, short: `entropy 2.17 bits → 1.50 at T 0.7 → 1.17 after the cut:
    same order, reshaped` (what each filter kept and the kept mass are on the sampler stages' own lines)."""
    if _greedy(step):
        return f"greedy: the top score wins, nothing reshaped (entropy {bits(step.entropy_bits)} bits raw)"
    return _entropy_chain(step, "", how=False) + ": same order, reshaped"


def wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, max(10, width), break_on_hyphens=False, break_long_words=True) or [""]
