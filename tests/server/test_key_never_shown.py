"""The API key against a server that sends it back as generated text (tests/hostile_server.py's "key-as-tokens":
split over tokens of three characters, then whole in one token, and in the candidates; "key-cut-off": the run ends
twelve characters into it): it is masked before anything records, prints or draws it, and the token ids stay as
the server sent them. And the key is never sent over plain http:// to another host unless the user says so: the
refusal comes before anything connects (no address here is ever contacted but the loopback fakes)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from fake_openai_server import FakeServer
from hostile_server import KEY_TOKEN, hostile, key_pieces
from tokentui.core.errors import ServerError
from tokentui.core.runs.events import Notice, PromptEvent, StepEvent
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.recording import RecordedRun
from tokentui.core.runs.run import Run
from tokentui.core.server.engine import ServerEngine, ServerOptions
from tokentui.core.server.http import ServerAddress
from tokentui.core.settings import RunOptions, SamplerSettings

SECRET = "K3y-5ecret-0123456789-abcdefghij"
MASK = "[API key]"
GREEDY = SamplerSettings(temperature=0.0, greedy=True)
REMOTE = "http://example.invalid:1"  # never contacted: the tests below make sure nothing connects to it


def assert_no_key(text: str) -> None:
    """Not the key, nor any 8 characters of it."""
    assert not any(SECRET[i:i + 8] in text for i in range(len(SECRET) - 7)), text


def connect(server) -> ServerEngine:
    return ServerEngine.connect(ServerOptions(server.url), GREEDY, RunOptions(max_new_tokens=40, top_candidates=3))


def run_recorded(server, tmp_path):
    engine = connect(server)
    with RecordedRun(engine.facts, RunRecorder(tmp_path), on_note=lambda m: None) as run:
        run.open()
        events = list(run.record(engine.run("hello")))
    engine.close()
    return events, run.path


def _env(key: str | None = SECRET) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TOKENTUI_API_KEY"}
    return env | ({"TOKENTUI_API_KEY": key} if key else {})


# ---- the key in generated text --------------------------------------------------------------------------------
def test_the_key_generated_as_tokens_is_masked_in_the_events_and_the_record(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENTUI_API_KEY", SECRET)
    with hostile("key-as-tokens") as server:
        events, path = run_recorded(server, tmp_path)
    assert_no_key(repr(events))
    assert_no_key(path.read_text())
    steps = [e for e in events if isinstance(e, StepEvent)]
    pieces = key_pieces(SECRET)
    assert [s.id for s in steps] == [KEY_TOKEN + n for n in range(len(pieces))]  # the ids as the server sent them
    assert [s.text for s in steps] == ["Your key is ", MASK] + [""] * (len(pieces) - 5) + [" ok", MASK, "."]
    assert {s.piece for s in steps[1:-3] + [steps[-2]]} == {MASK}  # each token that carried part of it
    assert [c.piece for c in steps[0].candidates] == ["Your␣key␣is␣", MASK, f"is␣{MASK}"]
    record = Run.from_record(path)
    assert record.text == events[-1].text == f"Your key is {MASK} ok{MASK}."
    assert record.values("id") == [s.id for s in steps]


def test_a_run_that_ends_partway_into_the_key_masks_what_came(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENTUI_API_KEY", SECRET)
    with hostile("key-cut-off") as server:
        events, path = run_recorded(server, tmp_path)
    assert_no_key(path.read_text())
    assert [e.text for e in events if isinstance(e, StepEvent)] == ["So: ", MASK, "", ""]
    assert events[-1].reason == "eos" and events[-1].text == f"So: {MASK}"


def test_the_cli_never_prints_nor_records_the_generated_key(tmp_path):
    outputs = []
    for mode in ("", "--json"):
        folder = tmp_path / (mode or "text")
        with hostile("key-as-tokens") as server:
            done = subprocess.run([sys.executable, "-m", "tokentui", "--server", server.url, "--headless", "--greedy",
                                   *([mode] if mode else []), "--record-dir", str(folder)],
                                  capture_output=True, text=True, timeout=120, env=_env())
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
        for text in (done.stdout, done.stderr, next(folder.iterdir()).read_text()):
            assert_no_key(text)
    assert f"Your key is {MASK} ok{MASK}." in outputs[0]
    lines = [json.loads(line) for line in outputs[1].splitlines()]
    assert [e["id"] for e in lines if e["event"] == "step"][1] == KEY_TOKEN + 1 and lines[-1]["text"].count(MASK) == 2


async def test_the_dashboard_never_shows_the_generated_key(monkeypatch):
    from fakes import screen_text, wait_for
    from tokentui.tui import DashboardConfig, TokentuiApp

    monkeypatch.setenv("TOKENTUI_API_KEY", SECRET)
    with hostile("key-as-tokens") as server:
        app = TokentuiApp(DashboardConfig(load=lambda progress: connect(server), sampler=GREEDY,
                                          options=RunOptions(max_new_tokens=40, top_candidates=3),
                                          user_theme_dir=None))
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.state.phase == "done", timeout=30, what="the run")
            shown = [screen_text(app)]
            for _ in range(6):  # back over the key's tokens: their pieces and candidates
                await pilot.press("[")
                await pilot.pause()
                shown.append(screen_text(app))
            await pilot.press("q")
    assert MASK in shown[0]
    for text in shown:
        assert_no_key(text)
        assert_no_key("".join(text.split()))  # nor wrapped over two lines


# ---- no key over plain http:// to another host -----------------------------------------------------------------
def test_the_key_goes_over_plain_http_only_to_a_loopback_host_or_with_the_flag():
    from tokentui.core.server.http import key_for

    remote, local = ServerAddress.parse("http://gpu-box.example:8000"), ServerAddress.parse("http://127.0.0.1:8080")
    with pytest.raises(ServerError, match="--allow-plain-http-key") as refused:
        key_for(remote, SECRET, "MY_KEY")
    assert "$MY_KEY would cross the network unencrypted" in str(refused.value) and SECRET not in str(refused.value)
    assert key_for(remote, SECRET, allow_plain_http=True) == SECRET
    assert key_for(local, SECRET) == SECRET and key_for(ServerAddress.parse("localhost:8080"), SECRET) == SECRET
    assert key_for(ServerAddress.parse("https://gpu-box.example"), SECRET) == SECRET
    assert key_for(remote, None) is None  # without a key there is nothing to hold back


@pytest.fixture
def no_network(monkeypatch):
    """Every name lookup and connection attempt, recorded and refused: none may happen."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("no network in this test")

    for name in ("getaddrinfo", "create_connection"):
        monkeypatch.setattr(socket, name, refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return attempts


@pytest.mark.parametrize("argv", [
    ["--server", REMOTE, "--headless", "--no-record"],
    ["--server", REMOTE, "--no-record"],  # the dashboard
])
def test_the_cli_refuses_the_key_over_plain_http_before_anything_connects(argv, no_network, monkeypatch, capsys):
    from tokentui.cli import main

    monkeypatch.setenv("TOKENTUI_API_KEY", SECRET)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and no_network == [], (code, err)
    assert err.count("\n") == 1 and "--allow-plain-http-key" in err and "unencrypted" in err and SECRET not in err


@pytest.mark.parametrize("command", [["branch", "--token", "101"], ["fanout", "-n", "2"]])
def test_branch_and_fanout_refuse_the_key_over_plain_http_before_anything_connects(command, tmp_path, no_network,
                                                                                   monkeypatch, capsys):
    from tokentui.cli import main

    with FakeServer() as origin:  # a served record, made on a loopback fake (its own process: no patched socket)
        made = subprocess.run([sys.executable, "-m", "tokentui", "--server", origin.url, "--headless", "--greedy",
                               "--max-new-tokens", "3", "--record-dir", str(tmp_path)], capture_output=True,
                              text=True, timeout=120, env=_env(None))
    assert made.returncode == 0, made.stderr
    monkeypatch.setenv("TOKENTUI_API_KEY", SECRET)
    code = main([command[0], str(next(tmp_path.iterdir())), "--at", "1", *command[1:], "--no-record",
                 "--server", REMOTE])
    err = capsys.readouterr().err
    assert code == 2 and no_network == [] and "--allow-plain-http-key" in err, err


def test_plain_http_without_a_key_or_with_the_flag_is_warned_about_before_the_prompt_goes(monkeypatch):
    """A loopback fake taken for another host (ServerAddress.plain_http patched): without a key it runs, and the
    warning is the run's first event, before the prompt is sent; with a key it is refused unless the flag is given,
    and the warning then names the key."""
    monkeypatch.setattr(ServerAddress, "plain_http", property(lambda self: True))
    with FakeServer() as server:
        monkeypatch.delenv("TOKENTUI_API_KEY", raising=False)
        engine = ServerEngine.connect(ServerOptions(server.url), GREEDY, RunOptions(max_new_tokens=2))
        events = engine.run("hello")
        first = next(events)
        prompt_sent = server.prompt_ids != []  # set by its /tokenize of the chat: the prompt's first request
        rest = list(events)
        engine.close()
        assert isinstance(first, Notice) and "the prompt and the answer cross the network unencrypted" in first.message
        assert not prompt_sent
        assert any(isinstance(e, PromptEvent) for e in rest) and rest[-1].reason == "length"
        monkeypatch.setenv("TOKENTUI_API_KEY", SECRET)
        before = len(server.headers)
        with pytest.raises(ServerError, match="--allow-plain-http-key"):
            ServerOptions(server.url)
        assert len(server.headers) == before  # refused as the options were built: nothing was asked
        engine = ServerEngine.connect(ServerOptions(server.url, allow_plain_http_key=True), GREEDY,
                                      RunOptions(max_new_tokens=2))
        first = next(engine.run("hello"))
        engine.close()
        assert "the prompt, the answer and the API key cross" in first.message
        assert server.headers[-1]["Authorization"] == f"Bearer {SECRET}"
