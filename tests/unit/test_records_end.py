"""Issue 21 item 6: whatever ends a run in the dashboard's model process, its record ends with an `error` event and a
`done` (reason "error"), every line whole and read back by tokentui — here an exception inside the engine, in a real
second process speaking the real protocol (the scripted engine of tests/fakes.py, as tests/scripted_process.py
runs it). The model process killed mid-run is tests/dashboard/test_trust_tmux.py's (the real dashboard, kill -9)."""

from __future__ import annotations

import pytest

import scripted_process
from client_replies import Replies, RunFailure
from tokentui.core.errors import ErrorKind
from tokentui.core.link.process_client import ProcessClient
from tokentui.core.link.protocol import EngineSpec
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.run import Run
from tokentui.core.settings import RunOptions, SamplerSettings

pytestmark = pytest.mark.asyncio


async def test_an_exception_inside_the_engine_ends_the_record_with_error_and_done(tmp_path):
    runs = tmp_path / "runs"
    started = scripted_process.start(0.0, 8, tmp_path / "stamps", raise_at=2)
    client = ProcessClient(EngineSpec(), SamplerSettings(temperature=0.0),
                           RunOptions(max_new_tokens=8, ignore_eos=True), RunRecorder(runs), started=started)
    try:
        await client.load()
        replies = Replies(client)
        client.start("Is OpenAI open?")
        with pytest.raises(RunFailure) as failed:
            await replies.rest(60.0)
    finally:
        client.close()
    assert "RuntimeError: scripted crash at step 3" in str(failed.value)
    (path,) = runs.glob("*.jsonl")
    record = Run.from_record(path)  # every line whole, read back by tokentui
    assert record.record_notice is None and len(record) == 2  # the two steps before the crash
    assert record.error.kind == ErrorKind.CRASH and "scripted crash at step 3" in record.error.message
    assert record.done.reason == "error" and record.done.tokens == 2
    last_two = path.read_text().splitlines()[-2:]
    assert ['"event": "error"' in last_two[0], '"event": "done"' in last_two[1]] == [True, True]
