"""The engine in a child process, for the dashboard.

Why a process and not a thread: the dashboard's Python work (Textual composing frames) and the engine's Python work
(dispatching ~1,000 small torch operations per token) would share one GIL. Measured on the 2-core benchmark box:
with the app and the model in one process, decode fell to 0.64x headless and the process used one core in all (a
torch thread next to a busy Python thread ran 50x fewer small matrix products). In a child process the model keeps
a core to itself and the dashboard only receives events. Headless mode keeps the in-process `Engine`.

`ProcessEngine` has the interface the app uses (`tui.config.EngineLike`): the same events, settings applied at the
next step boundary, pause / single step / stop. Importing this module does not import torch; the parent of a
dashboard never loads it.

Protocol: `multiprocessing.connection` over a socket pair, carrying the typed messages of core/protocol.py (the
parent sends Load, then StartRun / Stop / Pause / Resume / Step / SetSampler / SetOptions / Quit; the child
answers Loading (progress), then Ready or LoadFailed, then RunEvent and Crash, each tagged with its run's serial).
The child ends when the parent says quit or its end of the socket closes (the parent exited or was killed).
"""

from __future__ import annotations

import gc
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable, Iterator

from . import errors
from .errors import GenerationError, ModelLoadError, TokentuiError
from .events import (DoneEvent, ErrorEvent, Event, LoadProgress, ModelFacts, PromptEvent, StepEvent, StepTally,
                     stopped_done)
from .protocol import (COMMANDS, LOADING_REPLIES, RUN_REPLIES, Crash, Load, LoadFailed, Loading, Pause,
                       ProtocolError, Quit, Ready, Resume, RunEvent, SetOptions, SetSampler, StartRun, Step, Stop,
                       expect)
from .paths import state_dir
from .settings import RunOptions, SamplerSettings

Progress = Callable[[LoadProgress], None]
EVENT_BACKLOG = 256  # events buffered in the parent before the child's sends block (back-pressure)


@dataclass(frozen=True)
class EngineSpec:
    """Everything needed to build an Engine: what the command line says about the model and the run."""

    model: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    device_map: str | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    compile: bool = False
    threads: int | None = None
    weight_layout: str = "auto"
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    options: RunOptions = field(default_factory=RunOptions)


def load_engine(spec: EngineSpec, progress: Progress = lambda p: None):
    """Load the model and build an Engine in this process (headless mode, and the child of a ProcessEngine).

    `progress` gets the load stages in order, each in one stretch, and "ready" (fraction 1.0) once, last.

    The cyclic garbage collector is off while the ~2,500 modules of torch and transformers are imported and the
    model is built (it found nothing to free there and cost ~0.7 s of a 4-s start); the objects that survive are
    then frozen out of later collections, so the dashboard's and the decode loop's collections stay short."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        from .engine import Engine
        from .loader import STAGE_READY, load_model
        from .speed import SpeedOptions

        loaded = load_model(spec.model, device=spec.device, dtype=spec.dtype, device_map=spec.device_map,
                            trust_remote_code=spec.trust_remote_code, allow_pickle=spec.allow_pickle,
                            progress=progress, ready=False)
        engine = Engine(loaded, spec.sampler, spec.options, speed=SpeedOptions(compile=spec.compile,
                                                                                threads=spec.threads,
                                                                                weight_layout=spec.weight_layout),
                        progress=progress)
        progress(LoadProgress(STAGE_READY, 1.0))  # the last load event: after the weight layout and any compile
        return engine
    finally:
        if was_enabled:
            gc.freeze()
            gc.enable()


def worker_log_path() -> Path:
    """Where the model process writes its stdout/stderr (library warnings would otherwise scribble on the
    dashboard): overwritten by each start, named in the error when that process ends unexpectedly."""
    return state_dir() / "model-process.log"


# ---------------------------------------------------------------------------------------------------- parent side
@dataclass
class StartedProcess:
    proc: subprocess.Popen
    conn: Connection
    log_path: Path


def start_model_process(spec: EngineSpec, log_path: Path | None = None) -> StartedProcess:
    """Start the child and ask it to load `spec`; returns at once. The dashboard calls this before importing
    textual, so the child's ~4 s of imports and loading overlap the app's start instead of following it."""
    log_path = log_path or worker_log_path()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    parent_end, child_end = socket.socketpair()
    with open(log_path, "wb") as log:
        # A session of its own: terminal signals (Ctrl-C, SIGHUP) go to the dashboard, which ends this process.
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from tokentui.core.process import _child; _child(int(sys.argv[1]))",
             str(child_end.fileno())],
            pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    child_end.close()
    conn = Connection(parent_end.detach())
    try:
        conn.send(Load(spec))
    except OSError:  # it died at once; ProcessEngine reports how
        pass
    return StartedProcess(proc, conn, log_path)


@dataclass(frozen=True, slots=True)
class _ChildGone:
    """Queued by the reader once the child's end of the connection has closed (it exited or was ended)."""


@dataclass(frozen=True, slots=True)
class _Refused:
    """Queued by the reader for a message that broke the protocol: the run in progress ends with this error."""

    message: str


class ProcessEngine:
    """An Engine running in a child process; construct it from a thread that may block (it waits for the load)."""

    def __init__(self, spec: EngineSpec, progress: Progress = lambda p: None, *, log_path: Path | None = None,
                 started: "StartedProcess | None" = None):
        """`started`: a child already started for `spec` by `start_model_process` (it has been importing torch
        while the caller set up); otherwise one is started here."""
        started = started or start_model_process(spec, log_path)
        self.log_path = started.log_path
        self._proc, self._conn = started.proc, started.conn
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._events: queue.Queue = queue.Queue(maxsize=EVENT_BACKLOG)
        self._serial = 0
        self._paused = False
        self._closing = False
        try:
            ready = self._wait_ready(progress)
        except BaseException:
            self.close()
            raise
        self.facts: ModelFacts = ready.facts
        self._sampler: SamplerSettings = ready.sampler
        self._options: RunOptions = ready.options
        threading.Thread(target=self._read, name="tokentui-model-events", daemon=True).start()

    # ---- plumbing
    def _post(self, message) -> None:
        """A command for the child; silently dropped once the child is gone (the run reports that)."""
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, EOFError, ValueError):
            pass

    def _ended_text(self) -> str:
        code = self._proc.poll()
        if code is None:
            return "it closed its connection"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit status {code}"

    def _wait_ready(self, progress: Progress) -> Ready:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                raise ModelLoadError(f"the model process ended while loading ({self._ended_text()}); "
                                     f"its output is in {self.log_path}") from None
            message = expect(message, LOADING_REPLIES, "while loading")
            if isinstance(message, Loading):
                progress(message.progress)
            elif isinstance(message, Ready):
                return message
            else:  # LoadFailed
                error_type = getattr(errors, message.kind, None)
                if isinstance(error_type, type) and issubclass(error_type, TokentuiError):
                    raise error_type(message.message)
                raise ModelLoadError(message.message)

    def _read(self) -> None:
        """Move the child's run messages into a bounded queue (when it is full the child's sends wait: back-pressure);
        when the connection closes, say so with `_ChildGone`, so a waiting run never has to poll."""
        try:
            while True:
                message = self._conn.recv()
                try:
                    self._events.put(expect(message, RUN_REPLIES, "during a run"))
                except ProtocolError as err:
                    self._events.put(_Refused(str(err)))
        except (EOFError, OSError):
            pass
        finally:
            self._events.put(_ChildGone())

    @property
    def pid(self) -> int:
        return self._proc.pid

    # ---- EngineLike
    @property
    def sampler(self) -> SamplerSettings:
        with self._state_lock:
            return self._sampler

    def update_sampler(self, **changes) -> SamplerSettings:
        """Validated here (a bad value raises SettingsError at once), applied by the child at its next step."""
        with self._state_lock:
            new = self._sampler.with_changes(**changes)
            changed = new != self._sampler
            self._sampler = new
        if changed:
            self._post(SetSampler(new))
        return new

    @property
    def options(self) -> RunOptions:
        return self._options

    @options.setter
    def options(self, value: RunOptions) -> None:
        self._options = value
        self._post(SetOptions(self._options))

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        self._paused = True
        self._post(Pause())

    def resume(self) -> None:
        self._paused = False
        self._post(Resume())

    def step_once(self) -> None:
        if self._paused:
            self._post(Step())

    def stop(self) -> None:
        with self._state_lock:
            serial = self._serial
        self._post(Stop(serial))

    def run(self, prompt: str, system: str | None = None) -> Iterator[Event]:
        """One generation, as the child's Engine reports it. If the child is ended on purpose (close) the run
        ends with a "stopped" done event; if it dies, with GenerationError naming how and where its log is."""
        with self._state_lock:
            self._serial += 1
            serial = self._serial
        self._post(Stop(serial - 1))  # a newer run retires the older one, as with Engine
        self._post(StartRun(serial, prompt, system))
        steps = StepTally()  # enough for a "stopped" done, without keeping every step
        prompt_tokens = 0
        finished = False
        try:
            while not finished:
                message = self._events.get()
                if isinstance(message, _ChildGone):
                    self._events.put(message)  # for any later run too
                    if self._closing:
                        finished = True
                        yield steps.stopped_done(prompt_tokens, self.facts.vocab_rows)
                        return
                    try:
                        self._proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                    raise GenerationError(f"the model process ended unexpectedly ({self._ended_text()}); "
                                          f"its output is in {self.log_path}")
                if isinstance(message, _Refused):
                    raise GenerationError(message.message)
                if message.serial != serial:
                    continue  # the tail of an older run
                if isinstance(message, Crash):
                    raise GenerationError(message.message)
                event = message.event
                if isinstance(event, StepEvent):
                    steps.add(event)
                elif isinstance(event, PromptEvent):
                    prompt_tokens = len(event.ids)
                finished = isinstance(event, (DoneEvent, ErrorEvent))
                yield event
        finally:
            if not finished:  # abandoned part-way: let the child stop too
                self._post(Stop(serial))

    def close(self, timeout: float = 1.0) -> None:
        """End the child: at once if it is loading or in a long prefill (a run in progress then ends "stopped")."""
        self._closing = True
        self._post(Quit())
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        try:
            self._conn.close()
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------------- child side
class _Child:
    """The model process: loads the engine on the main thread, runs one generation at a time there, and applies
    commands (stop, pause, step, settings) from a reader thread at once — the engine takes them at its next step."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.send_lock = threading.Lock()
        self.runs: queue.Queue[StartRun] = queue.Queue()
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
        if isinstance(command, StartRun):
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
                self.send(RunEvent(run.serial, stopped_done([], 0, engine.facts.vocab_rows)))
                continue
            try:
                for event in engine.run(run.prompt, run.system):
                    self.send(RunEvent(run.serial, event))
            except Exception as err:
                traceback.print_exc()
                self.send(Crash(run.serial, f"the model process failed: {type(err).__name__}: {err}"))


def _child(fd: int) -> None:
    _Child(Connection(fd)).serve()
