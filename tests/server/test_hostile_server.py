"""--server against a server that misbehaves on purpose (tests/hostile_server.py): the API key never shows, text it
sends is printed escaped, every malformed answer ends the run with one line naming what was wrong (kind server)
and a record tokentui reads back, and no stream holds a run past --server-timeout or memory past the line cap."""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc

import pytest

from hostile_server import END, ESCAPES, chunk, hostile
from run_checks import failure_of
from tokentui.core.errors import ErrorKind, ServerError
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.recording import RecordedRun
from tokentui.core.runs.run import Run
from tokentui.core.runs.events import StepEvent
from tokentui.core.server.engine import ServerEngine, ServerOptions
from tokentui.core.settings import RunOptions, SamplerSettings

GREEDY = SamplerSettings(temperature=0.0, greedy=True)
SECRET = "K3y-5ecret-0123456789-abcdefghij"
MAX_LINE_BYTES = 4 * 2**20  # the documented cap of a streamed line (core/server/stream.py)


def connect(server, timeout=30.0, key_env=None):
    return ServerEngine.connect(ServerOptions(server.url, timeout=timeout, **({"key_env": key_env} if key_env else {})),
                                GREEDY, RunOptions(max_new_tokens=8, top_candidates=2))


def run_recorded(engine, tmp_path):
    with RecordedRun(engine.facts, RunRecorder(tmp_path), on_note=lambda m: None) as run:
        run.open()
        events = list(run.record(engine.run("hello")))
    engine.close()
    return events, Run.from_record(run.path)


def assert_no_key(text: str) -> None:
    """Not the key, nor any 8 characters of it (a cut after the key's start would leak those)."""
    assert not any(SECRET[i:i + 8] in text for i in range(len(SECRET) - 7)), text


@pytest.mark.parametrize("hostile_server, says", [
    ("list-chunk", "should be a JSON object, got a list of 3"),
    ("number-chunk", "should be a JSON object, got 5"),
    ("number-text", "choices[0]: text should be text, got 5"),
    ("logprob-1000", "logprobs.top_logprobs[0]['token_id:172']: a log-probability should be a number <= 0, got 1000"),
    ("logprob-5", "a log-probability should be a number <= 0, got 5.0"),
    ("nan-logprob", "a streamed line is not JSON (NaN is not JSON)"),
    ("infinity-logprob", "a streamed line is not JSON (Infinity is not JSON)"),
    ("prob-148", "a probability should be a number in 0..1, got 148.4"),
    ("prob-minus-3", "a probability should be a number in 0..1, got -3.0"),
    ("id-1e30", 'a token id should be an integer in 0..2147483647, got "token_id:100000000000'),
    ("id-1e12", 'a token id should be an integer in 0..2147483647, got "token_id:1000000000000"'),
    ("id-minus-1", 'a token id should be an integer in 0..2147483647, got "token_id:-1"'),
    ("tokenize-one", "/tokenize: should be a JSON object, got a list of 1"),
    ("tokenize-words", '/tokenize: tokens[0]: a token id should be an integer in 0..2147483647, got "one"'),
    ("escapes-in-error", "answered 500: bad <0x1B>]0;TITLE<0x07><0x1B>[2J thing"),
], indirect=["hostile_server"])
def test_a_malformed_answer_ends_the_run_in_one_line_and_the_record_reads_back(tmp_path, hostile_server, says):
    events, record = run_recorded(connect(hostile_server), tmp_path)
    error = failure_of(events)
    assert says in error.message and error.kind == ErrorKind.SERVER, error.message
    assert "\n" not in error.message and "\x1b" not in error.message
    assert record.error == error and record.done.reason == "error"  # a whole record, read back by tokentui


@pytest.mark.parametrize("hostile_server, says", [
    ("redirect", "the server redirected (302) to http://elsewhere.example/v1/models; tokentui does not follow "
                 "redirects"),
    ("slots-lots", '/slots: [0]: n_prompt_tokens should be an integer >= 0, got "lots"'),
    ("nested-models", "/v1/models: the answer is not JSON (it is nested too deeply)"),
], indirect=["hostile_server"])
def test_a_malformed_answer_to_the_probe_is_one_line(hostile_server, says):
    with pytest.raises(ServerError) as refused:
        ServerEngine.connect(ServerOptions(hostile_server.url))
    assert says in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


def test_the_key_echoed_in_a_line_that_is_not_json_is_scrubbed(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENTUI_API_KEY", SECRET)
    with hostile("key-in-line") as server:
        events, record = run_recorded(connect(server), tmp_path)
        assert server.headers[-1]["Authorization"] == f"Bearer {SECRET}"  # it did get the key, and echoed it
    error = failure_of(events)
    assert "a streamed line is not JSON" in error.message and "Bearer <key>" in error.message
    assert_no_key(error.message)
    assert_no_key(record.record_path.read_text())


def test_the_key_at_the_end_of_a_long_refusal_is_scrubbed_before_the_cut(monkeypatch):
    monkeypatch.setenv("TOKENTUI_API_KEY", SECRET)
    with hostile("key-in-long-body") as server:
        with pytest.raises(ServerError) as refused:
            ServerEngine.connect(ServerOptions(server.url))
    message = str(refused.value)
    assert_no_key(message)  # the old cut (at 300 characters, before the scrub) left 23 of its characters
    assert "answered 401" in message and "you sent Bearer <key>" not in message and len(message) < 300


def test_the_cli_prints_server_text_escaped_and_never_the_key(tmp_path):
    env_key = {"TOKENTUI_API_KEY": SECRET}
    with hostile("escapes-in-text") as server:
        text = subprocess.run([sys.executable, "-m", "tokentui", "--server", server.url, "--headless", "--greedy",
                               "--record-dir", str(tmp_path / "a")], capture_output=True, text=True, timeout=120,
                              env={**_env(), **env_key})
    assert text.returncode == 0, text.stderr
    assert "\x1b" not in text.stdout and f"a{ESCAPES}b".replace("\x1b", "<0x1B>").replace("\x07", "<0x07>") \
        in text.stdout
    record = Run.from_record(next((tmp_path / "a").iterdir()))
    assert ESCAPES in record.text  # the record keeps what the server sent; only what is printed is escaped
    with hostile("escapes-in-error") as server:
        error = subprocess.run([sys.executable, "-m", "tokentui", "--server", server.url, "--headless",
                                "--no-record"], capture_output=True, text=True, timeout=120, env={**_env(), **env_key})
    assert error.returncode == 1 and "\x1b" not in error.stderr and "<0x1B>]0;TITLE<0x07>" in error.stderr
    with hostile("key-in-line") as server:
        echoed = subprocess.run([sys.executable, "-m", "tokentui", "--server", server.url, "--headless", "--json",
                                 "--record-dir", str(tmp_path / "b")], capture_output=True, text=True, timeout=120,
                                env={**_env(), **env_key})
    assert echoed.returncode == 1 and "not JSON" in echoed.stdout
    for out in (echoed.stdout, echoed.stderr, next((tmp_path / "b").iterdir()).read_text()):
        assert_no_key(out)


def test_a_stream_without_a_newline_is_refused_at_the_line_cap_without_holding_it(tmp_path):
    tracemalloc.start()
    try:
        with hostile("no-newline") as server:
            events, _ = run_recorded(connect(server), tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "a streamed line is longer than 4 MiB" in failure_of(events).message
    # the server sent 12 MiB: at most the cap and the chunk being read are held (the fake's own buffers included)
    assert peak < 3 * MAX_LINE_BYTES, peak


def drip_then_a_token(write, handler):
    """The drip mode's stream, ending in a second token after 10 s of bytes (50 of them, never a whole line): a run
    whose deadline did not hold would read it, or stumble on the dripped line."""
    write(chunk())
    for _ in range(50):
        write(b"d")
        time.sleep(0.2)
    write(b"\n\n" + chunk(text="i") + END)


def test_a_server_dripping_bytes_meets_the_timeout_between_tokens(tmp_path):
    # ordered against the server's drip, not timed: the 1 s deadline ends the run ten times sooner than the drip
    # ends (a byte every 0.2 s kept the run going without end before)
    with hostile("drip", stream=drip_then_a_token) as server:
        engine = connect(server, timeout=1.0)
        events, record = run_recorded(engine, tmp_path)
    error = failure_of(events)
    assert "the server sent no further token within 1 s" in error.message and "--server-timeout" in error.message
    assert [e.text for e in events if isinstance(e, StepEvent)] == ["H"]  # the token before the drip is kept
    assert record.done.reason == "error"


def test_a_slow_consumer_is_not_a_slow_server(tmp_path):
    """The deadline counts the time spent waiting for the server, not the time the reader of the events takes."""
    from fake_openai_server import FakeServer

    with FakeServer(token_delay=0.05) as server:
        engine = connect(server, timeout=0.5)
        events = []
        for event in engine.run("hello"):
            events.append(event)
            if isinstance(event, StepEvent) and event.index == 1:
                time.sleep(1.2)  # the dashboard busy (or the terminal suspended) between two tokens
        engine.close()
    assert events[-1].reason == "eos", events[-2:]


def test_an_infinite_server_timeout_means_no_limit(tmp_path):
    from fake_openai_server import FakeServer

    with FakeServer("slow", slow_s=0.3) as server:
        events, _ = run_recorded(connect(server, timeout=float("inf")), tmp_path)
    assert events[-1].reason == "eos"


def _env():
    import os

    return {k: v for k, v in os.environ.items() if k != "TOKENTUI_API_KEY"}


@pytest.mark.parametrize("hostile_server, says", [
    ("number-text", "choices[0]: text should be text, got 5"),
    ("escapes-in-error", "bad <0x1B>]0;TITLE<0x07><0x1B>[2J thing"),
], indirect=["hostile_server"])
async def test_the_dashboard_shows_a_malformed_answer_as_its_one_line(hostile_server, says):
    from fakes import screen_text, wait_for
    from tokentui.tui import DashboardConfig, TokentuiApp
    from tokentui.tui.screens import ErrorDialog

    app = TokentuiApp(DashboardConfig(load=lambda progress: connect(hostile_server), sampler=GREEDY,
                                      user_theme_dir=None))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), timeout=30, what="the dialog")
        await pilot.pause()
        text = " ".join(screen_text(app).replace("█", " ").split())  # the dialog wraps its line
        assert says in text and "\x1b" not in text, text
        assert "Error:" not in text and "Traceback" not in text  # the line, not an exception's text
