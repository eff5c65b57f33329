"""The dashboard's engine client for the model in a child process (core/link/process_client.py): the same events as the
in-process engine, live controls, load errors as one line, a child that never outlives its parent or dies silently,
and a parent that reads it on the event loop with no thread of its own."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import pytest_asyncio

from client_replies import Replies, RunFailure
from tokentui.core.errors import ErrorKind
from tokentui.core.model.engine import Engine
from tokentui.core.errors import GenerationError, ModelLoadError, SettingsError
from tokentui.core.runs.events import DoneEvent, ErrorEvent, PromptEvent, StepEvent
from tokentui.core.model.load.loader import load_model
from tokentui.core.link.process_client import ProcessClient
from tokentui.core.link.protocol import EngineSpec
from tokentui.core.settings import RunOptions, SamplerSettings
from tmux_pane import alive, wait_gone

pytestmark = pytest.mark.asyncio(loop_scope="module")

GREEDY = SamplerSettings(temperature=0.0)
SHORT = RunOptions(max_new_tokens=24, ignore_eos=True)
LONG = RunOptions(max_new_tokens=400, ignore_eos=True)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def child(embedded):
    client = ProcessClient(EngineSpec(sampler=GREEDY, options=SHORT, dtype="float32"))  # the `embedded` model's path
    await client.load()
    yield client
    client.close()


def steps_of(events) -> list[StepEvent]:
    return [e for e in events if isinstance(e, StepEvent)]


async def test_the_child_reports_what_the_in_process_engine_reports(embedded, child):
    threads = threading.active_count()
    local = Engine(embedded, GREEDY, SHORT)
    here = list(local.run("Is OpenAI open?"))
    there = await Replies(child).run("Is OpenAI open?")
    assert threading.active_count() == threads  # the parent reads its child on the event loop: no thread
    assert child.facts.name == local.facts.name and child.facts.parameters == local.facts.parameters
    assert [type(e) for e in there] == [type(e) for e in here]
    assert next(e for e in there if isinstance(e, PromptEvent)) == next(e for e in here if isinstance(e, PromptEvent))
    a, b = steps_of(here), steps_of(there)
    assert [s.id for s in b] == [s.id for s in a] and len(b) == 24
    assert [s.text for s in b] == [s.text for s in a]
    assert [[(c.id, c.prob) for c in s.candidates] for s in b] == [[(c.id, c.prob) for c in s.candidates] for s in a]
    assert [s.kv_bytes for s in b] == [s.kv_bytes for s in a]
    assert there[-1].text == here[-1].text and there[-1].reason == "length"


async def test_live_settings_pause_step_and_stop_reach_the_child(child):
    child.set_options(LONG)
    with pytest.raises(SettingsError):  # checked in the parent, at once, and nothing changes
        child.set_sampler(child.sampler.with_changes(top_p=1.5))
    assert child.sampler == GREEDY
    replies = Replies(child)
    run_id = child.start("Tell me a story.")
    assert child.run_id == run_id
    steps = [await replies.next_step() for _ in range(4)]
    child.set_sampler(child.sampler.with_changes(temperature=0.9, top_k=7, seed=3))
    steps += [await replies.next_step() for _ in range(4)]
    assert [s.settings.temperature for s in steps[:4]] == [0.0] * 4
    assert steps[-1].settings.temperature == 0.9 and steps[-1].settings.top_k == 7
    child.pause()
    assert child.paused
    await asyncio.sleep(0.5)  # the step under way when pause arrived may still come
    drained = len(replies.drain())
    await asyncio.sleep(1.0)
    assert replies.queue.empty(), "steps kept arriving while paused"
    last = steps[-1].index + drained
    child.step_once()
    assert (await replies.next_step(10.0)).index == last + 1
    await asyncio.sleep(0.5)
    assert replies.queue.empty(), "one step let through, not more"
    child.resume()
    assert (await replies.next_step(10.0)).index == last + 2
    child.stop()
    rest = await replies.rest(10.0)
    assert isinstance(rest[-1], DoneEvent) and rest[-1].reason == "stopped" and len(rest) < 10
    child.set_options(SHORT)
    child.set_sampler(GREEDY)


async def test_a_new_run_supersedes_the_current_one_whose_events_never_arrive(child):
    child.set_options(LONG)
    replies = Replies(child)
    first = child.start("Count to a thousand.")
    await replies.next_step()
    child.set_options(RunOptions(max_new_tokens=5, ignore_eos=True))
    second = replies.start_anew("Hi")
    assert second == first + 1 == child.run_id
    events = await replies.rest()
    assert isinstance(events[0], PromptEvent) and events[0].user_prompt == "Hi"  # nothing of the first run
    assert [s.index for s in steps_of(events)] == [0, 1, 2, 3, 4]
    assert isinstance(events[-1], DoneEvent) and events[-1].reason == "length"
    child.set_options(SHORT)


async def test_a_bad_prompt_is_an_error_event_not_a_crash(child):
    replies = Replies(child)
    with pytest.raises(RunFailure, match="over this model's context") as failed:
        await replies.run("word " * 9000)
    assert failed.value.kind == ErrorKind.PROMPT
    assert steps_of(await replies.run("Hi"))  # the child is still serving


async def test_load_errors_arrive_as_the_same_one_line_error(isolated_dirs, tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ModelLoadError) as here:
        load_model(missing)
    client = ProcessClient(EngineSpec(model=missing))
    stages = []
    try:
        with pytest.raises(ModelLoadError) as there:
            await client.load(stages.append)
    finally:
        client.close()
    assert str(there.value) == str(here.value) and "\n" not in str(there.value)
    # progress came back from the child: its imports first, then the search that failed
    assert [s.stage for s in stages] == ["importing torch and transformers", "finding the model"]


async def test_a_child_killed_mid_run_is_a_failure_naming_its_log(embedded):
    client = ProcessClient(EngineSpec(sampler=GREEDY, options=LONG))
    try:
        await client.load()
        replies = Replies(client)
        client.start("Is OpenAI open?")
        await replies.next_step()
        os.kill(client.pid, signal.SIGKILL)
        with pytest.raises(RunFailure) as err:
            await replies.rest(30.0)
        assert "ended unexpectedly (killed by SIGKILL)" in str(err.value) and str(client.log_path) in str(err.value)
    finally:
        client.close()


async def test_closing_mid_run_ends_the_run_stopped_and_the_child(embedded, tmp_path):
    from tokentui.core.runs.record_writer import RunRecorder
    from tokentui.core.runs.run import Run

    client = ProcessClient(EngineSpec(sampler=GREEDY, options=LONG), recorder=RunRecorder(tmp_path))
    await client.load()
    replies = Replies(client)
    client.start("Is OpenAI open?")
    steps = [await replies.next_step() for _ in range(3)]
    pid = client.pid
    client.close()
    rest = [r.event for r in replies.drain() if hasattr(r, "event")]
    assert isinstance(rest[-1], DoneEvent) and rest[-1].reason == "stopped"
    assert rest[-1].tokens >= len(steps)
    assert wait_gone(pid, 5.0) < 5.0
    record = Run.from_record(next(tmp_path.glob("*.jsonl")))  # the record ends with that done, every line whole
    assert record.done == rest[-1] and record.record_notice is None


async def test_the_child_does_not_outlive_a_killed_parent(embedded, tmp_path):
    script = textwrap.dedent("""
        import asyncio
        from tokentui.core.link.process_client import ProcessClient
        from tokentui.core.link.protocol import EngineSpec

        async def main():
            client = ProcessClient(EngineSpec())
            await client.load()
            print(client.pid, flush=True)
            await asyncio.sleep(600)

        asyncio.run(main())
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(await asyncio.to_thread(parent.stdout.readline))
        assert alive(pid)
        parent.kill()
        parent.wait()
        assert wait_gone(pid, 10.0) < 10.0
    finally:
        parent.kill()


async def test_the_dashboard_parent_never_imports_torch():
    code = ("import sys; import tokentui.cli, tokentui.tui.app, tokentui.core.link.process_client, tokentui.core.link.client; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


async def test_the_weight_layout_flag_reaches_the_child(embedded):
    """`--weight-layout` travels in the spec: the child reports the re-laid matrices while loading, or none (float32
    weights: the 4-bit path has no wide float matrices to re-lay)."""
    from tokentui.cli import build_parser
    from tokentui.commands.common import engine_spec

    for flag, expect in (("auto", True), ("stock", False)):
        spec = engine_spec(build_parser().parse_args(["--weight-layout", flag, "--dtype", "float32"]))
        assert spec.weight_layout == flag
        stages = []
        client = ProcessClient(spec)
        try:
            await client.load(stages.append)
            relaid = [s.stage for s in stages if s.stage.startswith("re-laying")]
            assert relaid == (["re-laying 61 wide matrices (310 MiB) for a faster CPU decode (same values)"]
                              if expect else [])
            assert stages[-1].stage == "ready"  # after the layout
        finally:
            client.close()
