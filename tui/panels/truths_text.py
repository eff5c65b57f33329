"""The one-pass panel's small truths (issue 39, item 3) in words: the embedding table's shape, format and bytes, RoPE's
base (and scaling) with the rotation angle of the position in view for the first pairs of dimensions, and the
norms' epsilon — each from the model's own tensors (core/runs/truths.py, read off the loaded model), "not known"
where the model facts do not say. Plain functions of the facts and the step (tui/panels/anatomy.py draws them)."""

from __future__ import annotations

import math

from tokentui.core.runs.truths import rope_angles

from ..format import human_bytes

UNKNOWN = "not known"


def position_of(step) -> int:
    """The position the step's forward fed last (its query): the cache's length after it, less one."""
    return max(0, step.kv_tokens - 1)


def embedding_clause(truths, short: bool = False) -> str:
    if truths.embed_rows is None or truths.embed_cols is None:
        return "embedding table: " + UNKNOWN
    shape = f"[{truths.embed_rows:,} × {truths.embed_cols:,}]"
    held = []
    if truths.embed_format:
        held.append(truths.embed_format)
    if truths.embed_bytes:
        held.append(human_bytes(truths.embed_bytes))
    words = ("embedding " if short else "embedding table ") + shape
    return words + (" " + ", ".join(held) if held else "")


def _positions_kind(facts) -> str | None:
    """How the model's attention blocks know positions when not by rotary ones ("learned", "ALiBi", "none")."""
    anatomy = getattr(facts, "anatomy", None)
    kinds = {b.positions for b in anatomy.blocks if b.mixer == "attention"} if anatomy is not None else set()
    if kinds and "rotary" not in kinds:
        return "/".join(sorted(k or "unknown" for k in kinds))
    return None


def rope_clause(truths, facts, position: int, short: bool = False) -> str:
    """`RoPE θ 100,000 · position 117: pairs 1–3 at 3.32, 6.23, 0.35 rad (mod 2π)`: each pair turns by position ×
    its inverse frequency (θ^(−2i/d) for plain RoPE; the model's own frequencies, scaling included). Two clauses
    joined by " · " (`rope_clauses` splits them)."""
    other = _positions_kind(facts)
    if other is not None and truths.rope_theta is None and not truths.rope_inv_freq:
        return {"learned": "positions: a learned table (no RoPE)", "ALiBi": "positions: ALiBi (no RoPE)",
                "none": "positions: none (NoPE, no RoPE)"}.get(other, f"positions: {other} (no RoPE)")
    if truths.rope_theta is None and not truths.rope_inv_freq:
        return "RoPE: " + UNKNOWN
    base = f"{truths.rope_theta:,.0f}" if truths.rope_theta is not None and truths.rope_theta >= 1 else \
        (f"{truths.rope_theta:g}" if truths.rope_theta is not None else UNKNOWN)
    words = f"RoPE θ {base}"
    if truths.rope_type and truths.rope_type != "default":
        words += f" ({truths.rope_type} scaling)"
    angles = [a % (2 * math.pi) for a in rope_angles(truths, position)]
    if not angles:
        return words + "; the pairs' angles: " + UNKNOWN
    pairs = "pairs 1–" + str(len(angles)) if len(angles) > 1 else "pair 1"
    if short:
        return words + f" · pos {position}: " + ", ".join(f"{a:.2f}" for a in angles) + " rad"
    return words + f" · position {position}: {pairs} at " + ", ".join(f"{a:.2f}" for a in angles) + " rad (mod 2π)"


def norm_clause(truths) -> str:
    name = truths.norm or "norm"
    if truths.norm_eps is None:
        return f"{name} ε: " + UNKNOWN
    return f"{name} ε {truths.norm_eps:g}"


def truth_clauses(facts, step, short: bool = False) -> list[str]:
    """The three clauses for the step in view (none where the facts carry no truths: a record from before them)."""
    truths = getattr(facts, "truths", None)
    if truths is None:
        return []
    return [embedding_clause(truths, short), *rope_clause(truths, facts, position_of(step), short).split(" · "),
            norm_clause(truths)]
