"""Step 4's knobs, one row per parameter of the sampler chain (core/samplers.py: temperature, top-k, top-p, min-p,
greedy / sample, seed) — and which setting changed at which step."""

from __future__ import annotations

import textwrap

from rich.cells import cell_len
from rich.text import Text

from tokentui.core.samplers import PARAMS, param
from tokentui.core.settings import SamplerSettings

from ..format import fitting
from .base import Panel

LADDER = param("top_k")  # the one parameter whose keys walk a ladder of notches: the row shows the next ones

# A change asked for that the engine has not used yet, longest first: the first that fits is said.
PENDING_LIVE = ("changed: applies at the next step", "changed: from the next step", "changed: next step", "changed")
# A change previewed on the step in view (tui/preview.py): said instead, with the key that branches with it.
def previewed_forms(step: int) -> tuple[str, ...]:
    return (f"previewed on step {step} · enter branches", f"previewed on step {step} · enter",
            "preview · enter branches", "preview · enter", "preview")


PENDING_ENDED = ("changed: applies to the next run (r)", "changed: for the next run (r)", "changed: next run (r)",
                 "changed")


def room_for(history: list[str]) -> int:
    """Rows under the settings for the changes: "changed:" and the latest two (or the one there is)."""
    return 1 + min(len(history), 2)


SHORT_NAMES = {p.name: p.short_name for p in PARAMS}  # a setting's name in a change line ("temp 0.70→0.80")


def listed(p, s: SamplerSettings, brief: bool = False) -> bool:
    """Whether the panel lists parameter `p`: every setting that is on (and a stage's further settings while it is
    on), the ones with quick keys even when off (min-p), unless `brief` (one line); the chain's order only where it
    is not the default one (`S` changes it). The rest — a dozen stages off by default — are the editor's (`S`)."""
    if p.kind is str:  # the order (--samplers)
        return getattr(s, p.name) != p.default
    return not p.quiet(s) or (not brief and p.keys is not None)


def describe(s: SamplerSettings, brief: bool = False) -> dict[str, str]:
    """The panel's rows: one per sampler parameter listed (`listed`), its row name and its value in full;
    `brief` (one line) leaves out the stages that are off and need not say so (min-p off)."""
    return {p.row_name: p.long_text(p.shown(s)) for p in PARAMS if listed(p, s, brief)}


def setting_value(name: str, value) -> str:
    """One setting's value as the panel writes it (from a field of a step's SamplerSettings: the raw value)."""
    return param(name).text(value) if value is not None else "—"


def describe_change(change) -> list[str]:
    """`step 12 temp 0.70→0.80`, one string per setting that changed at that step."""
    return [f"step {change.step} {SHORT_NAMES.get(name, name)} {setting_value(name, old)}→{setting_value(name, new)}"
            for name, old, new in change.changes]


def latest_forms(changes) -> tuple[str, ...]:
    """The latest step's changes on one line, every setting changed at it (issue 40: a one-line panel said only
    the last of several), longest wording first: `step 12 temp 0.70→0.80, top-p 0.90→0.95`, `step 12 temp→0.80,
    top-p→0.95`, `step 12: temp, top-p changed`, `step 12: temp, top-p`, `step 12: 2 changes`. () when nothing
    changed."""
    if not changes:
        return ()
    change = changes[-1]
    names = [SHORT_NAMES.get(name, name) for name, _old, _new in change.changes]
    full = ", ".join(f"{short} {setting_value(name, old)}→{setting_value(name, new)}"
                     for short, (name, old, new) in zip(names, change.changes))
    brief = ", ".join(f"{short}→{setting_value(name, new)}"
                      for short, (name, _old, new) in zip(names, change.changes))
    step = f"step {change.step}"
    return (f"{step} {full}", f"{step} {brief}", f"{step}: {', '.join(names)} changed", f"{step}: {', '.join(names)}",
            f"{step}: {len(names)} change{'s' if len(names) != 1 else ''}")


def short_values(s: SamplerSettings, brief: bool = False, beside: SamplerSettings | None = None) -> dict[str, str]:
    """The settings in short form, for the time-travel view (the settings in force at a past step beside the live
    ones the keys change); `brief` as for `describe`; `beside`: also what those settings list (so the two views
    have the same rows)."""
    return {p.short_name: p.text(p.shown(s)) for p in PARAMS
            if listed(p, s, brief) or (beside is not None and listed(p, beside, brief))}


class SamplerPanel(Panel):
    TITLE = "4 sampler"

    COMPONENT_CLASSES = {"sampler--label", "sampler--value", "sampler--changed", "sampler--muted"}

    DEFAULT_CSS = """
    SamplerPanel {
        & > .sampler--label { color: $text-muted; }
        & > .sampler--value { color: $accent; text-style: bold; }
        & > .sampler--changed { color: $success; }
        & > .sampler--muted { color: $text-muted; }
    }
    """

    def __init__(self, *args, asked=None, replaying: bool = False, previews=None, **kwargs) -> None:
        """`asked()`: the settings asked for, read from their owner (the engine's client, through the controller)
        at each paint, never copied here. A replay (`replaying`) has none: it shows the recorded ones. `previews`:
        the dashboard's StepPreviews (tui/preview.py): a change previewed on the step in view is said so."""
        super().__init__(*args, **kwargs)
        self._asked = asked or SamplerSettings
        self.replaying = replaying
        self._previews = previews

    def build(self, state) -> Text:
        if self.replaying:
            return self._recorded(state)
        settings = self._asked()
        label = self.style_of("sampler--label")
        value = self.style_of("sampler--value")
        changed = self.style_of("sampler--changed")
        muted = self.style_of("sampler--muted")
        values = describe(settings)
        in_force = state.last_step.settings if state.last_step is not None else None
        differs = in_force is not None and in_force != settings  # both SamplerSettings
        width = self.content_size.width or 26
        height = self.content_size.height or 1
        # what a change asked for waits for, said whole in the room there is (never "changed: applies" cut off)
        waiting = (PENDING_LIVE if state.running else PENDING_ENDED) if differs else ()
        if self._previews is not None and self._previews.differs:  # shown on the step in view: enter takes it
            waiting = previewed_forms(state.view_step.index + 1)
        pending = Text(fitting(waiting, width), changed) if waiting else Text()
        history = [line for change in state.settings_changes for line in describe_change(change)]
        if history and height - len(values) < room_for(history):  # a quiet stage that is off gives its row up
            values = describe(settings, brief=True)
        viewed = state.view_step if not state.live else None
        if viewed is not None:  # the time-travel cursor holds a past step: its settings beside the live ones
            return self._travel(viewed, settings, width, height, pending, history)
        out = Text()
        if height < 4:  # one line: every value (but a quiet stage that is off), then the latest change
            notes = waiting or latest_forms(state.settings_changes)
            for labelled in (True, False):  # "sample" / "greedy" says what it is: its label goes to make room
                out = Text()
                for n, (key, val) in enumerate(describe(settings, brief=True).items()):
                    if n:
                        out.append(" · ", muted)
                    if labelled or key != "mode":
                        out.append(("temp" if key == "temperature" else key) + " ", label)
                    out.append(val.replace(" (greedy)", "").replace(" (off)", ""), value)
                note = fitting(notes, width - cell_len(out.plain) - 3)  # after " · "
                if note or not notes:
                    break
            if note:
                out.append(" · ", muted)
                out.append(note, changed)
            return out
        for n, (key, val) in enumerate(values.items()):
            if n:
                out.append("\n")
            out.append(f"{key:<12}", label)
            out.append(val, value)
            if key == LADDER.label:  # the notches its keys move to, so the ladder is visible
                value_now = getattr(settings, LADDER.name)
                down, up = LADDER.nudge(value_now, -1), LADDER.nudge(value_now, +1)
                hint = f"  {LADDER.keys[0]}→{down or 'off'} {LADDER.keys[1]}→{up or 'off'}"
                if 12 + len(val) + len(hint) <= width:
                    out.append(hint, muted)
        rows_left = height - len(values)
        if waiting and rows_left > 0:
            # the whole note over the lines it needs, broken between words, where there are rows for it
            wrapped = textwrap.wrap(waiting[0], width)
            for line in wrapped if len(wrapped) <= min(2, rows_left) else [pending.plain]:
                out.append("\n")
                out.append(line, changed)
                rows_left -= 1
        if history and rows_left > 0:
            shown = history[-(rows_left - 1):] if rows_left > 1 else history[-1:]
            if rows_left > 1:
                out.append("\n")
                out.append("changed (latest last):" if len(history) > 1 else "changed:", muted)
            for line in shown:
                out.append("\n")
                out.append(line, changed)
        elif not history and not pending and in_force is not None and rows_left > 0:
            out.append("\n")
            out.append("unchanged since step 1", muted)
        return out

    def _recorded(self, state) -> Text:
        """A replay: the settings the step in view was taken with (the record's), and the changes the record
        holds up to it — nothing about a next run, which a replay does not have."""
        label = self.style_of("sampler--label")
        value = self.style_of("sampler--value")
        changed = self.style_of("sampler--changed")
        muted = self.style_of("sampler--muted")
        step = state.view_step
        height = self.content_size.height or 1
        if step is None:
            return Text("recorded settings: from the first step", style=muted)
        values = describe(step.settings)
        upto = step.index + 1
        history = [line for change in state.settings_changes if change.step <= upto
                   for line in describe_change(change)]
        if history and height - len(values) < room_for(history):  # as for the live settings
            values = describe(step.settings, brief=True)
        out = Text()
        if height < 4:
            out.append("recorded ", label)
            for n, (key, val) in enumerate(describe(step.settings, brief=True).items()):
                if n:
                    out.append(" · ", muted)
                out.append(("temp" if key == "temperature" else key) + " ", label)
                out.append(val.replace(" (greedy)", "").replace(" (off)", ""), value)
            upto_changes = [change for change in state.settings_changes if change.step <= upto]
            note = fitting(latest_forms(upto_changes), (self.content_size.width or 26) - cell_len(out.plain) - 3)
            if note:  # whole, or not at all
                out.append(" · ", muted)
                out.append(note, changed)
            return out
        for n, (key, val) in enumerate(values.items()):
            if n:
                out.append("\n")
            out.append(f"{key:<12}", label)
            out.append(val, value)
        rows_left = height - len(values)
        if rows_left > 0:
            out.append("\n")
            out.append(f"as recorded at step {upto}", muted)
            rows_left -= 1
        if history and rows_left > 0:
            for line in history[-rows_left:]:
                out.append("\n")
                out.append(line, changed)
        elif rows_left > 0:
            out.append("\n")
            out.append("unchanged since step 1", muted)
        return out

    def _travel(self, step, live: SamplerSettings, width: int, height: int, pending: Text, history: list[str]) -> Text:
        """The settings in force at the viewed step (what that step used) beside the live settings (what the keys
        change, applied to the run going on underneath); live values that differ are marked."""
        label = self.style_of("sampler--label")
        value = self.style_of("sampler--value")
        changed = self.style_of("sampler--changed")
        muted = self.style_of("sampler--muted")
        then, now = short_values(step.settings, beside=live), short_values(live, beside=step.settings)
        number = f"step {step.index + 1}"
        out = Text()
        if height < 4:  # one line: the step's values, then what live has differently
            differing = [f"{key} {now[key]}" for key in now if now[key] != then[key]]
            for spaced in (True, False):
                out = Text(no_wrap=True, overflow="ellipsis")
                sep = " · " if spaced else " "
                out.append(number + ": ", label)
                for n, (key, val) in enumerate(short_values(step.settings, brief=True).items()):
                    if n:
                        out.append(sep, muted)
                    if key != "mode":  # "sample" / "greedy" says what it is
                        out.append(key + " ", label)
                    out.append(val, value)
                out.append(" │ live ", label)
                out.append((" · " if spaced else ", ").join(differing), changed)
                if not differing:
                    out.append("same", muted)
                if out.cell_len <= width:
                    break
            out.truncate(width, overflow="ellipsis")
            return out
        key_w = max(len(k) for k in then) + 1
        then_w = max(len(number), *(len(v) for v in then.values())) + 2
        now_w = max(len("live"), *(len(v) for v in now.values()))
        if key_w + then_w + now_w <= width:  # two columns: the step's, then live
            out.append(" " * key_w + number.ljust(then_w), label)
            out.append("live", label)
            for key, val in then.items():
                out.append("\n")
                out.append(key.ljust(key_w), label)
                out.append(val.ljust(then_w), value)
                out.append(now[key], changed if now[key] != val else muted)
        else:  # too narrow for two columns: the step's values, then what live has differently
            out.append(f"in force at {number}", label)
            for key, val in then.items():
                out.append("\n")
                out.append(key.ljust(key_w), label)
                out.append(val, value)
            differing = [f"{key} {now[key]}" for key in now if now[key] != then[key]]
            out.append("\n")
            out.append("live ", label)
            out.append(" · ".join(differing) if differing else "same", changed if differing else muted)
        rows_left = height - 1 - len(then) - (0 if key_w + then_w + now_w <= width else 1)
        if rows_left > 0 and pending:
            out.append("\n")
            out.append_text(pending)
        elif rows_left > 0 and history:
            out.append("\n")
            out.append(history[-1], changed)
        return out
