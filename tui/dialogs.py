"""The dashboard's dialogs, opened for the app (tui/app.py): each pauses the run it covers where it should, and ends
in one call to the controller (tui/controller.py) with what was chosen.

They reach the app through `DialogHost`, what they use of it, so this module does not import the app (which imports
it): the app is a DialogHost as it stands."""

from __future__ import annotations

from typing import Any, Callable, Protocol

from .config import DashboardConfig
from .controller import DashboardController
from .format import short_path
from .screens import ErrorDialog, HelpScreen, ModelPicker, PromptEditor
from .screens.branch_list import BranchList
from .screens.branch_picker import BranchPicker
from .screens.compare import CompareScreen
from .screens.exported import ExportedDialog
from .screens.fanout import FanoutScreen
from .screens.phrase import PhraseDialog
from .screens.scored import ScoredDialog


class DialogHost(Protocol):
    """What a dialog uses of the app (tui/app.py's TokentuiApp; Textual's App gives the screen stack and `notify`)."""

    CURSOR_BLINK: bool
    controller: DashboardController

    @property
    def config(self) -> DashboardConfig: ...

    @property
    def screen(self) -> Any: ...

    def push_screen(self, screen: Any, callback: Callable[[Any], None] | None = None) -> Any: ...

    def pop_screen(self) -> Any: ...

    def notify(self, message: str, *, title: str = "", severity: str = "information",
               timeout: float | None = None, markup: bool = True) -> None: ...

    def repaint(self, now: bool = True) -> None: ...

    def start_load(self) -> None: ...

    def status_message(self, message: str, seconds: float = 6.0) -> None: ...

    def action_quit(self) -> None: ...


def run_failed(app: DialogHost, title: str, message: str) -> None:
    """A run ended by a fault or bad input: say so; retry, edit the prompt, or carry on."""
    if isinstance(app.screen, ErrorDialog):
        app.pop_screen()
    controller = app.controller

    def chosen(choice: str | None) -> None:
        if choice == "retry":
            controller.start_run()
        elif choice == "edit":
            edit_prompt(app)
        elif choice == "quit":
            app.action_quit()

    app.push_screen(ErrorDialog(title, message, retry=not controller.replaying, edit=not controller.replaying),
                    chosen)


def load_failed(app: DialogHost, message: str) -> None:
    """The model could not be loaded: retry, another model or device, or quit (the exit status says why)."""

    def chosen(choice: str | None) -> None:
        if choice == "retry":
            app.start_load()
        elif choice == "change":
            change_model(app)
        elif choice == "quit":
            app.action_quit()

    app.push_screen(ErrorDialog("The model could not be loaded", message, retry=True,
                                change=app.config.relaunch is not None), chosen)


def change_model(app: DialogHost) -> None:
    """Pick another model / device (checked first, like the command line does) and load it."""
    controller = app.controller
    config = controller.config
    if config.relaunch is None or isinstance(app.screen, ModelPicker):
        return

    def chosen(result) -> None:
        if result is None:
            if not controller.loaded:  # still nothing loaded: the error stays on screen
                app.repaint()
            return
        controller.switch_model(*result)
        app.start_load()

    app.push_screen(ModelPicker(config.model, config.device, check=config.check), chosen)


def edit_prompt(app: DialogHost) -> None:
    controller = app.controller
    if isinstance(app.screen, PromptEditor):
        return
    if controller.replaying:
        app.notify("A replay plays the recorded prompt: run `tokentui --prompt …` to ask another", timeout=5)
        return
    paused = controller.pause_for_dialog()

    def done(result) -> None:
        if result is None:
            controller.resume_after_dialog()
            return
        controller.set_prompt(result.prompt, result.system, raw=result.raw)

    prompt_event = controller.state.prompt
    app.push_screen(PromptEditor(controller.prompt, controller.system, cursor_blink=app.CURSOR_BLINK,
                                 default_system=prompt_event.default_system_prompt if prompt_event else None,
                                 default_known=prompt_event is not None, run_paused=paused, raw=controller.raw),
                    done)


def help(app: DialogHost) -> None:  # noqa: A001 - the key's name
    if isinstance(app.screen, HelpScreen):
        return
    controller = app.controller
    paused = controller.pause_for_dialog()
    app.push_screen(HelpScreen(run_paused=paused), lambda _result: controller.resume_after_dialog())


def export(app: DialogHost) -> None:
    controller = app.controller
    path = controller.export()
    if path is None:
        return
    state = controller.state
    # the full paths in a dialog of their own, one per line, never wrapped (a toast broke them mid-name)
    if isinstance(app.screen, ExportedDialog):
        app.pop_screen()
    app.push_screen(ExportedDialog(path, state.record_path, running=state.running))
    app.status_message(f"exported {short_path(path)}")


def branch(app: DialogHost) -> None:
    """`b`: pick another candidate at the step in view; the model goes on from it."""
    controller = app.controller
    step = controller.step_to_branch()
    if step is None:
        return
    parent = controller.tree.shown_branch
    controller.pause_for_dialog()  # the picker covers the panels: the run waits (resumed if nothing is picked)

    label = f"#{parent.number}" if len(controller.tree) > 1 else ""

    def chosen(token: int | str | None) -> None:
        if token is None:
            controller.resume_after_dialog()
        elif token == "phrase":
            phrase(app, parent, step, label)
        else:
            controller.branch_at(parent, step, token)

    app.push_screen(BranchPicker(step, label, paused=controller.client.paused and not controller.dialog_paused),
                    chosen)


def phrase(app: DialogHost, parent, step, label: str) -> None:
    """`t` in the branch dialog: type a phrase to force at the step (the run stays paused while it is typed)."""
    controller = app.controller
    refusal = controller.client.refusal("phrase")
    if refusal is not None:
        app.notify(refusal[0].upper() + refusal[1:], severity="warning", timeout=6)
        controller.resume_after_dialog()
        return

    def chosen(result) -> None:
        if result is None:
            controller.resume_after_dialog()
            return
        text, ids = result
        controller.explore.force_phrase(parent, step, text, ids)

    app.push_screen(PhraseDialog(step, controller.explore.phrase_pieces, label, cursor_blink=app.CURSOR_BLINK),
                    chosen)


def show_fanout(app: DialogHost, fanout) -> None:
    """A fan-out began (`f`): its list, filled as the samples come; enter adopts one as a branch."""
    controller = app.controller
    if isinstance(app.screen, FanoutScreen):
        app.pop_screen()
    label = f"#{fanout.parent.number}" if len(controller.tree) > 1 else ""

    def chosen(sample: int | None) -> None:
        if sample is not None:
            controller.explore.adopt(sample)

    app.push_screen(FanoutScreen(fanout, label), chosen)


def fanout_changed(app: DialogHost) -> None:
    if isinstance(app.screen, FanoutScreen):
        app.screen.refresh_state()


def scored(app: DialogHost, summary) -> None:
    """A scored text's summary, over its heat-coloured answer."""
    app.repaint()
    app.push_screen(ScoredDialog(summary))


def runs(app: DialogHost) -> None:
    """`B`: the runs of this prompt — switch to one, or compare two side by side."""
    controller = app.controller
    tree = controller.tree
    if len(tree) < 2:
        app.notify("One run so far — b branches at the step in view" if not controller.replaying
                   else "This record holds one run", timeout=4)
        return

    def chosen(result) -> None:
        if result is None:
            return
        if result[0] == "show":
            controller.show_run(result[1])
        elif result[0] == "compare":
            app.push_screen(CompareScreen(tree.number(result[1]), tree.number(result[2])))

    app.push_screen(BranchList(tree), chosen)
