"""The engine in a child process, for the dashboard.

Why a process and not a thread: the dashboard's Python work (Textual composing frames) and the engine's Python work
(dispatching ~1,000 small torch operations per token) would share one GIL: with the app and the model in one process
decode was far slower than headless and the process used one core in all (docs/design-record.md, "The model in its own process"). In a child process
the model keeps a core to itself and the dashboard only receives events. Headless mode keeps the in-process
`Engine`.

`ProcessClient` is the dashboard's engine client (core/link/client.py) for that child, read on the asyncio event loop.
Importing this module does not import torch; the parent of a dashboard never loads it. The child's side is
core/model/process_main.py.

Protocol: `multiprocessing.connection` over a socket pair, carrying the typed messages of core/link/protocol.py (the
parent sends Load, then the declared engine operations, each as the message that declares it, and Quit; the child
answers Loading (progress), then Ready or LoadFailed, then RunEvent and Crash, each tagged with its run's id, and
the declared answer of each question, e.g. Tokenized for a Tokenize).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable

from ..errors import ErrorKind, ModelLoadError, ProtocolError, SettingsError, error_of_kind
from .client import EngineClient
from ..runs.events import LoadProgress
from .operations import RUN, operation_of
from .protocol import LOADING_REPLIES, RUN_REPLIES, Crash, EngineSpec, Load, Loading, Quit, Ready, RunEvent, expect
from ..paths import open_private_log, private_dir, state_dir
from ..settings import RunOptions, SamplerSettings

Progress = Callable[[LoadProgress], None]
MESSAGES_PER_WAKE = 64  # messages read per wake-up of the event loop, so a fast model cannot starve the UI


def worker_log_path() -> Path:
    """Where the model process writes its stdout/stderr (library warnings would otherwise scribble on the
    dashboard): overwritten by each start, named in the error when that process ends unexpectedly. 0600 in a 0700
    folder (core/paths.py): it can hold a prompt (a traceback's locals, a library's warning)."""
    return state_dir() / "model-process.log"


def _open_log(log_path: Path):
    """(the log's file, its path): `log_path` when it can be written; else a fresh 0600 file in the temporary
    folder (a read-only state folder: the dashboard goes on, as headless does without its record); else none,
    (None, None): the output is dropped."""
    try:
        private_dir(log_path.parent)
        return open_private_log(log_path), log_path
    except OSError:
        pass
    try:
        fd, name = tempfile.mkstemp(prefix="tokentui-model-process-", suffix=".log")  # 0600
        return os.fdopen(fd, "wb"), Path(name)
    except OSError:
        return None, None


# ---------------------------------------------------------------------------------------------------- parent side
@dataclass
class StartedProcess:
    proc: subprocess.Popen
    conn: Connection
    log_path: Path | None  # None: its output could be kept nowhere


def start_model_process(spec: EngineSpec, log_path: Path | None = None) -> StartedProcess:
    """Start the child and ask it to load `spec`; returns at once. The dashboard calls this before importing
    textual, so the child's ~4 s of imports and loading overlap the app's start instead of following it."""
    log, log_path = _open_log(log_path or worker_log_path())
    parent_end, child_end = socket.socketpair()
    try:
        # A session of its own: terminal signals (Ctrl-C, SIGHUP) go to the dashboard, which ends this process.
        proc = subprocess.Popen(
            [sys.executable, "-c",
             "import sys; from tokentui.core.model.process_main import child_main; child_main(int(sys.argv[1]))",
             str(child_end.fileno())],
            pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL,
            stdout=log if log is not None else subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    finally:
        if log is not None:
            log.close()
    child_end.close()
    conn = Connection(parent_end.detach())
    try:
        conn.send(Load(spec))
    except OSError:  # it died at once; ProcessEngine reports how
        pass
    return StartedProcess(proc, conn, log_path)


class ProcessClient(EngineClient):
    """The engine in a child process, read on the event loop (`loop.add_reader` on the socket): no thread here.

    Back-pressure: messages are read only as the loop gets to them (at most MESSAGES_PER_WAKE per wake-up); when
    the app falls behind, the socket's buffer fills and the child's sends wait. A message in flight is read whole
    (`Connection.recv` blocks until its last byte, which the child is already writing)."""

    def __init__(self, spec: EngineSpec, sampler: SamplerSettings | None = None, options: RunOptions | None = None,
                 recorder=None, *, started: StartedProcess | None = None, log_path: Path | None = None) -> None:
        """`started`: a child already started for `spec` by `start_model_process` (it has been importing torch
        while the caller set up); otherwise one is started by `load`."""
        super().__init__(sampler if sampler is not None else spec.sampler,
                         options if options is not None else spec.options, recorder)
        self.spec = spec
        self.log_path = started.log_path if started is not None else (log_path or worker_log_path())
        self._started = started
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._loading: asyncio.Future | None = None
        self._progress: Callable[[LoadProgress], None] = lambda p: None
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._asked: dict[int, asyncio.Future] = {}  # questions (ASK operations) not yet answered, by number

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # ---- plumbing
    def _post(self, message) -> None:
        """A command for the child; dropped once the child is gone (the run in progress reports that)."""
        if self._conn is None:
            return
        try:
            self._conn.send(message)
        except (OSError, EOFError, ValueError):
            pass

    def _ended_text(self) -> str:
        code = self._proc.poll() if self._proc is not None else None
        if code is None:
            return "it closed its connection"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit status {code}"

    def _output_is(self) -> str:
        return f"its output is in {self.log_path}" if self.log_path is not None else "its output was not kept"

    def _readable(self) -> None:
        """The socket has data: read what is there (up to MESSAGES_PER_WAKE messages) and hand each on."""
        conn = self._conn
        try:
            for _ in range(MESSAGES_PER_WAKE):
                if conn is None or not conn.poll():
                    return
                self._received(conn.recv())
                conn = self._conn  # handling a message may have closed it
        except (EOFError, OSError):
            self._gone()

    def _received(self, message) -> None:
        loading = self._loading
        if loading is not None and not loading.done():
            try:
                message = expect(message, LOADING_REPLIES, "while loading")
            except ProtocolError as err:
                loading.set_exception(ModelLoadError(str(err)))
                return
            if isinstance(message, Loading):
                self._progress(message.progress)
            elif isinstance(message, Ready):
                loading.set_result(message)
            else:  # LoadFailed
                loading.set_exception(error_of_kind(message.kind, message.message))
            return
        try:
            message = expect(message, RUN_REPLIES, "during a run")
        except ProtocolError as err:  # refused, not misread: the run in progress ends with it
            self._failed(self.run_id, str(err), ErrorKind.PROTOCOL)
            return
        if isinstance(message, RunEvent):
            self._event(message.run_id, message.event)
        elif isinstance(message, Crash):
            self._failed(message.run_id, message.message, ErrorKind.CRASH)
        else:  # the answer to a question
            asked = self._asked.pop(message.asked, None)
            if asked is not None and not asked.done():
                try:
                    asked.set_result(message.result())
                except SettingsError as err:
                    asked.set_exception(err)

    def _gone(self) -> None:
        """The child's end closed: it exited or was ended."""
        self._detach()
        for asked in self._asked.values():  # questions it can no longer answer
            if not asked.done():
                asked.set_exception(SettingsError("the model process has ended"))
        self._asked.clear()
        if self._proc is not None and not self._closing:
            try:  # its end closed because it is exiting: its exit status says how (a moment, not a poll)
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        loading = self._loading
        if loading is not None and not loading.done():
            loading.set_exception(ModelLoadError(
                f"the model process ended while loading ({self._ended_text()}); {self._output_is()}"))
            return
        for run_id in list(self._records):
            if self._closing:
                self._cut_off(run_id)
            else:
                self._failed(run_id, f"the model process ended unexpectedly ({self._ended_text()}); "
                                     f"{self._output_is()}", ErrorKind.PROCESS)

    def _detach(self) -> None:
        if self._conn is not None and self._loop is not None:
            try:
                self._loop.remove_reader(self._conn.fileno())
            except (OSError, ValueError):
                pass
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
        self._conn = None

    # ---- EngineClient
    async def _load(self, progress):
        self._end_process(timeout=1.0)  # a retry starts afresh
        started = self._started or start_model_process(self.spec, self.log_path)
        self._started = None
        self.log_path = started.log_path  # where its output went (a temporary file: the state folder is read-only)
        self._proc, self._conn = started.proc, started.conn
        self._closing = False
        self._loop = asyncio.get_running_loop()
        self._progress = progress
        self._loading = self._loop.create_future()
        self._loop.add_reader(self._conn.fileno(), self._readable)
        try:
            ready: Ready = await self._loading
        except BaseException:
            self._end_process(timeout=1.0)
            raise
        finally:
            self._loading = None
        self._paused = False
        return ready.facts, ready.sampler, ready.options

    def _send(self, message) -> None:
        """A run's start goes to the child's queue (its engine branches on its own held KV cache of the latest run,
        core/model/branch.py); a control is applied there at once."""
        self._post(message)
        if self._conn is None and operation_of(message).kind is RUN:  # the child is gone already: the run says so
            self._loop.call_soon(self._gone)

    async def _ask(self, message):
        if self._conn is None:
            raise SettingsError("the model process has ended")
        future = self._loop.create_future()
        self._asked[message.asked] = future
        self._post(message)
        return await future

    def _end_process(self, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        self._closing = True
        self._post(Quit())
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._gone()
        self._proc = None

    def close(self, timeout: float = 1.0) -> None:
        """End the child: at once if it is loading or in a long prefill (a run in progress then ends "stopped",
        its record too)."""
        self._end_process(timeout)
        if self._started is not None:  # started early but never loaded
            self._started.proc.kill()
            self._started.proc.wait()
            self._started.conn.close()
            self._started = None
        super().close()
