"""The model process, for the dashboard (core/link/process_client.py is the dashboard's side): it loads the engine on
its main thread, runs one generation (a run or a branch) at a time there, and applies commands (stop, pause, step,
settings) from a reader thread at once — the engine takes them at its next step. It ends when the parent says quit
or its end of the socket closes (the parent exited or was killed).

It lives with the model-side code because it is where the model runs (it imports the engine, and so torch); the
link's own modules never do. Runs are named by the dashboard's run ids, which the engine uses as its own (a Stop
of run N stops N and every earlier run, queued or running): there is no second count of runs here.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import traceback
from multiprocessing.connection import Connection

from ..errors import ErrorKind, ProtocolError, TokentuiError
from ..link.protocol import (COMMANDS, RUN_STARTS, Crash, Load, LoadFailed, Loading, Pause, Quit, Ready, Resume,
                             RunEvent, SetOptions, SetSampler, StartBranch, StartFanout, StartRun, StartScore, Step,
                             Stop, Tokenize, Tokenized, expect)
from ..runs.events import LoadProgress


class _Child:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.send_lock = threading.Lock()
        self.runs: queue.Queue[StartRun | StartBranch | StartScore | StartFanout] = queue.Queue()
        self.engine = None  # set once loaded
        self.stopped_up_to = 0  # a Stop that came while loading, handed to the engine once it exists

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
        if isinstance(command, RUN_STARTS):
            self.runs.put(command)
            return
        engine = self.engine
        if isinstance(command, Tokenize):  # answered here, at once: the main thread may be in a paused run
            self.send(self.tokenized(engine, command))
            return
        if engine is None:  # still loading: a stop is kept for the engine, the rest came with the spec
            if isinstance(command, Stop):
                self.stopped_up_to = max(self.stopped_up_to, command.serial)
            return
        if isinstance(command, Stop):
            engine.stop(command.serial)
        elif isinstance(command, Pause):
            engine.pause()
        elif isinstance(command, Resume):
            engine.resume()
        elif isinstance(command, Step):
            engine.step_once()
        elif isinstance(command, SetSampler):
            engine.set_sampler(command.settings)
        elif isinstance(command, SetOptions):
            engine.options = command.options

    @staticmethod
    def tokenized(engine, command: Tokenize) -> Tokenized:
        if engine is None:
            return Tokenized(command.asked, error="the model is not loaded yet")
        try:
            return Tokenized(command.asked, tuple(engine.phrase_pieces(command.text)))
        except TokentuiError as err:
            return Tokenized(command.asked, error=str(err))
        except Exception as err:  # a tokenizer's own failure: one line, the log has the rest
            traceback.print_exc()
            return Tokenized(command.asked, error=f"could not tokenize the phrase ({type(err).__name__}: {err})")

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
            from .load.build import load_engine

            engine = load_engine(first.spec, lambda p: self.send(Loading(p)))
        except TokentuiError as err:
            self.send(LoadFailed(err.kind, str(err)))
            return
        except Exception as err:  # shown in the dashboard's dialog as one line; the log has the traceback
            traceback.print_exc()
            self.send(LoadFailed(ErrorKind.MODEL_LOAD, f"could not load the model ({type(err).__name__}: {err})"))
            return
        if self.stopped_up_to:
            engine.stop(self.stopped_up_to)
        self.engine = engine
        self.send(Ready(engine.facts, engine.sampler, engine.options))
        while True:
            run = self.runs.get()
            try:
                if isinstance(run, StartBranch):
                    events = engine.branch(run.point, run_id=run.serial)
                elif isinstance(run, StartScore):
                    events = engine.score(run.request, run_id=run.serial)
                elif isinstance(run, StartFanout):
                    events = engine.fanout(run.request, run_id=run.serial)
                else:
                    events = engine.run(run.prompt, run.system, run_id=run.serial)
                for event in events:
                    self.send(RunEvent(run.serial, event))
            except Exception as err:  # a bug: the dashboard ends the run's record with it (core/link/client.py)
                traceback.print_exc()
                self.send(Crash(run.serial, f"the model process failed: {type(err).__name__}: {err}"))


def _child(fd: int) -> None:
    _Child(Connection(fd)).serve()
