"""The dashboard command: the model in a child process started before anything else (core/link/process_client.py
says why), the app configured from the arguments, run until the user quits."""

from __future__ import annotations

import argparse

from .common import engine_spec, make_loader, settings_from_args


def check_terminal() -> None:
    """The dashboard reads keys from stdin and draws on stderr (textual's Linux driver writes to sys.__stderr__), so
    both must be a terminal; stdout it does not use (`tokentui > file` works). Without one textual would spin on an
    input that never comes, or write its escape codes into a file for ever: a TokentuiError line instead, before
    anything is loaded. Called by the commands that open the dashboard, not by the app (tests drive the app with
    textual's pilot, no terminal needed)."""
    import sys

    from tokentui.core.errors import TokentuiError

    def is_terminal(stream) -> bool:
        try:
            return stream is not None and stream.isatty()
        except (AttributeError, ValueError, OSError):  # closed, or not a file
            return False

    missing = [name for name, stream in (("stdin", sys.__stdin__), ("stderr", sys.__stderr__))
               if not is_terminal(stream)]
    if missing:
        what = " and ".join(missing) + (" is not one" if len(missing) == 1 else " are not terminals")
        raise TokentuiError(f"the dashboard needs a terminal ({what}: it reads keys from stdin and draws on "
                            "stderr): use --headless")


class ProcessSource:
    """The dashboard's engine: the model in a child process (core/link/process_client.py says why), started at once so it
    imports torch while the dashboard starts; `client()` makes the dashboard's engine client for it."""

    def __init__(self, args) -> None:
        from tokentui.core.link.process_client import start_model_process

        self.args = args
        self.spec = engine_spec(args)
        self._early = [start_model_process(self.spec)]

    def client(self, sampler, options, recorder):
        from tokentui.core.link.process_client import ProcessClient

        started = self._early.pop() if self._early else None  # a second client starts its own process
        return ProcessClient(self.spec, sampler, options, recorder, started=started)


def run_dashboard(args, prompt: str, score=None) -> int:
    """`score`: a ScoreRequest (`tokentui score`): the first run scores its text instead of generating."""
    from tokentui.core.runs.record_writer import RunRecorder

    if args.server is not None:  # a served model: its engine is an HTTP client, run in this process
        from tokentui.tui.config import DashboardConfig
        from tokentui.tui.program import run_dashboard as run_app

        sampler, options = settings_from_args(args)
        return run_app(DashboardConfig(load=make_loader(args), prompt=prompt, system=args.system, sampler=sampler,
                                       options=options, theme=args.theme, score=score,
                                       raw=getattr(args, "raw", False),
                                       recorder=None if args.no_record else RunRecorder(args.record_dir)))

    source = ProcessSource(args)  # the model process starts first: it takes the longest

    from tokentui.tui.program import run_dashboard as run_app
    from tokentui.core.model.load.precheck import check_model_and_device
    from tokentui.tui.config import DashboardConfig

    def relaunch(model: str | None, device: str) -> ProcessSource:
        """Another model / device chosen in the dashboard, with every other flag as given."""
        return ProcessSource(argparse.Namespace(**{**vars(args), "model": model, "device": device}))

    sampler, options = settings_from_args(args)
    config = DashboardConfig(load=source, prompt=prompt, system=args.system,
                             sampler=sampler, options=options, theme=args.theme,
                             recorder=None if args.no_record else RunRecorder(args.record_dir),
                             model=args.model, device=args.device, relaunch=relaunch, score=score,
                             raw=getattr(args, "raw", False),
                             check=lambda model, device: check_model_and_device(
                                 model, device, allow_pickle=args.allow_pickle))
    return run_app(config)  # non-zero when the app says so (e.g. quit after a load error)
