"""The engine in a child process, for the dashboard.

Why a process and not a thread: the dashboard's Python work (Textual composing frames) and the engine's Python work
(dispatching ~1,000 small torch operations per token) would share one GIL. Measured on the 2-core benchmark box:
with the app and the model in one process, decode fell to 0.64x headless and the process used one core in all (a
torch thread next to a busy Python thread ran 50x fewer small matrix products). In a child process the model keeps
a core to itself and the dashboard only receives events. Headless mode keeps the in-process `Engine`.

`ProcessEngine` has the interface the app uses (`tui.config.EngineLike`): the same events, settings applied at the
next step boundary, pause / single step / stop. Importing this module does not import torch; the parent of a
dashboard never loads it.

Protocol: `multiprocessing.connection` over a socket pair, pickled tuples.
  parent -> child  ("load", EngineSpec) first; then ("run", serial, prompt, system), ("stop", serial),
                   ("pause",), ("resume",), ("step",), ("sampler", SamplerSettings), ("options", RunOptions), ("quit",)
  child -> parent  ("progress", LoadProgress) while loading, then ("ready", facts, sampler, options) or
                   ("load-error", kind, message); then ("event", serial, Event) and ("crash", serial, message)
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
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable, Iterator

from . import errors
from .errors import GenerationError, ModelLoadError, TokentuiError
from .events import DoneEvent, ErrorEvent, Event, LoadProgress, ModelFacts, PromptEvent, StepEvent, stopped_done
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
        conn.send(("load", spec))
    except OSError:  # it died at once; ProcessEngine reports how
        pass
    return StartedProcess(proc, conn, log_path)


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
        self._dead = threading.Event()
        try:
            ready = self._wait_ready(progress)
        except BaseException:
            self.close()
            raise
        self.facts: ModelFacts = ready[1]
        self._sampler: SamplerSettings = ready[2]
        self._options: RunOptions = ready[3]
        threading.Thread(target=self._read, name="tokentui-model-events", daemon=True).start()

    # ---- plumbing
    def _send(self, message: tuple) -> None:
        with self._send_lock:
            self._conn.send(message)

    def _post(self, message: tuple) -> None:
        """A control message; silently dropped once the child is gone (the run reports that)."""
        try:
            self._send(message)
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

    def _wait_ready(self, progress: Progress) -> tuple:
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
            if message[0] == "progress":
                progress(message[1])
            elif message[0] == "ready":
                return message
            elif message[0] == "load-error":
                kind, text = message[1], message[2]
                error_type = getattr(errors, kind, None)
                if isinstance(error_type, type) and issubclass(error_type, TokentuiError):
                    raise error_type(text)
                raise ModelLoadError(text)

    def _read(self) -> None:
        """Move the child's events into a bounded queue (when it is full the child's sends wait: back-pressure)."""
        try:
            while True:
                self._events.put(self._conn.recv())
        except (EOFError, OSError):
            pass
        finally:
            self._dead.set()

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
            self._post(("sampler", new))
        return new

    @property
    def options(self) -> RunOptions:
        return self._options

    @options.setter
    def options(self, value: RunOptions) -> None:
        self._options = value.validated()
        self._post(("options", self._options))

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        self._paused = True
        self._post(("pause",))

    def resume(self) -> None:
        self._paused = False
        self._post(("resume",))

    def step_once(self) -> None:
        if self._paused:
            self._post(("step",))

    def stop(self) -> None:
        with self._state_lock:
            serial = self._serial
        self._post(("stop", serial))

    def run(self, prompt: str, system: str | None = None) -> Iterator[Event]:
        """One generation, as the child's Engine reports it. If the child is ended on purpose (close) the run
        ends with a "stopped" done event; if it dies, with GenerationError naming how and where its log is."""
        with self._state_lock:
            self._serial += 1
            serial = self._serial
        self._post(("stop", serial - 1))  # a newer run retires the older one, as with Engine
        self._post(("run", serial, prompt, system))
        steps: list[StepEvent] = []
        prompt_tokens = 0
        finished = False
        try:
            while not finished:
                try:
                    message = self._events.get(timeout=0.1)
                except queue.Empty:
                    if not self._dead.is_set() or not self._events.empty():
                        continue
                    if self._closing:
                        finished = True
                        yield stopped_done(steps, prompt_tokens, self.facts.vocab_rows)
                        return
                    try:
                        self._proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                    raise GenerationError(f"the model process ended unexpectedly ({self._ended_text()}); "
                                          f"its output is in {self.log_path}")
                if message[1] != serial:
                    continue  # the tail of an older run
                if message[0] == "crash":
                    raise GenerationError(message[2])
                event = message[2]
                if isinstance(event, StepEvent):
                    steps.append(event)
                elif isinstance(event, PromptEvent):
                    prompt_tokens = len(event.ids)
                finished = isinstance(event, (DoneEvent, ErrorEvent))
                yield event
        finally:
            if not finished:  # abandoned part-way: let the child stop too
                self._post(("stop", serial))

    def close(self, timeout: float = 1.0) -> None:
        """End the child: at once if it is loading or in a long prefill (a run in progress then ends "stopped")."""
        self._closing = True
        self._post(("quit",))
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        try:
            self._conn.close()
        except OSError:
            pass
        self._dead.set()


# ---------------------------------------------------------------------------------------------------- child side
def _child(fd: int) -> None:
    conn = Connection(fd)
    send_lock = threading.Lock()

    def send(message: tuple) -> None:
        with send_lock:
            conn.send(message)

    try:
        first = conn.recv()
    except (EOFError, OSError):
        return
    spec: EngineSpec = first[1]
    runs: queue.Queue = queue.Queue()
    engine_box: list = []
    stop_serial = [0]
    running_serial = [0]

    def commands() -> None:
        """Control messages, applied at once; runs are queued for the main thread. EOF: the parent is gone."""
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                os._exit(0)
            op = message[0]
            if op == "quit":
                os._exit(0)
            engine = engine_box[0] if engine_box else None
            if op == "run":
                runs.put(message)
            elif engine is None:
                continue
            elif op == "stop":
                stop_serial[0] = max(stop_serial[0], message[1])
                if running_serial[0] <= message[1]:
                    engine.stop()
            elif op == "pause":
                engine.pause()
            elif op == "resume":
                engine.resume()
            elif op == "step":
                engine.step_once()
            elif op == "sampler":
                engine.update_sampler(**message[1].to_dict())
            elif op == "options":
                engine.options = message[1]

    threading.Thread(target=commands, name="tokentui-commands", daemon=True).start()
    # The imports take seconds in this fresh process: said, so the dashboard's first stage is not a blank. (Not
    # in load_engine: headless's signal tests interrupt at its first load event, and interrupted in the middle of
    # `import torch` the process once failed to exit; that case was not looked into further.)
    send(("progress", LoadProgress("importing torch and transformers", None)))
    try:
        engine = load_engine(spec, lambda p: send(("progress", p)))
    except TokentuiError as err:
        send(("load-error", type(err).__name__, str(err)))
        return
    except Exception as err:  # shown in the dashboard's dialog as one line; the log has the traceback
        import traceback

        traceback.print_exc()
        send(("load-error", "ModelLoadError", f"could not load the model ({type(err).__name__}: {err})"))
        return
    engine_box.append(engine)
    send(("ready", engine.facts, engine.sampler, engine.options))
    while True:
        _, serial, prompt, system = runs.get()
        running_serial[0] = serial
        if serial <= stop_serial[0]:  # stopped before it started
            send(("event", serial, stopped_done([], 0, engine.facts.vocab_rows)))
            continue
        try:
            for event in engine.run(prompt, system):
                send(("event", serial, event))
        except Exception as err:
            import traceback

            traceback.print_exc()
            send(("crash", serial, f"the model process failed: {type(err).__name__}: {err}"))

