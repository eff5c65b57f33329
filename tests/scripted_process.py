"""A model process that runs the tests' scripted engine (tests/fakes.py) instead of loading a model: the real
protocol, the real child loop (core/model/process_main.py), a real second process — so the dashboard can be
driven at any rate a GPU would reach without one. `start(delay, steps)` starts it, returning what ProcessClient's
`started=` takes. Its steps are paced to the rate asked (a deadline a step). Each step the engine yields is also stamped (its index and time.monotonic(), the clock both
processes share) into `stamps`, a file the test reads afterwards."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path

from tokentui.core.link.process_client import StartedProcess
from tokentui.core.link.protocol import EngineSpec, Load

HERE = Path(__file__).resolve().parent

CHILD = """
import sys, time
sys.path.insert(0, {here!r})
from fakes import ScriptedEngine
from tokentui.core.model import process_main
from tokentui.core.runs.events import DoneEvent, StepEvent
from tokentui.core.settings import RunOptions

class Stamped(ScriptedEngine):
    next_at = None

    def _sleep(self, run_id):
        # paced by a deadline a step, so the rate is the one asked (1 / delay), not delay plus the step's own work
        if not self.delay:
            return
        now = time.monotonic()
        self.next_at = max(self.next_at or now, now - 0.05) + self.delay  # after a stall, no burst of catching up
        if self.next_at > now:
            self.sleep_at_gate(self.next_at - now, run_id)

    def _run(self, prompt, system, run_id):
        with open({stamps!r}, "a") as out:
            for event in super()._run(prompt, system, run_id):
                if isinstance(event, StepEvent) and event.index % {every} == 0:
                    out.write(f"step {{event.index}} {{time.monotonic()}}\\n"); out.flush()
                if isinstance(event, DoneEvent):
                    out.write(f"done {{event.tokens}} {{time.monotonic()}}\\n"); out.flush()
                yield event

def load_engine(spec, progress):
    return Stamped(delay={delay}, options=RunOptions(max_new_tokens={steps}, ignore_eos=True), raise_at={raise_at})

process_main.load_engine = load_engine
import tokentui.core.model.load.build as build
build.load_engine = load_engine
process_main.child_main(int(sys.argv[1]))
"""


def start(delay: float, steps: int, stamps: Path, every: int = 50, log: Path | None = None,
          raise_at: int | None = None) -> StartedProcess:
    """`raise_at`: the engine raises RuntimeError at that step (tests/fakes.py's ScriptedEngine), a bug inside it."""
    parent_end, child_end = socket.socketpair()
    code = CHILD.format(here=str(HERE), stamps=str(stamps), every=every, delay=delay, steps=steps,
                        raise_at=raise_at)
    log = log or stamps.with_suffix(".log")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code, str(child_end.fileno())], pass_fds=(child_end.fileno(),),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    child_end.close()
    conn = Connection(parent_end.detach())
    conn.send(Load(EngineSpec()))
    return StartedProcess(proc, conn, log)


def read_stamps(stamps: Path) -> tuple[dict[int, float], tuple[int, float] | None]:
    steps, done = {}, None
    for line in stamps.read_text().splitlines():
        kind, n, t = line.split()
        if kind == "step":
            steps[int(n)] = float(t)
        else:
            done = (int(n), float(t))
    return steps, done
