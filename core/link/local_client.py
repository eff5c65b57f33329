"""`LocalClient`: the dashboard's engine client (core/link/client.py) for an engine in this process — a replay, a
served model's engine, the tests' scripted engine: any BaseEngine (core/interface.py). Each message is applied to
the engine as its declaration says (core/link/operations.py's `call`), as the model process does. A run's
blocking iterator (run, branch, score, fan-out) is stepped on one executor thread of the client's own: `next()` on
it is the only blocking call, and a stopped run ends at the engine's next step. Each event is then handled on the
event loop, as ProcessClient's are."""

from __future__ import annotations

import asyncio
import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

from ..errors import ErrorKind
from ..interface import BaseEngine
from ..runs.events import Event, LoadProgress
from ..runs.record_writer import RunRecorder
from ..settings import RunOptions, SamplerSettings
from .client import EngineClient, Progress
from .operations import RUN, call, operation_of

_END = object()  # next() on an exhausted run


class LocalClient(EngineClient):
    """An engine in this process, loaded by `loader(progress)` and run on one executor thread of its own, one run
    (or branch) after another."""

    def __init__(self, loader: Callable[[Progress], BaseEngine], sampler: SamplerSettings | None = None,
                 options: RunOptions | None = None, recorder: RunRecorder | None = None) -> None:
        super().__init__(sampler, options, recorder)
        self._loader = loader
        self.engine: BaseEngine | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokentui-engine")
        self._pump: asyncio.Task | None = None

    async def _load(self, progress: Progress):
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()  # the caller's (the app's): progress is handled as if it had called

        def threadsafe(p: LoadProgress) -> None:
            loop.call_soon_threadsafe(progress, p, context=context)

        self.engine = None
        engine = await loop.run_in_executor(self._executor, self._loader, threadsafe)
        if not isinstance(engine, BaseEngine):
            raise TypeError(f"the loader returned {type(engine).__name__}, not an engine (core/interface.py)")
        self.engine = engine
        self._paused = engine.paused
        return engine.facts, engine.sampler, engine.options

    def _send(self, message) -> None:
        if operation_of(message).kind is RUN:
            self._start_pump(message.run_id, lambda: call(self.engine, message))
        elif self.engine is not None:  # a control: applied at once (the engine takes it at its next step)
            call(self.engine, message)

    def _refusal(self, what: str) -> str | None:
        return getattr(self.engine, f"{what}_refusal")

    async def _ask(self, message):
        # on the loop's default executor, not the run's own thread: that one may be waiting at a paused step
        return await asyncio.get_running_loop().run_in_executor(None, call, self.engine, message)

    def _start_pump(self, run_id: int, events: Callable[[], Iterator[Event]]) -> None:
        previous = self._pump
        self._pump = asyncio.get_running_loop().create_task(self._pump_events(run_id, events, previous))

    async def _pump_events(self, run_id: int, start: Callable[[], Iterator[Event]],
                           previous: asyncio.Task | None) -> None:
        """Step the engine's blocking iterator `start()` (a run, a branch, a score, a fan-out) on the executor; each
        event is handled here, on the loop."""
        if previous is not None:  # one engine iterator at a time: the older one was stopped, ends at its next step
            await asyncio.wait([previous])
        if run_id != self._run_id:  # superseded before it began
            self._cut_off(run_id)
            return
        loop = asyncio.get_running_loop()
        stopping = False
        try:
            events = start()
            while True:
                event = await loop.run_in_executor(self._executor, next, events, _END)
                if event is _END:
                    break
                self._event(run_id, event)
                if run_id not in self._records:
                    break  # it ended (done / error)
                if not stopping and run_id != self._run_id:
                    self.engine.stop(run_id)  # superseded while running: it ends at its next step
                    stopping = True
        except asyncio.CancelledError:
            self.engine.stop(run_id)
            raise
        except Exception as err:  # the engine raised (a bug): its record ends with the error, then `done`
            self._failed(run_id, f"{type(err).__name__}: {err}", ErrorKind.CRASH)
            return
        self._cut_off(run_id)  # no-op when it ended with done

    @property
    def paused(self) -> bool:
        """The engine's own flag (in this process it can be read, and a test's engine may pause itself)."""
        return self.engine.paused if self.engine is not None else self._paused

    def close(self) -> None:
        """Close the engine (its run ends at its next step; nothing waits for it here) and the records."""
        if self.engine is not None:
            self.engine.close()
        self._executor.shutdown(wait=False)
        super().close()
