"""Loading the model and the ways out of a failure: the error dialogs, retry, another model or device, and the
exit status a failed load leaves. A mixin of `TokentuiApp` (tui/app.py)."""

from __future__ import annotations

import asyncio

from tokentui.core.errors import TokentuiError
from tokentui.core.runs.events import LoadProgress, ModelFacts
from tokentui.core.steps.display import printable_copy

from .panels import StatusLine
from .screens import ErrorDialog, ModelPicker


class LoadingMixin:
    # ---- loading -------------------------------------------------------------------------------------------
    def _start_load(self) -> None:
        self.state.phase = "loading"
        self.state.load_stage = "starting"
        self.state.load_fraction = None
        self._repaint_now()
        self.run_worker(self._load(), exclusive=True, group="load", name="load", exit_on_error=False)

    async def _load(self) -> None:
        """Ask the engine client to load the model (no thread here: its replies come on the event loop)."""
        try:
            facts = await self.client.load(self._load_progressed)
        except asyncio.CancelledError:  # quitting mid-load: the client has ended the model process
            raise
        except Exception as err:
            self._load_failed(err)
            return
        self._engine_ready(facts)

    def _load_progressed(self, progress: LoadProgress) -> None:
        if self.state.phase == "loading":
            self.state.apply(progress)
            self.query_one(StatusLine).show(self.state)

    def _engine_ready(self, facts: ModelFacts) -> None:
        self.load_error = None
        self.state.facts = printable_copy(facts)  # a record's or a server's names are drawn as they are: escaped
        if facts.server is not None:  # a served model: panels that depend on it (the one-pass row) lay out again
            self._layout_plan = None
            self._apply_layout()
        self._start_run()

    def _load_failed(self, error: BaseException | None) -> None:
        self.state.phase = "load-failed"
        self.load_error = error or RuntimeError("unknown error")
        if isinstance(error, TokentuiError):
            message = str(error)
        else:
            message = f"{type(error).__name__}: {error}" if error else "unknown error"
        self.state.error_message = message
        self._repaint_now()
        self.push_screen(ErrorDialog("The model could not be loaded", message, retry=True,
                                     change=self.config.relaunch is not None), self._after_error_dialog)

    def _after_error_dialog(self, choice: str | None) -> None:
        if choice == "retry":
            self._start_load()
        elif choice == "change":
            self.action_change_model()
        elif choice == "quit":
            self.action_quit()

    @property
    def exit_code(self) -> int:
        """What quitting now returns: 0, or — while the model has failed to load — 2 for bad input (a model or
        device that cannot work) and 1 for any other failure, as the command line does."""
        if not self.client.loaded and self.load_error is not None:
            return 2 if isinstance(self.load_error, TokentuiError) else 1
        return 0

    def action_change_model(self) -> None:
        """Pick another model / device (checked first, like the command line does) and load it."""
        relaunch = self.config.relaunch
        if relaunch is None or isinstance(self.screen, ModelPicker):
            return

        def chosen(result) -> None:
            if result is None:
                if not self.client.loaded:  # still nothing loaded: the error stays on screen
                    self._repaint_now()
                return
            model, device = result
            self.config.load = relaunch(model, device)
            self.config.model, self.config.device = model, device
            old, self.client = self.client, self.config.new_client(self.client.sampler)  # the settings carry over
            self.client.listener = self._on_reply
            old.listener = lambda reply: None
            old.close()
            self._start_load()

        self.push_screen(ModelPicker(self.config.model, self.config.device, check=self.config.check), chosen)

    def _run_failed(self, title: str, message: str) -> None:
        """A run ended by a fault or bad input: say so in a dialog; retry, edit the prompt, or carry on."""
        if isinstance(self.screen, ErrorDialog):
            self.pop_screen()

        def chosen(choice: str | None) -> None:
            if choice == "retry":
                self._start_run()
            elif choice == "edit":
                self.action_edit_prompt()
            elif choice == "quit":
                self.action_quit()

        self.push_screen(ErrorDialog(title, message, retry=True, edit=True), chosen)
