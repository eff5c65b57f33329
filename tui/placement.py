"""Where the logit lens (`l`) and the one-pass panel (`a`) go at a terminal size, as a pure function of the size's
plan (tui/sizes.py) and what is on. Plain Python, no Textual: the app applies the answer to its widgets.

- The one-pass panel has a row of its own at >= 160x48, where it is on by default; on a smaller terminal `a` shows
  it (`anatomy-side`) in the model panel's place, or the candidates' where there is no model panel.
- The lens takes the model panel's place where there is one, else the candidates'.
- When both want the same place, the one turned on last has it and the other waits behind it (`a` on a waiting
  one-pass panel brings it forward).
"""

from __future__ import annotations

from dataclasses import dataclass

ROW_ID = "anatomy"  # the one-pass panel's own row
SIDE_ID = "anatomy-side"  # the one-pass panel standing in the model panel's (or the candidates') place


@dataclass
class SidePlace:
    """Which of the lens and the one-pass panel was turned on last (the one the shared place shows)."""

    latest: str = "anatomy"
    lens_seen: bool = False


@dataclass(frozen=True)
class Placement:
    model: bool
    candidates: bool
    lens: bool
    row: bool  # the one-pass panel in its own row
    side: bool  # the one-pass panel in the shared place

    @property
    def anatomy_shown(self) -> bool:
        return self.row or self.side


def place(layout, lens_on: bool, anatomy_on: bool, side: SidePlace) -> Placement:
    """What shows, for `layout` (tui/sizes.py's plan) with the lens and the one-pass panel on or off."""
    has_model = layout.shows("model")
    if lens_on and not side.lens_seen:
        side.latest = "lens"  # the lens was just turned on: it takes the place
    side.lens_seen = lens_on
    row = anatomy_on and layout.shows(ROW_ID)
    side_panel = anatomy_on and not row
    lens = lens_on
    if side_panel and lens:  # both want the same place: the one turned on last has it
        if side.latest == "lens":
            side_panel = False
        else:
            lens = False
    takes_model = (lens or side_panel) and has_model
    takes_candidates = (lens or side_panel) and not has_model
    return Placement(model=has_model and not takes_model, candidates=not takes_candidates, lens=lens, row=row,
                     side=side_panel)


def anatomy_default(layout, served: bool) -> bool:
    """Whether the one-pass panel is on when `a` has not said: where its row is (not for a served model, whose
    passes are the server's: it would only say it is not available)."""
    return layout.shows(ROW_ID) and not served
