"""The run model (core/runs/run.py): folding a run's events, navigating its steps, writing it as a record and reading
records back (core/runs/record_reader.py), the memory a long run takes, and the dashboard's RunState reading from it."""

from __future__ import annotations

import gc
import json
import tracemalloc
from dataclasses import replace

import pytest

from fakes import ANSWER, ANSWER_TEXT, FACTS, ScriptedEngine
from tokentui.core.runs.events import (Candidate, DoneEvent, LoadProgress, MultiTokenChar, Notice, PromptEvent,
                                  PromptPiece, StepEvent)
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.record_reader import RecordError, event_from_dict
from tokentui.core.runs.run import Cursor, Run, RunError
from tokentui.core.samplers import PARAMS
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.tui.state import RunState
from tokentui.tui.state_readings import PLOT_POINTS


def scripted_events(**kwargs) -> list:
    return list(ScriptedEngine(**kwargs).run("Is OpenAI open?"))


def folded(events, facts=FACTS) -> Run:
    run = Run(facts)
    for event in events:
        run.apply(event)
    return run


def write_lines(path, objects) -> None:
    path.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objects), encoding="utf-8")


# ---- folding and navigating ----------------------------------------------------------------------------------

def test_a_run_holds_every_event_in_order_and_gives_the_steps_back_equal():
    events = scripted_events()
    steps = [e for e in events if isinstance(e, StepEvent)]
    run = folded(events)
    assert len(run) == len(ANSWER) == 14
    assert list(run.events()) == [FACTS, *events]  # the order they came in, steps rebuilt equal
    assert [run.step(i) for i in range(len(run))] == steps and list(run) == steps
    assert run[3] == steps[3] and run[-1] == steps[-1] and run[2:5] == steps[2:5] and run[::5] == steps[::5]
    assert run.first == steps[0] and run.last is steps[-1]  # the latest one is kept as it came
    assert isinstance(run[4].candidates[0], Candidate) and run[10].completed_chars == [
        MultiTokenChar("开", "e5 bc 80", 2)]
    assert run.prompt == events[0] and run.prefill == events[1] and run.done == events[-1] and run.ended
    assert run.text == ANSWER_TEXT and run.values("latency_ms", 0, 3) == [s.latency_ms for s in steps[:3]]
    assert run.values("special", 12) == [False, True] and run.values("index", 2, 4) == [2, 3]
    with pytest.raises(IndexError):
        run.step(14)


def test_the_answer_so_far_and_the_characters_completed_over_several_tokens():
    run = Run(FACTS)
    for event in scripted_events()[:-1]:  # no done yet: the text is the steps'
        run.apply(event)
    assert run.done is None and run.text == ANSWER_TEXT
    assert run.completed_chars() == [MultiTokenChar("开", "e5 bc 80", 2)] and run.completed_chars(last=0) == []


def test_a_step_out_of_order_is_refused_and_leaves_the_run_as_it_was():
    events = scripted_events()
    run = folded(events[:4])  # prompt, prefill, steps 0 and 1
    with pytest.raises(RunError, match="step 5 cannot follow 2"):
        run.apply(events[7])
    assert len(run) == 2
    with pytest.raises(RunError, match="cannot be stored"):
        run.apply(replace(events[4], kv_bytes="lots"))
    assert len(run) == 2 and run[1] == events[3]
    run.apply(events[4])
    assert run[2] == events[4]


def test_a_cursor_follows_the_latest_step_or_holds_one():
    events = scripted_events()
    run = folded(events[:2])
    cursor = run.cursor()
    assert cursor.following and cursor.index is None and cursor.step is None and cursor.go(3) is None
    for event in events[2:6]:
        run.apply(event)
    assert cursor.index == 3 and cursor.step == events[5]  # following: the latest
    assert cursor.go(1) == 1 and not cursor.following
    run.apply(events[6])
    assert cursor.step == events[3]  # held where it was put
    assert cursor.move(-5) == 0 and cursor.at_first and cursor.move(100) == 4 and cursor.at_last
    cursor.follow()
    run.apply(events[7])
    assert cursor.index == 5 and isinstance(Cursor(run, 2).step, StepEvent) and Cursor(run, 2).index == 2


# ---- records ---------------------------------------------------------------------------------------------------

def test_a_recorders_record_reads_back_to_the_same_run(tmp_path):
    events = scripted_events()
    recorder = RunRecorder(tmp_path)
    path = recorder.open_run()
    recorder.write(FACTS)
    for event in events:
        recorder.write(event)
    recorder.close()
    run = Run.from_record(path)
    assert list(run.events()) == [FACTS, *events]
    assert run.cut_line is None and run.record_notice is None and run.record_path == path
    saved = run.save(tmp_path / "again.jsonl")
    assert saved.read_bytes() == path.read_bytes()  # written back byte for byte
    with pytest.raises(FileExistsError):
        run.save(saved)  # never overwrites


def test_headless_json_output_reads_back_with_its_load_lines_left_out_and_new_fields_ignored(tmp_path):
    events = scripted_events()
    lines = [LoadProgress("finding the model", None).to_dict(), LoadProgress("ready", 1.0).to_dict(),
             {**FACTS.to_dict(), "from_the_future": 1}]
    for event in events:
        data = event.to_dict()
        if isinstance(event, StepEvent):
            data["candidates"] = [{**c, "rank_in_vocab": 7} for c in data["candidates"]]
        lines.append({**data, "added_later": [1, 2]})
    write_lines(tmp_path / "run.jsonl", lines)
    run = Run.from_record(tmp_path / "run.jsonl")
    assert run.facts == FACTS and list(run) == [e for e in events if isinstance(e, StepEvent)]
    assert run.done == events[-1] and run.prompt.pieces[0] == PromptPiece(151644, "<|im_start|>", True)


def test_a_record_cut_short_reads_up_to_its_last_whole_line(tmp_path):
    events = scripted_events()
    text = "".join(json.dumps(e.to_dict(), ensure_ascii=False) + "\n" for e in [FACTS, *events])
    lines = text.splitlines(keepends=True)
    cut = "".join(lines[:9]) + lines[9][: len(lines[9]) // 2]  # line 10 (step 6) half-written
    (tmp_path / "cut.jsonl").write_text(cut, encoding="utf-8")
    run = Run.from_record(tmp_path / "cut.jsonl")
    assert run.cut_line == 10 and len(run) == 6 and run.end is None
    assert run.record_notice == "the record ends early (cut at line 10)"
    # cut inside a multi-byte character: the same
    (tmp_path / "cut2.jsonl").write_bytes(("".join(lines[:13]) + lines[13]).encode()[:-30])
    assert Run.from_record(tmp_path / "cut2.jsonl").cut_line == 14
    # every line whole but no end (killed between lines): said too
    (tmp_path / "open.jsonl").write_text("".join(lines[:9]), encoding="utf-8")
    run = Run.from_record(tmp_path / "open.jsonl")
    assert run.cut_line is None and run.record_notice == "the record ends early (no done or error event)"


@pytest.mark.parametrize("content, message", [
    ("", "not a tokentui run record (no model event)"),
    ("hello\nworld\n", "line 1 is not JSON: not a tokentui run record"),
    ('[1, 2]\n{"event": "x"}\n', "line 1: it is not a JSON object"),
    ('{"name": 1}\n{"event": "x"}\n', "line 1: it has no event name"),
    ('{"event": "teleport"}\n{"event": "x"}\n', "line 1: unknown event 'teleport' (from a newer tokentui?)"),
    ("PROMPT_FIRST", "not a tokentui run record (line 1 is a 'prompt' event, not the model event a record "
                     "starts with)"),
    ("FACTS_ONLY", "not a tokentui run record (no prompt event)"),
    ("BAD_MIDDLE", "line 2 is not JSON: not a tokentui run record"),
    ("MISSING_FIELD", "line 2: prompt lacks ids (a schema this version cannot read)"),
    ("WRONG_TYPE", "line 4: step.candidates[1].raw_prob should be float, got \"high\""),
    ("SETTINGS_TYPE", "line 4: step.settings.top_k should be int, got \"5\""),
    ("SETTINGS_RANGE", "line 4: step.settings: top-p must be in (0, 1] (1 = off), got 1.5"),
    ("SETTINGS_NOT_AN_OBJECT", "line 4: step.settings should be an object"),
    ("STEP_SKIPPED", "line 5: step 2 cannot follow 1 step(s)"),
    ("AFTER_END", "a 'notice' event after the run's end"),
    ("TWO_RUNS", "a second prompt event (a record holds one run)"),
])
def test_a_file_that_is_not_a_record_is_refused_in_one_line(tmp_path, content, message):
    events = scripted_events()
    base = [FACTS.to_dict(), *(e.to_dict() for e in events)]
    if content == "PROMPT_FIRST":
        objects = base[1:]
    elif content == "FACTS_ONLY":
        objects = base[:1]
    elif content == "MISSING_FIELD":
        objects = [base[0], {k: v for k, v in base[1].items() if k != "ids"}]
    elif content == "WRONG_TYPE":
        step = json.loads(json.dumps(base[3]))
        step["candidates"][1]["raw_prob"] = "high"
        objects = [*base[:3], step]
    elif content.startswith("SETTINGS_"):
        step = json.loads(json.dumps(base[3]))
        step["settings"] = {"SETTINGS_TYPE": {**step["settings"], "top_k": "5"},
                            "SETTINGS_RANGE": {**step["settings"], "top_p": 1.5},
                            "SETTINGS_NOT_AN_OBJECT": [0.7, 0]}[content]
        objects = [*base[:3], step]
    elif content == "STEP_SKIPPED":
        objects = [*base[:4], base[5]]
    elif content == "AFTER_END":
        objects = [*base, Notice("late").to_dict()]
    elif content == "TWO_RUNS":
        objects = [*base[:5], base[1]]
    else:
        objects = None
    path = tmp_path / "file.jsonl"
    if content == "BAD_MIDDLE":
        path.write_text(json.dumps(base[0]) + "\n{oops\n" + json.dumps(base[1]) + "\n", encoding="utf-8")
    elif objects is not None:
        write_lines(path, objects)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(RecordError) as caught:
        Run.from_record(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_step_settings_are_sampler_settings_in_memory_and_the_same_dict_on_disk(tmp_path):
    """The engine's SamplerSettings object rides on each step; records and JSON write the dict they always did; the
    reader builds SamplerSettings again (keys it does not know ignored, like any field a newer schema adds; a bad
    value refuses the record: the parametrized test above); equal settings are one object in a run."""
    engine = ScriptedEngine()
    events = list(engine.run("Is OpenAI open?"))
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert all(type(s.settings) is SamplerSettings for s in steps) and steps[0].settings == engine.sampler
    written = steps[0].to_dict()["settings"]
    assert list(written) == [p.name for p in PARAMS]  # one key per parameter (core/samplers.py), in its order
    assert {k: written[k] for k in list(written)[:6]} == {"temperature": 0.7, "top_k": 0, "top_p": 0.9, "min_p": 0.0,
                                                          "greedy": False, "seed": 0}
    assert all(written[p.name] == p.default for p in PARAMS[6:])  # issue 38's stages, each at its default: off
    with pytest.raises(TypeError, match="must be SamplerSettings, got dict"):
        replace(steps[0], settings=steps[0].settings.to_dict())
    lines = [FACTS.to_dict()]
    for n, event in enumerate(events):
        data = event.to_dict()
        if isinstance(event, StepEvent):
            data["settings"] = {**data["settings"], "future_p": 0.05}  # a setting from a newer tokentui
            if n > 8:
                data["settings"]["temperature"] = 0.0 if n < 12 else 0.7  # two changes: 0.7, 0.0, back to 0.7
        lines.append(data)
    write_lines(tmp_path / "run.jsonl", lines)
    run = Run.from_record(tmp_path / "run.jsonl")
    settings = [run[i].settings for i in range(len(run))]
    assert [s.temperature for s in settings] == [0.7] * 7 + [0.0] * 3 + [0.7] * 4  # steps are events 2..15
    assert len({id(s) for s in settings[:-1]}) == 2  # one object per distinct value, the last step's as it came
    assert settings[0] is settings[12] and settings[0] == SamplerSettings() and settings[-1] == settings[0]
    assert '"future_p"' not in json.dumps(run[0].to_dict())  # the unknown key is not carried on


def test_a_missing_file_or_a_folder_is_refused_in_one_line(tmp_path):
    with pytest.raises(RecordError, match="no such file"):
        Run.from_record(tmp_path / "missing.jsonl")
    with pytest.raises(RecordError, match="is a folder, not a run record"):
        Run.from_record(tmp_path)


# ---- memory ----------------------------------------------------------------------------------------------------

def test_ten_thousand_steps_of_ten_candidates_stay_well_under_50_mib(tmp_path):
    """Measured as the dashboard gets them (new strings every step, as from the model process) and as read back
    from a record; the figure per 1,000 steps is printed (run with -s)."""
    engine = ScriptedEngine(options=RunOptions(max_new_tokens=10_000, ignore_eos=True))
    run = Run(FACTS)
    for event in engine.run("Is OpenAI open?"):
        run.apply(event)
    path = run.save(tmp_path / "long.jsonl")
    del run, engine
    lines = path.read_text(encoding="utf-8").splitlines()
    events = [event_from_dict(json.loads(line)) for line in lines]  # fresh objects, strings not shared
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run = Run()
        for event in events:
            run.apply(event)
        del events
        gc.collect()
        live = tracemalloc.get_traced_memory()[0] - before
        read_before = tracemalloc.get_traced_memory()[0]
        again = Run.from_record(path)
        gc.collect()
        read = tracemalloc.get_traced_memory()[0] - read_before
    finally:
        tracemalloc.stop()
    assert len(run) == len(again) == 10_000 and all(len(s.candidates) == 10 for s in run[::997])
    assert again[9_999] == run[9_999]
    per_1000 = live / 2**20 / 10
    print(f"\nrun model: {per_1000:.2f} MiB per 1,000 steps of 10 candidates "
          f"({live / 2**20:.1f} MiB folded, {read / 2**20:.1f} MiB read from a record, for 10,000)")
    assert live < 50 * 2**20 and read < 50 * 2**20
    assert live < 10 * 2**20  # columns, not objects: ~0.5 MiB per 1,000 steps (a StepEvent each: ~30 MiB)


# ---- the dashboard's state reads from the run -----------------------------------------------------------------

def test_run_state_keeps_one_copy_of_the_steps_and_derives_what_the_panels_read():
    engine = ScriptedEngine(options=RunOptions(max_new_tokens=600, ignore_eos=True))
    state = RunState()
    state.facts = engine.facts
    state.start_run()
    for event in engine.run("Is OpenAI open?"):
        state.apply(event)
    steps = engine.steps
    assert state.run.facts == engine.facts and len(state.run) == state.steps == 600
    assert state.last_step is steps[-1] and state.done == engine.events[-1] and state.error is None
    assert state.prompt == engine.events[0] and state.prefill == engine.events[1]
    tokens = state.tokens
    assert len(tokens) == 600 and tokens[5].text == steps[5].text and tokens[-1].piece == steps[-1].piece
    assert [(t.text, t.raw_prob, t.prob, t.special) for t in tokens[590:]] == [
        (s.text, s.chosen_raw_prob, s.chosen_prob, s.special) for s in steps[590:]]
    assert state.decode_latencies == [s.latency_ms for s in steps[1:]]
    assert state.plot_points == [(s.index + 1, s.latency_ms) for s in steps[-PLOT_POINTS:]]
    assert [c.char for c in state.multi_token_chars] == ["开"] * 8  # the latest 8
    state.start_run()
    assert state.steps == 0 and not state.tokens and state.last_step is None and state.plot_points == []
    assert state.run.facts == engine.facts and state.done is None


def test_run_state_lists_notices_from_the_run():
    state = RunState()
    state.start_run()
    for event in ScriptedEngine(chat_template=False).run("Is OpenAI open?"):
        state.apply(event)
    assert state.notices == ["This model has no chat template: the raw prompt is used as typed"]
    assert isinstance(state.run.notices[0], Notice) and isinstance(state.done, DoneEvent)
    assert isinstance(state.prompt, PromptEvent)
