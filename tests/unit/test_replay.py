"""`tokentui replay FILE.jsonl` (core/runs/replay.py, tokentui/commands/replay.py): each record source replays, at the recorded
speed or N× or as fast as possible, pauses and steps like the engine, a cut record plays up to its last whole line,
a bad file is one line and exit 2, and neither torch nor transformers is imported."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from fakes import ANSWER_TEXT, FACTS, ScriptedEngine, record_scripted, screen_text, wait_for
from noting_app import NotingApp
from tokentui.cli import main
from tokentui.core.errors import SettingsError
from tokentui.core.runs.events import DoneEvent, LoadProgress, Notice, StepEvent
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.run import Run
from tokentui.core.settings import SamplerSettings
from tokentui.commands.replay import replay_config
from tokentui.tui import TokentuiApp


def record_as_headless_json(path, engine: ScriptedEngine | None = None):
    """What `tokentui --headless --json > FILE` writes: load progress, the facts, the run."""
    engine = engine or ScriptedEngine()
    lines = [LoadProgress("finding the model", None), LoadProgress("ready", 1.0), engine.facts,
             *engine.run("Is OpenAI open?")]
    path.write_text("".join(json.dumps(e.to_dict(), ensure_ascii=False) + "\n" for e in lines), encoding="utf-8")
    return path


def played(engine: ReplayEngine, prompt: str | None = None) -> list:
    return list(engine.run(prompt))


# ---- the engine ------------------------------------------------------------------------------------------------

def test_a_recorders_record_replays_event_for_event(tmp_path):
    path, events = record_scripted(tmp_path)
    engine = ReplayEngine.from_record(path, speed=0)
    assert played(engine, "Is OpenAI open?") == events
    assert engine.facts.source == f"replay of {path.name}" and engine.facts.vocab_rows == FACTS.vocab_rows
    assert engine.sampler == SamplerSettings() and engine.options.max_new_tokens == 14
    assert not engine.options.ignore_eos and engine.options.top_candidates == 10
    with pytest.raises(SettingsError, match="a replay cannot change the sampler"):
        engine.update_sampler(temperature=1.0)
    assert played(engine) == events  # again from the start (r in the dashboard)


def test_headless_json_output_replays(tmp_path):
    path = record_as_headless_json(tmp_path / "headless.jsonl")
    events = list(ScriptedEngine().run("Is OpenAI open?"))
    assert played(ReplayEngine.from_record(path, speed=0)) == events


def test_the_recorded_sampler_and_a_different_prompt_are_said(tmp_path):
    sampler = SamplerSettings(temperature=0.0, top_k=3)
    path, events = record_scripted(tmp_path, ScriptedEngine(sampler=sampler))
    engine = ReplayEngine.from_record(path, speed=0)
    assert engine.sampler == sampler
    out = played(engine, "something else")
    assert out[0] == Notice("a replay plays the recorded prompt; the prompt given is not run") and out[1:] == events


def test_a_cut_record_replays_up_to_its_last_whole_line_with_a_notice(tmp_path):
    path, events = record_scripted(tmp_path)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:8]) + lines[8][:40], encoding="utf-8")  # steps 0-4 whole, step 5 half
    out = played(ReplayEngine.from_record(cut, speed=0))
    steps = [e for e in out if isinstance(e, StepEvent)]
    assert steps == events[2:7]
    assert out[-2] == Notice("the record ends early (cut at line 9): replayed up to there")
    done = out[-1]
    assert isinstance(done, DoneEvent) and done.reason == "stopped" and done.tokens == 5
    assert done.text == "".join(s.text for s in steps) and done.prompt_tokens == 13


class VirtualClock:
    """The replay's sleeps, counted instead of slept: `now` is the time the replay waited for."""

    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float, run_id: int, until_paused: bool = False) -> bool:  # the engine's sleep_at_gate
        self.now += seconds
        return True


def test_speed_zero_is_fast_and_the_recorded_speed_takes_the_recorded_time(tmp_path, monkeypatch):
    """The time a replay waits, counted on a virtual clock (not measured: a busy machine only sleeps longer)."""
    path, events = record_scripted(tmp_path)
    recorded_s = sum(e.latency_ms for e in events if isinstance(e, StepEvent)) / 1000  # 0.35 s
    waited = {}
    for speed in (1.0, 4.0, 0.0):
        clock = VirtualClock()
        engine = ReplayEngine.from_record(path, speed=speed)
        monkeypatch.setattr(engine, "sleep_at_gate", clock.sleep)
        assert played(engine) == events
        waited[speed] = clock.now
    assert recorded_s > 0.1
    assert waited[1.0] == pytest.approx(recorded_s)  # as recorded
    assert waited[4.0] == pytest.approx(recorded_s / 4)
    assert waited[0.0] == 0.0  # as fast as it can
    with pytest.raises(SettingsError, match="--speed must be a number >= 0"):
        ReplayEngine.from_record(path, speed=-1)


def test_pause_and_step_hold_the_replay_at_step_boundaries_like_the_engine(tmp_path):
    path, events = record_scripted(tmp_path)
    engine = ReplayEngine.from_record(path, speed=0)
    engine.pause()
    engine.step_once()  # granted before the run: the first token comes, then it holds
    out: list = []
    thread = threading.Thread(target=lambda: out.extend(engine.run()), daemon=True)
    thread.start()

    def steps() -> int:
        return sum(isinstance(e, StepEvent) for e in out)

    deadline = time.monotonic() + 5
    while steps() < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert steps() == 1 and engine.paused
    engine.step_once()
    engine.step_once()
    deadline = time.monotonic() + 5
    while steps() < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert steps() == 3
    engine.stop()  # a stop ends it at the boundary, as "stopped"
    thread.join(5)
    assert not thread.is_alive() and out[-1].reason == "stopped" and out[-1].tokens == 3


# ---- the command line ------------------------------------------------------------------------------------------

def test_headless_replay_prints_the_answer_and_json_replay_gives_the_record_back(tmp_path, capsys):
    path, _ = record_scripted(tmp_path)
    assert main(["replay", str(path), "--headless", "--speed", "0"]) == 0
    assert capsys.readouterr().out == ANSWER_TEXT + "\n"
    assert main(["replay", str(path), "--headless", "--json", "--speed", "0"]) == 0
    assert capsys.readouterr().out == path.read_text(encoding="utf-8")  # line for line, as recorded
    headless = record_as_headless_json(tmp_path / "headless.jsonl")
    assert main(["replay", str(headless), "--headless", "--json", "--speed", "0"]) == 0
    expected = [line for line in headless.read_text(encoding="utf-8").splitlines() if '"event": "load"' not in line]
    assert capsys.readouterr().out.splitlines() == expected


@pytest.mark.parametrize("content, words", [
    ("not json at all\nsecond\n", "line 1 is not JSON: not a tokentui run record"),
    ('{"event": "prompt", "text": "x"}\n{"event": "done"}\n', "line 1: prompt lacks ids, pieces, templated"),
    ('{"event": "wormhole"}\n{}\n', "unknown event 'wormhole'"),
    (None, "no such file"),
])
def test_a_bad_file_is_one_line_and_exit_2(tmp_path, capsys, content, words):
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    assert main(["replay", str(path), "--headless"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"tokentui: {path}: ")
    assert words in captured.err and captured.err.count("\n") == 1


def test_bad_replay_flags_are_one_line_and_exit_2(tmp_path, capsys):
    path, _ = record_scripted(tmp_path)
    assert main(["replay", str(path), "--speed", "-2"]) == 2
    assert capsys.readouterr().err == ("tokentui: --speed must be a number >= 0 (1 = as recorded, 0 = as fast as "
                                       "possible), got -2.0\n")
    assert main(["replay", str(path), "--json"]) == 2
    assert capsys.readouterr().err == "tokentui: --json needs --headless\n"
    with pytest.raises(SystemExit) as exited:
        main(["replay", str(path), "--speed", "fast"])
    assert exited.value.code == 2 and "--speed must be a number, got 'fast'" in capsys.readouterr().err


def test_replay_never_imports_torch_or_transformers(tmp_path):
    path, _ = record_scripted(tmp_path)
    code = f"""
import io, sys, contextlib
from tokentui.cli import main
from tokentui.core.runs.replay import ReplayEngine
from tokentui.commands.replay import replay_config
from tokentui.tui.app import TokentuiApp
app = TokentuiApp(replay_config(ReplayEngine.from_record({str(path)!r}, speed=0)))
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["replay", {str(path)!r}, "--headless", "--speed", "0"]) == 0
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# ---- the dashboard ---------------------------------------------------------------------------------------------

async def test_the_dashboard_replays_a_record_writes_none_and_refuses_sampler_keys(tmp_path):
    path, events = record_scripted(tmp_path / "runs")
    recorder_dir = tmp_path / "records"
    engine = ReplayEngine.from_record(path, speed=0)
    config = replay_config(engine, user_theme_dir=None)
    assert config.recorder is None and config.prompt == "Is OpenAI open?" and config.sampler == engine.sampler
    app = NotingApp(config)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the replay")
        await pilot.pause(0.1)
        assert app.state.answer_text == ANSWER_TEXT and app.state.steps == 14
        assert list(app.state.run) == [e for e in events if isinstance(e, StepEvent)]
        screen = screen_text(app)
        assert app.state.facts.source == f"replay of {path.name}" and "source       replay of" in screen
        assert path.name in screen  # the record's name, whole (on a line of its own where the panel is narrow)
        await pilot.press("t")  # temperature up: a replay cannot
        await pilot.pause(0.1)
        assert any("A replay plays the recorded settings" in str(n.message) for n in app.toasts)
        assert app.controller.sampler == engine.sampler
        await pilot.press("q")
    assert app.controller.tree_paths == [] and not recorder_dir.exists()


async def test_the_dashboard_pauses_and_steps_a_replay(tmp_path):
    path, _ = record_scripted(tmp_path)
    engine = ReplayEngine.from_record(path, speed=0.05)  # 20× slower than recorded: ~0.4 s a step
    app = TokentuiApp(replay_config(engine, user_theme_dir=None))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.steps >= 1, timeout=10, what="the first step")
        await pilot.press("space")
        await wait_for(pilot, lambda: engine.paused, what="the pause")
        await pilot.pause(1.5)
        held = app.state.steps
        await pilot.pause(1.0)
        assert app.state.steps == held  # held at a step boundary
        await pilot.press("n")
        await wait_for(pilot, lambda: app.state.steps == held + 1, timeout=5, what="one step")
        await pilot.pause(1.0)
        assert app.state.steps == held + 1
        await pilot.press("q")


@pytest.mark.slow
def test_a_real_headless_json_run_on_the_embedded_model_replays(embedded, isolated_dirs, tmp_path):
    result = subprocess.run([sys.executable, "-m", "tokentui", "--headless", "--json", "--temperature", "0",
                             "--max-new-tokens", "6", "--no-record"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    path = tmp_path / "real.jsonl"
    path.write_text(result.stdout, encoding="utf-8")
    done = json.loads(result.stdout.splitlines()[-1])
    run = Run.from_record(path)
    assert len(run) == done["tokens"] and run.done.text == done["text"] and run.facts.source == "embedded"
    replayed = subprocess.run([sys.executable, "-m", "tokentui", "replay", str(path), "--headless", "--speed", "0"],
                              capture_output=True, text=True, timeout=60)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout == done["text"] + done["flushed"] + "\n"
