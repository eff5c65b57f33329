"""The sampler chain as rows, for the selection panel (issue 38, 2): one row per stage that ran on the step, in the
chain's order — the stage, its setting, the candidates it kept, the probability mass it cut, the entropy after it —
then the kept set's totals. Plain text (rich), no widget: tui/panels/candidates.py places them. Also what that
panel draws for the step in view (`Shown`: the step, or its preview) and a cut row's "by <stage>" (`cut_by_text`).

Two sources. A step's report from the engine (core/runs/preview.py StageRow: the chain of core/steps/stages.py run
on the step's scores, while it stands still: tui/preview.py) gives every number. A step as its event carries it
(a run going on, a replay) gives what the event says: each stage's kept count where the step reports one
(core/samplers.py `Stage.kept`, the last cutting stage's being the step's kept_count), the entropy after the first
stage when it is temperature and after the last; the rest is shown as unknown ("—"), never made up.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text

from tokentui.core import samplers

from ..format import percent

DASH = "—"
SHORT_OF = {getattr(s, "label", None) or s.param.label: s.param.short_name for s in samplers.STAGES}  # "typ"


@dataclass(frozen=True)
class ChainRow:
    """One stage as the panel writes it: None where the source does not say."""

    label: str
    setting: str
    kept: int | None
    mass_cut: float | None
    entropy_bits: float | None


def _stage_label(stage) -> str:
    return getattr(stage, "label", None) or stage.param.label


def _cuts(stage) -> bool:
    """Whether a stage can set entries to -inf (temperature and the penalties reshape scores only)."""
    return getattr(stage, "cutting", stage.param.off is not None)


def _order(settings) -> list:
    """The stages that ran, in the chain's order (the registry's `chain_order` where it has one)."""
    order = getattr(samplers, "chain_order", None)
    return list(order(settings)) if order is not None else [s for s in samplers.STAGES if s.active(settings)]


def rows_of_report(stages) -> list[ChainRow]:
    """A step's report (StageRow, core/runs/preview.py): every number known."""
    return [ChainRow(s.label, s.setting, s.kept, s.mass_cut, s.entropy_bits) for s in stages]


def rows_of_step(step) -> list[ChainRow]:
    """A step as its event says it (see the module docstring); greedy: no stage ran."""
    settings = step.settings
    if step.greedy:
        return []
    stages = _order(settings)
    cutting = [s for s in stages if _cuts(s)]
    last_cut = cutting[-1] if cutting else None
    rows = []
    kept = None  # entries left so far (None: not known)
    for n, stage in enumerate(stages):
        if _cuts(stage):
            own = getattr(stage, "kept", None)
            kept = getattr(step, own, None) if own else (step.kept_count if stage is last_cut else None)
            mass = None
        else:
            mass = 0.0  # it reshapes the scores and cuts nothing
        entropy = None
        if n == len(stages) - 1:
            entropy = step.sampled_entropy_bits
        elif n == 0 and stage.name == "temperature":
            entropy = step.temp_entropy_bits
        rows.append(ChainRow(_stage_label(stage), stage.param.text(getattr(settings, stage.param.name)), kept, mass,
                             entropy))
    return rows


def _kept_text(kept: int | None, first: bool) -> str:
    if kept is None:
        return "all" if first else DASH
    return f"{kept:,}"


def table(rows: list[ChainRow], width: int, styles: dict) -> list[Text]:
    """The rows under a header, as many columns as `width` holds: every column with the stages' names, or with
    their short names ("temp") where that makes room for all; else the setting goes first, then the entropy; []
    when even the stage and its kept count do not fit."""
    if not rows:
        return []
    whole = _table(rows, width, styles)
    if len(whole) and whole[0].plain.split()[-1] == "bits" and "setting" in whole[0].plain:
        return whole
    short = [ChainRow(SHORT_OF.get(r.label, r.label), r.setting, r.kept, r.mass_cut, r.entropy_bits) for r in rows]
    brief = _table(short, width, styles)
    return brief if brief and len(brief[0].plain.split()) > len(whole[0].plain.split() if whole else []) else whole


def _table(rows: list[ChainRow], width: int, styles: dict) -> list[Text]:
    label_w = max(len("stage"), *(cell_len(r.label) for r in rows))
    setting_w = max(len("setting"), *(cell_len(r.setting) for r in rows))
    kept = [_kept_text(r.kept, n == 0) for n, r in enumerate(rows)]
    kept_w = max(len("kept"), *(len(k) for k in kept))
    cut = [DASH if r.mass_cut is None else percent(r.mass_cut) for r in rows]
    cut_w = max(len("cut p"), *(len(c) for c in cut))
    # entropy is >= 0; float32 rounding leaves -1e-9 where one candidate is left, which must not read "-0.00"
    ent = [DASH if r.entropy_bits is None else f"{max(0.0, r.entropy_bits):.2f}" for r in rows]
    ent_w = max(len("H bits"), *(len(e) for e in ent))
    columns = [("setting", setting_w), ("entropy", ent_w)]  # dropped in this order where the width is short
    base = label_w + 1 + kept_w + 1 + cut_w
    shown = []
    for name, w in columns:
        if base + sum(cw + 1 for _n, cw in shown) + w + 1 <= width:
            shown.append((name, w))
    if base > width:
        return []
    with_setting = any(n == "setting" for n, _w in shown)
    with_entropy = any(n == "entropy" for n, _w in shown)
    header = "stage".ljust(label_w) + (" " + "setting".ljust(setting_w) if with_setting else "") + " " + \
        "kept".rjust(kept_w) + " " + "cut p".rjust(cut_w) + (" " + "H bits".rjust(ent_w) if with_entropy else "")
    out = [Text(header, style=styles["header"])]
    for n, r in enumerate(rows):
        line = Text()
        line.append(r.label.ljust(label_w), styles["label"])
        if with_setting:
            line.append(" " + r.setting.ljust(setting_w), styles["value"])
        line.append(" " + kept[n].rjust(kept_w), styles["value"] if r.kept is not None else styles["muted"])
        line.append(" " + cut[n].rjust(cut_w), styles["value"] if r.mass_cut is not None else styles["muted"])
        if with_entropy:
            line.append(" " + ent[n].rjust(ent_w), styles["value"] if r.entropy_bits is not None else styles["muted"])
        out.append(line)
    return out


def cut_by_text(label: str | None, room: int) -> str:
    """Which stage cut a candidate, in the `room` cells of its bar: "by min-p", or the stage's short name where
    its label does not fit ("by typ"); "" where neither fits or no stage is known (the row then says "cut")."""
    if not label:
        return ""
    for name in (label, SHORT_OF.get(label, label)):
        if cell_len(f"by {name}") <= room:
            return f"by {name}"
    return ""


@dataclass(frozen=True)
class Shown:
    """What the panel draws for the step in view: the step as it ran (its event, maybe with the engine's report of
    it: `report`), or a preview of it under other settings (`previewed`); the fields the step's event names."""

    candidates: list
    id: int
    piece: str
    chosen_rank: int | None
    chosen_raw_prob: float | None
    chosen_prob: float | None
    kept_count: int | None
    kept_mass: float | None
    entropy_bits: float | None
    sampled_entropy_bits: float | None
    greedy: bool
    settings: object
    chain: list[ChainRow]
    previewed: bool = False

    @classmethod
    def of(cls, step, report=None) -> "Shown":
        """`step` (a StepEvent), with `report` (a StepPreview of it, core/runs/preview.py) where there is one: under
        the step's own settings it adds the chain's numbers and the stage that cut each candidate; under others it
        is a preview, its pick marked."""
        if report is None:
            return cls(list(step.candidates), step.id, step.piece, step.chosen_rank, step.chosen_raw_prob,
                       step.chosen_prob, step.kept_count, step.kept_mass, step.entropy_bits,
                       step.sampled_entropy_bits, step.greedy, step.settings, rows_of_step(step))
        previewed = report.settings != step.settings
        token = report.pick if previewed else step.id
        on = next((c for c in report.candidates if c.id == token), None)
        return cls(list(report.candidates), token, report.pick_piece if previewed else step.piece,
                   report.pick_rank if previewed else step.chosen_rank,
                   report.pick_raw_prob if previewed else on.raw_prob if on is not None else step.chosen_raw_prob,
                   report.pick_prob if previewed else on.prob if on is not None else step.chosen_prob,
                   report.kept_count, report.kept_mass,
                   report.entropy_bits, report.sampled_entropy_bits, report.greedy, report.settings,
                   rows_of_report(report.stages), previewed)
