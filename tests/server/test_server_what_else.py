"""A served model (tests/fake_openai_server.py) and issue 26: on llama-server a fan-out, a scored text and a forced
phrase are each refused in one line (an `error` event, then `done`) — the server is not asked for them. (vLLM and
SGLang fan out: tests/server/test_server_fanout.py.)"""

from __future__ import annotations

from fake_openai_server import FakeServer
from tokentui.core.errors import ErrorKind
from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.runs.events import DoneEvent, ErrorEvent
from tokentui.core.runs.requests import FanoutRequest, ScoreRequest
from tokentui.core.server.engine import ServerEngine, ServerOptions
from tokentui.core.settings import RunOptions, SamplerSettings


def test_fan_out_score_and_phrase_on_a_served_model_are_one_line_each():
    with FakeServer(engine="llama.cpp") as server:
        engine = ServerEngine.connect(ServerOptions(server.url), SamplerSettings(temperature=0.8),
                                      RunOptions(max_new_tokens=4))
        asked = len(server.requests)
        cases = [
            (engine.fanout(FanoutRequest((1, 2), (), 0, n=4, m=3)), "llama-server does not return n completions: fan-out needs the local engine"),
            (engine.score(ScoreRequest("hello", "world")), "this engine cannot score a text"),
            (engine.branch(BranchPoint((1, 2), (), 0, 5, phrase=(5, 6))), "this engine cannot force a phrase"),
        ]
        for events, line in cases:
            error, done = list(events)
            assert isinstance(error, ErrorEvent) and error.message == line and error.kind == ErrorKind.SETTINGS
            assert isinstance(done, DoneEvent) and done.reason == "error"
        assert len(server.requests) == asked  # nothing was sent
