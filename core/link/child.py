"""The model process's side of core/link/process_client.py: it loads the engine on its main thread, runs one generation (a run
or a branch) at a time there, and applies commands (stop, pause, step, settings) from a reader thread at once — the
engine takes them at its next step. It ends when the parent says quit or its end of the socket closes (the parent
exited or was killed)."""

from __future__ import annotations

import os
import queue
import sys
import threading
import traceback
from multiprocessing.connection import Connection

from ..errors import TokentuiError
from ..runs.events import LoadProgress, stopped_done
from .protocol import (COMMANDS, Crash, Load, LoadFailed, Loading, Pause, ProtocolError, Quit, Ready, Resume,
                       RunEvent, SetOptions, SetSampler, StartBranch, StartRun, Step, Stop, expect)


class _Child:
    """The model process: loads the engine on the main thread, runs one generation at a time there (StartRun:
    `engine.run`, StartBranch: `engine.branch`, in the order asked), and applies commands (stop, pause, step,
    settings) from a reader thread at once — the engine takes them at its next step."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.send_lock = threading.Lock()
        self.runs: queue.Queue[StartRun | StartBranch] = queue.Queue()
        self.engine = None  # set once loaded
        self.stop_serial = 0  # every run up to this one is stopped
        self.running_serial = 0

    def send(self, message) -> None:
        with self.send_lock:
            self.conn.send(message)

    def commands(self) -> None:
        """Control messages, applied at once; runs are queued for the main thread. EOF: the parent is gone."""
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                os._exit(0)
            try:
                self.apply(expect(message, COMMANDS, "the model process"))
            except ProtocolError as err:  # refused, not guessed at: a note in the log, nothing done
                print(f"tokentui model process: refused a message: {err}", file=sys.stderr)

    def apply(self, command) -> None:
        if isinstance(command, Quit):
            os._exit(0)
        if isinstance(command, (StartRun, StartBranch)):
            self.runs.put(command)
            return
        engine = self.engine
        if engine is None:
            return  # still loading: nothing to stop, pause or set yet (the spec carried the settings)
        if isinstance(command, Stop):
            self.stop_serial = max(self.stop_serial, command.serial)
            if self.running_serial <= command.serial:
                engine.stop()
        elif isinstance(command, Pause):
            engine.pause()
        elif isinstance(command, Resume):
            engine.resume()
        elif isinstance(command, Step):
            engine.step_once()
        elif isinstance(command, SetSampler):
            engine.update_sampler(**command.settings.to_dict())
        elif isinstance(command, SetOptions):
            engine.options = command.options

    def serve(self) -> None:
        try:
            first = expect(self.conn.recv(), (Load,), "the model process's first message")
        except (EOFError, OSError, ProtocolError):
            return
        threading.Thread(target=self.commands, name="tokentui-commands", daemon=True).start()
        # The imports take seconds in this fresh process: said, so the dashboard's first stage is not a blank. (Not
        # in load_engine: headless's signal tests interrupt at its first load event, and interrupted in the middle of
        # `import torch` the process once failed to exit; that case was not looked into further.)
        self.send(Loading(LoadProgress("importing torch and transformers", None)))
        try:
            from .process_client import load_engine

            engine = load_engine(first.spec, lambda p: self.send(Loading(p)))
        except TokentuiError as err:
            self.send(LoadFailed(type(err).__name__, str(err)))
            return
        except Exception as err:  # shown in the dashboard's dialog as one line; the log has the traceback
            traceback.print_exc()
            self.send(LoadFailed("ModelLoadError", f"could not load the model ({type(err).__name__}: {err})"))
            return
        self.engine = engine
        self.send(Ready(engine.facts, engine.sampler, engine.options))
        while True:
            run = self.runs.get()
            self.running_serial = run.serial
            if run.serial <= self.stop_serial:  # stopped before it started
                prompt_tokens = len(run.point.prompt_ids) if isinstance(run, StartBranch) else 0
                self.send(RunEvent(run.serial, stopped_done([], prompt_tokens, engine.facts.vocab_rows)))
                continue
            try:
                if isinstance(run, StartBranch):
                    events = engine.branch(run.point)
                else:
                    events = engine.run(run.prompt, run.system)
                for event in events:
                    self.send(RunEvent(run.serial, event))
            except Exception as err:
                traceback.print_exc()
                self.send(Crash(run.serial, f"the model process failed: {type(err).__name__}: {err}"))


def _child(fd: int) -> None:
    _Child(Connection(fd)).serve()
