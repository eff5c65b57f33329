"""The model process, for the dashboard (core/link/process_client.py is the dashboard's side): it loads the engine on
its main thread, runs one generation (a run, a branch, a score, a fan-out) at a time there, and applies controls
(stop, pause, step, settings) and answers questions (a phrase's tokens) from a reader thread at once — the engine
takes them at its next step. Each message is dispatched as its declaration in core/link/protocol.py says
(core/link/operations.py's `call`): no message is handled by name here. It ends when the parent says quit or its
end of the socket closes (the parent exited or was killed).

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
from ..link.operations import ASK, RUN, Operation, operation_of
from ..link.protocol import COMMANDS, Crash, Load, LoadFailed, Loading, Quit, Ready, RunEvent, Stop, expect
from ..runs.events import LoadProgress


class _Child:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.send_lock = threading.Lock()
        self.runs: queue.Queue = queue.Queue()  # the RUN operations' messages, run one at a time
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
            except TokentuiError as err:  # refused, not guessed at (or the engine refused it): a note in the log
                print(f"tokentui model process: refused a message: {err}", file=sys.stderr)

    def apply(self, command) -> None:
        if isinstance(command, Quit):
            os._exit(0)
        op = operation_of(command)
        if op.kind is RUN:
            self.runs.put(command)
            return
        engine = self.engine
        if op.kind is ASK:  # answered here, at once: the main thread may be in a paused run
            self.send(self.answer(engine, op, command))
            return
        if engine is None:  # still loading: a stop is kept for the engine, the rest came with the spec
            if isinstance(command, Stop):
                self.stopped_up_to = max(self.stopped_up_to, command.run_id)
            return
        op.call(engine, command)

    @staticmethod
    def answer(engine, op: Operation, question):
        """The answer to an ASK: what the engine returns (a sequence, sent as a tuple), or the one line why not."""
        if engine is None:
            return op.answer(question.asked, error="the model is not loaded yet")
        try:
            return op.answer(question.asked, tuple(op.call(engine, question)))
        except TokentuiError as err:
            return op.answer(question.asked, error=str(err))
        except Exception as err:  # e.g. a tokenizer's own failure: one line, the log has the rest
            traceback.print_exc()
            return op.answer(question.asked, error=f"could not answer {type(question).__name__} "
                                                   f"({type(err).__name__}: {err})")

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
            self.run(engine, self.runs.get())

    def run(self, engine, run) -> None:
        """One queued RUN operation to its end: each event sent back under its run_id."""
        try:
            for event in operation_of(run).call(engine, run):
                self.send(RunEvent(run.run_id, event))
        except Exception as err:  # a bug: the dashboard ends the run's record with it (core/link/client.py)
            traceback.print_exc()
            self.send(Crash(run.run_id, f"the model process failed: {type(err).__name__}: {err}"))


def child_main(fd: int) -> None:
    """The model process's entry point (core/link/process_client.py starts it): serve the dashboard on `fd`."""
    _Child(Connection(fd)).serve()
