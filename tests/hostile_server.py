"""A served-model server that misbehaves on purpose (issue 21): tests/fake_openai_server.py's FakeServer with one of
the answers below put in place of the normal one. `hostile(name)` makes it, the `hostile_server` fixture starts it
for a test (indirect parametrization by mode); `HOSTILE` lists the modes:

- key echoes: the Authorization header sent back in a line that is not JSON, and at the end of a long 401 body;
  the key sent back as generated text ("key-as-tokens": split over tokens of a few characters, then whole in one
  token, and in the candidates; "key-cut-off": the run ends partway into it);
- escapes: terminal escape sequences in an error body and in the answer's text;
- malformed chunks: a list, a number, a text that is a number, a log-probability of 1000, NaN / Infinity, a
  probability of 148.4 or -3, ids of 10^30, 10^12 and -1;
- a stream with no newline, a stream dripping one byte at a time, a redirect;
- malformed answers outside the stream: /tokenize of ["one"], /slots with n_prompt_tokens "lots", a /v1/models
  nested 100,000 deep.

Every streamed mode answers the prompt's /tokenize normally (the fake's vLLM shapes), so a run gets as far as its
stream."""

from __future__ import annotations

import json
import time

import pytest

from fake_openai_server import FakeServer, Reply

TOKEN = 100 + ord("H")  # the fake's id of "H"


def chunk(text: str = "H", token: str = f"token_id:{TOKEN}", logprob=-0.1, top=None, finish=None,
          raw_value: str | None = None) -> bytes:
    """One /v1/completions data line in the classic logprobs shape (vLLM's). `raw_value`: written in place of the
    logprob as it is (NaN, Infinity: not JSON)."""
    choice = {"index": 0, "text": text, "finish_reason": finish,
              "logprobs": {"tokens": [token], "token_logprobs": [logprob],
                           "top_logprobs": [top if top is not None else {token: logprob}]}}
    line = json.dumps({"choices": [choice]})
    if raw_value is not None:
        line = line.replace('"token_logprobs": [-0.1]', f'"token_logprobs": [{raw_value}]')
    return b"data: " + line.encode() + b"\n\n"


def content_chunk(prob: float, text: str = "H", key: str = "prob") -> bytes:
    """One data line in the "content" shape: post-sampling probabilities (llama-server's `prob` keys), or with
    `key` "logprob" log-probabilities; the token's text is its bytes."""
    top = "top_probs" if key == "prob" else "top_logprobs"
    entry = {"id": TOKEN, "token": text, key: prob, top: [{"id": TOKEN, "token": text, key: prob}]}
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": None,
                                                "logprobs": {"content": [entry]}}]}).encode() + b"\n\n"


END = b'data: {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'


def lines(*data: bytes):
    """A stream of these lines, then the end chunk and [DONE]."""
    def stream(write, handler):
        for line in data:
            write(line)
        write(END)
    return stream


def _key_in_line(write, handler):
    write(chunk())
    write(b"data: oops " + handler.headers.get("Authorization", "").encode() + b"\n\n")


KEY_TOKEN = 1000  # the first id of the key's tokens (ids the fake's own vocabulary does not use)


def key_of(handler) -> str:
    """The API key the request came with (its Authorization header, less "Bearer ")."""
    return handler.headers.get("Authorization", "").removeprefix("Bearer ")


def key_pieces(key: str, every: int = 3) -> list[str]:
    """What "key-as-tokens" generates: a lead-in, the key `every` characters a token, a word, the key as one
    token, a full stop."""
    return ["Your key is ", *(key[i:i + every] for i in range(0, len(key), every)), " ok", key, "."]


def text_chunk(token_id: int, text: str, alternatives: list[tuple[int, str]] = (), finish=None) -> bytes:
    """One data line in the "content" shape naming the token's id and text (its bytes), with `alternatives`
    ((id, text) pairs) after it among the candidates."""
    top = [{"id": token_id, "token": text, "logprob": -0.1}]
    top += [{"id": i, "token": t, "logprob": -3.0 - n} for n, (i, t) in enumerate(alternatives)]
    entry = {"id": token_id, "token": text, "logprob": -0.1, "top_logprobs": top}
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish,
                                                "logprobs": {"content": [entry]}}]}).encode() + b"\n\n"


def _key_as_tokens(write, handler):
    key = key_of(handler)
    for n, piece in enumerate(key_pieces(key)):  # the candidates: the whole key, and 10 characters of it
        write(text_chunk(KEY_TOKEN + n, piece, [(KEY_TOKEN + 100, key), (KEY_TOKEN + 101, f"is {key[5:15]}")]))
    write(END)


def _key_cut_off(write, handler):
    key = key_of(handler)
    for n, piece in enumerate(["So: ", key[:4], key[4:8], key[8:12]]):  # 12 characters of it, then the end
        write(text_chunk(KEY_TOKEN + n, piece))
    write(END)


def _no_newline(write, handler):
    for _ in range(12):  # 12 MiB without a newline, then nothing more (a client buffering it would hold it all)
        write(b"x" * 2**20)
    time.sleep(5)


def _drip(write, handler, every: float = 0.2, lasting: float = 20.0):
    write(chunk())  # one token, then a byte at a time, never a whole line (for `lasting` s: a test's bound)
    until = time.monotonic() + lasting
    while time.monotonic() < until:
        write(b"d")
        time.sleep(every)


ESCAPES = "\x1b]0;TITLE\x07\x1b[2J"
LONG = "x" * 260


HOSTILE: dict[str, dict] = {
    "key-in-line": {"stream": _key_in_line},
    "key-as-tokens": {"stream": _key_as_tokens},
    "key-cut-off": {"stream": _key_cut_off},
    "key-in-long-body": {"routes": {"/v1/models": Reply(401, {"error": {"message": f"{LONG} you sent <auth>"}})}},
    "escapes-in-error": {"routes": {"/v1/completions": Reply(500, {"error": {"message": f"bad {ESCAPES} thing"}})}},
    "escapes-in-text": {"stream": lines(content_chunk(-0.1, f"a{ESCAPES}b", key="logprob"))},
    "list-chunk": {"stream": lines(b"data: [1,2,3]\n\n")},
    "number-chunk": {"stream": lines(b"data: 5\n\n")},
    "number-text": {"stream": lines(chunk().replace(b'"text": "H"', b'"text": 5'))},
    "logprob-1000": {"stream": lines(chunk(logprob=1000))},
    "nan-logprob": {"stream": lines(chunk(raw_value="NaN"))},
    "infinity-logprob": {"stream": lines(chunk(raw_value="Infinity"))},
    "logprob-5": {"stream": lines(chunk(logprob=5.0))},  # exp(5) = 148.4
    "prob-148": {"stream": lines(content_chunk(148.4))},
    "prob-minus-3": {"stream": lines(content_chunk(-3.0))},
    "id-1e30": {"stream": lines(chunk(token=f"token_id:{10**30}"))},
    "id-1e12": {"stream": lines(chunk(token=f"token_id:{10**12}"))},
    "id-minus-1": {"stream": lines(chunk(token="token_id:-1"))},
    "no-newline": {"stream": _no_newline},
    "drip": {"stream": _drip},
    "redirect": {"routes": {"/v1/models": Reply(302, b"", {"Location": "http://elsewhere.example/v1/models"})}},
    "tokenize-one": {"routes": {"/tokenize": Reply(200, ["one"])}},
    "tokenize-words": {"routes": {"/tokenize": Reply(200, {"tokens": ["one"]})}},
    "nested-models": {"routes": {"/v1/models": Reply(200, b"[" * 100_000 + b"]" * 100_000)}},
}

# /slots is read from llama-server only: these modes speak enough of its /props for the probe to take the server for
# one (the probe reads /slots before anything else of llama-server's is asked).
LLAMA_PROPS = Reply(200, {"default_generation_settings": {"n_ctx": 512}, "build_info": "fake"})
HOSTILE["slots-lots"] = {"routes": {"/props": LLAMA_PROPS, "/metrics": Reply(404), "/slots": Reply(200, [
    {"id": 0, "n_ctx": 512, "is_processing": True, "n_prompt_tokens": "lots"}])}}


def hostile(name: str, **kwargs) -> FakeServer:
    """The FakeServer of mode `name` (not started: use it as a context manager)."""
    return FakeServer(**{**HOSTILE[name], **kwargs})


@pytest.fixture
def hostile_server(request):
    """The fixture of a mode, started (tests/conftest.py shares it): `@pytest.mark.parametrize("hostile_server",
    ["drip", ...], indirect=True)`; the server's `mode` is the mode's name."""
    with hostile(request.param) as server:
        server.mode = request.param
        yield server
