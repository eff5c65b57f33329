"""core/gate.py: pause, single step and stop at step boundaries, the one implementation the engine, the replay and
the scripted test engine share."""

from __future__ import annotations

import threading
import time

from tokentui.core.gate import StepGate


def run_steps(gate: StepGate, stop: list[bool], taken: list[int], n: int = 1000) -> threading.Thread:
    def body() -> None:
        for i in range(n):
            if not gate.wait(lambda: stop[0]):
                return
            taken.append(i)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def settle(taken: list[int]) -> int:
    """Wait until the stepping thread has stopped moving; its count then."""
    last = -1
    while last != len(taken):
        last = len(taken)
        time.sleep(0.05)
    return last


def test_pause_holds_and_each_step_lets_exactly_one_through():
    gate, stop, taken = StepGate(), [False], []
    gate.pause()
    thread = run_steps(gate, stop, taken)
    assert settle(taken) == 0
    for expected in (1, 2, 3):
        gate.step_once()
        assert settle(taken) == expected
    gate.resume()
    thread.join(5)
    assert len(taken) == 1000


def test_a_step_granted_while_running_is_not_saved_for_later():
    gate, stop, taken = StepGate(), [False], []
    gate.step_once()  # not paused: ignored
    gate.pause()
    thread = run_steps(gate, stop, taken)
    assert settle(taken) == 0
    gate.step_once()
    gate.pause()  # pausing again takes back a step not yet used
    assert settle(taken) <= 1
    stop[0] = True
    gate.wake()
    thread.join(5)
    assert not thread.is_alive()


def test_stop_wakes_a_paused_run_and_a_sleep():
    gate, stop, taken = StepGate(), [False], []
    gate.pause()
    thread = run_steps(gate, stop, taken)
    settle(taken)
    with gate.lock:
        stop[0] = True
    gate.wake()
    thread.join(5)
    assert not thread.is_alive() and taken == []
    started = time.monotonic()
    assert gate.sleep(10.0, lambda: stop[0]) is False
    assert time.monotonic() - started < 1.0


def test_a_huge_infinite_or_nan_sleep_never_overflows_and_still_stops():
    """A replay's wait is a number from a file (issue 21 item 8): inf or 1e300 s raised OverflowError in
    Condition.wait; now each waits (up to the platform's longest timeout) until stopped, and NaN waits nothing."""
    gate = StepGate()
    assert gate.sleep(float("nan"), lambda: False) is True
    for seconds in (float("inf"), 1e300, float(threading.TIMEOUT_MAX) * 2):
        stop, result = [False], []
        thread = threading.Thread(target=lambda: result.append(gate.sleep(seconds, lambda: stop[0])), daemon=True)
        thread.start()
        time.sleep(0.1)
        assert thread.is_alive() and result == []  # waiting, not raised
        stop[0] = True
        gate.wake()
        thread.join(2.0)
        assert result == [False], seconds  # woken to stop
