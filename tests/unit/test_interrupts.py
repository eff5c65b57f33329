"""core/interrupts.py: a signal handler's interrupt held until an `unbroken()` section of the main thread ends, raised
at once elsewhere. Oracle: the statements that ran, and where the KeyboardInterrupt surfaced, with real signals
(signal.raise_signal runs the Python handler before the next statement)."""

from __future__ import annotations

import signal
import threading

import pytest

from tokentui.core.interrupts import interrupt, unbroken


@pytest.fixture
def handler():
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: interrupt())
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_outside_a_section_the_interrupt_is_at_once(handler):
    ran = []
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGUSR1)
        ran.append("after")
    assert ran == []


def test_inside_a_section_it_waits_for_the_sections_end(handler):
    ran = []
    with pytest.raises(KeyboardInterrupt):
        with unbroken():
            signal.raise_signal(signal.SIGUSR1)
            ran.append("rest of the section")
            with unbroken():  # a nested section: the interrupt waits for the outermost
                ran.append("inner")
            ran.append("after the inner one")
        ran.append("after the section")
    assert ran == ["rest of the section", "inner", "after the inner one"]
    with unbroken():  # nothing left pending
        ran.append("next section")
    assert ran[-1] == "next section"


def test_an_error_in_the_section_becomes_the_interrupts_context(handler):
    with pytest.raises(KeyboardInterrupt) as caught:
        with unbroken():
            signal.raise_signal(signal.SIGUSR1)
            raise ValueError("the section's own")
    assert isinstance(caught.value.__context__, ValueError)


def test_on_another_thread_a_section_holds_nothing():
    seen = []

    def other():
        with unbroken():
            try:
                interrupt()
            except KeyboardInterrupt:
                seen.append("at once")

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == ["at once"]
