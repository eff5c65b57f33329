"""Faults inside the engine and at the edges of the command line, without a terminal: CUDA out of memory (made
on the CPU by a patched forward), bfloat16 on a GPU that cannot do it, bad flags in dashboard mode, a closed
output pipe in headless mode, and half-written model caches left by a killed process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from tiny_models import tiny_model
from cli_run import tokentui
from run_checks import failure_of
from tokentui.core.errors import ErrorKind
from tokentui.core.model.engine import Engine, oom_message
from tokentui.core.runs.events import ErrorEvent, StepEvent
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.settings import RunOptions, SamplerSettings

OOM_TEXT = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.64 GiB of which "
            "1.06 GiB is free.")


@pytest.fixture(scope="module")
def tiny(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer)
    return LoadedModel(model=model, tokenizer=smol_tokenizer,
                       facts=model_facts(model, smol_tokenizer, name="tiny-llama"))


def oom_after(model, runs: int):
    """Patch the model's forward: the first `runs` calls work, the next raises CUDA out-of-memory."""
    original = model.forward
    calls = {"n": 0}

    def forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > runs:
            raise torch.cuda.OutOfMemoryError(OOM_TEXT)
        return original(*args, **kwargs)

    model.forward = forward  # an instance attribute: nn.Module.__call__ finds it first
    return lambda: model.__dict__.pop("forward", None)


@pytest.mark.parametrize("runs, where", [(3, "at step 4"), (0, "in prefill")])
def test_out_of_memory_ends_the_run_with_numbers_and_a_suggestion(tiny, monkeypatch, runs, where):
    def no_cuda_query(*_):
        raise AssertionError("mem_get_info must not be called for a CPU model")

    monkeypatch.setattr(torch.cuda, "mem_get_info", no_cuda_query)
    engine = Engine(tiny, SamplerSettings(temperature=0), RunOptions(max_new_tokens=10, ignore_eos=True))
    restore = oom_after(tiny.model, runs)
    try:
        events = list(engine.run("Hi"))
    finally:
        restore()
    error = failure_of(events)
    assert error.kind == ErrorKind.OOM and events[-1].tokens == runs  # the done after it counts the steps
    assert sum(isinstance(e, StepEvent) for e in events) == runs  # every step before the fault was reported
    assert error.step == (runs if runs else -1)
    message = error.message
    assert "\n" not in message and message.startswith(f"out of GPU memory {where}")
    assert "tried to allocate 2.00 GiB" in message  # the numbers the error carried
    assert "--dtype bfloat16" in message and "--max-new-tokens" in message  # what to try (fp32 model here)
    # the engine is usable again afterwards
    assert list(engine.run("Hi"))[-1].event == "done"


def test_oom_message_on_a_gpu_reports_free_memory_and_survives_a_broken_query(monkeypatch):
    """The message the engine's run ends with (the test above) on a CUDA device, which can say what is free."""
    gpu = SimpleNamespace(type="cuda", index=0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (int(1.5 * 2**30), 8 * 2**30))
    message = oom_message(torch.cuda.OutOfMemoryError(OOM_TEXT), 7, gpu, "float32")
    assert "at step 8" in message and "1.5 of 8.0 GiB free" in message and "tried to allocate 2.00 GiB" in message

    def broken(device):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "mem_get_info", broken)
    message = oom_message(torch.cuda.OutOfMemoryError("CUDA out of memory."), 7, gpu, "float32")
    assert message.startswith("out of GPU memory at step 8; try")  # index 7 = the 8th token
    # already half precision: not suggested again
    assert "--dtype bfloat16" not in oom_message(torch.cuda.OutOfMemoryError("x"), 1, gpu, "bfloat16")


def test_headless_out_of_memory_is_one_line_and_a_failed_exit(embedded, isolated_dirs, tmp_path):
    """The real command, with the decode step patched to run out of memory at its third call."""
    script = textwrap.dedent(f"""
        import sys, torch
        import tokentui.core.model.step_loop as loop
        real, calls = loop.decode_one_token, {{"n": 0}}
        def decode(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 3:
                raise torch.cuda.OutOfMemoryError({OOM_TEXT!r})
            return real(*args, **kwargs)
        loop.decode_one_token = decode
        from tokentui.cli import main
        raise SystemExit(main(sys.argv[1:]))
    """)
    result = subprocess.run([sys.executable, "-c", script, "--headless", "--temperature", "0", "--ignore-eos",
                             "--max-new-tokens", "20", "--record-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip() and "run recorded in" not in ln]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tokentui: out of GPU memory at step 4 (tried to allocate 2.00 GiB)"), lines[0]
    (record,) = tmp_path.glob("*.jsonl")
    error, last = (json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()[-2:])
    assert error["event"] == "error" and error["kind"] == "oom" and error["step"] == 3
    assert last["event"] == "done" and last["reason"] == "error" and last["tokens"] == 3


def test_bfloat16_on_a_gpu_that_cannot_do_it(monkeypatch):
    from tokentui.core.errors import SettingsError
    from tokentui.core.model.load.loader import resolve_dtype

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    gpu = SimpleNamespace(type="cuda", index=0)
    with pytest.raises(SettingsError, match="this GPU cannot compute in bfloat16; use --dtype float16"):
        resolve_dtype("bfloat16", gpu)
    assert resolve_dtype("auto", gpu) is torch.float16  # auto picks what the GPU can do
    assert resolve_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16


@pytest.mark.parametrize("args, needle", [
    (["--temperature", "-1"], "temperature must be a number >= 0"),
    (["--top-p", "2"], "top-p must be in (0, 1]"),
    (["--prompt", ""], "the prompt is empty"),
    (["--prompt-file", "/nonexistent/prompt.txt"], "no such file"),
    (["--json"], "--json needs --headless"),
    (["--weight-layout", "sideways"], "argument --weight-layout: invalid choice: 'sideways'"),
])
def test_dashboard_mode_bad_flags_are_one_line_before_the_screen_changes(args, needle):
    result = tokentui(*args, timeout=120)
    assert result.returncode == 2
    assert "\x1b[" not in result.stdout + result.stderr  # the terminal was never switched to the dashboard
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tokentui: ") and needle in lines[0], result.stderr


def test_headless_output_closed_mid_run_stops_the_run_and_keeps_the_record(embedded, isolated_dirs, tmp_path):
    """`tokentui --headless | head -c 20`: the reader goes away; the run stops, no traceback, record complete."""
    proc = subprocess.Popen([sys.executable, "-m", "tokentui", "--headless", "--ignore-eos", "--max-new-tokens",
                             "2000", "--record-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = proc.stdout.read(20)
        assert first
        proc.stdout.close()  # the pipe's reader is gone: the next write fails (EPIPE)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert b"Traceback" not in err and b"Exception ignored" not in err
    (record,) = tmp_path.glob("*.jsonl")
    raw = record.read_text(encoding="utf-8")
    assert raw.endswith("\n")
    events = [json.loads(line) for line in raw.splitlines()]
    steps = [e for e in events if e["event"] == "step"]
    assert events[-1]["event"] == "done" and events[-1]["reason"] == "stopped"
    assert events[-1]["tokens"] == len(steps) < 2000


def test_half_written_caches_of_dead_processes_are_removed(tmp_path):
    from tokentui.core.model.load.model_cache import _remove_abandoned

    target = tmp_path / "converted" / "model-abc"
    target.parent.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine = target.parent / f".{target.name}.{os.getpid()}.tmp"
    gone = target.parent / f".{target.name}.{dead.pid}.tmp"
    odd = target.parent / f".{target.name}.notapid.tmp"
    for folder in (mine, gone, odd):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"\0" * 64)
    _remove_abandoned(target)
    assert mine.exists() and odd.exists() and not gone.exists()


def test_the_dashboard_uses_the_driver_that_survives_a_lost_terminal():
    from tokentui.tui import DashboardConfig, TokentuiApp
    from tokentui.tui.driver import TerminalDriver, _GuardedOutput

    app = TokentuiApp(DashboardConfig(load=lambda progress: None, user_theme_dir=None))
    assert app.driver_class is TerminalDriver

    class DeadTerminal:
        def __init__(self):
            self.writes = 0

        def write(self, text):
            self.writes += 1
            raise OSError(5, "Input/output error")

        def flush(self):
            raise OSError(5, "Input/output error")

        def fileno(self):
            return 2

    lost = []
    terminal = DeadTerminal()
    out = _GuardedOutput(terminal, lambda: lost.append(1))
    assert out.write("\x1b[?1049l") == len("\x1b[?1049l")  # no exception reaches Textual's writer thread
    out.flush()
    out.write("more")
    assert lost == [1] and out.lost and terminal.writes == 1 and out.fileno() == 2


def test_the_listener_check_sees_a_listening_socket():
    """The no-listener checks in test_reliability_signals.py rely on this: a LISTEN socket is found by inode."""
    import socket

    from tmux_pane import listening_sockets

    before = listening_sockets(os.getpid())
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        found = listening_sockets(os.getpid())
        assert len(found) == len(before) + 1 and "tcp" in found[-1]
    assert listening_sockets(os.getpid()) == before
