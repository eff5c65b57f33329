"""`LocalClient`: the dashboard's engine client (core/link/client.py) for an engine in this process — a replay, a
served model's engine, the tests' scripted engine: any BaseEngine (core/interface.py). Its blocking `run()` /
`branch()` iterators are stepped on one executor thread of the client's own: `next()` on them is the only blocking
call, and a stopped run ends at the engine's next step. Each event is then handled on the event loop, as
ProcessClient's are."""

from __future__ import annotations

import asyncio
import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

from ..errors import ErrorKind
from ..interface import BaseEngine
from ..runs.branch_point import BranchPoint
from ..runs.events import Event, LoadProgress
from ..runs.record_writer import RunRecorder
from ..settings import RunOptions, SamplerSettings
from .client import EngineClient, Progress

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

    def _send_start(self, run_id: int, prompt: str, system: str | None) -> None:
        self._start_pump(run_id, lambda: self.engine.run(prompt, system, run_id=run_id))

    def _send_branch(self, run_id: int, point: BranchPoint) -> None:
        self._start_pump(run_id, lambda: self.engine.branch(point, run_id=run_id))

    def _branch_refusal(self) -> str | None:
        return self.engine.branch_refusal

    def _refusal(self, what: str) -> str | None:
        return getattr(self.engine, f"{what}_refusal")

    def _send_score(self, run_id: int, request) -> None:
        self._start_pump(run_id, lambda: self.engine.score(request, run_id=run_id))

    def _send_fanout(self, run_id: int, request) -> None:
        self._start_pump(run_id, lambda: self.engine.fanout(request, run_id=run_id))

    async def _tokenize(self, text: str):
        # on the loop's default executor, not the run's own thread: that one may be waiting at a paused step
        return await asyncio.get_running_loop().run_in_executor(None, self.engine.phrase_pieces, text)

    def _start_pump(self, run_id: int, events: Callable[[], Iterator[Event]]) -> None:
        previous = self._pump
        self._pump = asyncio.get_running_loop().create_task(self._pump_events(run_id, events, previous))

    async def _pump_events(self, run_id: int, start: Callable[[], Iterator[Event]],
                           previous: asyncio.Task | None) -> None:
        """Step the engine's blocking iterator `start()` (a run or a branch) on the executor; each event is handled
        here, on the loop."""
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

    def _send_stop(self, run_id: int) -> None:
        if self.engine is not None:
            self.engine.stop(run_id)

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
        self.engine.set_sampler(sampler)

    def _send_options(self, options: RunOptions) -> None:
        self.engine.options = options

    def close(self) -> None:
        """Close the engine (its run ends at its next step; nothing waits for it here) and the records."""
        if self.engine is not None:
            self.engine.close()
        self._executor.shutdown(wait=False)
        super().close()
