"""A temperature key press timed to the screen, as a user feels it: the key delivered as the terminal's input thread
delivers it, and the time until the sampler panel renders the new value. Shared by the dashboard's long-answer test
and benchmarks/dashboard_rate.py."""

from __future__ import annotations

import asyncio
import time

from textual import events

from tokentui.tui.panels import SamplerPanel


class SamplerRenders:
    """While entered, every render of the app's sampler panel, stamped: (time.perf_counter(), its text)."""

    def __init__(self, app) -> None:
        self.panel = app.query_one(SamplerPanel)
        self.renders: list[tuple[float, str]] = []

    def __enter__(self) -> "SamplerRenders":
        original = self._original = self.panel.render

        def render():
            result = original()
            self.renders.append((time.perf_counter(), getattr(result, "plain", str(result))))
            return result

        self.panel.render = render
        return self

    def __exit__(self, *exc) -> None:
        self.panel.render = self._original


async def press_temperature(app, renders: SamplerRenders, key: str, limit: float) -> float | None:
    """Press `key` ("T" up or "t" down); the milliseconds until the sampler panel shows the new temperature, or None
    when it has not within `limit` seconds."""
    target = round(app.controller.sampler.temperature + (0.1 if key == "T" else -0.1), 2)
    wanted = f"temperature {target:.2f}"
    started = time.perf_counter()
    renders.renders.clear()
    app.post_message(events.Key(key, key))  # as the terminal's driver delivers it (Pilot.press waits for idle)
    while True:
        shown = [t for t, text in renders.renders if t >= started and wanted in " ".join(text.split())]
        if shown:
            return (min(shown) - started) * 1000
        if time.perf_counter() - started > limit:
            return None
        await asyncio.sleep(0.0005)
