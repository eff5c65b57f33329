"""--server against a misbehaving OpenAI-compatible server (tests/fake_openai_server.py, vLLM's shapes): each
fault ends the run with one line and a record that ends with `done`; the API key never reaches a record, an error
or the screen; plain http:// to another host is warned about (tests/server/test_key_never_shown.py: the key in
generated text, and held back from plain http://)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from fake_openai_server import ANSWER, FakeServer
from run_checks import failure_of
from tokentui.core.errors import ErrorKind
from tokentui.core.runs.events import DoneEvent, Notice, PromptEvent, StepEvent
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.record_reader import read_lines
from tokentui.core.runs.recording import RecordedRun
from tokentui.core.server.engine import ServerEngine, ServerOptions
from tokentui.core.errors import ServerError
from tokentui.core.server.http import ServerAddress
from tokentui.core.settings import RunOptions, SamplerSettings

GREEDY = SamplerSettings(temperature=0.0, greedy=True)


def run_recorded(engine, tmp_path, prompt="hello"):
    with RecordedRun(engine.facts, RunRecorder(tmp_path), on_note=lambda m: None) as run:
        run.open()
        events = list(run.record(engine.run(prompt)))
    lines = [event for _, event in read_lines(run.path)[0]]
    return events, lines


def connect(server, **kw):
    return ServerEngine.connect(ServerOptions(server.url, timeout=kw.pop("timeout", 60.0), **kw), GREEDY,
                                RunOptions(max_new_tokens=kw.pop("max_new_tokens", 20), top_candidates=2))


def test_openai_compatible_stream_gives_ids_text_and_pending_bytes(tmp_path):
    with FakeServer() as server:
        engine = connect(server)
        assert engine.facts.server.engine == "vLLM" and engine.facts.server.probs == "unknown"
        assert engine.facts.max_context == 512 and engine.facts.layers is None
        events, lines = run_recorded(engine, tmp_path)
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert [s.id for s in steps] == [100 + b for b in ANSWER.encode()]
    assert "".join(s.text for s in steps) == ANSWER
    # vLLM names ids, not bytes: a token that is part of a character has no bytes to show (its piece is its id),
    # and the text is the server's own, whole characters only, never U+FFFD
    k = ANSWER.encode().index("开".encode())
    assert [s.piece for s in steps[k:k + 2]] == [f"token_id:{100 + b}" for b in "开".encode()[:2]]
    assert [s.text for s in steps[k:k + 3]] == ["", "", "开"] and all(s.pending_hex == "" for s in steps)
    assert all(s.chosen_raw_prob is None and s.chosen_prob == pytest.approx(0.904837, abs=1e-5) for s in steps)
    # vllm:kv_cache_usage_perc from /metrics, read off the token path (None until the first reading)
    assert {s.server_kv_usage for s in steps} <= {None, 0.25} and steps[-1].server_kv_usage == 0.25
    assert server.requests[0]["return_tokens_as_token_ids"] is True
    assert server.requests[0]["prompt"] == next(e for e in events if isinstance(e, PromptEvent)).ids
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.reason == "eos" and done.text == ANSWER
    assert isinstance(lines[-1], DoneEvent)


@pytest.mark.parametrize("mode, says", [
    ("no-logprobs", "without log-probabilities"),
    ("cut", "ended without a finish reason"),
    ("refuse", "answered 500: CUDA out of memory (fake)"),
])
def test_a_fault_ends_the_run_with_one_line_and_a_whole_record(tmp_path, mode, says):
    with FakeServer(mode) as server:
        events, lines = run_recorded(connect(server), tmp_path)
    error = failure_of(events)
    assert says in error.message and "\n" not in error.message and error.kind == ErrorKind.SERVER
    assert failure_of(lines) == error  # the record ends the same way
    if mode == "cut":  # what came before the cut is kept
        assert events[-1].tokens == 3 and len([e for e in lines if isinstance(e, StepEvent)]) == 3


def test_a_slow_server_times_out_with_one_line(tmp_path):
    with FakeServer("slow", slow_s=2.0) as server:
        events, _ = run_recorded(connect(server, timeout=0.5), tmp_path)
    error = failure_of(events).message
    assert "sent no token within 0.5 s" in error and "--server-timeout" in error


def test_unreachable_server_and_unknown_model_are_one_line_errors():
    with FakeServer() as server:
        url = server.url
        with pytest.raises(ServerError, match="--server-model 'nope': the server lists fake-model"):
            ServerEngine.connect(ServerOptions(url, model="nope"))
    with pytest.raises(ServerError, match="cannot connect .*is the server running"):
        ServerEngine.connect(ServerOptions(url))  # the server is gone now


def test_api_key_comes_from_the_environment_and_never_shows(tmp_path, monkeypatch):
    secret = "sk-test-0123456789abcdef"
    with FakeServer("auth", key=secret) as server:
        monkeypatch.setenv("MY_KEY", "wrong-" + secret)
        with pytest.raises(ServerError) as refused:
            ServerEngine.connect(ServerOptions(server.url, key_env="MY_KEY"))
        assert "401" in str(refused.value) and secret not in str(refused.value)  # the echoed key is scrubbed
        monkeypatch.setenv("MY_KEY", secret)
        engine = ServerEngine.connect(ServerOptions(server.url, key_env="MY_KEY"), GREEDY, RunOptions(max_new_tokens=5))
        events, _ = run_recorded(engine, tmp_path)
        assert server.headers[-1]["Authorization"] == f"Bearer {secret}"
    assert isinstance(events[-1], DoneEvent) and events[-1].reason == "length"
    for path in tmp_path.iterdir():
        assert secret not in path.read_text()


def test_cli_headless_error_is_one_line_and_exit_status(tmp_path):
    with FakeServer("refuse") as server:
        result = subprocess.run([sys.executable, "-m", "tokentui", "--server", server.url, "--headless",
                                 "--record-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "answered 500: CUDA out of memory (fake)" in result.stderr and "Traceback" not in result.stderr
    record = next(tmp_path.iterdir())
    assert json.loads(record.read_text().splitlines()[-1])["event"] == "done"


def test_plain_http_to_another_host_is_warned_about():
    assert ServerAddress.parse("http://127.0.0.1:8080").plain_http_warning() is None
    assert ServerAddress.parse("localhost:8080/v1").url == "http://localhost:8080"
    assert "the prompt and the answer cross the network unencrypted" in \
        ServerAddress.parse("http://gpu-box.example:8000").plain_http_warning()
    assert "and the API key cross" in ServerAddress.parse("http://gpu-box.example:8000").plain_http_warning(True)
    assert ServerAddress.parse("https://gpu-box.example").plain_http_warning(True) is None
    with pytest.raises(ServerError, match="not in the URL"):
        ServerAddress.parse("http://user:key@host:8000")


def test_stop_from_another_thread_ends_a_blocked_read_at_once(tmp_path):
    """The stop comes while the run waits on the server's second token, which the server sends 5 s after the first:
    the run ends without it. A stop that waited for the read to return would play that token (counted, not timed)."""
    with FakeServer(token_delay=5.0) as server:
        engine = connect(server)
        events = []
        for event in engine.run("hello"):
            events.append(event)
            if isinstance(event, StepEvent):
                threading.Timer(0.2, engine.stop).start()  # once we wait on the next token
    assert events[-1].reason == "stopped"
    assert [e.text for e in events if isinstance(e, StepEvent)] == [ANSWER[0]]  # not the token the read waited on
    assert not [e for e in events if isinstance(e, Notice)]


def test_settings_change_from_another_thread_reissues_from_the_prefix(tmp_path):
    with FakeServer(token_delay=0.4) as server:
        engine = connect(server)
        threading.Timer(0.6, lambda: engine.update_sampler(temperature=0.5, greedy=False)).start()
        events = list(engine.run("hello"))
        steps = [e for e in events if isinstance(e, StepEvent)]
        prompt = next(e for e in events if isinstance(e, PromptEvent))
    assert [s.id for s in steps] == [100 + b for b in ANSWER.encode()]  # the fake answers the same either way
    changed = next(s for s in steps if s.settings_changed)
    assert changed.index > 0 and changed.reissue_ttft_ms is not None and changed.settings.temperature == 0.5
    second = server.requests[1]
    assert second["prompt"] == prompt.ids + [s.id for s in steps[:changed.index]]
    assert second["temperature"] == 0.5 and server.requests[0]["temperature"] == 0.0
    assert events[-1].reason == "eos"


def test_the_dashboard_checks_the_server_before_it_opens(tmp_path):
    with FakeServer() as server:
        wrong = subprocess.run([sys.executable, "-m", "tokentui", "--server", server.url, "--server-model", "nope"],
                               capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        url = server.url
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines() == [
        "tokentui: --server-model 'nope': the server lists fake-model"]
    gone = subprocess.run([sys.executable, "-m", "tokentui", "--server", url], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert gone.returncode == 2 and len(gone.stderr.strip().splitlines()) == 1
    assert "cannot connect" in gone.stderr and "Traceback" not in gone.stderr
