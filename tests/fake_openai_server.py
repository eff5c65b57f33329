"""A small OpenAI-compatible server for the --server error tests (a real llama-server covers the rest): it speaks
vLLM's shapes (`owned_by: vllm`, classic completions logprobs with "token_id:N" tokens, /tokenize with messages,
/detokenize, /metrics) and misbehaves on request: `mode` is "ok", "no-logprobs", "cut" (the stream stops after
three tokens, no finish), "slow" (sleeps before the first token), "refuse" (500 with a message), "auth" (401
unless the Bearer key matches; its error echoes the key it got, as careless servers do).

`engine` says which server it plays: "vllm" (the default), "sglang" (`owned_by: sglang`), "llama.cpp" (a /props with
`build_info`, as llama-server's, so the probe calls it llama.cpp), "other" (an OpenAI-compatible server of no known
kind). Asked for `n` completions (a fan-out), it streams n choices interleaved, one token per chunk, each with its
`index`, as vLLM does: choice i writes `fanout_answer(i)`.

A hostile server (tests/hostile_server.py names its modes) replaces any answer: `routes` maps a path to the `Reply`
sent instead of the normal one, and `stream` writes the raw bytes of /v1/completions' answer itself.

The vocabulary: token id 100 + b for each byte b of the text (so a Chinese character is three tokens)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

ANSWER = "Hi 开!"


@dataclass
class Reply:
    """An answer a route sends instead of the normal one: `body` bytes as they are, anything else as JSON (NaN and
    Infinity written bare, as a careless server would)."""

    status: int = 200
    body: object = b""
    headers: dict = field(default_factory=dict)

    def data(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


def ids_of(text: str) -> list[int]:
    return [100 + b for b in text.encode("utf-8")]


def fanout_answer(i: int) -> str:
    """What choice i of a fan-out writes: the samples differ from their first token on."""
    return f"{i}: hello"  # ASCII: one token a character


def fanout_logprob(token_id: int) -> float:
    """The log-probability the fake reports for a fan-out token (each differs, so a test can tell them apart)."""
    return -0.01 * (token_id % 50) - 0.05


class FakeServer:
    def __init__(self, mode: str = "ok", key: str | None = None, slow_s: float = 3.0,
                 token_delay: float = 0.01, *, engine: str = "vllm", routes: dict[str, Reply] | None = None,
                 stream: Callable[[Callable[[bytes], None], BaseHTTPRequestHandler], None] | None = None) -> None:
        self.mode = mode
        self.engine = engine
        self.routes = routes or {}
        self.stream = stream  # stream(write, handler): the raw bytes of the streamed answer
        self.token_delay = token_delay
        self.key = key
        self.slow_s = slow_s
        self.requests: list[dict] = []  # the /v1/completions bodies
        self.tokenized: list[dict] = []  # the /tokenize bodies (a chat template's messages, a raw text)
        self.headers: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status: int, obj) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                got = self.headers.get("Authorization", "")
                server.headers.append(dict(self.headers))
                if server.mode == "auth" and got != f"Bearer {server.key}":
                    self._send(401, {"error": {"message": f"invalid API key {got!r}"}})
                    return False
                return True

            def _routed(self) -> bool:
                reply = server.routes.get(self.path)
                if reply is None:
                    return False
                # "<auth>" in a reply stands for the Authorization header the request came with (a key echoed)
                data = reply.data().replace(b"<auth>", self.headers.get("Authorization", "").encode())
                self.send_response(reply.status)
                for name, value in {"Content-Type": "application/json", **reply.headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return True

            def do_GET(self):
                if not self._authorized() or self._routed():
                    return
                if self.path == "/v1/models":
                    owner = {"vllm": "vllm", "sglang": "sglang"}.get(server.engine, "someone")
                    self._send(200, {"data": [{"id": "fake-model", "owned_by": owner, "max_model_len": 512}]})
                elif self.path == "/props" and server.engine == "llama.cpp":
                    self._send(200, {"build_info": "b0-fake", "default_generation_settings": {"n_ctx": 512}})
                elif self.path == "/version":
                    self._send(200, {"version": "0.0-fake"})
                elif self.path == "/metrics":
                    data = b"# HELP x\nvllm:kv_cache_usage_perc{model_name=\"fake-model\"} 0.25\n"
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                else:
                    self._send(404, {"error": {"message": "no such endpoint"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/v1/completions":
                    server.requests.append(body)
                if not self._authorized() or self._routed():
                    return
                if self.path == "/tokenize":
                    server.tokenized.append(body)
                    if "messages" in body:
                        text = "<user>" + body["messages"][-1]["content"] + "<assistant>"
                        server.prompt_ids = ids_of(text)
                    else:
                        text = body["prompt"]
                    self._send(200, {"tokens": ids_of(text), "count": len(text)})
                elif self.path == "/detokenize":
                    data = bytes(i - 100 for i in body["tokens"] if 100 <= i < 356)
                    self._send(200, {"prompt": data.decode("utf-8", errors="replace")})
                elif self.path == "/v1/completions":
                    self._complete(body)
                else:
                    self._send(404, {"error": {"message": "no such endpoint"}})

            def _complete(self, body) -> None:
                if server.mode == "refuse":
                    self._send(500, {"error": {"message": "CUDA out of memory (fake)"}})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                if server.stream is not None:
                    def write(data: bytes) -> None:
                        self.wfile.write(data)
                        self.wfile.flush()
                    try:
                        server.stream(write, self)
                    except OSError:  # the client went (it refused the stream, or was stopped)
                        pass
                    return
                if server.mode == "slow":
                    time.sleep(server.slow_s)
                if body.get("n", 1) > 1:
                    self._fan_out(body)
                    return
                answer = ANSWER.encode("utf-8")
                done = len(body["prompt"]) - len(server.prompt_ids)  # tokens already generated: the prefix
                ids = [100 + b for b in answer][max(0, done):][: body["max_tokens"]]
                text_bytes = b""
                for n, token_id in enumerate(ids):
                    if server.mode == "cut" and n == 3:
                        self.wfile.flush()
                        self.connection.shutdown(2)
                        return
                    text_bytes += bytes([token_id - 100])
                    try:
                        text = text_bytes.decode("utf-8")
                        text_bytes = b""
                    except UnicodeDecodeError:
                        text = ""
                    choice = {"index": 0, "text": text, "finish_reason": None}
                    if server.mode != "no-logprobs":
                        top = {f"token_id:{token_id}": -0.1, f"token_id:{token_id + 1}": -2.5}
                        choice["logprobs"] = {"tokens": [f"token_id:{token_id}"], "token_logprobs": [-0.1],
                                              "top_logprobs": [top], "text_offset": [0]}
                    try:
                        self._event({"choices": [choice]})
                    except OSError:  # the client closed the stream (a stop, a pause, a settings change)
                        return
                    time.sleep(server.token_delay)
                finish = "length" if len(ids) == body["max_tokens"] else "stop"
                self._event({"choices": [{"index": 0, "text": "", "finish_reason": finish}]})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _fan_out(self, body) -> None:
                """n choices, interleaved one token per chunk, each with its index; then each one's finish."""
                answers = [ids_of(fanout_answer(i))[: body["max_tokens"]] for i in range(body["n"])]
                for t in range(max(len(a) for a in answers)):
                    for i, ids in enumerate(answers):
                        if t >= len(ids):
                            continue
                        token_id = ids[t]
                        top = {f"token_id:{token_id}": fanout_logprob(token_id), f"token_id:{token_id + 1}": -3.0}
                        logprobs = {"tokens": [f"token_id:{token_id}"], "token_logprobs": [fanout_logprob(token_id)],
                                    "top_logprobs": [top], "text_offset": [0]}
                        text = bytes([token_id - 100]).decode("utf-8", errors="ignore")  # ASCII answers
                        try:
                            self._event({"choices": [{"index": i, "text": text, "logprobs": logprobs,
                                                      "finish_reason": None}]})
                        except OSError:  # the client closed the stream (a stop, a pause)
                            return
                        time.sleep(server.token_delay)
                for i, ids in enumerate(answers):
                    finish = "length" if len(ids) == body["max_tokens"] else "stop"
                    self._event({"choices": [{"index": i, "text": "", "finish_reason": finish}]})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _event(self, obj) -> None:
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

        self.prompt_ids: list[int] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
