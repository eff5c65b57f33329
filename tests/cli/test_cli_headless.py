"""`tokentui --headless`: the JSON schema, the plain stream, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cli_run import tokentui

SCHEMA = {
    "model": {"name", "parameters", "layers", "hidden_size", "vocab_rows", "kv_heads", "head_dim",
              "kv_bytes_per_token", "kv_bytes_per_value", "device", "dtype", "max_context"},
    "prompt": {"text", "ids", "pieces"},
    "prefill": {"tokens", "ms"},
    "step": {"index", "id", "piece", "text", "pending_hex", "candidates", "chosen_rank", "settings", "latency_ms",
             "kv_tokens", "kv_bytes"},
    "done": {"reason", "tokens", "runs", "scores", "ttft_ms", "decode_tok_s", "paused_ms", "dropped_hex",
             "dropped_needed"},
}


@pytest.fixture(scope="module")
def json_run(embedded, isolated_dirs):
    result = tokentui("--headless", "--json", "--temperature", "0", "--max-new-tokens", "12")
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()], result.stderr


def test_json_events_follow_the_documented_schema(json_run):
    events, stderr = json_run
    assert "Loading weights" not in stderr and "%|" not in stderr  # no progress bars on the terminal
    kinds = [e["event"] for e in events]
    assert set(kinds[: kinds.index("model")]) == {"load"}  # progress first, then the model's facts
    kinds = kinds[kinds.index("model"):]
    assert kinds[0] == "model" and kinds[1] == "prompt" and kinds[2] == "prefill" and kinds[-1] == "done"
    assert kinds.count("step") == events[-1]["tokens"]
    for event in events:
        assert SCHEMA.get(event["event"], set()) <= event.keys()
    step = next(e for e in events if e["event"] == "step")
    assert {"id", "piece", "raw_prob", "prob"} <= step["candidates"][0].keys()
    assert step["settings"]["temperature"] == 0.0


def test_default_prompt_is_the_seeds_question(json_run):
    events, _ = json_run
    prompt = next(e for e in events if e["event"] == "prompt")
    assert "Is OpenAI open?" in prompt["text"] and prompt["user_prompt"] == "Is OpenAI open?"


def test_plain_stream_equals_the_json_runs_text_and_the_record_is_complete(json_run, isolated_dirs):
    events, _ = json_run
    result = tokentui("--headless", "--temperature", "0", "--max-new-tokens", "12")
    assert result.returncode == 0
    assert result.stdout == events[-1]["text"] + "\n"
    line = [ln for ln in result.stderr.splitlines() if "run recorded in" in ln][-1]
    record = line.split("run recorded in ", 1)[1].strip()
    assert record.startswith(str(isolated_dirs["TOKENTUI_STATE_DIR"]))
    lines = [json.loads(x) for x in open(record, encoding="utf-8")]
    assert lines[0]["event"] == "model" and lines[-1]["event"] == "done"
    assert lines[-1]["text"] == events[-1]["text"]


@pytest.mark.parametrize("args, needle", [
    (["--temperature", "-1"], "temperature must be a number >= 0"),
    (["--temperature", "hot"], "temperature must be a number"),
    (["--top-p", "0"], "top-p must be in (0, 1]"),
    (["--top-p", "1.5"], "top-p must be in (0, 1]"),
    (["--top-k", "-3"], "top-k must be an integer >= 0"),
    (["--max-new-tokens", "0"], "max-new-tokens must be an integer >= 1"),
    (["--prompt", "   "], "the prompt is empty"),
    (["--prompt-file", "/nonexistent/prompt.txt"], "no such file"),
    (["--model", "/nonexistent/model"], "no such file or folder"),
    (["--device", "tpu"], "--device must be"),
    (["--dtype", "float8"], "--dtype must be one of"),
    (["--bogus-flag"], "unrecognized arguments"),
])
def test_bad_input_is_one_line_and_a_nonzero_exit(args, needle):
    result = tokentui("--headless", *args, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("tokentui: ")


def test_prompt_file_that_is_not_utf8(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    result = tokentui("--headless", "--prompt-file", str(bad), timeout=120)
    assert result.returncode == 2 and "not UTF-8" in result.stderr and "Traceback" not in result.stderr
