"""Inside one block, for the step's new token (issue 39): where its query looks, and what each sublayer adds.

These are the typed values a StepEvent carries (`StepEvent.attention`, `StepEvent.sublayers`, core/runs/events.py)
from the model process to the dashboard, into `--headless --json` and into run records; core/model/observe/
attention.py and sublayers.py compute them. Plain data, no torch: checked where they are built (a record is outside
input, and core/runs/record_reader.py builds these from it), so a value out of range cannot exist.

Which query: a step's token is chosen from the scores of the forward that fed the position before it (the prompt's
last token for step 0, the previous step's token after that), so a step's attention is that forward's last query:
the query at position `query` looking at the keys of positions 0..query (itself included), as the logit lens of a
step is that forward's. Positions count from the prompt's first token (0) through the answer, as the prompt's ids
followed by the steps' ids do.

JSON (`to_dict()`, asdict's form): a LayerAttention is {"layer", "query", "window", "top": [[position, weight],
...], "heads": [[[position, weight], ...] per head] or null}; a SublayerRow is {"layer", "resid_before",
"attn_norm", "mlp_norm", "resid_after", "after_attn", "after_mlp"} with the two lens rows as LensRow objects or null.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .events import LensRow
from .pickling import install_fast_pickling

# How many source positions a layer's `top` keeps: `--attention` writes 8 per layer (issue 39); the dashboard may ask
# for more (RunOptions.attention_top) to paint its heat strip.
ATTENTION_TOP = 8
MAX_ATTENTION_TOP = 4096  # a bound for records (outside input): no view shows more per layer
_WEIGHT_SLACK = 1e-4  # float rounding's overshoot allowed on a weight (as the record reader allows on probabilities)

Sources = tuple[tuple[int, float], ...]  # (position, weight) pairs, the highest weight first


def _sources(value, query: int, window: int | None, where: str) -> Sources:
    """`value` (pairs as tuples, or a record's lists) checked and normalised: positions integers the query could
    see (0..query, inside the window), weights finite in 0..1, highest first, each position once, their sum <= 1."""
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{where} should be a list of [position, weight] pairs, got {type(value).__name__}")
    if len(value) > MAX_ATTENTION_TOP:
        raise ValueError(f"{where} has {len(value)} pairs, more than {MAX_ATTENTION_TOP}")
    first = visible_from(query, window)
    pairs = []
    seen = set()
    for n, pair in enumerate(value):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"{where}[{n}] should be a [position, weight] pair")
        position, weight = pair
        if isinstance(position, float) and position.is_integer():
            position = int(position)  # JSON numbers written as 3.0 by another writer
        if isinstance(position, bool) or not isinstance(position, int) or not first <= position <= query:
            raise ValueError(f"{where}[{n}]: position {position!r} is not one the query at {query} sees "
                             f"({first}..{query})")
        if position in seen:
            raise ValueError(f"{where}[{n}]: position {position} twice")
        seen.add(position)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                or not -_WEIGHT_SLACK <= weight <= 1 + _WEIGHT_SLACK:
            raise ValueError(f"{where}[{n}]: weight {weight!r} is not in 0..1")
        pairs.append((position, float(weight)))
    if any(a[1] < b[1] for a, b in zip(pairs, pairs[1:])):
        raise ValueError(f"{where}: pairs should come highest weight first")
    if sum(w for _, w in pairs) > 1 + _WEIGHT_SLACK * max(1, len(pairs)):
        raise ValueError(f"{where}: weights add up to more than 1")
    return tuple(pairs)


def visible_from(query: int, window: int | None) -> int:
    """The first position the query at `query` sees: 0, or with a sliding window of `window` positions (its own
    included, as transformers' sliding masks count them) query - window + 1."""
    return 0 if window is None else max(0, query - window + 1)


@dataclass(frozen=True, slots=True)
class LayerAttention:
    """One decoder layer's attention for the step's token (the module docstring says which query).

    layer: 1..L, as LensRow.layer. query: the query's position. window: the sliding window this layer sees through
    (None: every earlier position; chunked layers give the size their mask allows at this position). top: the
    positions with the highest head-mean weight (the mean over the query heads of softmax(q·k / sqrt(d)) as
    transformers' eager attention computes it), highest first, up to RunOptions.attention_top of them; positions the
    layer cannot see are never listed (their weight is 0). heads: the same per query head (None: not asked for,
    `--attention-heads`)."""

    layer: int
    query: int
    window: int | None
    top: tuple[tuple[int, float], ...]
    heads: tuple[tuple[tuple[int, float], ...], ...] | None = None

    def __post_init__(self) -> None:
        for name in ("layer", "query"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "layer" else 0):
                raise ValueError(f"attention {name} should be an integer >= {1 if name == 'layer' else 0}, "
                                 f"got {value!r}")
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, int)
                                        or self.window < 1):
            raise ValueError(f"attention window should be an integer >= 1 or null, got {self.window!r}")
        where = f"attention layer {self.layer}"
        object.__setattr__(self, "top", _sources(self.top, self.query, self.window, f"{where} top"))
        if self.heads is not None:
            if not isinstance(self.heads, (tuple, list)) or not self.heads:
                raise ValueError(f"{where} heads should be a non-empty list, one entry per head")
            object.__setattr__(self, "heads", tuple(
                _sources(h, self.query, self.window, f"{where} head {n}") for n, h in enumerate(self.heads)))

    @property
    def first_visible(self) -> int:
        """The first position this layer's query sees (0 without a window)."""
        return visible_from(self.query, self.window)

    @property
    def rest(self) -> float:
        """The head-mean weight on the positions `top` leaves out (1 less what it lists; never below 0)."""
        return max(0.0, 1.0 - sum(w for _, w in self.top))


def _norm(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where} should be a finite number >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class SublayerRow:
    """What decoder layer `layer` (1..L) did to the residual stream at the new token's position (the query
    position of LayerAttention), as Euclidean norms of [hidden] vectors, in float32:

    resid_before: the stream entering the layer (the embedding for layer 1); resid_after: leaving it (the block's
    output, what the logit lens reads); attn_norm: what the attention sublayer added to the stream (after a
    post-attention norm where the family has one, e.g. Gemma 2); mlp_norm: what the MLP (or mixture of experts)
    added. resid_after = resid_before + attention's + MLP's contributions, as vectors.
    after_attn / after_mlp: the logit lens's top token read from the stream after the attention sublayer (before
    the MLP) and after the MLP (= the lens's row for this layer); None when the lens is off or not available."""

    layer: int
    resid_before: float
    attn_norm: float
    mlp_norm: float
    resid_after: float
    after_attn: LensRow | None = None
    after_mlp: LensRow | None = None

    def __post_init__(self) -> None:
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 1:
            raise ValueError(f"sublayer layer should be an integer >= 1, got {self.layer!r}")
        for name in ("resid_before", "attn_norm", "mlp_norm", "resid_after"):
            object.__setattr__(self, name, _norm(getattr(self, name), f"layer {self.layer} {name}"))
        for name in ("after_attn", "after_mlp"):
            row = getattr(self, name)
            if row is not None and not isinstance(row, LensRow):
                raise TypeError(f"layer {self.layer} {name} should be a LensRow, got {type(row).__name__}")


def sink_positions(prompt_specials: list[bool] | tuple[bool, ...], step_specials=()) -> frozenset[int]:
    """The positions a view marks as attention sinks: the first token, and every special token (the prompt's
    pieces' `special` flags in order, then the steps' `special` flags, as their positions follow the prompt)."""
    flags = list(prompt_specials) + list(step_specials)
    return frozenset({0} | {n for n, special in enumerate(flags) if special}) if flags else frozenset()


install_fast_pickling(globals())  # pickled with every step the model process sends, as events.py's classes are
