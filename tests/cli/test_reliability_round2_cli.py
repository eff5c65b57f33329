"""Issue 35 ("Reliability, round 2") at the command line, each through the real `tokentui` in a subprocess:
--threads far past the machine (a segfault, nothing said) is one line; the dashboard without a terminal (it spun on
stdin, or drew into a redirected stderr for ever) is one line before anything loads; a text argument that is not
UTF-8 (a crash log) is one line; a long fan-out shows how far it has gone on a terminal's stderr."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys

import pytest
from cli_run import one_line_error, tokentui
from fakes import record_scripted

from tokentui.commands.load_progress import ERASE


@pytest.fixture(scope="module")
def record(embedded, isolated_dirs, tmp_path_factory):
    """A short run of the embedded model, recorded: what branch and fanout go on from."""
    folder = tmp_path_factory.mktemp("round2-records")
    result = tokentui("--headless", "--temperature", "0", "--max-new-tokens", "4", "--ignore-eos",
                      "--prompt", "Name a colour.", "--record-dir", str(folder))
    assert result.returncode == 0, result.stderr
    (path,) = folder.glob("*.jsonl")
    return path


def on_a_terminal(args, *, stdin_tty: bool, stderr_tty: bool, timeout: float = 300):
    """`tokentui ARGS` with stdin and/or stderr on a pseudo-terminal (the others /dev/null, a pipe): (exit status,
    what the terminal got, stderr when it was a pipe, stdout)."""
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "tokentui", *args], stdout=subprocess.PIPE,
                               stdin=slave if stdin_tty else subprocess.DEVNULL,
                               stderr=slave if stderr_tty else subprocess.PIPE, env=dict(os.environ))
    os.close(slave)
    seen = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            if not ready:
                break
            try:
                chunk = os.read(master, 4096)
            except OSError:  # every process holding the terminal has closed it
                break
            if not chunk:
                break
            seen += chunk
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    return process.returncode, seen.decode(errors="replace"), (stderr or b"").decode(errors="replace"), \
        stdout.decode(errors="replace")


# ---- item 1: --threads is bounded by the machine ------------------------------------------------------------------
@pytest.mark.parametrize("command", [
    ["--headless", "--max-new-tokens", "1"],
    ["--headless", "--dtype", "float32", "--max-new-tokens", "1"],
    ["score", "--headless", "--answer", "Blue."],
    ["branch", "RECORD", "--at", "2", "--token", "1", "--max-new-tokens", "1"],
    ["fanout", "RECORD", "--at", "2", "-n", "2", "--tokens", "1"],
])
def test_threads_far_past_the_cores_is_one_line_not_a_crash(command, record, isolated_dirs):
    args = [str(record) if a == "RECORD" else a for a in command]
    result = tokentui(*args, "--threads", "100000", "--no-record", timeout=300)
    one_line_error(result, f"threads must be an integer from 1 to {4 * os.cpu_count()}")
    assert "got 100000" in result.stderr


# ---- item 4: the dashboard needs a terminal ----------------------------------------------------------------------
@pytest.mark.parametrize("command", [["--no-record"], ["score", "--answer", "Blue.", "--no-record"],
                                     ["replay", "RECORD"]])
def test_the_dashboard_without_a_terminal_is_one_line(command, tmp_path, isolated_dirs):
    scripted, _ = record_scripted(tmp_path)
    args = [str(scripted) if a == "RECORD" else a for a in command]
    # before: it drew into the redirected stderr and never ended (the timeout)
    result = subprocess.run([sys.executable, "-m", "tokentui", *args], capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    one_line_error(result, "the dashboard needs a terminal (stdin and stderr are not terminals")
    assert "use --headless" in result.stderr and "\x1b[" not in result.stdout + result.stderr


def test_the_dashboard_with_stdin_not_a_terminal_says_so_on_the_terminal(isolated_dirs):
    # before: it drew the dashboard, then spun a core for as long as it lived (the timeout)
    status, screen, _, _ = on_a_terminal(["--no-record"], stdin_tty=False, stderr_tty=True, timeout=60)
    assert status == 2, screen
    assert screen.strip() == ("tokentui: the dashboard needs a terminal (stdin is not one: it reads keys from stdin "
                              "and draws on stderr): use --headless")


def test_the_dashboard_with_stderr_redirected_says_so(isolated_dirs):
    status, screen, stderr, _ = on_a_terminal(["--no-record"], stdin_tty=True, stderr_tty=False, timeout=60)
    assert status == 2 and screen == "", (screen, stderr)
    assert stderr.strip().splitlines() == ["tokentui: the dashboard needs a terminal (stderr is not one: it reads "
                                           "keys from stdin and draws on stderr): use --headless"]


# ---- item 6: text arguments must be UTF-8 ------------------------------------------------------------------------
@pytest.mark.parametrize("command, needle", [
    ([b"--headless", b"--prompt", b"ab\xffc"], "--prompt is not UTF-8 text (bad byte 0xff at offset 2)"),
    ([b"--headless", b"--system", b"\xe9t\xe9"], "--system is not UTF-8 text (bad byte 0xe9 at offset 0)"),
    ([b"--prompt", b"caf\xe9"], "--prompt is not UTF-8 text (bad byte 0xe9 at offset 3)"),  # the dashboard's
    ([b"score", b"--headless", b"--answer", b"Blue\xff"], "--answer is not UTF-8 text (bad byte 0xff at offset 4)"),
    ([b"branch", b"RECORD", b"--at", b"2", b"--text", b"\xc3("],
     "--text is not UTF-8 text (bad byte 0xc3 at offset 0)"),
    ([b"--headless", b"--server", b"http://127.0.0.1:9", b"--prompt", b"\xff"],
     "--prompt is not UTF-8 text (bad byte 0xff at offset 0)"),
])
def test_a_text_argument_that_is_not_utf8_is_one_line(command, needle, record, isolated_dirs):
    args = [os.fsencode(record) if a == b"RECORD" else a for a in command]
    result = subprocess.run([os.fsencode(sys.executable), b"-m", b"tokentui", *args, b"--no-record"],
                            capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
    result.stderr = result.stderr.decode(errors="replace")
    one_line_error(result, needle)
    assert "pass it as UTF-8" in result.stderr


# ---- item 14: a fan-out shows its progress -----------------------------------------------------------------------
def test_a_long_fanout_shows_its_progress_on_a_terminal_then_erases_it(record, isolated_dirs):
    # long enough that its decode takes more than a second (a progress line at most once a second) on any machine
    status, screen, _, stdout = on_a_terminal(["fanout", str(record), "--at", "2", "-n", "2", "--tokens", "300",
                                               "--ignore-eos", "--temperature", "1", "--no-record"],
                                              stdin_tty=False, stderr_tty=True)
    assert status == 0, screen
    assert "tokentui: loading the model — " in screen
    drawn = [part for part in screen.split(ERASE) if part.startswith("tokentui: fan-out — ")]
    assert drawn, screen
    assert "/300 tokens a sample (" in drawn[-1] and "tokens drawn, 0/2 samples ended early (" in drawn[-1]
    assert screen.rstrip("\r\n").endswith(ERASE)  # nothing of it left on the screen
    assert len([ln for ln in stdout.splitlines() if ln.startswith("#")]) == 2  # the samples, on stdout alone
