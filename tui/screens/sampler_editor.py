"""`S`: the sampler editor (issue 38, 3) — every stage of the chain with every setting, in the order the chain runs
them, keyboard only: ↑ ↓ choose a setting, type its value (checked by the registry's own check as it is committed:
the one-line error under its row), alt+↑ / alt+↓ move the stage earlier / later in the order, ctrl+t turns it on or
off, enter applies the whole draft (one SamplerSettings, built and checked once), esc cancels.

Everything is read off the registry (core/samplers.py STAGES, PARAMS; each stage's `params`), never a list of its
own, so a stage added there is here too. The order is the settings' `samplers` field (llama.cpp's --samplers): a
stage not named in it does not run, so ctrl+t on a stage that can be ordered takes it out of the order or puts it
back where the default order has it; a stage that cannot be ordered (the logit bias, always first; Mirostat, which
replaces the chain) is turned off by its off value. A setting of several items (the logit bias's pairs, DRY's
breakers) is shown, and set with its flag.

`SamplerDraft` is the editor's state as plain Python (tested without a terminal); `SamplerEditor` draws it.
"""

from __future__ import annotations

import textwrap

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from tokentui.core import samplers
from tokentui.core.errors import SettingsError

HINT = "↑↓ setting · type a value · alt+↑↓ move stage · ctrl+t on/off · enter apply · esc cancel"
HINT_SHORT = "↑↓ · type · alt+↑↓ move · ctrl+t on/off · enter apply · esc"
_TRUE = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}
_ORDER = "samplers"  # the settings' field that orders the chain (llama.cpp's --samplers)


def _label(stage) -> str:
    return getattr(stage, "label", None) or stage.param.label


def _params(stage) -> tuple:
    return getattr(stage, "params", None) or (stage.param,)


def _orderable(stage, settings) -> bool:
    return getattr(stage, "orderable", False) and hasattr(settings, _ORDER)


def edit_text(param, value) -> str:
    """A value as the editor's field holds it, to be typed over ("0.9", "40", "true", "top_k;top_p")."""
    if param.kind is bool:
        return "true" if value else "false"
    if param.kind is float:
        return f"{value:g}"
    return str(value)


def parse(param, text: str):
    """The value typed for `param`, as its kind reads it; what cannot be read is passed on as typed, for the
    registry's check to say why in its own words."""
    text = text.strip()
    if param.kind is bool:
        return _TRUE.get(text.lower(), text)
    if param.kind in (int, float):
        if text.lower() == "off" and param.off is not None:
            return param.off
        try:
            return param.kind(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                return text
            return int(number) if param.kind is int and number.is_integer() else number
    return text


class SamplerDraft:
    """The settings being edited (`settings`, always a valid SamplerSettings), the rows (stage, param) in the order
    the chain runs them, the row chosen (`index`) and the error of the last change refused (`error`, one line)."""

    def __init__(self, settings) -> None:
        self.original = settings
        self.settings = settings
        self.index = 0
        self.error: str | None = None

    # ---- the rows ----------------------------------------------------------------------------------------------
    def stages(self) -> list:
        """Every stage, in the order the chain runs them: those the order names first (the logit bias before
        them), then those it leaves out, then the ones that cannot be ordered."""
        s = self.settings
        order = s.samplers.split(";") if hasattr(s, _ORDER) else [st.name for st in samplers.STAGES]
        by = {st.name: st for st in samplers.STAGES}
        fixed_first = [st for st in samplers.STAGES if not getattr(st, "orderable", True) and st.name == "logit_bias"]
        named = [by[n] for n in order if n in by]
        rest = [st for st in samplers.STAGES if st not in named and st not in fixed_first]
        return fixed_first + named + rest

    def rows(self) -> list[tuple]:
        """(stage, param) per setting, stage by stage; then greedy and the seed (stage None)."""
        rows = [(stage, p) for stage in self.stages() for p in _params(stage)]
        staged = {p.name for _stage, p in rows}
        rows += [(None, p) for p in samplers.PARAMS if p.name not in staged and p.name != _ORDER]
        return rows

    @property
    def row(self) -> tuple:
        rows = self.rows()
        self.index = max(0, min(self.index, len(rows) - 1))
        return rows[self.index]

    def in_order(self, stage) -> bool:
        s = self.settings
        return not _orderable(stage, s) or stage.name in s.samplers.split(";")

    def on(self, stage) -> bool:
        """The stage runs with these settings (in the order, and its settings turn it on)."""
        s = self.settings
        if not self.in_order(stage):
            return False
        turned_on = getattr(stage, "on", None)
        return turned_on(s) if turned_on is not None else not stage.param.is_off(getattr(s, stage.param.name))

    # ---- changes --------------------------------------------------------------------------------------------
    def move(self, delta: int) -> None:
        """Choose the setting `delta` rows away (clamped)."""
        self.index = max(0, min(len(self.rows()) - 1, self.index + delta))

    def set_text(self, text: str) -> bool:
        """The chosen setting's value, typed: checked by the registry (core/samplers.py `check`) and by the
        settings as they are built; False, with `error` saying why in one line, when refused."""
        _stage, p = self.row
        if p.kind is tuple:
            if text.strip() != edit_text(p, getattr(self.settings, p.name)).strip():
                self.error = f"{p.label} holds several items: set it with {p.flag}"
                return False
            return True
        value = parse(p, text)
        try:
            value = samplers.check(p.name, value)
            self.settings = self.settings.with_changes(**{p.name: value})
        except SettingsError as err:
            self.error = str(err)
            return False
        self.error = None
        return True

    def _order_with(self, names: list[str]) -> bool:
        try:
            self.settings = self.settings.with_changes(**{_ORDER: ";".join(names)})
        except SettingsError as err:
            self.error = str(err)
            return False
        self.error = None
        return True

    def reorder(self, delta: int) -> bool:
        """Move the chosen setting's stage `delta` places in the order (the chosen row follows it)."""
        stage, p = self.row
        if stage is None or not _orderable(stage, self.settings):
            what = _label(stage) if stage is not None else p.label
            self.error = f"{what} has a fixed place in the chain: it cannot be moved"
            return False
        names = self.settings.samplers.split(";")
        if stage.name not in names:
            self.error = f"{_label(stage)} is off (not in the order): ctrl+t puts it back first"
            return False
        at = names.index(stage.name)
        to = max(0, min(len(names) - 1, at + delta))
        if to == at:
            self.error = None
            return False
        names.insert(to, names.pop(at))
        if not self._order_with(names):
            return False
        self.index = next(n for n, (s, q) in enumerate(self.rows()) if q.name == p.name)
        return True

    def toggle(self) -> bool:
        """Turn the chosen setting's stage off or on (see the module docstring)."""
        stage, p = self.row
        if stage is None:
            self.error = f"{p.label} is not a stage: type its value"
            return False
        if _orderable(stage, self.settings):
            names = self.settings.samplers.split(";")
            if stage.name in names:
                names.remove(stage.name)
            else:  # back where the default order has it, among the stages still named
                default = [st.name for st in samplers.STAGES if getattr(st, "orderable", False)]
                names.append(stage.name)
                names.sort(key=default.index)
            changed = self._order_with(names)
        elif self.on(stage) and stage.param.off is not None:
            try:
                self.settings = self.settings.with_changes(**{stage.param.name: stage.param.off})
                self.error, changed = None, True
            except SettingsError as err:
                self.error, changed = str(err), False
        else:
            self.error = f"{_label(stage)} is turned on by its value: type one for {stage.param.label}"
            return False
        if changed:
            self.index = next(n for n, (s, q) in enumerate(self.rows()) if q.name == p.name)
        return changed

    # ---- drawing ------------------------------------------------------------------------------------------------
    def lines(self, width: int, height: int, styles: dict) -> list[Text]:
        """The rows that fit in `height` lines around the chosen one, each whole in `width` cells (a long value
        goes on a line of its own); the error under the chosen row."""
        rows = self.rows()
        stage_w = max(cell_len(_label(st)) for st, _p in rows if st is not None) + 2
        param_w = max(cell_len(p.label) for _st, p in rows)
        out: list[tuple[int, Text]] = []
        number = 0
        previous = object()
        for n, (stage, p) in enumerate(rows):
            line = Text()
            if stage is not previous:
                previous = stage
                if stage is not None:
                    number += 1
                    state = "on " if self.on(stage) else "off"
                    line.append(f"{number:>2} ", styles["muted"])
                    line.append(_label(stage).ljust(stage_w - 2), styles["label"])
                    line.append(" " + state + " ", styles["on"] if state == "on " else styles["muted"])
                else:
                    line.append("   " + "other".ljust(stage_w - 2) + "     ", styles["muted"])
            else:
                line.append(" " * (3 + stage_w - 2 + 5))
            value = p.text(getattr(self.settings, p.name))
            head = p.label.ljust(param_w) + "  "
            if line.cell_len + cell_len(head) + cell_len(value) <= width:
                line.append(head, styles["muted"])
                line.append(value, styles["value"])
                parts = [line]
            else:  # too narrow for the value beside its name: the value on the next line, whole
                line.append(p.label, styles["muted"])
                parts = [line] + [Text("     " + value[i:i + width - 5], style=styles["value"])
                                  for i in range(0, len(value), max(1, width - 5))]
            if n == self.index:
                for part in parts:
                    part.stylize(styles["chosen"])
            out += [(n, part) for part in parts]
            if n == self.index and self.error:
                out += [(n, Text(part, style=styles["error"])) for part in _wrap(self.error, width)]
        chosen = [i for i, (n, _t) in enumerate(out) if n == self.index]
        top = max(0, min(chosen[0] - height // 3, len(out) - height)) if len(out) > height else 0
        if chosen and chosen[-1] >= top + height:
            top = chosen[-1] - height + 1
        return [t for _n, t in out[top:top + height]]


def _wrap(text: str, width: int) -> list[str]:
    """`text` folded between words at `width` (never cut)."""
    return textwrap.wrap(text, max(10, width)) or [""]


class SamplerEditor(ModalScreen):
    """Dismisses with the new SamplerSettings (enter), or None (esc)."""

    BINDINGS = [
        Binding("escape", "cancel", "cancel", priority=True),
        Binding("enter", "apply", "apply", priority=True),
        Binding("up", "choose(-1)", "setting", priority=True, show=False),
        Binding("down", "choose(1)", "setting", priority=True, show=False),
        Binding("pageup", "choose(-8)", "page", priority=True, show=False),
        Binding("pagedown", "choose(8)", "page", priority=True, show=False),
        Binding("alt+up", "reorder(-1)", "earlier", priority=True, show=False),
        Binding("alt+down", "reorder(1)", "later", priority=True, show=False),
        Binding("ctrl+t", "toggle", "on/off", priority=True, show=False),
    ]

    DEFAULT_CSS = """
    SamplerEditor { align: center middle; background: $background 60%; }
    SamplerEditor > Vertical {
        width: 90; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1;
        border-title-color: $primary; border-title-style: bold; border-subtitle-color: $text-muted;
    }
    SamplerEditor #sampler-rows { height: auto; }
    SamplerEditor #sampler-field { margin-top: 1; }
    SamplerEditor #sampler-hint { color: $text-muted; height: auto; }
    """

    def __init__(self, settings, cursor_blink: bool = True, note: str | None = None) -> None:
        """`note`: one line under the rows (e.g. that the run is paused while the editor is open)."""
        super().__init__()
        self.draft = SamplerDraft(settings)
        self._blink = cursor_blink
        self._note = note

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "sampler chain"
            box.border_subtitle = "enter apply · esc cancel"
            yield Static("", id="sampler-rows")
            field = Input("", id="sampler-field", compact=True)
            field.cursor_blink = self._blink
            yield field
            yield Static("", id="sampler-hint", markup=False)

    def on_mount(self) -> None:
        self._load_field()
        self.refresh_rows()
        self.query_one(Input).focus()

    def on_resize(self) -> None:
        self.refresh_rows()

    # ---- what the draft draws ------------------------------------------------------------------------------
    def _styles(self) -> dict:
        def style(name: str) -> str:
            return {"label": "bold", "muted": "dim", "value": "bold", "on": "bold", "chosen": "reverse",
                    "error": "bold red"}[name]
        return {name: style(name) for name in ("label", "muted", "value", "on", "chosen", "error")}

    def refresh_rows(self) -> None:
        """Draw the rows that fit: the screen's height less the frame, the field and the hint lines under them."""
        width, height = self.app.size
        width = min(max(20, width - 4), 86)  # the box: 90 wide at most, its border and padding 4
        hint = HINT if cell_len(HINT) <= width else HINT_SHORT
        p = self.draft.row[1]
        lines = [part for line in [f"{p.label}: {p.help}", hint] + ([self._note] if self._note else [])
                 for part in _wrap(line, width)]
        self.query_one("#sampler-hint", Static).update("\n".join(lines))
        room = max(3, height - 2 - 1 - 1 - len(lines))  # the border, the field, the line above it, the hint
        self.query_one("#sampler-rows", Static).update(Text("\n").join(self.draft.lines(width, room,
                                                                                           self._styles())))

    def _load_field(self) -> None:
        _stage, p = self.draft.row
        field = self.query_one(Input)
        field.value = edit_text(p, getattr(self.draft.settings, p.name))
        field.cursor_position = len(field.value)

    def _commit(self) -> bool:
        ok = self.draft.set_text(self.query_one(Input).value)
        self.refresh_rows()
        return ok

    # ---- keys -------------------------------------------------------------------------------------------------
    def action_choose(self, delta: int) -> None:
        if not self._commit():
            return  # the error stays under the row until the value is one the registry takes
        self.draft.move(delta)
        self._load_field()
        self.refresh_rows()

    def action_reorder(self, delta: int) -> None:
        if self._commit():
            self.draft.reorder(delta)
            self._load_field()
        self.refresh_rows()

    def action_toggle(self) -> None:
        if self._commit():
            self.draft.toggle()
            self._load_field()
        self.refresh_rows()

    def action_apply(self) -> None:
        if self._commit():
            self.dismiss(self.draft.settings)

    def action_cancel(self) -> None:
        self.dismiss(None)


def open_editor(app) -> None:
    """`S`: open the editor on the settings asked for; what it applies goes through the controller's one path for
    a change (`change_sampler`: a paused step previews it, a running one takes it at its next step)."""
    controller = app.controller
    if isinstance(app.screen, SamplerEditor):
        return
    if controller.replaying:
        app.notify("A replay plays the recorded settings: the sampler editor needs the model", severity="warning",
                   timeout=5)
        return
    paused = controller.pause_for_dialog()

    def done(settings) -> None:
        if settings is not None:
            changes = {p.name: getattr(settings, p.name) for p in samplers.PARAMS
                       if getattr(settings, p.name) != getattr(controller.sampler, p.name)}
            if changes:
                controller.change_sampler(**changes)
        controller.resume_after_dialog()

    note = "generation is paused while this is open" if paused else None
    app.push_screen(SamplerEditor(controller.sampler, cursor_blink=app.CURSOR_BLINK, note=note), done)
