"""core/runs/recording.py: the recording and `done` bookkeeping shared by `--headless` and the dashboard.

Driven by the scripted engine (tests/fakes.py) and a real RunRecorder in a temporary folder; each record is read
back as JSON and compared with the events the run yielded."""

from __future__ import annotations

import errno
import json
import signal

import pytest

from fakes import ANSWER, FACTS, ScriptedEngine
from tokentui.core.interrupts import interrupt
from tokentui.core.runs.events import DoneEvent, StepEvent
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.recording import RecordedRun


def read_record(path) -> list[dict]:
    raw = path.read_text(encoding="utf-8")
    assert raw.endswith("\n")  # whole lines only
    return [json.loads(line) for line in raw.splitlines()]


def as_json(event) -> dict:
    return json.loads(json.dumps(event.to_dict(), ensure_ascii=False))


class DiskFills(RunRecorder):
    """A RunRecorder whose disk fills after `room` lines: the next write fails as a full disk does."""

    def __init__(self, directory, room: int):
        super().__init__(directory)
        self.room = room
        self.lines = 0

    def write(self, event) -> None:
        if self.lines >= self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.lines += 1
        super().write(event)


class InterruptedAt(ScriptedEngine):
    """A signal arrives while step `at` is computed: headless mode's handler raises KeyboardInterrupt there."""

    def __init__(self, at: int, **kwargs):
        super().__init__(**kwargs)
        self.at = at

    def _run(self, prompt, system, run_id):
        for event in super()._run(prompt, system, run_id):
            if isinstance(event, StepEvent) and event.index == self.at:
                raise KeyboardInterrupt
            yield event


def test_every_event_is_recorded_after_the_facts(tmp_path):
    notes: list[str] = []
    engine = ScriptedEngine()
    with RecordedRun(engine.facts, RunRecorder(tmp_path), on_note=notes.append) as run:
        path = run.open()
        events = list(run.record(engine.run("Is OpenAI open?")))
    assert path is not None and path.parent == tmp_path
    assert read_record(path) == [as_json(FACTS)] + [as_json(e) for e in events]
    assert events == engine.events and isinstance(events[-1], DoneEvent) and events[-1].reason == "eos"
    assert run.finished and run.cut_off is None and notes == []


def test_a_write_error_mid_run_stops_recording_with_one_note_and_the_run_goes_on(tmp_path):
    notes: list[str] = []
    engine = ScriptedEngine()
    recorder = DiskFills(tmp_path, room=5)  # the facts and four events
    with RecordedRun(engine.facts, recorder, on_note=notes.append) as run:
        path = run.open()
        events = list(run.record(engine.run("Is OpenAI open?")))
    assert notes == [f"recording stopped: No space left on device; {path} ends early"]
    assert run.cut_short
    assert len(events) == len(engine.events) > 5 and isinstance(events[-1], DoneEvent)  # the run went on
    assert read_record(path) == [as_json(FACTS)] + [as_json(e) for e in events[:4]]
    assert recorder.lines == 5  # nothing was tried after the failure


def test_a_record_that_cannot_be_opened_is_one_note_and_the_run_goes_on(tmp_path):
    blocked = tmp_path / "runs"
    blocked.write_text("a file where the folder should be")
    notes: list[str] = []
    engine = ScriptedEngine()
    with RecordedRun(engine.facts, RunRecorder(blocked), on_note=notes.append) as run:
        assert run.open() is None
        events = list(run.record(engine.run("Is OpenAI open?")))
    assert notes == [f"run not recorded: {blocked} is a file, not a folder"]  # not "[Errno 17] File exists"
    assert isinstance(events[-1], DoneEvent) and run.path is None


def test_an_interrupted_runs_record_ends_with_done_stopped(tmp_path):
    events = []
    with pytest.raises(KeyboardInterrupt):
        engine = InterruptedAt(3)
        with RecordedRun(engine.facts, RunRecorder(tmp_path), on_note=pytest.fail) as run:
            path = run.open()
            for event in run.record(engine.run("Is OpenAI open?")):
                events.append(event)
    lines = read_record(path)
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert len(steps) == 3 and lines[:-1] == [as_json(FACTS)] + [as_json(e) for e in events]
    done = lines[-1]
    assert done == as_json(run.cut_off)
    assert done["event"] == "done" and done["reason"] == "stopped"
    assert done["tokens"] == 3 and done["text"] == "".join(s.text for s in ANSWER[:3]) == "Partly."
    assert done["prompt_tokens"] == 13 and done["kv_tokens"] == steps[-1].kv_tokens
    assert done["ttft_ms"] == steps[0].latency_ms


class SignalWhileWriting(RunRecorder):
    """A RunRecorder during whose write of step `at` a signal arrives, its handler interrupting as headless mode's
    does on a second signal (core/interrupts.py's `interrupt`): Python runs the handler right after the write."""

    def __init__(self, directory, at: int):
        super().__init__(directory)
        self.at = at

    def write(self, event) -> None:
        super().write(event)
        if isinstance(event, StepEvent) and event.index == self.at:
            signal.raise_signal(signal.SIGUSR1)


def test_a_signal_while_a_step_is_written_leaves_a_done_that_counts_it(tmp_path):
    """A second signal lands while a step is being recorded: the step is counted with its line, and the interrupt
    follows, so the `done` written for the cut-off run counts every step line the record holds (before: the interrupt
    fell between the write and the count, and `done` said one token fewer than the record held)."""
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: interrupt())
    try:
        engine = ScriptedEngine()
        passed = []
        with pytest.raises(KeyboardInterrupt):
            with RecordedRun(engine.facts, SignalWhileWriting(tmp_path, 2), on_note=pytest.fail) as run:
                path = run.open()
                for event in run.record(engine.run("Is OpenAI open?")):
                    passed.append(event)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    lines = read_record(path)
    steps = [line for line in lines if line["event"] == "step"]
    assert [s["index"] for s in steps] == [0, 1, 2]  # the step being written when the signal came is in the record
    assert lines[-1] == as_json(run.cut_off) and lines[-1]["reason"] == "stopped"
    assert lines[-1]["tokens"] == len(steps) == 3
    assert lines[-1]["text"] == "".join(s["text"] for s in steps)
    assert [e.index for e in passed if isinstance(e, StepEvent)] == [0, 1]  # interrupted before passing it on


def test_a_run_the_caller_stops_reading_still_ends_with_done(tmp_path):
    """The caller leaves the loop (its output is gone, it was interrupted between events): leaving the `with`
    finishes the record."""
    engine = ScriptedEngine()
    with RecordedRun(engine.facts, RunRecorder(tmp_path), on_note=pytest.fail) as run:
        path = run.open()
        for event in run.record(engine.run("Is OpenAI open?")):
            if isinstance(event, StepEvent) and event.index == 1:
                break
    lines = read_record(path)
    assert [e["event"] for e in lines] == ["model", "prompt", "prefill", "step", "step", "done"]
    assert lines[-1]["reason"] == "stopped" and lines[-1]["tokens"] == 2 and lines[-1]["text"] == "Partly"
    assert not run.finished and run.cut_off.tokens == 2


def test_cut_off_before_the_run_started(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with RecordedRun(FACTS, RunRecorder(tmp_path), on_note=pytest.fail) as run:
            path = run.open()
            raise KeyboardInterrupt  # a signal before the first event
    lines = read_record(path)
    assert [e["event"] for e in lines] == ["model", "done"]
    assert lines[-1]["tokens"] == 0 and lines[-1]["ttft_ms"] is None and lines[-1]["reason"] == "stopped"


def test_a_crash_ends_the_record_with_an_error_and_done_then_is_passed_on(tmp_path):
    engine = ScriptedEngine(raise_at=2)
    with pytest.raises(RuntimeError, match="scripted crash at step 3"):
        with RecordedRun(engine.facts, RunRecorder(tmp_path), on_note=pytest.fail) as run:
            path = run.open()
            for _ in run.record(engine.run("Is OpenAI open?")):
                pass
    lines = read_record(path)
    assert [e["event"] for e in lines] == ["model", "prompt", "prefill", "step", "step", "error", "done"]
    assert lines[-2]["kind"] == "crash" and "RuntimeError: scripted crash at step 3" in lines[-2]["message"]
    assert lines[-1]["reason"] == "error" and lines[-1]["tokens"] == 2
    assert run.cut_off is None and run.error is not None


def test_without_a_recorder_the_run_is_passed_through():
    engine = ScriptedEngine()
    with RecordedRun(engine.facts, None, on_note=pytest.fail) as run:
        assert run.open() is None
        events = list(run.record(engine.run("Is OpenAI open?")))
    assert events == engine.events and run.cut_off is None


def test_the_runner_keeps_no_steps_of_its_own(tmp_path):
    """A long run in the dashboard must not be held twice: the runner keeps a tally for its "stopped" done, not the
    steps (the run model in tui/state.py is their one owner)."""
    import gc
    from dataclasses import replace

    template = next(e for e in ScriptedEngine().run("Is OpenAI open?") if isinstance(e, StepEvent))

    class Streaming:
        """Makes each step fresh and forgets it: only what the runner keeps can stay alive."""

        def run(self):
            for i in range(2000):
                yield replace(template, index=i)

    alive = []
    with RecordedRun(FACTS, RunRecorder(tmp_path), on_note=lambda note: None) as run:
        run.open()
        for n, event in enumerate(run.record(Streaming().run())):
            if n == 1500:
                del event
                gc.collect()
                alive.append(sum(isinstance(o, StepEvent) for o in gc.get_objects()))
    assert alive and alive[0] <= 5, alive  # the last step (and the one in hand), not 1,500


def test_a_tally_gives_the_same_stopped_done_as_the_steps(tmp_path):
    from tokentui.core.runs.ending import StepTally, stopped_done

    steps = [e for e in ScriptedEngine().run("Is OpenAI open?") if isinstance(e, StepEvent)][:10]
    tally = StepTally()
    for step in steps:
        tally.add(step)
    tally.prompt_tokens = 13
    done = tally.done("stopped", FACTS.vocab_rows)
    assert done == stopped_done(steps, 13, FACTS.vocab_rows)
    assert done.tokens == 10 and done.ttft_ms == steps[0].latency_ms
    assert done.text == "".join(s.text for s in steps)
    assert done.dropped_hex == steps[-1].pending_hex  # the 10th step holds e5 bc of 开
