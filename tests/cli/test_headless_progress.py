"""Headless text mode shows the model's loading on a terminal's stderr (issue 23 item 10: a 29 s first start was
silent), on one line erased once the model is loaded; a redirected stderr gets none of it (as git's progress)."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys

from tokentui.commands.load_progress import ERASE, LoadProgressLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_each_stage_rewrites_one_line_which_is_erased_at_the_end():
    stream, now = Terminal(), [0.0]
    line = LoadProgressLine(stream, clock=lambda: now[0])
    line.update("reading weights")
    now[0] = 12.4
    line.update("de-quantizing GGUF tensors (first start only)", 0.42)
    line.finish()
    line.update("ready", 1.0)  # after the end: nothing more drawn
    text = stream.getvalue()
    assert text == (ERASE + "tokentui: loading the model — reading weights (0 s)"
                    + ERASE + "tokentui: loading the model — de-quantizing GGUF tensors (first start only) 42% (12 s)"
                    + ERASE)


def test_a_redirected_stderr_gets_nothing():
    stream = io.StringIO()
    line = LoadProgressLine(stream)
    line.update("reading weights", 0.5)
    line.finish()
    assert stream.getvalue() == ""


def test_the_real_command_on_a_terminal_shows_the_loading_then_only_the_answer(embedded, isolated_dirs):
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "tokentui", "--headless", "--temperature", "0",
                                "--max-new-tokens", "4", "--no-record"], stdout=subprocess.PIPE, stderr=slave,
                               stdin=subprocess.DEVNULL, env=dict(os.environ))
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    stdout, _ = process.communicate(timeout=120)
    os.close(master)
    assert process.returncode == 0, seen
    text = seen.decode()
    assert "tokentui: loading the model — starting" in text
    # a later stage too: the cache's weights, or the conversion when this is the session's first 4-bit start
    assert "reading weights" in text or "(first start only)" in text
    assert text.rstrip("\r\n").endswith(ERASE)  # nothing of it left on the screen
    assert stdout.strip()  # the answer, on stdout alone
