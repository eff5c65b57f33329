"""`tokentui --headless --follow-up TEXT` and `--raw` (issue 40, 13): the turns of one conversation in one process,
each turn's --json lines tagged with its number, its own record, its prefill saying what it reused (a raw run's ids
are checked against `tokenizer(text)` in tests/unit/test_turns.py, without a process of its own here). Bad input (an empty follow-up, a follow-up outside --headless, a system prompt in a raw run): one
line, exit status 2, before anything loads."""

from __future__ import annotations

import json

import pytest

from cli_run import one_line_error, tokentui


@pytest.fixture(scope="module")
def conversation(embedded, isolated_dirs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("turns")
    result = tokentui("--headless", "--json", "--temperature", "0", "--max-new-tokens", "8", "--record-dir",
                      str(folder), "--prompt", "Is OpenAI open?", "--follow-up", "And Anthropic?",
                      "--follow-up", "Why?")
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()], result.stderr, folder


def of_turn(events, n):
    return [e for e in events if e.get("turn") == n]


def test_each_turn_is_tagged_and_ends_with_its_done(conversation):
    events, _, _ = conversation
    assert [e["event"] for e in events if "turn" not in e] and all(
        e["event"] in ("load", "model") for e in events if "turn" not in e)
    for n in (1, 2, 3):
        kinds = [e["event"] for e in of_turn(events, n)]
        assert kinds[-1] == "done" and "prompt" in kinds and "prefill" in kinds, (n, kinds)
    assert [e["event"] for e in of_turn(events, 2)][0] == "turn"  # a follow-up starts with its turn event


def test_a_follow_up_holds_the_history_and_reuses_the_turn_before(conversation):
    events, stderr, _ = conversation
    first_prompt = next(e for e in of_turn(events, 1) if e["event"] == "prompt")
    first_done = next(e for e in of_turn(events, 1) if e["event"] == "done")
    turn = next(e for e in of_turn(events, 2) if e["event"] == "turn")
    prompt = next(e for e in of_turn(events, 2) if e["event"] == "prompt")
    prefill = next(e for e in of_turn(events, 2) if e["event"] == "prefill")
    assert [(m["role"], m["content"]) for m in turn["messages"]] == [
        ("user", "Is OpenAI open?"), ("assistant", first_done["text"]), ("user", "And Anthropic?")]
    assert turn["messages"][1]["ended"] == first_done["reason"]
    assert prompt["text"].startswith(first_prompt["text"])  # the conversation goes on from the first prompt
    assert prefill["reused_tokens"] == turn["reused_tokens"] >= len(first_prompt["ids"])
    assert prefill["tokens"] + prefill["reused_tokens"] == len(prompt["ids"])
    third = next(e for e in of_turn(events, 3) if e["event"] == "turn")
    assert len(third["messages"]) == 5 and third["turn"] == 3


def test_the_plain_stream_prints_each_answer_and_says_what_each_turn_reused(conversation):
    events, _, _ = conversation
    result = tokentui("--headless", "--temperature", "0", "--max-new-tokens", "8", "--no-record", "--prompt",
                      "Is OpenAI open?", "--follow-up", "And Anthropic?")
    assert result.returncode == 0, result.stderr
    texts = [e["text"] for e in events if e["event"] == "done"][:2]  # the same greedy turns as the --json run
    assert result.stdout == texts[0] + "\n" + texts[1] + "\n"
    prefill = next(e for e in of_turn(events, 2) if e["event"] == "prefill")
    line = f"turn 2: prefill {prefill['tokens']} new tokens · {prefill['reused_tokens']} reused from turn 1 (KV "
    assert line in result.stderr, result.stderr


def test_each_turn_has_its_own_record(conversation):
    from tokentui.core.runs.run import Run

    _, stderr, folder = conversation
    records = list(folder.glob("*.jsonl"))
    assert len(records) == 3, stderr
    runs = {}  # turn -> (its record, its run)
    for path in records:
        run = Run.from_record(path)
        runs[run.turn.turn if run.turn is not None else 1] = (path, run)
    assert sorted(runs) == [1, 2, 3]
    assert runs[2][1].turn.parent == runs[1][0].name and runs[3][1].turn.parent == runs[2][0].name


@pytest.mark.parametrize("args, needle", [
    (("--headless", "--follow-up", " "), "--follow-up 1 is empty"),
    (("--follow-up", "more?"), "--follow-up needs --headless"),
    (("--headless", "--raw", "--system", "Be terse."), "--system has no place in a --raw prompt"),
])
def test_bad_turn_flags_are_one_line(args, needle):
    one_line_error(tokentui(*args, timeout=60), needle)
