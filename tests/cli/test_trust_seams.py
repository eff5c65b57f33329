"""Issue 21 at the command line: each hostile or odd input is one actionable line and a non-zero exit (or, where it
is legitimate, just works); an unexpected exception is one line naming the log of its traceback; records and logs
are private; a record cut by a full disk says so."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

from cli_run import one_line_error, tokentui
from fake_openai_server import FakeServer
from tokentui.core.errors import SettingsError
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.run import Run
from tokentui.core.settings import SamplerSettings

DATA = Path(__file__).resolve().parent.parent / "data"
RECORD = DATA / "record.jsonl"  # a real record of the embedded model (4 steps)
MAX_SEED = 2**64 - 1  # the documented ranges (core/settings.py)
MIN_TEMPERATURE = 1e-30


def edited_record(tmp_path, edit, name="edited.jsonl") -> Path:
    lines = [json.loads(line) for line in RECORD.read_text().splitlines()]
    edit(lines)
    path = tmp_path / name
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---- item 8: one line, never a traceback -----------------------------------------------------------------------
def test_a_record_line_nested_100000_deep_is_one_line(tmp_path):
    lines = RECORD.read_text().splitlines()
    deep = '{"event": "notice", "message": "x", "extra": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path = tmp_path / "deep.jsonl"
    path.write_text("\n".join(lines[:2] + [deep] + lines[2:]) + "\n")
    one_line_error(tokentui("replay", str(path), "--headless", "--speed", "0"),
                   f"{path}: line 3 is not JSON (it is nested too deeply)")


def test_a_record_with_an_infinite_latency_is_one_line_and_a_tiny_speed_is_refused(tmp_path):
    def infinite(lines):
        lines[3]["latency_ms"] = float("inf")  # json.dumps writes the bare Infinity a careless writer would

    path = edited_record(tmp_path, infinite)
    assert "Infinity" in path.read_text()
    one_line_error(tokentui("replay", str(path), "--headless"), "line 4 is not JSON (Infinity is not JSON)")
    one_line_error(tokentui("replay", str(RECORD), "--headless", "--speed", "1e-300"),
                   "--speed 1e-300 is below 0.001")
    played = tokentui("replay", str(RECORD), "--headless", "--speed", "1e300")  # legitimate: as fast as it can
    assert played.returncode == 0 and played.stdout.strip() == "Hello! How can", played.stderr


def test_a_record_with_a_long_latency_waits_and_stops_on_ctrl_c(tmp_path):
    """An hour's step is read (1e300 ms is refused: tests/unit/test_reliability_round2_records.py); the replay waits
    on it (at most a minute, core/runs/replay.py's MAX_WAIT_S) until interrupted: one line and 130, no
    traceback."""
    import signal

    path = edited_record(tmp_path, lambda lines: lines[4].update(latency_ms=3_600_000.0))
    # SIGINT as a terminal delivers it: a test run started in the background inherits it ignored, and so would the
    # child (Python keeps an ignored SIGINT ignored)
    proc = subprocess.Popen([sys.executable, "-m", "tokentui", "replay", str(path), "--headless"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    out = ""
    while "Hello" not in out:  # the step before the long one has been printed: it is waiting now
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else out
        out += os.read(proc.stdout.fileno(), 100).decode()
    time.sleep(0.5)
    assert proc.poll() is None  # still waiting, not failed
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in err and "OverflowError" not in err, err
    assert err.strip().splitlines()[-1].startswith("tokentui: interrupted"), err


@pytest.mark.parametrize("edit, says", [
    (lambda lines: lines[3]["candidates"][0].update(prob=148.4), "step.candidates[0].prob should be a probability"),
    (lambda lines: lines[3]["candidates"][0].update(raw_prob=-3), "step.candidates[0].raw_prob should be a prob"),
    (lambda lines: lines[3].update(id=10**12), "step.id should be a token id in 0..2147483647"),
    (lambda lines: lines[3].update(id=-1), "step.id should be a token id in 0..2147483647"),
    (lambda lines: lines[3].update(id=10**30), "step.id should be a 64-bit integer"),
    (lambda lines: lines[3].update(id=49152), "token id 49152 is outside the model's vocabulary of 49152"),
    (lambda lines: lines[3].update(latency_ms=-5.0), "step.latency_ms should be a time in 0..86400000 ms"),
])
def test_a_record_with_values_no_run_has_is_one_line(tmp_path, edit, says):
    one_line_error(tokentui("replay", str(edited_record(tmp_path, edit)), "--headless", "--speed", "0"),
                   f"line 4: {says}")


def test_tiny_temperatures_are_refused_with_the_reason_and_the_smallest_works():
    one_line_error(tokentui("--headless", "--temperature", "1e-40"), "temperature 1e-40 is below 1e-30, the "
                   "smallest that works (the scores divided by it overflow float32): use 0 for greedy")
    from tokentui.core.steps.select import select

    scores = torch.randn(49152) * 40  # logits as large as a real model's, and larger
    chosen = select(scores, SamplerSettings(temperature=MIN_TEMPERATURE, top_p=0.9), torch.Generator())
    assert chosen.token_id == int(scores.argmax()) and chosen.chosen_prob == 1.0  # finite, and as greedy as it gets
    with pytest.raises(SettingsError):
        SamplerSettings(temperature=MIN_TEMPERATURE / 10)


def test_the_seed_range_is_torchs():
    one_line_error(tokentui("--headless", "--seed", str(2**64)), f"seed must be an integer in 0..{2**64 - 1}")
    one_line_error(tokentui("--headless", "--seed", str(10**40)), "got a 41-digit number")
    torch.Generator().manual_seed(SamplerSettings(seed=MAX_SEED).seed)  # the largest is one torch takes...
    with pytest.raises((RuntimeError, ValueError, OverflowError)):
        torch.Generator().manual_seed(MAX_SEED + 1)  # ...and the next is not


def test_a_prompt_file_is_capped_and_dev_zero_is_one_line_at_once():
    started = time.perf_counter()
    one_line_error(tokentui("--headless", "--prompt-file", "/dev/zero"), "larger than 8 MiB, the most a prompt file")
    assert time.perf_counter() - started < 30  # read up to the cap, not forever


def test_record_dir_naming_a_file_is_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    one_line_error(tokentui("--headless", "--record-dir", str(afile)),
                   f"--record-dir {afile} is a file, not a folder")
    one_line_error(tokentui("branch", str(RECORD), "--at", "1", "--token", "5", "--record-dir", str(afile)),
                   f"--record-dir {afile} is a file, not a folder")


def test_server_timeout_inf_means_no_limit(tmp_path):
    with FakeServer() as server:
        result = tokentui("--server", server.url, "--headless", "--server-timeout", "inf", "--no-record")
    assert result.returncode == 0 and result.stdout.strip() == "Hi 开!", result.stderr
    one_line_error(tokentui("--server", "http://127.0.0.1:9", "--headless", "--server-timeout", "nan"),
                   "--server-timeout must be a number of seconds > 0 (inf: no limit), got nan")


def test_a_config_validation_error_ends_with_its_detail(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 5,
        "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100, "num_key_value_heads": 5}))
    (folder / "model.safetensors").write_bytes(b"{}")
    one_line_error(tokentui("--headless", "--no-record", "--model", str(folder), timeout=300),
                   "'validate_architecture': ValueError: The hidden size (64) is not a multiple of the number of "
                   "attention heads (5)")


def test_a_record_with_vocab_rows_0_branches_without_a_nonsense_range(tmp_path):
    path = edited_record(tmp_path, lambda lines: lines[0].update(vocab_rows=0))
    result = tokentui("branch", str(path), "--at", "1", "--token", "5", "--model", str(tmp_path / "nope"))
    one_line_error(result, "no such file or folder")  # past the token check: on to the model, which is missing
    assert "0..-1" not in result.stderr
    one_line_error(tokentui("branch", str(path), "--at", "1", "--token", "-1"), "--token -1: not a token id (token "
                   "ids are integers >= 0)")


# ---- item 11: the last line of defence -------------------------------------------------------------------------
def test_an_unexpected_exception_is_one_line_naming_its_log(tmp_path):
    """A bug deep in a run (here the sampler raising a plain RuntimeError at the third step, carrying the API key
    in its message): one line naming the log, exit 1; the log has the traceback without the key; the record still
    ends with the crash's error and done."""
    secret = "sk-crash-0123456789abcdef"
    script = (
        "import sys, tokentui.core.model.step_loop as loop\n"
        "real, calls = loop.select, []\n"
        "def choose(*a, **k):\n"
        "    calls.append(1)\n"
        f"    if len(calls) == 3: raise RuntimeError('a bug holding {secret}')\n"
        "    return real(*a, **k)\n"
        "loop.select = choose\n"
        "from tokentui.cli import main\n"
        "raise SystemExit(main(sys.argv[1:]))\n")
    state = tmp_path / "state"
    result = subprocess.run([sys.executable, "-c", script, "--headless", "--greedy", "--max-new-tokens", "8",
                             "--record-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TOKENTUI_STATE_DIR": str(state), "TOKENTUI_API_KEY": secret})
    lines = [line for line in result.stderr.splitlines() if line.strip() and "recorded in" not in line]
    assert result.returncode == 1 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("tokentui: unexpected error (RuntimeError: a bug holding <key>); the traceback is "
                               f"in {state}/crash-") and secret not in result.stderr
    log = Path(lines[0].split("the traceback is in ")[1].split(" (please report it)")[0])
    assert "Traceback (most recent call last)" in log.read_text() and secret not in log.read_text()
    assert mode(log) == 0o600
    record = Run.from_record(next((tmp_path / "runs").iterdir()))
    assert record.error.kind.value == "crash" and record.done.reason == "error" and len(record) == 2


async def test_the_dashboard_writes_an_unhandled_exception_to_a_log_not_the_terminal(tmp_path, monkeypatch):
    from fakes import ScriptedEngine, make_loader
    from tokentui.tui import DashboardConfig, TokentuiApp
    from tokentui.tui.program import quit_lines

    monkeypatch.setenv("TOKENTUI_STATE_DIR", str(tmp_path / "state"))
    app = TokentuiApp(DashboardConfig(load=make_loader(ScriptedEngine()), user_theme_dir=None))

    def broken():
        raise ZeroDivisionError("a bug in a key handler")

    with pytest.raises(ZeroDivisionError):  # run_test hands the app's exception to the test, as Textual does
        async with app.run_test(size=(100, 40)) as pilot:
            await pilot.pause()
            app.call_later(broken)  # on the app's own loop, as a key handler would run
            await pilot.pause()
    assert app.crash_log is not None and "ZeroDivisionError" in app.crash_log.read_text()
    assert app.crash_log.parent == tmp_path / "state"
    assert quit_lines(app)[-1] == (f"unexpected error (ZeroDivisionError: a bug in a key handler); the traceback "
                                   f"is in {app.crash_log} (please report it)")
    assert app._exit_renderables == []  # Textual's traceback (with every frame's locals) is not printed


# ---- item 5: private records and logs --------------------------------------------------------------------------
def test_records_are_0600_in_0700_folders_and_an_older_state_folder_is_tightened(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o755)  # as an older tokentui made it
    (state / "runs").mkdir(mode=0o755)
    os.chmod(state, 0o755)
    os.chmod(state / "runs", 0o755)
    with FakeServer() as server:
        result = tokentui("--server", server.url, "--headless", "--greedy",
                          env_extra={"TOKENTUI_STATE_DIR": str(state)})
        assert result.returncode == 0, result.stderr
        named = tmp_path / "new" / "records"
        result = tokentui("--server", server.url, "--headless", "--greedy", "--record-dir", str(named))
        assert result.returncode == 0, result.stderr
    record = next((state / "runs").iterdir())
    assert (mode(state), mode(state / "runs"), mode(record)) == (0o700, 0o700, 0o600)
    assert (mode(named.parent), mode(named), mode(next(named.iterdir()))) == (0o700, 0o700, 0o600)
    saved = Run.from_record(record).save(tmp_path / "saved.jsonl")
    assert mode(saved) == 0o600


def test_the_model_process_log_is_0600_and_a_read_only_state_folder_does_not_stop_it(tmp_path, monkeypatch):
    from tokentui.core.link.process_client import start_model_process
    from tokentui.core.link.protocol import EngineSpec

    old = tmp_path / "state" / "model-process.log"
    old.parent.mkdir()
    old.write_text("an older log")
    os.chmod(old, 0o644)
    started = start_model_process(EngineSpec(model=str(tmp_path / "missing")), log_path=old)
    started.proc.kill()
    started.proc.wait()
    assert started.log_path == old and mode(old) == 0o600
    # the state folder cannot be written (here: a file stands where it should be): the output goes to a private
    # temporary file instead, and the process starts
    blocked = tmp_path / "blocked"
    blocked.write_text("a file")
    monkeypatch.setenv("TOKENTUI_STATE_DIR", str(blocked / "state"))
    started = start_model_process(EngineSpec(model=str(tmp_path / "missing")))
    try:
        assert started.proc.poll() is None and started.log_path is not None
        assert started.log_path.parent != blocked and mode(started.log_path) == 0o600
    finally:
        started.proc.kill()
        started.proc.wait()
        started.log_path.unlink()


def test_an_exported_answer_is_as_private_as_its_record(tmp_path):
    from tokentui.tui.export import export_answer

    record = tmp_path / "run.jsonl"
    path = export_answer("an answer", record)
    assert path == tmp_path / "run.answer.txt" and mode(path) == 0o600 and path.read_text() == "an answer\n"
    os.chmod(path, 0o644)  # an export made by an older version, written again
    assert mode(export_answer("again", record)) == 0o600 and path.read_text() == "again\n"
    assert mode(export_answer("not recorded", None, tmp_path)) == 0o600


# ---- item 12: a record cut by a full disk says so ---------------------------------------------------------------
class DiskFills(RunRecorder):
    """A recorder whose disk is full after `room` lines."""

    room = 4

    def write(self, event):
        if self.is_open:
            self.room -= 1
            if self.room < 0:
                raise OSError(28, "No space left on device")
        super().write(event)


def test_after_a_full_disk_the_last_line_says_the_record_was_cut_and_where(tmp_path, monkeypatch):
    import tokentui.core.runs.record_writer as writer
    from tokentui.cli import main

    monkeypatch.setattr(writer, "RunRecorder", DiskFills)
    err = io.StringIO()
    with FakeServer() as server, redirect_stdout(io.StringIO()), redirect_stderr(err):
        status = main(["--server", server.url, "--headless", "--greedy", "--record-dir", str(tmp_path)])
    record = next(tmp_path.iterdir())
    lines = err.getvalue().splitlines()
    assert status == 0 and lines[0] == f"tokentui: recording stopped: No space left on device; {record} ends early"
    assert lines[-1] == (f"tokentui: the run's record was cut (recording stopped; see above): {record} holds it "
                         "up to there")
    assert "run recorded in" not in err.getvalue()
    assert Run.from_record(record).record_notice == "the record ends early (no done or error event)"


def test_the_dashboards_quit_lines_name_a_cut_record(tmp_path):
    from types import SimpleNamespace

    from tokentui.tui.program import quit_lines

    whole, cut, cut_mid_line = tmp_path / "whole.jsonl", tmp_path / "cut.jsonl", tmp_path / "mid.jsonl"
    text = RECORD.read_text()
    whole.write_text(text)
    cut.write_text("".join(text.splitlines(keepends=True)[:-1]))  # up to the last step: no done
    cut_mid_line.write_text(text[:-40])
    long_done = json.loads(text.splitlines()[-1])
    long_done["text"] = "x" * 200_000  # a `done` longer than one block read from the end
    (tmp_path / "long.jsonl").write_text("".join(text.splitlines(keepends=True)[:-1]) + json.dumps(long_done) + "\n")
    trees = ["4 runs of one prompt recorded in TREE"]  # the controller's own lines (the tree files) come first
    controller = SimpleNamespace(record_paths=[whole, cut, cut_mid_line, tmp_path / "long.jsonl"],
                                 quit_lines=lambda: list(trees))
    app = SimpleNamespace(controller=controller, crash=None)
    assert quit_lines(app) == [
        *trees,
        f"the record {cut} was cut (recording stopped): it holds the run up to there",
        f"the record {cut_mid_line} was cut (recording stopped): it holds the run up to there"]
