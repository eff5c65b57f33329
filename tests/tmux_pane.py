"""Drive the real `tokentui` command in a real terminal: a private tmux server, one session, one pane.

Each `Pane` runs its own tmux server (`tmux -L <unique socket>`), so tests never touch a user's tmux and always
clean up: `close()` kills the server (use the pane as a context manager). The shell in the pane is a plain bash
with the test's environment (so `TOKENTUI_*` dirs from the `isolated_dirs` fixture reach the program).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

PROMPT = "tt$ "
EXIT_MARK = "TOKENTUI-EXIT="

# Pane flags that say whether the program left the terminal as it found it.
FLAGS = ("alternate_on", "cursor_flag", "mouse_any_flag", "mouse_button_flag", "mouse_standard_flag",
         "mouse_sgr_flag", "wrap_flag", "pane_dead")


def have_tmux() -> bool:
    return shutil.which("tmux") is not None


class Pane:
    def __init__(self, name: str, width: int = 160, height: int = 48, env: dict | None = None):
        tag = f"{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.socket = f"tokentui-test-{tag}"
        self.session = tag
        self.width, self.height = width, height
        self.env = {**os.environ, **(env or {})}
        self.env.pop("TMUX", None)  # never nest in (or talk to) a tmux the tests run under
        self.env.pop("TMUX_PANE", None)
        self.started = False
        self.socket_path = ""

    # ---- tmux plumbing ---------------------------------------------------------------------------------------
    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True,
                              text=True, env=self.env, check=check, timeout=30)

    def start(self) -> "Pane":
        shell_env = {"HISTFILE": "/dev/null", "TERM": "xterm-256color", "LANG": "C.UTF-8",
                     "COLORTERM": "truecolor"}
        env_args = [a for key, value in shell_env.items() for a in ("-e", f"{key}={value}")]
        self.tmux("new-session", "-d", "-s", self.session, "-x", str(self.width), "-y", str(self.height),
                  *env_args, "bash --norc --noprofile")
        self.started = True
        self.socket_path = self.tmux("display-message", "-p", "#{socket_path}").stdout.strip()
        # bash resets PS1 when it starts; set it afterwards (spelt so that the typed line is not the prompt)
        self.type_line(f"PS1='{PROMPT[0]}''{PROMPT[1:]}'; clear")
        self.wait_for(lambda text: text.strip() == PROMPT.strip(), timeout=20, what="the shell prompt")
        return self

    def close(self) -> None:
        if self.started:
            self.tmux("kill-server", check=False)
            self.started = False
            if self.socket_path:  # tmux leaves its socket file behind
                Path(self.socket_path).unlink(missing_ok=True)

    def __enter__(self) -> "Pane":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- looking ---------------------------------------------------------------------------------------------
    def capture(self, joined: bool = False) -> str:
        args = ["capture-pane", "-p", "-t", self.session]
        if joined:
            args += ["-J", "-S", "-"]  # whole history, wrapped lines joined
        return self.tmux(*args).stdout

    def flags(self) -> dict[str, str]:
        fmt = " ".join(f"#{{{f}}}" for f in FLAGS)
        values = self.tmux("display-message", "-p", "-t", self.session, fmt).stdout.split()
        return dict(zip(FLAGS, values))

    def wait_for(self, predicate, timeout: float = 60.0, what: str = "", interval: float = 0.2) -> str:
        """Poll the screen until `predicate(text)` holds; return that screen. Fails with the last screen."""
        deadline = time.monotonic() + timeout
        text = ""
        while True:
            text = self.capture()
            if predicate(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; the screen:\n{text}")
            time.sleep(interval)

    # ---- doing -----------------------------------------------------------------------------------------------
    def send(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", self.session, *keys)

    def resize(self, width: int, height: int) -> None:
        """Resize the pane's window, as a user dragging the terminal would."""
        self.tmux("resize-window", "-t", self.session, "-x", str(width), "-y", str(height))
        self.width, self.height = width, height

    def type_line(self, line: str) -> None:
        self.tmux("send-keys", "-t", self.session, "-l", line)
        self.tmux("send-keys", "-t", self.session, "Enter")

    def run_tokentui(self, args: list[str], pidfile: Path, stdout: Path | None = None) -> None:
        """Start `python -m tokentui ARGS` in the pane (a subshell that execs it, so `pidfile` holds its pid),
        then print TOKENTUI-EXIT=<status> when it ends."""
        redirect = f" > {shlex.quote(str(stdout))}" if stdout else ""
        command = shlex.join([sys.executable, "-m", "tokentui", *args])
        self.type_line(f"(echo $BASHPID > {shlex.quote(str(pidfile))}; exec {command}{redirect}); "
                       f"echo {EXIT_MARK}$?")

    def exit_status(self, timeout: float = 30.0) -> int:
        text = self.wait_for(lambda t: re.search(EXIT_MARK + r"\d+", t), timeout=timeout, what="the exit status")
        return int(re.search(EXIT_MARK + r"(\d+)", text).group(1))

    def stty(self) -> set[str]:
        """Run `stty -a` in the pane's shell; the set of its flags (e.g. "icanon", "-echo")."""
        marker = uuid.uuid4().hex[:6]
        self.type_line(f"clear; stty -a; echo STTY-{marker}-DONE")
        text = self.wait_for(lambda t: f"STTY-{marker}-DONE" in t.replace(f"echo STTY-{marker}-DONE", ""),
                             timeout=20, what="stty output")
        return set(re.split(r"[\s;]+", text))


def read_pid(pidfile: Path, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = pidfile.read_text().strip()
            if text:
                return int(text)
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"no pid in {pidfile}")


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_gone(pid: int, timeout: float = 15.0) -> float:
    """Seconds until `pid` is gone; fails after `timeout`."""
    started = time.monotonic()
    while alive(pid):
        if time.monotonic() - started > timeout:
            raise AssertionError(f"process {pid} still running {timeout}s after the signal")
        time.sleep(0.05)
    return time.monotonic() - started


def listening_sockets(pid: int) -> list[str]:
    """The TCP/UDP sockets in LISTEN state (tcp st 0A; bound UDP with no peer) that `pid` holds open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        m = re.fullmatch(r"socket:\[(\d+)\]", target)
        if m:
            inodes.add(m.group(1))
    found = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            cols = line.split()
            local, remote, state, inode = cols[1], cols[2], cols[3], cols[9]
            if inode not in inodes:
                continue
            listening = state == "0A" if table.startswith("tcp") else remote.strip("0:") == ""
            if listening:
                found.append(f"{table} {local} inode {inode}")
    return found


def socket_inodes(pid: int) -> int:
    """How many sockets of any kind the process holds (for the report; unix sockets are fine)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except OSError:
            pass
    return count

def assert_terminal_restored(pane: "Pane") -> None:
    """The program left the terminal as it found it: no alternate screen, cursor on, wrapping on, no mouse reporting,
    cooked mode with echo, and a shell that answers."""
    flags = pane.flags()
    assert flags["alternate_on"] == "0", flags  # the alternate screen is gone
    assert flags["cursor_flag"] == "1", flags  # the cursor is visible
    assert flags["wrap_flag"] == "1", flags  # line wrapping is back on
    for mouse in ("mouse_any_flag", "mouse_button_flag", "mouse_standard_flag", "mouse_sgr_flag"):
        assert flags[mouse] == "0", flags  # no mouse reporting left on
    modes = pane.stty()
    for mode in ("icanon", "echo", "isig", "icrnl", "opost"):
        assert mode in modes and f"-{mode}" not in modes, (mode, sorted(modes))
    pane.type_line("echo usable-$((6*7))")
    pane.wait_for(lambda t: "usable-42" in t.replace("usable-$((6*7))", ""), timeout=20, what="the shell to answer")
