"""A follow-up turn and a raw run on a served model (issue 40, 13; core/server/completions.py `ServerRun.turn`)
against tests/fake_openai_server.py: a server keeps no state, so a follow-up sends the whole conversation to its
chat template; what its prompt cache reused is not known (None, "reuse unknown") unless it reports cached tokens
(llama-server's `timings.cache_n`, read from its stream); a raw run's text is tokenized by the server as is, with
its special tokens, and the run says it goes to the server's completions endpoint."""

from __future__ import annotations

from fake_openai_server import ANSWER, FakeServer

from tokentui.core.runs.events import PrefillEvent
from tokentui.core.runs.run import Run
from tokentui.core.runs.turns import TurnRequest, follow_up, reuse_line
from tokentui.core.server.engine import ServerEngine, ServerOptions
from tokentui.core.server.wire import read_native
from tokentui.core.settings import RunOptions, SamplerSettings


def _engine(server: FakeServer) -> ServerEngine:
    return ServerEngine.connect(ServerOptions(server.url), SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=16))


def folded(events) -> Run:
    run = Run()
    for event in events:
        run.apply(event)
    return run


def test_a_follow_up_sends_the_whole_history_and_its_reuse_is_unknown():
    with FakeServer() as server:
        engine = _engine(server)
        first = folded(engine.run("Hi?"))
        assert first.done.text == ANSWER
        second = folded(engine.turn(follow_up(first, "More?")))
        engine.close()
    messages = next(b for b in reversed(server.tokenized) if "messages" in b)["messages"]  # the template's request
    assert messages == [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": ANSWER},
                        {"role": "user", "content": "More?"}]
    assert second.turn.turn == 2 and second.turn.reused_tokens is None and second.prefill.reused_tokens is None
    assert "reuse unknown" in reuse_line(second.turn, second.prefill)
    assert second.prefill.tokens == len(second.prompt.ids) and second.done.reason in ("eos", "length")


def test_a_raw_run_is_the_text_tokenized_by_the_server_with_its_special_tokens():
    with FakeServer() as server:
        engine = _engine(server)
        run = folded(engine.turn(TurnRequest.first("Once upon", raw=True)))
        engine.close()
    body = next(b for b in server.tokenized if b.get("prompt") == "Once upon")
    assert body["add_special_tokens"] is True and "messages" not in body
    assert run.turn.raw and not run.prompt.templated and run.prompt.text == "Once upon"
    said = [n.message for n in run.notices]
    assert any("raw: no chat template" in m and "/v1/completions" in m for m in said), said
    assert not any(isinstance(e, PrefillEvent) and e.reused_tokens for e in run.events())


def test_llama_servers_cached_tokens_are_read_from_its_stream():
    chunk = read_native({"content": "x", "stop": False, "tokens_predicted": 1,
                         "timings": {"prompt_n": 5, "cache_n": 187}})
    assert chunk.cached == 187
    assert read_native({"content": "x", "stop": False}).cached is None  # not reported: None, never a guess


def test_llama_server_reports_what_its_prompt_cache_reused_for_a_follow_up(llama_server):
    """The real llama-server (its prompt cache on, as tokentui asks): a follow-up's prefill says the cached prompt
    tokens the server reported (`timings.cache_n` on its first token's chunk), at most the common prefix of the
    follow-up's ids with what the first request left in the server's cache (the prompt and the answer)."""
    from tokentui.core.runs.turns import common_prefix

    engine = ServerEngine.connect(ServerOptions(llama_server.url), SamplerSettings(temperature=0.0, greedy=True),
                                  RunOptions(max_new_tokens=8))
    first = folded(engine.run("Is OpenAI open?"))
    second = folded(engine.turn(follow_up(first, "And Anthropic?")))
    engine.close()
    assert second.turn.reused_tokens is None  # not tokentui's to say
    cached = second.prefill.reused_tokens
    held = first.prompt.ids + [s.id for s in first]
    assert cached is not None and 0 < cached <= common_prefix(held, second.prompt.ids), cached
    assert cached >= len(first.prompt.ids) - 1  # the first prompt at least (the server may redo its last token)
    assert f"{cached} of them from the server's prompt cache" in reuse_line(second.turn, second.prefill)
