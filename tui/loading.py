"""Loading the model and the ways out of a failure: the error dialogs, retry, another model or device, and the
exit status a failed load leaves. A mixin of `TokentuiApp` (tui/app.py)."""

from __future__ import annotations

import threading

from textual import work
from textual.worker import get_current_worker

from tokentui.core.errors import SettingsError, TokentuiError
from tokentui.core.events import LoadProgress

from .config import EngineLike
from .messages import LoadProgressed
from .panels import StatusLine
from .screens import ErrorDialog, ModelPicker


class LoadingMixin:
    # ---- loading -------------------------------------------------------------------------------------------
    def _start_load(self) -> None:
        self.state.phase = "loading"
        self.state.load_stage = "starting"
        self.state.load_fraction = None
        self._repaint_now()
        self._load_engine()

    @work(thread=True, exclusive=True, group="load", name="load", exit_on_error=False)
    def _load_engine(self) -> EngineLike | None:
        """Call the loader in a daemon thread, so quitting does not wait for a 30-second conversion."""
        worker = get_current_worker()
        result: dict = {}
        finished = threading.Event()

        def progress(p: LoadProgress) -> None:
            self.post_message(LoadProgressed(p))

        def target() -> None:
            try:
                result["engine"] = self.config.load(progress)
            except BaseException as err:  # handed to the worker, which re-raises it
                result["error"] = err
            finally:
                finished.set()

        self._load_thread = threading.Thread(target=target, name="tokentui-load", daemon=True)
        self._load_thread.start()
        while not finished.wait(0.05):
            if worker.is_cancelled:
                return None
        if "error" in result:
            raise result["error"]
        return result.get("engine")

    def on_load_progressed(self, message: LoadProgressed) -> None:
        if self.state.phase == "loading":
            self.state.apply(message.progress)
            self.query_one(StatusLine).show(self.state)

    def _engine_ready(self, engine: EngineLike) -> None:
        self.engine = engine
        self.load_error = None
        try:
            if engine.sampler != self._sampler_before_load:  # keys pressed while it loaded
                engine.update_sampler(**self._sampler_before_load.to_dict())
            if getattr(engine, "options", None) != self.config.options:
                engine.options = self.config.options
        except SettingsError as err:
            self.notify(str(err), severity="error", markup=False)
        self.state.facts = engine.facts
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
        if self.engine is None and self.load_error is not None:
            return 2 if isinstance(self.load_error, TokentuiError) else 1
        return 0

    def action_change_model(self) -> None:
        """Pick another model / device (checked first, like the command line does) and load it."""
        relaunch = self.config.relaunch
        if relaunch is None or isinstance(self.screen, ModelPicker):
            return

        def chosen(result) -> None:
            if result is None:
                if self.engine is None:  # still nothing loaded: the error stays on screen
                    self._repaint_now()
                return
            model, device = result
            self.config.load = relaunch(model, device)
            self.config.model, self.config.device = model, device
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
