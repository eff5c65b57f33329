"""Live controls: settings changed mid-run, pause / single step / stop, and the engine behind the dashboard's
in-process engine client (core/link/client.py LocalClient).
A tiny random model keeps these fast; what is checked is the loop's behaviour, not the model."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from client_replies import Replies
from tiny_models import tiny_model
from run_checks import failure_of
from tokentui.core.errors import ErrorKind
from tokentui.core.link.client import RunOpened
from tokentui.core.link.local_client import LocalClient
from tokentui.core.model.engine import Engine
from tokentui.core.errors import SettingsError
from tokentui.core.runs.events import DoneEvent, ErrorEvent, PromptEvent, StepEvent
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.run import Run
from tokentui.core.settings import RunOptions, SamplerSettings


@pytest.fixture(scope="module")
def tiny(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer)
    return LoadedModel(model=model, tokenizer=smol_tokenizer,
                       facts=model_facts(model, smol_tokenizer, name="tiny-llama"))


def test_settings_changed_mid_run_apply_at_the_next_step(tiny):
    engine = Engine(tiny, SamplerSettings(temperature=1.0, top_p=1.0, seed=1), RunOptions(max_new_tokens=8,
                                                                                          ignore_eos=True))
    seen = []
    for event in engine.run("Is OpenAI open?"):
        if isinstance(event, StepEvent):
            seen.append(event)
            if event.index == 2:
                engine.update_sampler(temperature=0.0, top_k=5)
    assert [s.settings.temperature for s in seen] == [1.0, 1.0, 1.0] + [0.0] * 5
    assert [s.settings_changed for s in seen] == [False, False, False, True, False, False, False, False]
    assert all(s.greedy for s in seen[3:]) and not any(s.greedy for s in seen[:3])
    assert all(s.id == s.candidates[0].id for s in seen[3:])  # greedy = the top raw candidate
    assert seen[3].settings.top_k == 5


def test_invalid_live_change_is_refused_and_the_run_goes_on(tiny):
    engine = Engine(tiny, SamplerSettings(), RunOptions(max_new_tokens=4, ignore_eos=True))
    for bad in (dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1)):
        with pytest.raises(SettingsError):
            engine.update_sampler(**bad)
    assert engine.sampler == SamplerSettings()
    assert isinstance(list(engine.run("Hi"))[-1], DoneEvent)


def test_new_seed_mid_run_reseeds_from_that_step(tiny):
    opts = RunOptions(max_new_tokens=10, ignore_eos=True)

    def ids(change_at=None):
        engine = Engine(tiny, SamplerSettings(temperature=1.5, top_p=1.0, seed=1), opts)
        out = []
        for e in engine.run("Hi"):
            if isinstance(e, StepEvent):
                out.append(e.id)
                if e.index == change_at:
                    engine.update_sampler(seed=2)
        return out

    base, changed = ids(), ids(change_at=4)
    assert base[:5] == changed[:5] and base[5:] != changed[5:]


def _collect_in_thread(engine, prompt="Is OpenAI open?"):
    events: list = []

    def consume():
        for event in engine.run(prompt):
            events.append(event)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    return events, thread


def _steps(events):
    return [e for e in list(events) if isinstance(e, StepEvent)]


def _wait_for(predicate, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_pause_single_step_resume_and_stop(tiny):
    engine = Engine(tiny, SamplerSettings(temperature=0), RunOptions(max_new_tokens=100_000, ignore_eos=True))
    engine.pause()
    events, thread = _collect_in_thread(engine)
    # Paused before the prefill: nothing past the prompt event.
    time.sleep(0.3)
    assert _steps(events) == []
    engine.step_once()
    assert _wait_for(lambda: len(_steps(events)) == 1)
    time.sleep(0.3)
    assert len(_steps(events)) == 1  # exactly one step per press
    engine.step_once()
    engine.step_once()
    assert _wait_for(lambda: len(_steps(events)) == 3)
    time.sleep(0.2)
    assert len(_steps(events)) == 3
    engine.resume()
    assert _wait_for(lambda: len(_steps(events)) > 20)
    engine.stop()
    thread.join(10)
    assert not thread.is_alive()
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.reason == "stopped"
    assert done.tokens == len(_steps(events))


def test_stop_while_paused_ends_the_run(tiny):
    engine = Engine(tiny, SamplerSettings(temperature=0), RunOptions(max_new_tokens=1000, ignore_eos=True))
    events, thread = _collect_in_thread(engine)
    assert _wait_for(lambda: len(_steps(events)) >= 2)
    engine.pause()
    time.sleep(0.1)
    engine.stop()
    thread.join(10)
    assert not thread.is_alive() and events[-1].reason == "stopped"


def test_a_new_run_retires_the_previous_one(tiny):
    engine = Engine(tiny, SamplerSettings(temperature=0), RunOptions(max_new_tokens=100_000, ignore_eos=True))
    first, thread = _collect_in_thread(engine)
    assert _wait_for(lambda: len(_steps(first)) >= 2)
    engine.options = RunOptions(max_new_tokens=3, ignore_eos=True)
    second = list(engine.run("Hi"))  # starting it retires the first run at its next step boundary
    thread.join(10)
    assert not thread.is_alive() and first[-1].reason == "stopped"
    assert isinstance(second[-1], DoneEvent) and second[-1].reason == "length" and second[-1].tokens == 3


def _local_client(engine, recorder=None):
    """The dashboard's in-process engine client (core/link/client.py) on `engine`, with the engine's own settings."""
    return LocalClient(lambda progress: engine, engine.sampler, engine.options, recorder)


async def test_a_local_client_runs_the_engine_off_the_event_loop(tiny):
    opts = RunOptions(max_new_tokens=12, ignore_eos=True)
    engine = Engine(tiny, SamplerSettings(temperature=0), opts)
    blocking = [e.id for e in engine.run("Hi") if isinstance(e, StepEvent)]
    ticks = 0

    async def ticker():  # the event loop keeps running while the model works
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    client = _local_client(engine)
    task = asyncio.create_task(ticker())
    try:
        await client.load()
        got = await Replies(client).run("Hi")
    finally:
        task.cancel()
        client.close()
    assert [e.id for e in got if isinstance(e, StepEvent)] == blocking
    assert isinstance(got[-1], DoneEvent) and ticks > 3


async def test_the_engine_waits_for_the_event_loop(tiny):
    """Back-pressure: the client asks the engine for one event at a time, so a busy event loop holds the run (at
    most the step already under way finishes) instead of letting events pile up."""
    engine = Engine(tiny, SamplerSettings(temperature=0), RunOptions(max_new_tokens=100_000, ignore_eos=True))
    forwards = 0

    def count(module, args, output):
        nonlocal forwards
        forwards += 1

    handle = tiny.model.register_forward_hook(count)
    client = _local_client(engine)
    try:
        await client.load()
        replies = Replies(client)
        client.start("Hi")
        for _ in range(3):
            await replies.next_step()
        before = forwards
        time.sleep(0.5)  # the loop is blocked: nobody asks for the next event (a tiny model's step takes ~ms)
        assert forwards - before <= 1
        client.stop()
        rest = await replies.rest()
        assert isinstance(rest[-1], DoneEvent) and rest[-1].reason == "stopped"
    finally:
        handle.remove()
        client.close()


async def test_a_superseded_or_stopped_run_ends_and_its_record_ends_with_done(tiny, tmp_path):
    engine = Engine(tiny, SamplerSettings(temperature=0), RunOptions(max_new_tokens=100_000, ignore_eos=True))
    client = _local_client(engine, RunRecorder(tmp_path))
    records = []
    try:
        await client.load()
        replies = Replies(client)
        listener = client.listener
        client.listener = lambda reply: (records.append(reply.record_path) if isinstance(reply, RunOpened)
                                         else None, listener(reply))
        first = client.start("Hi")
        for _ in range(5):
            await replies.next_step()
        client.set_options(RunOptions(max_new_tokens=3, ignore_eos=True))
        second = replies.start_anew("Hi")  # the first run ends at its next step; its events no longer arrive
        assert second == first + 1 == client.run_id
        events = await replies.rest()
        assert isinstance(events[0], PromptEvent) and [e.index for e in events if isinstance(e, StepEvent)] == [0, 1, 2]
        assert isinstance(events[-1], DoneEvent) and events[-1].reason == "length" and events[-1].tokens == 3
        # the engine is free again; stopping a run mid-way ends it "stopped" too
        client.set_options(RunOptions(max_new_tokens=100_000, ignore_eos=True))
        client.start("Hi")
        for _ in range(2):
            await replies.next_step()
        client.stop()
        rest = await replies.rest()
        assert isinstance(rest[-1], DoneEvent) and rest[-1].reason == "stopped"
        assert await client.finish(10.0)
    finally:
        client.close()
    assert len(records) == 3 and len(set(records)) == 3
    superseded, short, stopped = (Run.from_record(path) for path in records)
    for run in (superseded, short, stopped):
        assert run.record_notice is None and run.prompt is not None  # whole, each with its own events only
    assert superseded.done.reason == "stopped" and superseded.done.tokens == len(superseded) >= 5
    assert short.done.reason == "length" and len(short) == 3
    assert stopped.done == rest[-1] and len(stopped) >= 2


def test_empty_and_too_long_prompts_end_with_an_error_event(tiny):
    engine = Engine(tiny, SamplerSettings(temperature=0), RunOptions(max_new_tokens=3))
    err = failure_of(engine.run("   "))
    assert "empty" in err.message and err.kind == ErrorKind.PROMPT
    err = failure_of(engine.run("word " * 600))  # tiny model context: 512
    assert "over this model's context of 512" in err.message and err.kind == ErrorKind.PROMPT


def test_nan_logits_stop_the_run_naming_the_step(tiny):
    engine = Engine(tiny, SamplerSettings(temperature=0), RunOptions(max_new_tokens=10, ignore_eos=True))
    calls = {"n": 0}

    def poison(module, args, output):
        calls["n"] += 1
        if calls["n"] >= 3:
            return output * float("nan")
    handle = tiny.model.lm_head.register_forward_hook(poison)
    try:
        events = list(engine.run("Hi"))
    finally:
        handle.remove()
    err = failure_of(events)
    assert "step 3" in err.message and "NaN" in err.message and err.kind == ErrorKind.GENERATION and err.step == 2
    assert len(_steps(events)) == 2  # two tokens out; the third (step 3, numbered from 1) failed


def test_run_stops_when_the_context_is_full(tiny):
    engine = Engine(tiny, SamplerSettings(temperature=0), RunOptions(max_new_tokens=10_000, ignore_eos=True))
    events = list(engine.run("Is OpenAI open?"))
    prompt_tokens = len(events[0].ids)
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.reason == "context"
    # every token fed to the model sat at a position < 512; the last chosen token is reported, not fed
    assert done.kv_tokens == 512
    assert done.tokens == 512 - prompt_tokens + 1
