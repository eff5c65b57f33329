"""Reading an engine client's replies in a test: they come to one listener on the event loop; this queues them."""

from __future__ import annotations

import asyncio

from tokentui.core.link.client import EngineClient, RunFailed
from tokentui.core.errors import GenerationError
from tokentui.core.runs.events import DoneEvent, ErrorEvent, Event, StepEvent
from tokentui.core.link.protocol import RunEvent


class Replies:
    def __init__(self, client: EngineClient) -> None:
        self.client = client
        self.queue: asyncio.Queue = asyncio.Queue()
        client.listener = self.queue.put_nowait

    async def next_event(self, timeout: float = 60.0) -> Event:
        """The next engine event of the current run; a RunFailed reply raises GenerationError with its words."""
        while True:
            reply = await asyncio.wait_for(self.queue.get(), timeout)
            if isinstance(reply, RunFailed):
                raise GenerationError(reply.message)
            if isinstance(reply, RunEvent):
                return reply.event

    async def next_step(self, timeout: float = 60.0) -> StepEvent:
        while not isinstance(event := await self.next_event(timeout), StepEvent):
            pass
        return event

    async def rest(self, timeout: float = 120.0) -> list[Event]:
        """Every event up to and including the run's end."""
        got = []
        while True:
            event = await self.next_event(timeout)
            got.append(event)
            if isinstance(event, (DoneEvent, ErrorEvent)):
                return got

    async def run(self, prompt: str, system: str | None = None) -> list[Event]:
        self.client.start(prompt, system)
        return await self.rest()

    def drain(self) -> list:
        out = []
        while not self.queue.empty():
            out.append(self.queue.get_nowait())
        return out
