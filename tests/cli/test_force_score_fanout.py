"""`tokentui branch --text`, `tokentui score` and `tokentui fanout` on the embedded model: their JSON against the
oracles (a teacher-forced forward, `generate`, a single-sequence run of one seed), their text, and their bad input
(one line, exit status 2, before anything runs)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from cli_run import tokentui
from tiny_models import generate_ids

from tokentui.core.runs.run import Run


@pytest.fixture(scope="module")
def record(embedded, isolated_dirs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("phrase-records")
    result = tokentui("--headless", "--json", "--temperature", "0", "--max-new-tokens", "8", "--ignore-eos",
                      "--prompt", "What is the capital of France?", "--record-dir", str(folder))
    assert result.returncode == 0, result.stderr
    (path,) = folder.glob("*.jsonl")
    return path


def json_lines(result) -> list[dict]:
    assert result.returncode == 0, result.stderr[-2000:]
    return [json.loads(line) for line in result.stdout.splitlines()]


def raw_probs_of(model, ids: list[int], start: int) -> list[float]:
    """Teacher-forced: the raw probability of ids[i] after ids[:i], for i >= start (one forward, fp32)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    probs = torch.softmax(logits, dim=-1)
    return [float(probs[i - 1, ids[i]]) for i in range(start, len(ids))]


def test_branch_text_forces_each_token_then_goes_on_as_generate(record, embedded_stock):
    parent = Run.from_record(record)
    prefix = [s.id for s in parent[:4]]
    phrase = " Lyon, and"
    phrase_ids = embedded_stock.tokenizer(phrase, add_special_tokens=False)["input_ids"]
    events = json_lines(tokentui("branch", str(record), "--at", "5", "--text", phrase, "--json", "--greedy",
                                 "--max-new-tokens", "8", "--ignore-eos", "--no-record"))
    branch = next(e for e in events if e["event"] == "branch")
    assert (branch["phrase_ids"], branch["phrase_text"], branch["id"]) == (phrase_ids, phrase, phrase_ids[0])
    steps = [e for e in events if e["event"] == "step"]
    forced = steps[:len(phrase_ids)]
    assert [s["id"] for s in forced] == phrase_ids and all(s.get("forced") for s in forced)
    assert not any(s.get("forced") for s in steps[len(phrase_ids):])
    ids = parent.prompt.ids + prefix + phrase_ids
    expected = raw_probs_of(embedded_stock.model, ids, len(parent.prompt.ids) + len(prefix))
    assert [s["chosen_raw_prob"] for s in forced] == pytest.approx(expected, abs=1e-4)
    assert [s["id"] for s in steps[len(phrase_ids):]] == generate_ids(embedded_stock.model, ids,
                                                                     8 - len(phrase_ids))


def test_branch_text_prints_each_forced_token_with_probability_rank_and_preference(record):
    result = tokentui("branch", str(record), "--at", "5", "--text", " Lyon", "--greedy", "--max-new-tokens", "3",
                      "--no-record")
    assert result.returncode == 0, result.stderr
    line = next(ln for ln in result.stderr.splitlines() if ln.startswith("step    5"))
    assert "'␣Lyon'" in line and "rank " in line and "bits" in line and "the model preferred" in line


def test_score_json_steps_equal_a_teacher_forced_forward_and_sum_to_the_summary(embedded_stock, isolated_dirs):
    answer = "The capital of France is Lyon."
    # the float32 model, which the oracle runs (the default 4-bit path has fidelity tests of its own)
    events = json_lines(tokentui("score", "--headless", "--json", "--dtype", "float32", "--prompt",
                                 "What is the capital of France?", "--answer", answer, "--no-record"))
    kinds = [e["event"] for e in events]
    assert kinds[:3] == ["model", "prompt", "score"] and kinds[-2:] == ["score_summary", "done"]
    prompt, score = events[1], events[2]
    answer_ids = embedded_stock.tokenizer(answer, add_special_tokens=False)["input_ids"]
    assert score["ids"] == answer_ids
    steps = [e for e in events if e["event"] == "step"]
    assert [s["id"] for s in steps] == answer_ids and all(s["forced"] for s in steps)
    expected = raw_probs_of(embedded_stock.model, prompt["ids"] + answer_ids, len(prompt["ids"]))
    assert [s["chosen_raw_prob"] for s in steps] == pytest.approx(expected, abs=1e-4)
    summary = events[-2]
    logprob = sum(math.log(p) for p in expected)
    assert summary["tokens"] == len(answer_ids) and summary["logprob"] == pytest.approx(logprob, abs=1e-3)
    assert summary["perplexity"] == pytest.approx(math.exp(-logprob / len(answer_ids)), rel=1e-3)
    assert summary["least_likely"][0]["piece"] == "␣Lyon" and events[-1]["reason"] == "scored"


def test_score_text_lists_every_token_and_the_summary(isolated_dirs, tmp_path):
    answer = tmp_path / "answer.txt"
    answer.write_text("Paris is.\n", encoding="utf-8")
    result = tokentui("score", "--headless", "--prompt", "What is the capital of France?", "--answer-file",
                      str(answer), "--no-record")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [ln.split()[2] for ln in lines if ln.startswith("step")] == ["'Paris'", "'␣is'", "'.'"]
    assert "log-probability" in result.stdout and "perplexity" in result.stdout and "least likely" in result.stdout


def test_fanout_json_samples_are_each_their_seed_s_single_sequence_run(record, embedded_stock):
    parent = Run.from_record(record)
    args = ("fanout", str(record), "--at", "5", "--tokens", "6", "--temperature", "0.8", "--top-p", "1",
            "--ignore-eos", "--json", "--no-record")
    events = [e for e in json_lines(tokentui(*args, "-n", "4", "--seed", "11"))
              if e["event"] != "fanout_progress"]  # at most one a second: a slow machine may send one
    kinds = [e["event"] for e in events]
    assert kinds == ["model", "fanout", "prefill"] + ["sample"] * 4 + ["done"]
    fan = events[1]
    assert (fan["at"], fan["n"], fan["m"], fan["seed"]) == (4, 4, 6, 11)
    assert fan["tokens"] == [s.id for s in parent[:4]]
    samples = events[3:7]
    assert [s["seed"] for s in samples] == [11, 12, 13, 14] and all(len(s["ids"]) == 6 for s in samples)
    assert len({tuple(s["ids"]) for s in samples}) > 1  # at temperature 0.8 they differ
    ids = parent.prompt.ids + fan["tokens"]
    for sample in samples:
        assert sample["raw_probs"] == pytest.approx(raw_probs_of(embedded_stock.model, ids + sample["ids"],
                                                                 len(ids)), abs=1e-4)
        assert sample["logprob"] == pytest.approx(sum(math.log(p) for p in sample["probs"]), abs=1e-6)
    alone = json_lines(tokentui(*args, "-n", "1", "--seed", "13"))
    assert next(e for e in alone if e["event"] == "sample")["ids"] == samples[2]["ids"]


def test_fanout_text_ranks_the_samples_and_compares_first_tokens(record):
    result = tokentui("fanout", str(record), "--at", "5", "-n", "3", "--tokens", "4", "--no-record")
    assert result.returncode == 0, result.stderr
    rows = [ln for ln in result.stdout.splitlines() if ln.startswith("#")]
    logprobs = [float(ln.split("logprob")[1].split()[0]) for ln in rows]
    assert len(rows) == 3 and logprobs == sorted(logprobs, reverse=True)
    assert "first tokens of 3 samples" in result.stdout


@pytest.mark.parametrize("args, needle", [
    (["branch", "RECORD", "--at", "5", "--text", ""], "the phrase is empty"),
    (["branch", "RECORD", "--at", "5", "--text", "  "], "the phrase is empty"),
    (["branch", "RECORD", "--at", "5", "--token", "3", "--text", "x"], "not allowed with"),
    (["fanout", "RECORD", "--at", "5", "-n", "0"], "the number of samples (-n) must be a whole number from 1 to 64"),
    (["fanout", "RECORD", "--at", "5", "-n", "65"], "from 1 to 64"),
    (["fanout", "RECORD", "--at", "5", "--tokens", "0"], "the tokens per sample (--tokens)"),
    (["fanout", "RECORD", "--at", "5", "--tokens", "5000"], "from 1 to 1024"),
    (["fanout", "RECORD", "--at", "99"], "numbered 1..9"),
    (["score", "--headless", "--answer", ""], "the answer to score is empty"),
    (["score", "--headless"], "nothing to score"),
    (["score", "--headless", "--answer", "a", "--answer-file", "f.txt"], "pass one of them"),
    (["score", "--headless", "--answer-file", "/no/such/answer.txt"], "no such file"),
    (["score", "--json", "--answer", "a"], "--json needs --headless"),
])
def test_bad_input_is_one_line_and_exit_2_before_the_model_loads(record, capsys, args, needle):
    from tokentui.cli import main

    assert main([str(record) if a == "RECORD" else a for a in args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_phrase_past_the_context_is_one_line_and_exit_2(record):
    result = tokentui("branch", str(record), "--at", "5", "--text", " a" * 8300, "--max-new-tokens", "9000",
                      "--no-record")
    assert result.returncode == 2, result.stderr[-600:]
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "past this model's context of 8192" in lines[0] and "Traceback" not in result.stderr
