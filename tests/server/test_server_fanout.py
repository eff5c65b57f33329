"""Fan-out on a served model (core/server/fanout.py) against tests/fake_openai_server.py: one request for `n`
completions to a server that honours it (vLLM, SGLang), the local fan-out's events with the server's numbers
(what it does not give is None), a malformed choice ending the run with a server error, and the one-line refusal
of the servers that cannot (llama-server, one of no known kind)."""

from __future__ import annotations

import json
import math

import pytest
from cli_run import one_line_error, tokentui
from fake_openai_server import FakeServer, Reply, fanout_answer, fanout_logprob, ids_of

from tokentui.core.errors import ErrorKind
from tokentui.core.runs.events import DoneEvent, ErrorEvent, Notice, PrefillEvent
from tokentui.core.runs.explore_events import FanoutEvent, SampleEvent
from tokentui.core.runs.requests import FanoutRequest
from tokentui.core.server.engine import ServerEngine, ServerOptions
from tokentui.core.settings import RunOptions, SamplerSettings

PROMPT = (1, 2, 3)


def _engine(server: FakeServer, probs: str = "auto") -> ServerEngine:
    return ServerEngine.connect(ServerOptions(server.url, probs=probs), SamplerSettings(temperature=0.8, seed=5),
                                RunOptions(max_new_tokens=16))


@pytest.mark.parametrize("engine_kind", ["vllm", "sglang"])
def test_fan_out_is_one_request_for_n_completions_with_the_local_events(engine_kind):
    with FakeServer(engine=engine_kind) as server:
        engine = _engine(server, probs="raw")
        before = len(server.requests)
        events = list(engine.fanout(FanoutRequest(PROMPT, (7, 8), 2, n=3, m=4, seed=11, parent="p.jsonl",
                                                  parent_token=9)))
        engine.close()
    (body,) = server.requests[before:]  # one request
    assert (body["n"], body["max_tokens"], body["prompt"], body["seed"]) == (3, 4, [1, 2, 3, 7, 8], 11)
    assert body["logprobs"] == 10 and body["temperature"] == 0.8 and body["stream"] is True
    kinds = [type(e) for e in events if not isinstance(e, Notice)]
    assert kinds == [FanoutEvent, PrefillEvent, SampleEvent, SampleEvent, SampleEvent, DoneEvent]
    fan = events[0]
    assert (fan.at, fan.n, fan.m, fan.seed, fan.prompt_ids, fan.tokens, fan.parent, fan.parent_id) == \
        (2, 3, 4, 11, [1, 2, 3], [7, 8], "p.jsonl", 9)
    assert fan.kv_reused_tokens == 0 and fan.settings.temperature == 0.8
    first = ids_of(fanout_answer(0))[0]  # the step's candidates: the server's alternatives for the first token
    assert [(c.id, c.raw_prob, c.prob) for c in fan.candidates] == [
        (first, pytest.approx(math.exp(fanout_logprob(first))), None), (first + 1, pytest.approx(math.exp(-3.0)), None)]
    assert any("one request seeded 11" in e.message for e in events if isinstance(e, Notice))
    prefill = next(e for e in events if isinstance(e, PrefillEvent))
    assert prefill.tokens == 5 and prefill.kv_bytes is None and prefill.ms >= 0
    samples = [e for e in events if isinstance(e, SampleEvent)]
    for i, sample in enumerate(samples):
        ids = ids_of(fanout_answer(i))[:4]
        assert (sample.n, sample.seed, sample.ids, sample.text) == (i, 11, ids, fanout_answer(i)[:4])
        assert sample.pieces == [chr(t - 100).replace(" ", "␣") for t in ids]
        assert sample.raw_probs == pytest.approx([math.exp(fanout_logprob(t)) for t in ids])
        assert sample.probs == [None] * 4 and sample.logprob is None  # raw numbers: the post-sampler ones unknown
        assert sample.reason == "length"
    done = events[-1]
    assert (done.reason, done.tokens, done.runs, done.kv_bytes, done.scores) == ("length", 12, 1, None, None)


def test_post_sampler_numbers_give_each_samples_logprob_and_an_end_token_ends_it():
    with FakeServer() as server:
        engine = _engine(server, probs="post-sampler")
        events = list(engine.fanout(FanoutRequest(PROMPT, (), 0, n=2, m=20, seed=0)))
        engine.close()
    samples = [e for e in events if isinstance(e, SampleEvent)]
    for i, sample in enumerate(samples):
        ids = ids_of(fanout_answer(i))  # shorter than 20: the server finished it ("stop")
        assert sample.ids == ids and sample.raw_probs == [None] * len(ids)
        assert sample.logprob == pytest.approx(sum(fanout_logprob(t) for t in ids))
        assert sample.reason == "eos"
    assert events[-1].reason == "eos"


def _stream_of(*chunks):
    def stream(write, handler):
        for chunk in chunks:
            write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        write(b"data: [DONE]\n\n")
    return stream


def _token(token_id: int, index: int, logprob: float = -0.5) -> dict:
    return {"choices": [{"index": index, "text": "x", "finish_reason": None, "logprobs": {
        "tokens": [f"token_id:{token_id}"], "token_logprobs": [logprob],
        "top_logprobs": [{f"token_id:{token_id}": logprob}], "text_offset": [0]}}]}


@pytest.mark.parametrize("bad, field", [
    (_token(150, 5), "index should be an integer in 0..1"),          # a choice that was not asked for
    (_token(150, 1, logprob=2.0), "a log-probability should be a number <= 0"),
    ({"choices": [{"text": "x", "finish_reason": None}]}, "index should name one of the 2 completions"),
])
def test_a_malformed_choice_ends_the_run_with_a_server_error_and_done(bad, field):
    with FakeServer(stream=_stream_of(_token(150, 0), bad)) as server:
        engine = _engine(server)
        events = list(engine.fanout(FanoutRequest(PROMPT, (), 0, n=2, m=4)))
        engine.close()
    error, done = events[-2:]
    assert isinstance(error, ErrorEvent) and error.kind == ErrorKind.SERVER and field in error.message
    assert "\n" not in error.message
    assert isinstance(done, DoneEvent) and done.reason == "error"
    assert not any(isinstance(e, SampleEvent) for e in events)


def test_a_choice_the_server_never_finishes_is_a_server_error():
    # choice 1 is never sent: a server that ignores n answers one completion
    with FakeServer(stream=_stream_of(_token(150, 0), {"choices": [{"index": 0, "text": "",
                                                                    "finish_reason": "length"}]})) as server:
        engine = _engine(server)
        events = list(engine.fanout(FanoutRequest(PROMPT, (), 0, n=2, m=1)))
        engine.close()
    error, done = events[-2:]
    assert isinstance(error, ErrorEvent) and error.kind == ErrorKind.SERVER
    assert "completion 1 of the 2 asked for ended without a finish reason" in error.message
    assert done.reason == "error"


@pytest.mark.parametrize("engine_kind, line", [
    ("llama.cpp", "llama-server does not return n completions: fan-out needs the local engine"),
    ("other", "this server (OpenAI-compatible) is not known to return n completions (vLLM and SGLang do): fan-out "
              "needs the local engine"),
])
def test_servers_that_do_not_honour_n_refuse_in_one_line_and_are_not_asked(engine_kind, line):
    with FakeServer(engine=engine_kind) as server:
        engine = _engine(server)
        assert engine.fanout_refusal == line
        asked = len(server.requests)
        error, done = list(engine.fanout(FanoutRequest(PROMPT, (), 0, n=4, m=3)))
        engine.close()
    assert isinstance(error, ErrorEvent) and error.message == line and error.kind == ErrorKind.SETTINGS
    assert isinstance(done, DoneEvent) and done.reason == "error"
    assert len(server.requests) == asked


def test_a_settings_change_during_the_fan_out_leaves_its_request_be():
    with FakeServer(token_delay=0.0) as server:
        engine = _engine(server, probs="raw")
        events = engine.fanout(FanoutRequest(PROMPT, (), 0, n=2, m=6))
        seen = []
        for event in events:
            seen.append(event)
            if isinstance(event, PrefillEvent):
                engine.set_sampler(SamplerSettings(temperature=0.3))
        engine.close()
    samples = [e for e in seen if isinstance(e, SampleEvent)]
    assert [len(s.ids) for s in samples] == [6, 6] and seen[-1].reason == "length"
    assert seen[0].settings.temperature == 0.8  # the settings it started with


def test_a_stop_closes_the_stream_and_each_sample_ends_where_it_was():
    with FakeServer(token_delay=0.05) as server:
        engine = _engine(server, probs="raw")
        seen = []
        for event in engine.fanout(FanoutRequest(PROMPT, (), 0, n=2, m=8)):
            seen.append(event)
            if isinstance(event, PrefillEvent):
                engine.stop()
        engine.close()
    samples = [e for e in seen if isinstance(e, SampleEvent)]
    assert len(samples) == 2 and all(s.reason == "stopped" for s in samples)
    assert 1 <= sum(len(s.ids) for s in samples) < 16
    for i, sample in enumerate(samples):  # what came is each choice's own beginning
        assert sample.ids == ids_of(fanout_answer(i))[:len(sample.ids)]
    assert seen[-1].reason == "stopped"


def test_a_prefix_outside_the_servers_vocabulary_or_past_its_context_is_one_line_and_not_sent():
    models = {"data": [{"id": "fake-model", "owned_by": "vllm", "max_model_len": 64, "meta": {"n_vocab": 300}}]}
    with FakeServer(routes={"/v1/models": Reply(body=models)}) as server:
        engine = _engine(server)
        asked = len(server.requests)
        outside = list(engine.fanout(FanoutRequest(PROMPT + (400,), (), 0, n=2, m=4)))
        too_long = list(engine.fanout(FanoutRequest(PROMPT, (), 0, n=2, m=62)))
        engine.close()
    assert "prompt id 400 is not in this model's vocabulary (ids 0..299)" in outside[0].message
    assert "past this model's context of 64; ask for at most 61 tokens" in too_long[0].message
    assert [e.reason for e in (outside[-1], too_long[-1])] == ["error", "error"]
    assert len(server.requests) == asked


# ---- the command line -----------------------------------------------------------------------------------------------
def _served_record(tmp_path, server: FakeServer):
    made = tokentui("--server", server.url, "--server-probs", "raw", "--headless", "--temperature", "0.8", "--max-new-tokens",
                    "3", "--record-dir", str(tmp_path / "runs"), timeout=120)
    assert made.returncode == 0, made.stderr
    return next((tmp_path / "runs").iterdir())


def test_tokentui_fanout_of_a_served_record_asks_its_server_for_n(tmp_path):
    with FakeServer() as server:
        record = _served_record(tmp_path, server)
        before = len(server.requests)
        result = tokentui("fanout", str(record), "--at", "2", "-n", "3", "--tokens", "4", "--temperature", "0.7",
                          "--seed", "4", "--json", "--no-record", timeout=120)
        assert result.returncode == 0, result.stderr
        (body,) = server.requests[before:]
        text = tokentui("fanout", str(record), "--at", "2", "-n", "3", "--tokens", "4", "--temperature", "0.7",
                        "--seed", "4", "--no-record", timeout=120)
    assert (body["n"], body["max_tokens"], body["seed"], body["temperature"]) == (3, 4, 4, 0.7)
    prompt_ids = body["prompt"][:-1]
    assert body["prompt"][-1:] == ids_of("H")  # the record's step 1 before the step fanned out from
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [e["event"] for e in lines if e["event"] not in ("notice",)] == \
        ["model", "fanout", "prefill", "sample", "sample", "sample", "done"]
    fan = next(e for e in lines if e["event"] == "fanout")
    assert (fan["at"], fan["n"], fan["m"], fan["seed"], fan["prompt_ids"]) == (1, 3, 4, 4, prompt_ids)
    samples = [e for e in lines if e["event"] == "sample"]
    assert [s["ids"] for s in samples] == [ids_of(fanout_answer(i))[:4] for i in range(3)]
    assert all(s["probs"] == [None] * 4 and s["logprob"] is None and s["seed"] == 4 for s in samples)
    assert text.returncode == 0, text.stderr
    assert "one request seeded 4" in text.stderr and "seeds 4..6" not in text.stderr
    out = text.stdout.splitlines()
    assert sum(ln.startswith("#") for ln in out) == 3 and "logprob         ?" in out[0]
    assert any("'0'" in ln and "not reported by the server" in ln for ln in out)  # raw: no post-sampler p


def test_tokentui_fanout_on_llama_server_is_refused_in_one_line(tmp_path):
    with FakeServer() as made_on, FakeServer(engine="llama.cpp") as llama:
        record = _served_record(tmp_path, made_on)
        result = tokentui("fanout", str(record), "--at", "1", "-n", "2", "--tokens", "2", "--server", llama.url,
                          "--no-record", timeout=120)
        assert llama.requests == []
    one_line_error(result, "llama-server does not return n completions: fan-out needs the local engine", code=2)


def test_tokentui_fanout_sends_the_api_key_only_to_a_server_named_on_the_command_line(tmp_path):
    secret = "sk-fanout-0123456789abcdef"
    with FakeServer() as server:
        record = _served_record(tmp_path, server)
        before = len(server.headers)
        args = ("fanout", str(record), "--at", "1", "-n", "2", "--tokens", "2", "--no-record")
        refused = tokentui(*args, env_extra={"TOKENTUI_API_KEY": secret}, timeout=120)
        assert len(server.headers) == before  # the record's server heard nothing
        named = tokentui(*args, "--server", server.url, env_extra={"TOKENTUI_API_KEY": secret}, timeout=120)
        sent = [h.get("Authorization", "") for h in server.headers[before:]]
    one_line_error(refused, f"add --server {server.url}", code=2)
    assert secret not in refused.stderr
    assert named.returncode == 0, named.stderr
    assert sent and set(sent) == {f"Bearer {secret}"}
