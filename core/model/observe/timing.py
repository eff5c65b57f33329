"""Where a step's time goes: `StepClock` measures core/runs/events.py's `StepTiming` for the engine's loop.

The parts tile the step. `latency_ms` runs from the step's start (the forward's start; for a run's first step, the
prefill's) to the moment its event is built, and forward + select + copy + detok cover that span: on the host's
clock the forward part runs from the step's start to the forward's return (so the engine's microseconds around
core/steps/decode.py's own timer count in it, and so would a garbage-collector pause there), while
StepEvent.forward_ms is the forward's own figure; under CUDA events all of the span but those microseconds. `wait` lies
outside it: the time from yielding the previous step's event to starting this step, less time paused at the step
gate, i.e. how long the consumer (in the dashboard: the pipe to the UI) held the engine's generator, plus the
engine's own tens of microseconds between steps (constructing the event, the step gate).

How each part is read:

* CPU: wall clock (`time.perf_counter`) at each boundary. forward is core/steps/decode.py's (or the prefill's) own
  milliseconds; select runs from the forward's end to the selection's return, less the copy; copy is the `.tolist()`
  of the selection's packed float32 vector: nothing crosses a bus on CPU, so "copy" is the CPU's counterpart of the
  GPU's device-to-host copy (the packed numbers turned into Python ones), and d2h_bytes the bytes it read.
* CUDA with `RunOptions.time_stages` ("exact"): wall clock too, with the device synced after the forward (as
  core/steps/decode.py always did) and once more just before the copy, so select holds the selection's kernels and copy
  the transfer alone. Costs that one extra sync per step.
* CUDA without it ("events", the default): no sync is added, and the forward's own sync is dropped (the host queues
  the selection while the model runs, as far as the sampler's own ops do not wait for the device). CUDA events
  recorded at the forward's start, at its end and just before the copy are read once the copy has returned (the
  copy's own sync has completed them): forward = first to second, select = second to third (the device's
  timeline: the selection's kernels and any gaps while the host queued them) plus the host's unpacking after the
  copy, copy = what remains of the span up to the copy's return (the transfer and the wake-up from its sync). A
  run's first step has a synced prefill: its forward is wall clock. When a selection copies twice (a widened
  prefix, rare), the first copy counts in select. What the events measure is the device's own timeline.
* A model spread over several devices (a device_map) is timed as under time_stages (events of two devices cannot
  be compared); its sync before the copy costs next to nothing, the copy would wait for the same work. A selection
  that never calls `to_host` reports no copy: all after the forward counts as select.

The logit lens (when on) runs after the selection; its time is added to forward (it is the model's final norm and
LM head once more per layer) and its own read-back is not counted in d2h_bytes.
h2d_bytes: 8 per int64 id the forward read (the prompt's ids for a run's first step, a real copy made before the
prefill's timer starts; one id for a decode step, which travels as a fill kernel's argument inside the forward).
"""

from __future__ import annotations

import time

import torch

from ...runs.events import StepTiming

ID_BYTES = 8  # an int64 token id


def _event(device: torch.device):
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event


def _seconds(start, end) -> float:
    """Seconds between two recorded CUDA events; waits for `end` only if it has not completed (it has, after the
    copy's sync, unless a selection never copied)."""
    if not end.query():
        end.synchronize()
    return start.elapsed_time(end) / 1000.0


class StepClock:
    """The stopwatch of one run's steps; the engine calls, per step: `forward_begins` (or `first`), `forward_ends`,
    the selection's copy through `to_host`, `selected`, `lensed` when the lens ran, then `finish`."""

    def __init__(self, model_device: torch.device, logits_device: torch.device):
        self.device = model_device
        self._events_possible = model_device.type == "cuda" and logits_device == model_device
        self._yielded: float | None = None  # when the previous step's event was handed over
        self.events = False
        self.step_start = 0.0
        self.forward_ms = 0.0  # the model run alone, for StepEvent.forward_ms (set by `finish`)

    @property
    def sync_forward(self) -> bool:
        """Whether core/steps/decode.py should sync after the forward (not when CUDA events time it)."""
        return not self.events

    def _reset(self, exact: bool, fed: int) -> None:
        self.events = self._events_possible and not exact
        self._f0 = self._f1 = self._s1 = None
        self._forward_s = 0.0
        self._copy_s = 0.0
        self._t_copy_end: float | None = None
        self._d2h = 0
        self._h2d = fed * ID_BYTES
        self._t_forward_end = self._t_selected = self._t_lensed = 0.0
        self._around_s = 0.0  # a decode step's host time from its start to the forward's return, beyond the forward's

    def first(self, forward_ms: float, fed: int, exact: bool) -> float:
        """A run's first step, scored by a prefill (synced; `forward_ms` long) that read `fed` ids: returns the step's
        start, `forward_ms` before now. No wait: nothing came before it."""
        now = time.perf_counter()
        self._reset(exact, fed)
        self._wait_s = 0.0
        self._forward_s = forward_ms / 1000.0
        self.step_start = now - self._forward_s
        self._t_forward_end = now
        if self.events:
            self._f1 = _event(self.device)  # where the selection starts on the device (now idle)
        return self.step_start

    def forward_begins(self, exact: bool, paused_s: float = 0.0) -> float:
        """A decode step starts now (returned); `exact`: RunOptions.time_stages; `paused_s`: time the step gate held
        the run since the last step, which is not the consumer's wait."""
        now = time.perf_counter()
        self._reset(exact, 1)
        self._wait_s = max(0.0, now - self._yielded - paused_s) if self._yielded is not None else 0.0
        self.step_start = now
        if self.events:
            self._f0 = _event(self.device)
        return now

    def forward_ends(self, forward_ms: float, fed: int = 1) -> None:
        """core/steps/decode.py returned after `forward_ms` (synced, or only queued under events), having read `fed`
        ids (one; a scored text's one forward reads the answer)."""
        self._t_forward_end = time.perf_counter()
        self._forward_s = forward_ms / 1000.0
        self._around_s = max(0.0, self._t_forward_end - self.step_start - self._forward_s)
        self._h2d = fed * ID_BYTES
        if self.events:
            self._f1 = _event(self.device)

    def to_host(self, packed: torch.Tensor) -> list:
        """The selection's device-to-host copy (core/steps/select.py's `to_host`), timed and counted."""
        if self.events:
            self._s1 = _event(packed.device)
        elif packed.device.type == "cuda":
            torch.cuda.synchronize(packed.device)  # exact: the selection's kernels end before the copy starts
        started = time.perf_counter()
        values = packed.tolist()
        self._t_copy_end = time.perf_counter()
        self._copy_s += self._t_copy_end - started
        self._d2h += packed.numel() * packed.element_size()
        return values

    def selected(self) -> None:
        """The selection returned."""
        self._t_selected = self._t_lensed = time.perf_counter()

    def lensed(self) -> None:
        """The logit lens, run after the selection, is done (its time counts as forward)."""
        self._t_lensed = time.perf_counter()

    def finish(self, now: float) -> StepTiming:
        """The step's parts, its event built at `now` (also sets `forward_ms`); the consumer's wait starts here."""
        forward = self._forward_s
        copy = self._copy_s
        if self.events and self._f0 is not None:
            forward = _seconds(self._f0, self._f1)  # decode's own figure was only the time to queue the forward
        if self.events and self._s1 is not None:
            on_device = _seconds(self._f1, self._s1)  # the selection's kernels, up to the packed vector
            copy = max(0.0, self._t_copy_end - self.step_start - forward - on_device)
            select = on_device + (self._t_selected - self._t_copy_end)
        elif self.events:  # a selection that did not copy through `to_host`: everything after the forward is select
            select, copy = max(0.0, self._t_selected - self.step_start - forward), 0.0
        else:
            select = max(0.0, self._t_selected - self._t_forward_end - copy)
        lens = self._t_lensed - self._t_selected
        self.forward_ms = forward * 1000.0
        # the split's forward part, from the step's start to the forward's return: timed by the host's clock, it also
        # holds the engine's microseconds around core/steps/decode.py's own timer (and a garbage-collector pause that
        # falls there), so the parts tile the span; StepEvent.forward_ms stays the forward's own figure
        span = forward if self.events else forward + self._around_s
        self._yielded = time.perf_counter()
        return StepTiming(forward_ms=(span + lens) * 1000.0, select_ms=select * 1000.0, copy_ms=copy * 1000.0,
                          detok_ms=(now - self._t_lensed) * 1000.0, wait_ms=self._wait_s * 1000.0,
                          h2d_bytes=self._h2d, d2h_bytes=self._d2h)
