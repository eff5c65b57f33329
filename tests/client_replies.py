"""Reading an engine client's replies in a test: they come to one listener on the event loop; this queues them."""

from __future__ import annotations

import asyncio

from tokentui.core.errors import ErrorKind
from tokentui.core.link.client import EngineClient, RunUpdate
from tokentui.core.runs.events import DoneEvent, ErrorEvent, Event, StepEvent


class RunFailure(Exception):
    """The current run ended with an `error` event (and, as every failed run does, a `done` with reason "error" right
    after it): its message and kind."""

    def __init__(self, error: ErrorEvent) -> None:
        super().__init__(error.message)
        self.error = error
        self.kind: ErrorKind = error.kind


class Replies:
    def __init__(self, client: EngineClient) -> None:
        self.client = client
        self.queue: asyncio.Queue = asyncio.Queue()
        client.listener = self.queue.put_nowait

    async def next_update(self, timeout: float = 60.0) -> Event:
        while True:
            reply = await asyncio.wait_for(self.queue.get(), timeout)
            if isinstance(reply, RunUpdate):
                return reply.event

    async def next_event(self, timeout: float = 60.0) -> Event:
        """The next event of the current run; an `error` raises RunFailure once its `done` (reason "error") has
        followed it."""
        event = await self.next_update(timeout)
        if isinstance(event, ErrorEvent):
            done = await self.next_update(timeout)
            assert isinstance(done, DoneEvent) and done.reason == "error", done
            raise RunFailure(event)
        return event

    async def next_step(self, timeout: float = 60.0) -> StepEvent:
        while not isinstance(event := await self.next_event(timeout), StepEvent):
            pass
        return event

    async def rest(self, timeout: float = 120.0) -> list[Event]:
        """Every event up to and including the run's end (its `done`)."""
        got = []
        while True:
            event = await self.next_event(timeout)
            got.append(event)
            if isinstance(event, DoneEvent):
                return got

    async def run(self, prompt: str, system: str | None = None) -> list[Event]:
        self.client.start(prompt, system)
        return await self.rest()

    def start_anew(self, prompt: str, system: str | None = None) -> int:
        """Start a run that supersedes the current one. What the old run delivered before this call may still sit in
        the queue (the engine works on while the test reads), so it is dropped first; after the call nothing of the
        old run may arrive but how it ended (RunEnded), which is what the tests check."""
        self.drain()
        return self.client.start(prompt, system)

    def drain(self) -> list:
        out = []
        while not self.queue.empty():
            out.append(self.queue.get_nowait())
        return out
