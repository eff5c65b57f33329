"""How every run ends: with a `done` event, whatever ended it (core/interface.py's stream contract).

`StepTally` keeps, as a run's events pass, what its `done` needs when the engine cannot send its own — the count,
the first step's latency, the decode latencies' sum, the text, the last step — instead of the steps themselves (a
long run in the dashboard would otherwise hold every step twice). `finish_run` is the one error path every engine's
stream goes through: a TokentuiError becomes an ErrorEvent with its kind, and an ErrorEvent is followed by a `done`
with reason "error". core/runs/recording.py uses the same tally for the ends an engine never reports (an interrupt,
a crash, the model process killed).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

from ..errors import TokentuiError
from .events import BranchEvent, DoneEvent, ErrorEvent, Event, PrefillEvent, PromptEvent, StepEvent


class StepTally:
    __slots__ = ("count", "first_ms", "decode_ms", "text", "last", "prompt_tokens", "prefix_text", "kv")

    def __init__(self) -> None:
        self.count = 0
        self.first_ms: float | None = None
        self.decode_ms = 0.0
        self.text: list[str] = []
        self.last: StepEvent | None = None
        self.prompt_tokens = 0
        self.prefix_text = ""  # a branch's answer before its branch point (its `done` text starts with it)
        self.kv: tuple[int, int | None] = (0, 0)  # (tokens, bytes) the latest prefill or step reported

    def see(self, event: Event) -> None:
        """Note one event of the run (any kind: the ones a `done` needs are kept)."""
        if isinstance(event, StepEvent):
            self.add(event)
        elif isinstance(event, PromptEvent):
            self.prompt_tokens = len(event.ids)
        elif isinstance(event, BranchEvent):
            self.prompt_tokens = len(event.prompt_ids)
            self.prefix_text = event.prefix_text
        elif isinstance(event, PrefillEvent):
            self.kv = (event.kv_tokens, event.kv_bytes)

    def add(self, step: StepEvent) -> None:
        if self.count == 0:
            self.first_ms = step.latency_ms
        else:
            self.decode_ms += step.latency_ms
        self.count += 1
        if step.text:
            self.text.append(step.text)
        self.last = step
        self.kv = (step.kv_tokens, step.kv_bytes)

    def done(self, reason: str, vocab_rows: int | None) -> DoneEvent:
        """The `done` of a run that ended without the engine's own (reason "stopped": cut off from outside; "error":
        after an ErrorEvent). Time to first token and decode speed come from the steps' own latencies (None without
        a first token / a decode step); bytes the last step still held are reported as dropped."""
        n, last = self.count, self.last
        return DoneEvent(reason=reason, tokens=n, runs=n, scores=n * vocab_rows if vocab_rows else None,
                         ttft_ms=self.first_ms,
                         decode_tok_s=(n - 1) / (self.decode_ms / 1000.0) if self.decode_ms > 0 else None,
                         text=self.prefix_text + "".join(self.text), prompt_tokens=self.prompt_tokens,
                         kv_tokens=self.kv[0], kv_bytes=self.kv[1],
                         dropped_hex=last.pending_hex if last else "",
                         dropped_needed=last.pending_needed if last else 0)


def stopped_done(steps: "list[StepEvent]", prompt_tokens: int, vocab_rows: int | None) -> DoneEvent:
    """A "stopped" `done` for steps at hand as a list (a replay that played some of a record)."""
    tally = StepTally()
    tally.prompt_tokens = prompt_tokens
    for step in steps:
        tally.add(step)
    return tally.done("stopped", vocab_rows)


def stopped_before_first_token(prompt_tokens: int, kv_tokens: int = 0, kv_bytes: int | None = 0,
                               paused_ms: float = 0.0) -> DoneEvent:
    """The `done` of a run stopped before its first token (before or during prefill): no token, so no time to first
    token and no decode speed (null, not 0); the KV figures are what the prefill chunks done hold."""
    return DoneEvent(reason="stopped", tokens=0, runs=0, scores=0, ttft_ms=None, decode_tok_s=None, text="",
                     prompt_tokens=prompt_tokens, kv_tokens=kv_tokens, kv_bytes=kv_bytes, paused_ms=paused_ms)


def error_event(err: TokentuiError) -> ErrorEvent:
    return ErrorEvent(message=str(err), step=err.step, kind=err.kind)


def finish_run(events: Iterator[Event], vocab_rows: int | None) -> Iterator[Event]:
    """`events` passed on up to their end: their `done`; or an ErrorEvent (raised as a TokentuiError, or yielded)
    and then a `done` with reason "error" — the stream's own when one follows the error (a record played back),
    else one made from the steps seen. Nothing follows the end."""
    tally = StepTally()
    failed = False
    try:
        for event in events:
            if failed:  # after the error only its `done` is passed on
                if isinstance(event, DoneEvent):
                    yield event if event.reason == "error" else replace(event, reason="error")
                    return
                continue
            tally.see(event)
            yield event
            if isinstance(event, DoneEvent):
                return
            failed = isinstance(event, ErrorEvent)
    except TokentuiError as err:
        if not failed:
            yield error_event(err)
            failed = True
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
    if failed:
        yield tally.done("error", vocab_rows)


__all__ = ["StepTally", "error_event", "finish_run", "stopped_before_first_token", "stopped_done"]
