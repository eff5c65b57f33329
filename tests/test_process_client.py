"""The dashboard's engine in a child process (core/process.py): the same events as the in-process engine, live
controls, load errors as one line, and a child that never outlives its parent or dies silently."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tokentui.core.engine import Engine
from tokentui.core.errors import GenerationError, ModelLoadError, SettingsError
from tokentui.core.events import DoneEvent, ErrorEvent, PrefillEvent, PromptEvent, StepEvent
from tokentui.core.loader import load_model
from tokentui.core.process import EngineSpec, ProcessEngine
from tokentui.core.settings import RunOptions, SamplerSettings
from tmux_pane import alive, wait_gone

GREEDY = SamplerSettings(temperature=0.0)
LONG = RunOptions(max_new_tokens=400, ignore_eos=True)


@pytest.fixture(scope="module")
def child(embedded):
    engine = ProcessEngine(EngineSpec(sampler=GREEDY, options=RunOptions(max_new_tokens=24, ignore_eos=True)))
    yield engine
    engine.close()


def steps_of(events) -> list[StepEvent]:
    return [e for e in events if isinstance(e, StepEvent)]


def test_the_child_reports_what_the_in_process_engine_reports(embedded, child):
    local = Engine(embedded, GREEDY, RunOptions(max_new_tokens=24, ignore_eos=True))
    here, there = list(local.run("Is OpenAI open?")), list(child.run("Is OpenAI open?"))
    assert child.facts.name == local.facts.name and child.facts.parameters == local.facts.parameters
    assert [type(e) for e in there] == [type(e) for e in here]
    assert next(e for e in there if isinstance(e, PromptEvent)) == next(e for e in here if isinstance(e, PromptEvent))
    a, b = steps_of(here), steps_of(there)
    assert [s.id for s in b] == [s.id for s in a] and len(b) == 24
    assert [s.text for s in b] == [s.text for s in a]
    assert [[(c.id, c.prob) for c in s.candidates] for s in b] == [[(c.id, c.prob) for c in s.candidates] for s in a]
    assert [s.kv_bytes for s in b] == [s.kv_bytes for s in a]
    assert there[-1].text == here[-1].text and there[-1].reason == "length"


def test_live_settings_pause_step_and_stop_reach_the_child(child):
    child.options = LONG
    child.update_sampler(temperature=0.0)
    with pytest.raises(SettingsError):  # checked in the parent, at once
        child.update_sampler(top_p=1.5)
    arrived: queue.Queue = queue.Queue()

    def read() -> None:
        for event in child.run("Tell me a story."):
            arrived.put(event)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def next_step(timeout: float = 30.0) -> StepEvent:
        while True:
            event = arrived.get(timeout=timeout)
            if isinstance(event, StepEvent):
                return event

    steps = [next_step() for _ in range(4)]
    child.update_sampler(temperature=0.9, top_k=7, seed=3)
    steps += [next_step() for _ in range(4)]
    assert [s.settings["temperature"] for s in steps[:4]] == [0.0] * 4
    assert steps[-1].settings["temperature"] == 0.9 and steps[-1].settings["top_k"] == 7
    child.pause()
    assert child.paused
    time.sleep(0.5)  # the step under way when pause arrived may still come
    drained = arrived.qsize()
    time.sleep(1.0)
    assert arrived.qsize() == drained, "steps kept arriving while paused"
    last = steps[-1].index + drained
    while not arrived.empty():
        arrived.get()
    child.step_once()
    assert next_step(10.0).index == last + 1
    time.sleep(0.5)
    assert arrived.empty(), "one step let through, not more"
    child.resume()
    assert next_step(10.0).index == last + 2
    child.stop()
    reader.join(10.0)
    assert not reader.is_alive()
    rest = []
    while not arrived.empty():
        rest.append(arrived.get())
    assert isinstance(rest[-1], DoneEvent) and rest[-1].reason == "stopped" and len(rest) < 10
    child.options = RunOptions(max_new_tokens=24, ignore_eos=True)
    child.update_sampler(**GREEDY.to_dict())


def test_a_new_run_retires_an_abandoned_one(child):
    child.options = LONG
    first = child.run("Count to a thousand.")
    got = [next(first) for _ in range(5)]
    assert any(isinstance(e, PrefillEvent) for e in got)
    first.close()  # abandoned half-way, as the app does when a run is superseded
    child.options = RunOptions(max_new_tokens=5, ignore_eos=True)
    events = list(child.run("Hi"))
    assert [s.index for s in steps_of(events)] == [0, 1, 2, 3, 4]
    assert isinstance(events[-1], DoneEvent) and events[-1].reason == "length"
    child.options = RunOptions(max_new_tokens=24, ignore_eos=True)


def test_a_bad_prompt_is_an_error_event_not_a_crash(child):
    events = list(child.run("word " * 9000))
    assert isinstance(events[-1], ErrorEvent) and "over this model's context" in events[-1].message
    assert steps_of(list(child.run("Hi")))  # the child is still serving


def test_load_errors_arrive_as_the_same_one_line_error(isolated_dirs, tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ModelLoadError) as here:
        load_model(missing)
    with pytest.raises(ModelLoadError) as there:
        ProcessEngine(EngineSpec(model=missing))
    assert str(there.value) == str(here.value) and "\n" not in str(there.value)


def test_a_child_killed_mid_run_is_an_error_naming_its_log(embedded):
    engine = ProcessEngine(EngineSpec(sampler=GREEDY, options=LONG))
    try:
        run = engine.run("Is OpenAI open?")
        while not isinstance(next(run), StepEvent):
            pass
        os.kill(engine.pid, signal.SIGKILL)
        with pytest.raises(GenerationError) as err:
            list(run)
        assert "ended unexpectedly (killed by SIGKILL)" in str(err.value) and str(engine.log_path) in str(err.value)
    finally:
        engine.close()


def test_closing_mid_run_ends_the_run_stopped_and_the_child(embedded):
    engine = ProcessEngine(EngineSpec(sampler=GREEDY, options=LONG))
    run = engine.run("Is OpenAI open?")
    steps = []
    for event in run:
        if isinstance(event, StepEvent):
            steps.append(event)
            if len(steps) == 3:
                break
    engine.close()
    rest = list(run)
    assert isinstance(rest[-1], DoneEvent) and rest[-1].reason == "stopped"
    assert rest[-1].tokens == len(steps) + len(steps_of(rest))
    assert engine._proc.poll() is not None


def test_the_child_does_not_outlive_a_killed_parent(embedded, tmp_path):
    script = textwrap.dedent("""
        import sys, time
        from tokentui.core.process import EngineSpec, ProcessEngine
        engine = ProcessEngine(EngineSpec())
        print(engine.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        assert alive(pid)
        parent.kill()
        parent.wait()
        assert wait_gone(pid, 10.0) < 10.0
    finally:
        parent.kill()


def test_the_dashboard_parent_never_imports_torch():
    code = ("import sys; import tokentui.cli, tokentui.tui.app, tokentui.core.process; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_dashboard_loader_starts_a_model_process(isolated_dirs, tmp_path):
    from tokentui.cli import build_parser, make_loader

    args = build_parser().parse_args(["--model", str(tmp_path / "missing")])
    stages = []
    with pytest.raises(ModelLoadError, match="no such file or folder"):
        make_loader(args, in_process=False)(stages.append)
    # progress came back from the child: its imports first, then the search that failed
    assert [s.stage for s in stages] == ["importing torch and transformers", "finding the model"]


def test_the_weight_layout_flag_reaches_the_child(embedded):
    """`--weight-layout` travels in the spec: the child reports the re-laid matrices while loading, or none."""
    from tokentui.cli import build_parser, engine_spec

    for flag, expect in (("auto", True), ("stock", False)):
        spec = engine_spec(build_parser().parse_args(["--weight-layout", flag]))
        assert spec.weight_layout == flag
        stages = []
        engine = ProcessEngine(spec, stages.append)
        try:
            relaid = [s.stage for s in stages if s.stage.startswith("re-laying")]
            assert relaid == (["re-laying 61 wide matrices (310 MiB) for a faster CPU decode (same values)"]
                              if expect else [])
            assert stages[-1].stage == "ready"  # after the layout
        finally:
            engine.close()
