"""Fuzz tests (hypothesis) of the two parsers that take outside input: the record reader (core/runs/record_reader.py)
and the server wire parser (core/server/stream.py's event stream, core/server/wire.py's chunks).

Inputs: arbitrary bytes, arbitrary JSON, and mutations of real records (tests/data/record.jsonl from the embedded
model, tests/data/served_record.jsonl from a served one) and of real llama-server chunks
(tests/data/llama_server_stream.txt, captured from `scripts/llama_server.py`'s build).
Property: a valid run (or chunk), or one RecordError / ServerError line; never another exception, and never more
than a bounded amount of memory (tracemalloc's peak). A valid run also replays and writes a record that reads back.

Example counts: a few thousand in all by default, derandomized (the same cases on every run, so the suite cannot
flake). TOKENTUI_FUZZ_SCALE=N runs N times as many, with fresh random cases each time (by hand:
`TOKENTUI_FUZZ_SCALE=20 .venv/bin/python -m pytest -q tests/unit/test_fuzz_parsers.py --hypothesis-show-statistics`).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import tracemalloc
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tokentui.core.errors import RecordError, ServerError
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.run import Run
from tokentui.core.server.http import Connection, ServerAddress
from tokentui.core.server.stream import Deadline, EventStream
from tokentui.core.server.wire import WireChunk, read_chunk, read_native

DATA = Path(__file__).resolve().parent.parent / "data"
RECORDS = [(DATA / name).read_bytes() for name in ("record.jsonl", "served_record.jsonl")]
CHUNKS = [line[5:].strip() for line in (DATA / "llama_server_stream.txt").read_bytes().splitlines()
          if line.startswith(b"data:") and not line.endswith(b"[DONE]")]

SCALE = max(1, int(os.environ.get("TOKENTUI_FUZZ_SCALE", "1")))
FIXED = SCALE == 1  # the suite's profile: the same cases every run


def fuzz(examples: int):
    return settings(max_examples=examples * SCALE, derandomize=FIXED, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- values -----------------------------------------------------------------------------------------------------
# keys a record or a chunk uses, so that objects hypothesis makes look like the real ones often enough
KEYS = st.one_of(st.sampled_from(["event", "id", "token", "logprob", "prob", "bytes", "choices", "text", "logprobs",
                                  "content", "tokens", "top_logprobs", "index", "candidates", "settings", "server",
                                  "completion_probabilities", "stop", "message", "kind", "ids", "pieces"]),
                 st.text(max_size=6))
SCALARS = st.one_of(
    st.none(), st.booleans(), st.text(max_size=12),
    st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, -1, 1, 2**31, 2**63, 10**30, 49152]),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.0, 1.0, -3.0, 148.4, 1e308, -1e-300]),
    st.sampled_from(["\x1b]0;T\x07", "\ud800", "token_id:5", "token_id:-1", "bytes:\\xe5", "NaN", "[DONE]"]))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(KEYS, inner, max_size=4)),
                    max_leaves=10)


def _paths(value, prefix=()):
    """Every place in a JSON value: (path, value at it)."""
    yield prefix, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for n, item in enumerate(value):
            yield from _paths(item, prefix + (n,))


def _replace(value, path, new):
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace(value[head], rest, new)
    return copy


@st.composite
def mutated_json(draw, value):
    """`value` with one to three places replaced by other JSON (or a key deleted)."""
    for _ in range(draw(st.integers(1, 3))):
        places = list(_paths(value))
        path, _ = places[draw(st.integers(0, len(places) - 1))]
        if path and draw(st.integers(0, 4)) == 0:  # delete it
            parent_path, key = path[:-1], path[-1]
            parent = dict(_paths(value))[parent_path] if parent_path else value
            if isinstance(parent, dict):
                parent = {k: v for k, v in parent.items() if k != key}
            else:
                parent = [v for n, v in enumerate(parent) if n != key]
            value = _replace(value, parent_path, parent)
        else:
            value = _replace(value, path, draw(JSON))
    return value


def _dump(value, ascii_only: bool = False) -> bytes:
    """JSON bytes as a writer might make them: UTF-8 (a lone surrogate as its raw bytes), or ASCII with \\u escapes
    (a lone surrogate as the `\\ud800` JSON allows)."""
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", errors="surrogatepass")


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@st.composite
def mutated_record(draw):
    """A real record with lines mutated (a value replaced, a key deleted), cut, dropped, repeated or swapped, or its
    bytes flipped."""
    lines = draw(st.sampled_from(RECORDS)).split(b"\n")
    lines = [line for line in lines if line]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["value", "value", "value", "cut", "drop", "repeat", "swap", "bytes", "constant",
                                     "deep"]))
        n = draw(st.integers(0, len(lines) - 1))
        if kind == "value":
            try:
                value = json.loads(lines[n])
            except (ValueError, RecursionError):  # a line an earlier mutation cut, flipped or nested too deep
                continue
            lines[n] = _dump(draw(mutated_json(value)), draw(st.booleans()))
        elif kind == "constant":  # a number written as NaN / Infinity, as json.dumps writes a float's nan and inf
            numbers = [m for m in range(len(lines[n]) - 1) if lines[n][m:m + 2] in (b": ", b", ")
                       and lines[n][m + 2:m + 3].isdigit()]
            if numbers:
                at = draw(st.sampled_from(numbers)) + 2
                end = at
                while end < len(lines[n]) and lines[n][end:end + 1] in b"0123456789.e-":
                    end += 1
                lines[n] = lines[n][:at] + draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity"])) + lines[n][end:]
        elif kind == "deep":  # a value nested far past the recursion limit, in a field this version ignores
            depth = draw(st.sampled_from([10, 999, 5000, 100_000]))
            lines[n] = lines[n][:1] + b'"extra": ' + _deep(depth) + b", " + lines[n][1:] if lines[n][:1] == b"{" \
                else _deep(depth)
        elif kind == "cut":
            lines[n] = lines[n][:draw(st.integers(0, len(lines[n])))]
        elif kind == "drop" and len(lines) > 1:
            del lines[n]
        elif kind == "repeat":
            lines.insert(n, lines[n])
        elif kind == "swap":
            m = draw(st.integers(0, len(lines) - 1))
            lines[n], lines[m] = lines[m], lines[n]
        elif kind == "bytes" and lines[n]:
            at = draw(st.integers(0, len(lines[n]) - 1))
            lines[n] = lines[n][:at] + bytes([draw(st.integers(0, 255))]) + lines[n][at + 1:]
    return b"\n".join(lines) + draw(st.sampled_from([b"\n", b""]))


JSON_LINES = st.lists(JSON.map(_dump), min_size=1, max_size=6).map(lambda lines: b"\n".join(lines) + b"\n")
MODEL_LINE = RECORDS[0].split(b"\n", 1)[0]
WITH_MODEL = JSON_LINES.map(lambda body: MODEL_LINE + b"\n" + body)


# ---- the record reader ------------------------------------------------------------------------------------------
@contextmanager
def bounded_memory(limit: int):
    """The block's peak of allocated memory (tracemalloc's) stays under `limit` bytes. Only the parser is traced, not
    hypothesis making the case (tracing that cost most of the run time)."""
    tracemalloc.start()
    try:
        yield
    finally:  # a refusal (RecordError, ServerError) is measured too, then passed on
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < limit, peak


def _read_record(data: bytes) -> None:
    """The property for one file's bytes."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzzed.jsonl"
        path.write_bytes(data)
        try:
            with bounded_memory(64 * len(data) + 4 * 2**20):
                run = Run.from_record(path)
        except RecordError as err:
            assert "\n" not in str(err) and str(err).startswith(str(path))
            event("refused in one line")
            return
        # a valid run replays (as fast as it can, headless) to its end and writes a record that reads back: a
        # replay that raises fails here, a record the reader takes must be one the replay can play
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            events = list(ReplayEngine(run, speed=0).run())
        assert events and events[-1].event == "done", events[-1:]
        again = Run.from_record(run.save(Path(folder) / "again.jsonl"))
        assert len(again) == len(run) and again.text == run.text
        event(f"a valid run ({'with' if len(run) else 'without'} steps)")


@fuzz(200)
@given(st.binary(max_size=3000))
def test_any_bytes_are_a_record_or_one_line(data):
    _read_record(data)


@fuzz(200)
@given(st.one_of(JSON_LINES, WITH_MODEL))
def test_any_json_lines_are_a_record_or_one_line(data):
    _read_record(data)


@fuzz(600)
@given(mutated_record())
def test_mutated_real_records_are_a_record_or_one_line(data):
    _read_record(data)


def test_the_real_records_read_back():
    for data in RECORDS:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "r.jsonl"
            path.write_bytes(data)
            assert len(Run.from_record(path)) > 0


# ---- the server wire parser -------------------------------------------------------------------------------------
def _parse(value) -> None:
    for read in (read_native, read_chunk):
        try:
            chunk = read(value, "http://server/x")
            assert isinstance(chunk, WireChunk)
            event(f"{read.__name__}: a chunk ({'with' if chunk.tokens else 'without'} tokens)")
        except ServerError as err:
            assert "\n" not in str(err) and str(err).startswith("http://server/x")
            event(f"{read.__name__}: refused in one line")


class _Response:
    """What EventStream reads of an httpx response: its raw bytes, in the chunks given."""

    def __init__(self, parts: list[bytes]) -> None:
        self._parts = parts

    def iter_raw(self):
        yield from self._parts


def _stream(parts: list[bytes]) -> None:
    conn = Connection(ServerAddress.parse("http://127.0.0.1:9"))  # never connects: the bytes are given
    try:
        with bounded_memory(64 * sum(map(len, parts)) + 4 * 2**20):
            for value in EventStream(conn, "/completion", _Response(parts), Deadline(None, lambda: None)):
                _parse(value)
        event("the stream ended")
    except ServerError as err:
        assert "\n" not in str(err)
        event("the stream refused in one line")
    finally:
        conn.close()


@fuzz(300)
@given(JSON)
def test_any_json_is_a_chunk_or_one_line(value):
    _parse(value)


@fuzz(600)
@given(st.sampled_from(CHUNKS).flatmap(lambda raw: mutated_json(json.loads(raw))))
def test_mutated_llama_server_chunks_are_a_chunk_or_one_line(value):
    _parse(value)


@st.composite
def streamed_bytes(draw):
    """A stream's bytes in arbitrary chunks: real `data:` lines, mutated lines, arbitrary bytes, all mixed."""
    pieces = draw(st.lists(st.one_of(
        st.sampled_from(CHUNKS).map(lambda c: b"data: " + c + b"\n\n"),
        st.sampled_from(CHUNKS).flatmap(lambda c: mutated_json(json.loads(c))).map(
            lambda v: b"data: " + _dump(v) + b"\n"),
        st.binary(max_size=200), st.sampled_from([b"data: [DONE]\n", b"data: NaN\n", b": keep-alive\n", b"\r\n"])),
        max_size=8))
    data = b"".join(pieces)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


@fuzz(300)
@given(streamed_bytes())
def test_any_stream_bytes_are_events_or_one_line(parts):
    _stream(parts)


def test_the_real_chunks_parse():
    for raw in CHUNKS:
        value = json.loads(raw)
        read = read_chunk if "choices" in value else read_native
        assert isinstance(read(value, "x"), WireChunk)
