"""--server against a real llama.cpp llama-server on the embedded GGUF (tests/llama_server_fixture.py): the
stream's tokens are the server's own greedy completion, the probabilities are valid and labelled as what they
are, split characters are held as the local engine holds them, a settings change / pause / step continues from the
same prefix, and a server killed mid-stream ends the run with a whole record."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import httpx
import pytest

from run_checks import failure_of
from tokentui.core.errors import ErrorKind
from tokentui.core.steps.detokenize import IncrementalDetokenizer
from tokentui.core.runs.events import DoneEvent, Notice, PrefillEvent, PromptEvent, StepEvent
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.record_reader import read_lines
from tokentui.core.runs.recording import RecordedRun
from tokentui.core.server.engine import ServerEngine, ServerOptions
from tokentui.core.settings import RunOptions, SamplerSettings

GREEDY = SamplerSettings(temperature=0.0, greedy=True)
EMOJI_PROMPT = "Say 你好 and an emoji"


def connect(server, max_new_tokens=24, **options):
    return ServerEngine.connect(ServerOptions(server.url), GREEDY,
                                RunOptions(max_new_tokens=max_new_tokens, **options))


def steps_of(events):
    return [e for e in events if isinstance(e, StepEvent)]


def servers_own_greedy(server, ids, n):
    """The oracle: the server's own non-streamed greedy completion of `ids`."""
    body = {"prompt": ids, "n_predict": n, "temperature": 0.0, "top_k": 0, "min_p": 0.0, "stream": False,
            "return_tokens": True, "cache_prompt": False}
    return httpx.post(server.url + "/completion", json=body, timeout=120).json()["tokens"]


def test_greedy_stream_is_the_servers_own_completion_with_valid_raw_probs(llama_server):
    engine = connect(llama_server)
    assert engine.facts.server.engine == "llama.cpp" and engine.facts.server.probs == "raw"
    assert engine.facts.vocab_rows == 49152 and engine.facts.layers is None  # not reported: None, not invented
    events = list(engine.run("Is OpenAI open?"))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    assert prompt.templated and prompt.text.startswith("<|im_start|>")
    assert prompt.pieces[0].special and prompt.pieces[0].piece == "<|im_start|>"
    assert not any(p.special for p in prompt.pieces if p.piece in ("user", "Is"))
    steps = steps_of(events)
    assert isinstance(events[-1], DoneEvent) and events[-1].tokens == len(steps) > 5
    assert [s.id for s in steps] == servers_own_greedy(llama_server, prompt.ids, len(steps))
    assert isinstance(next(e for e in events if isinstance(e, PrefillEvent)).ms, float)
    for s in steps:
        if s.merged:
            continue
        assert s.chosen_rank == 0 and s.candidates[0].id == s.id  # greedy: the chosen token is the top one
        raws = [c.raw_prob for c in s.candidates]
        assert all(c.prob is None for c in s.candidates)  # raw only: never labelled post-sampler
        assert all(0.0 <= p <= 1.0 for p in raws) and raws == sorted(raws, reverse=True)
        assert sum(raws) <= 1.0 + 1e-5 and s.chosen_raw_prob == pytest.approx(raws[0])
        assert s.forward_ms is None and s.kv_bytes is None and s.entropy_bits is None
    assert "".join(s.text for s in steps) + events[-1].flushed == events[-1].text


def test_kv_use_is_what_the_servers_slots_report(llama_server):
    """llama-server's /slots: the busy slot's prompt + decoded tokens over its context, read off the token path."""
    engine = connect(llama_server, max_new_tokens=80, ignore_eos=True)
    assert engine.facts.server.kv_source == "/slots"
    events = list(engine.run("Is OpenAI open?"))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    usage = [s.server_kv_usage for s in steps_of(events) if s.server_kv_usage is not None]
    limit = (len(prompt.ids) + 80) / engine.facts.max_context
    assert usage and max(usage) > 0 and all(0 <= u <= limit + 1e-9 for u in usage)


def test_split_characters_are_held_as_the_local_engine_holds_them(llama_server, smol_tokenizer):
    engine = connect(llama_server, max_new_tokens=40)
    events = list(engine.run(EMOJI_PROMPT))
    steps = steps_of(events)
    assert any(s.merged for s in steps) and any(s.pending_hex for s in steps)
    local = IncrementalDetokenizer(smol_tokenizer)
    for s in steps:
        want = local.push(s.id)
        assert (s.text, s.pending_hex, s.pending_needed, s.completed_chars) == \
            (want.text, want.pending_hex, want.pending_needed, list(want.completed))
    assert "\ufffd" not in "".join(s.text for s in steps)
    done = events[-1]
    assert done.text.startswith("".join(s.text for s in steps))


def test_settings_change_mid_stream_continues_from_the_same_prefix(llama_server):
    plain = steps_of(connect(llama_server).run("Is OpenAI open?"))
    engine = connect(llama_server)
    steps = []
    for event in engine.run("Is OpenAI open?"):
        if isinstance(event, StepEvent):
            steps.append(event)
            if event.index == 3:
                engine.update_sampler(top_k=5)  # greedy either way: the tokens must not change
    assert [s.id for s in steps] == [s.id for s in plain]
    changed = steps[4]
    assert changed.settings_changed and changed.settings.top_k == 5
    assert changed.reissue_ttft_ms is not None and changed.reissue_ttft_ms > 0
    assert all(s.reissue_ttft_ms is None for s in steps[:4])


def test_pause_stops_reading_and_a_single_step_asks_for_one_token(llama_server):
    plain = steps_of(connect(llama_server, max_new_tokens=12).run("Is OpenAI open?"))
    engine = connect(llama_server, max_new_tokens=12)
    steps = []
    timers = []
    for event in engine.run("Is OpenAI open?"):
        if isinstance(event, StepEvent):
            steps.append(event)
            if event.index == 2:
                engine.pause()
                timers = [threading.Timer(0.3, engine.step_once), threading.Timer(1.0, engine.resume)]
                for t in timers:
                    t.start()
    for t in timers:
        t.join()
    assert [s.id for s in steps] == [s.id for s in plain]
    assert steps[3].reissue_ttft_ms is not None  # the single step: a request of its own
    assert steps[4].reissue_ttft_ms is not None  # the resume


def test_server_killed_mid_stream_ends_the_run_with_a_whole_record(llama_server_factory, tmp_path):
    server = llama_server_factory()
    engine = connect(server, max_new_tokens=400, ignore_eos=True)
    events = []
    with RecordedRun(engine.facts, RunRecorder(tmp_path), on_note=lambda m: None) as run:
        run.open()
        for event in run.record(engine.run("Write a long story.")):
            events.append(event)
            if isinstance(event, StepEvent) and event.index == 3:
                server.process.kill()
    error = failure_of(events)
    assert "\n" not in error.message and error.kind == ErrorKind.SERVER and events[-1].tokens >= 4
    lines = [event for _, event in read_lines(run.path)[0]]
    assert isinstance(lines[-1], DoneEvent) and len(steps_of(lines)) == events[-1].tokens


def test_a_refused_request_shows_the_servers_message(llama_server_factory):
    server = llama_server_factory(extra_args=("-c", "64"))
    events = list(connect(server).run("word " * 600))  # the server rounds -c up to 256
    error = failure_of(events).message
    assert "answered 400" in error and "context" in error


def test_headless_json_record_replays(llama_server, tmp_path):
    cmd = [sys.executable, "-m", "tokentui", "--server", llama_server.url, "--headless", "--json", "--greedy",
           "--max-new-tokens", "8", "--record-dir", str(tmp_path)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    lines = [line for line in lines if line["event"] != "load"]
    assert lines[0]["event"] == "model" and lines[0]["server"]["engine"] == "llama.cpp"
    assert lines[-1]["event"] == "done"
    record = next(tmp_path.iterdir())
    replay = subprocess.run([sys.executable, "-m", "tokentui", "replay", str(record), "--headless", "--speed", "0"],
                            capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.rstrip("\n") == lines[-1]["text"].rstrip("\n")


def test_a_branch_forces_a_token_and_the_server_goes_on_from_there(llama_server):
    from tokentui.core.runs.branch_point import BranchPoint
    from tokentui.core.runs.events import BranchEvent

    engine = connect(llama_server, max_new_tokens=12)
    events = list(engine.run("Is OpenAI open?"))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    parent = [s for s in steps_of(events) if not s.merged]
    at = 3
    other = parent[at].candidates[1].id  # the runner-up at step 3
    point = BranchPoint(tuple(prompt.ids), tuple(s.id for s in parent[:at]), at, other, "parent", parent[at].id)
    branch = list(engine.branch(point))
    assert isinstance(branch[0], BranchEvent) and branch[0].at == at and branch[0].id == other
    assert branch[0].prefix_text == "".join(s.text for s in parent[:at])
    assert isinstance(branch[1], PrefillEvent) and branch[1].tokens == len(prompt.ids) + at
    forced = branch[2]
    assert forced.forced and forced.index == at and forced.id == other
    # the same prefix, so the same distribution as the parent's step: the forced token's probability is its own
    assert [c.id for c in forced.candidates] == [c.id for c in parent[at].candidates]
    assert forced.chosen_raw_prob == pytest.approx(parent[at].candidates[1].raw_prob, rel=1e-3)
    assert forced.chosen_rank == 1
    rest = [s for s in branch[3:] if isinstance(s, StepEvent)]
    assert [s.index for s in rest] == list(range(at + 1, at + 1 + len(rest)))
    expected = servers_own_greedy(llama_server, list(prompt.ids) + [s.id for s in parent[:at]] + [other], len(rest))
    assert [s.id for s in rest] == expected
    done = branch[-1]
    assert isinstance(done, DoneEvent) and done.tokens == 1 + len(rest) <= 12
    assert done.text.startswith(branch[0].prefix_text + forced.text)


def test_tokentui_branch_of_a_served_record_goes_to_its_server(llama_server, tmp_path):
    record_dir = tmp_path / "runs"
    cmd = [sys.executable, "-m", "tokentui", "--server", llama_server.url, "--headless", "--json", "--greedy",
           "--max-new-tokens", "8", "--record-dir", str(record_dir)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    steps = [json.loads(line) for line in result.stdout.splitlines() if '"event": "step"' in line]
    record = next(record_dir.iterdir())
    other = next(c["id"] for c in steps[2]["candidates"] if c["id"] != steps[2]["id"])
    branch = subprocess.run([sys.executable, "-m", "tokentui", "branch", str(record), "--at", "3", "--token",
                             str(other), "--json", "--no-record", "--max-new-tokens", "4"],
                            capture_output=True, text=True, timeout=120)
    assert branch.returncode == 0, branch.stderr
    events = [json.loads(line) for line in branch.stdout.splitlines()]
    names = [e["event"] for e in events]
    assert "branch" in names and names[-1] == "done"
    forced = next(e for e in events if e["event"] == "step")
    assert forced["index"] == 2 and forced["id"] == other and forced.get("forced") is True


def test_post_sampler_probabilities_are_the_raw_ones_through_temperature_and_top_k(llama_server):
    """--server-probs post-sampler: llama-server's post_sampling_probs, labelled as such, equal to its raw
    probabilities put through temperature and top-k as transformers' warpers do (softmax(log p / T) over the k
    best)."""
    raw_engine = connect(llama_server, max_new_tokens=1)
    raw_step = steps_of(raw_engine.run("Is OpenAI open?"))[0]
    sampler = SamplerSettings(temperature=0.7, top_k=5, top_p=1.0, seed=3)
    post_engine = ServerEngine.connect(ServerOptions(llama_server.url, probs="post-sampler"), sampler,
                                       RunOptions(max_new_tokens=1))
    assert post_engine.facts.server.probs == "post-sampler"
    post_step = steps_of(post_engine.run("Is OpenAI open?"))[0]
    assert all(c.raw_prob is None and c.prob is not None for c in post_step.candidates)
    assert post_step.chosen_raw_prob is None and post_step.chosen_prob is not None
    top = raw_step.candidates[:5]
    weights = [c.raw_prob ** (1 / 0.7) for c in top]
    expected = {c.id: w / sum(weights) for c, w in zip(top, weights)}
    got = {c.id: c.prob for c in post_step.candidates}
    assert set(got) == set(expected)  # top-k 5: exactly the five best, nothing else kept
    for token_id, p in expected.items():
        assert got[token_id] == pytest.approx(p, abs=2e-3)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-3)
