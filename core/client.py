"""The dashboard's one engine client: what the app talks to, on its asyncio event loop.

The client is the one owner, in the dashboard's process, of the current run's id and of the sampler settings and
run options asked for (before the model is loaded too: they are handed to the engine when it is ready). Commands are
method calls that take effect at the engine's next step boundary; replies come back as typed dataclasses through
one `listener`, called on the event loop:

    RunOpened(run_id, record_path)  a run started (its record, if recorded)
    RunEvent(run_id, event)         one engine event of the current run (core/protocol.py)
    RunNote(run_id, message)        something about the run that is not an engine event (the record failed)
    RunFailed(run_id, message)      the engine failed outside its own error events (a crash, its process died)

Events of a run that a newer one superseded are still recorded (its record ends with `done`) but not passed on,
so the app never filters stale events itself. Recording is core/runner.py's `RecordedRun`, fed event by event.

Two transports: `ProcessClient` (core/process.py), the model in a child process read with `loop.add_reader` — no
thread in this process; and `LocalClient` here, an in-process engine with the blocking `run()` iterator (a replay,
the tests' scripted engine), stepped on one executor thread: `next()` on it is the only blocking call, and it ends
at the engine's next step once stopped.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

from .errors import SettingsError, TokentuiError
from .events import DoneEvent, ErrorEvent, Event, LoadProgress, ModelFacts
from .protocol import RunEvent
from .record import RunRecorder
from .runner import RecordedRun
from .settings import RunOptions, SamplerSettings

Progress = Callable[[LoadProgress], None]


@dataclass(frozen=True, slots=True)
class RunOpened:
    run_id: int
    record_path: Path | None


@dataclass(frozen=True, slots=True)
class RunNote:
    run_id: int
    message: str
    severity: str = "warning"


@dataclass(frozen=True, slots=True)
class RunFailed:
    run_id: int
    message: str


Reply = Union[RunOpened, RunEvent, RunNote, RunFailed]
Listener = Callable[[Reply], None]


class EngineClient:
    """What both transports share: the run id, the settings, the records, stale-run filtering. Subclasses send the
    commands (`_send_*`) and report what the engine says through `_event` / `_failed`."""

    def __init__(self, sampler: SamplerSettings | None = None, options: RunOptions | None = None,
                 recorder: RunRecorder | None = None) -> None:
        self.facts: ModelFacts | None = None  # once loaded
        self._sampler = sampler or SamplerSettings()
        self._options = options or RunOptions()
        self._recorder = recorder
        self.listener: Listener = lambda reply: None
        self._run_id = 0
        self._records: dict[int, RecordedRun] = {}  # runs not yet ended, by id (a superseded one may still run)
        self._ended: dict[int, asyncio.Future] = {}
        self._paused = False

    # ---- state this client owns ---------------------------------------------------------------------------
    @property
    def run_id(self) -> int:
        """The current run's id (0 before the first); only its events reach the listener."""
        return self._run_id

    @property
    def loaded(self) -> bool:
        return self.facts is not None

    @property
    def sampler(self) -> SamplerSettings:
        return self._sampler

    def update_sampler(self, **changes) -> SamplerSettings:
        """Validated here (a bad value raises SettingsError and changes nothing); the engine uses the new settings
        from its next step."""
        new = self._sampler.with_changes(**changes)
        if new != self._sampler:
            if self.loaded:
                self._send_sampler(new)  # an engine that cannot change them (a replay) refuses: nothing changes
            self._sampler = new
        return new

    @property
    def options(self) -> RunOptions:
        return self._options

    def set_options(self, options: RunOptions) -> None:
        if not isinstance(options, RunOptions):
            raise TypeError(f"options must be RunOptions, got {type(options).__name__}")
        self._options = options
        if self.loaded:
            self._send_options(options)

    @property
    def paused(self) -> bool:
        return self._paused

    # ---- loading ------------------------------------------------------------------------------------------
    async def load(self, progress: Progress = lambda p: None) -> ModelFacts:
        """Load the model (raises TokentuiError with one line when it cannot); then the settings asked for so far
        are the engine's."""
        self.facts = None
        facts, sampler, options = await self._load(progress)
        self.facts = facts
        if options != self._options:
            self._send_options(self._options)
        if sampler != self._sampler:
            try:
                self._send_sampler(self._sampler)
            except SettingsError as err:  # e.g. a replay plays its recorded settings: those are the ones in force
                self._sampler = sampler
                self.listener(RunNote(self._run_id, str(err)))
        return facts

    # ---- runs ---------------------------------------------------------------------------------------------
    def start(self, prompt: str, system: str | None = None) -> int:
        """Stop the current run (it ends at its next step, recorded) and start `prompt`; returns the new run's id."""
        if not self.loaded:
            raise RuntimeError("start() before the model is loaded")
        self.stop()
        self._run_id += 1
        run_id = self._run_id
        record = RecordedRun(self, self._recorder,
                             on_note=lambda message: self._reply(run_id, RunNote(run_id, message)))
        self._records[run_id] = record
        self._ended[run_id] = asyncio.get_running_loop().create_future()
        self._reply(run_id, RunOpened(run_id, record.open()))
        self._send_start(run_id, prompt, system)
        return run_id

    def stop(self) -> None:
        if self._run_id in self._records:
            self._send_stop(self._run_id)

    def pause(self) -> None:
        self._paused = True
        self._send_pause()

    def resume(self) -> None:
        self._paused = False
        self._send_resume()

    def step_once(self) -> None:
        if self._paused:
            self._send_step()

    def halt(self) -> None:
        """Stop the current run and let it end (a paused one is resumed so it can)."""
        self.stop()
        if self._paused:
            self.resume()

    async def finish(self, timeout: float) -> bool:
        """Stop the current run and wait up to `timeout` s for it to end (its record then ends with the engine's
        own `done`); False if it did not (one long model run, e.g. a long prompt's prefill, cannot stop half-way)."""
        self.halt()
        pending = [future for future in self._ended.values() if not future.done()]
        if not pending:
            return True
        done, _ = await asyncio.wait(pending, timeout=timeout)
        return len(done) == len(pending)

    def close_records(self) -> None:
        """End every record still open: a run cut off before its `done` gets a "stopped" one from its steps."""
        for run_id in list(self._records):
            self._end(run_id)

    # ---- what subclasses report ---------------------------------------------------------------------------
    def _event(self, run_id: int, event: Event) -> None:
        record = self._records.get(run_id)
        if record is None:
            return  # a run already ended (or never started here): nothing to record or show
        record.feed(event)
        self._reply(run_id, RunEvent(run_id, event))
        if isinstance(event, (DoneEvent, ErrorEvent)):
            self._end(run_id)

    def _failed(self, run_id: int, message: str) -> None:
        record = self._records.get(run_id)
        if record is None:
            return
        record.crashed()
        self._end(run_id)
        self._reply(run_id, RunFailed(run_id, message))

    def _cut_off(self, run_id: int) -> None:
        """The engine's stream of `run_id` ended without `done` (its process was closed on purpose): the record's
        "stopped" done is passed on as the run's end."""
        record = self._records.get(run_id)
        if record is None:
            return
        self._end(run_id)
        if record.cut_off is not None:
            self._reply(run_id, RunEvent(run_id, record.cut_off))

    def _end(self, run_id: int) -> None:
        record = self._records.pop(run_id, None)
        if record is not None:
            record.close()
        future = self._ended.pop(run_id, None)
        if future is not None and not future.done():
            future.set_result(None)

    def _reply(self, run_id: int, reply: Reply) -> None:
        if run_id == self._run_id:
            self.listener(reply)

    # ---- the transport ------------------------------------------------------------------------------------
    async def _load(self, progress: Progress) -> tuple[ModelFacts, SamplerSettings, RunOptions]:
        raise NotImplementedError

    def _send_start(self, run_id: int, prompt: str, system: str | None) -> None:
        raise NotImplementedError

    def _send_stop(self, run_id: int) -> None:
        raise NotImplementedError

    def _send_pause(self) -> None:
        raise NotImplementedError

    def _send_resume(self) -> None:
        raise NotImplementedError

    def _send_step(self) -> None:
        raise NotImplementedError

    def _send_sampler(self, sampler: SamplerSettings) -> None:
        raise NotImplementedError

    def _send_options(self, options: RunOptions) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """End the engine (and its process, if any); records still open end with a "stopped" done."""
        self.close_records()


_END = object()  # next() on an exhausted run


class LocalClient(EngineClient):
    """An engine in this process (`tui.config.EngineLike`: a replay, the tests' scripted engine), loaded by
    `loader(progress)` and run on one executor thread of its own, one run after another."""

    def __init__(self, loader: Callable[[Progress], object], sampler: SamplerSettings | None = None,
                 options: RunOptions | None = None, recorder: RunRecorder | None = None) -> None:
        super().__init__(sampler, options, recorder)
        self._loader = loader
        self.engine = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokentui-engine")
        self._pump: asyncio.Task | None = None

    async def _load(self, progress: Progress):
        loop = asyncio.get_running_loop()

        def threadsafe(p: LoadProgress) -> None:
            loop.call_soon_threadsafe(progress, p)

        self.engine = None
        engine = await loop.run_in_executor(self._executor, self._loader, threadsafe)
        if engine is None:
            raise RuntimeError("the loader returned no engine")
        self.engine = engine
        self._paused = engine.paused
        return engine.facts, engine.sampler, engine.options

    def _send_start(self, run_id: int, prompt: str, system: str | None) -> None:
        previous = self._pump
        self._pump = asyncio.get_running_loop().create_task(self._run(run_id, prompt, system, previous))

    async def _run(self, run_id: int, prompt: str, system: str | None, previous: asyncio.Task | None) -> None:
        """Step the engine's blocking iterator on the executor; each event is handled here, on the loop."""
        if previous is not None:  # one engine.run at a time: the older one was stopped and ends at its next step
            await asyncio.wait([previous])
        if run_id != self._run_id:  # superseded before it began
            self._cut_off(run_id)
            return
        loop = asyncio.get_running_loop()
        events = self.engine.run(prompt, system)
        stopping = False
        try:
            while True:
                event = await loop.run_in_executor(self._executor, next, events, _END)
                if event is _END:
                    break
                self._event(run_id, event)
                if run_id not in self._records:
                    break  # it ended (done / error)
                if not stopping and run_id != self._run_id:
                    self.engine.stop()  # superseded while running: it ends at its next step
                    stopping = True
        except asyncio.CancelledError:
            self.engine.stop()
            raise
        except Exception as err:
            self._failed(run_id, _one_line(err))
            return
        self._cut_off(run_id)  # no-op when it ended with done

    @property
    def paused(self) -> bool:
        """The engine's own flag (in this process it can be read, and a test's engine may pause itself)."""
        return self.engine.paused if self.engine is not None else self._paused

    def _send_stop(self, run_id: int) -> None:
        if self.engine is not None:
            self.engine.stop()

    def _send_pause(self) -> None:
        if self.engine is not None:
            self.engine.pause()

    def _send_resume(self) -> None:
        if self.engine is not None:
            self.engine.resume()

    def _send_step(self) -> None:
        if self.engine is not None:
            self.engine.step_once()

    def _send_sampler(self, sampler: SamplerSettings) -> None:
        self.engine.update_sampler(**sampler.to_dict())

    def _send_options(self, options: RunOptions) -> None:
        self.engine.options = options

    def close(self) -> None:
        if self.engine is not None:
            self.engine.stop()
            if self.engine.paused:
                self.engine.resume()
        self._executor.shutdown(wait=False)  # the run ends at its next step; nothing waits for it here
        super().close()


def _one_line(err: BaseException) -> str:
    return str(err) if isinstance(err, TokentuiError) else f"{type(err).__name__}: {err}"
