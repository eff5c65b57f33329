"""How the native library's products split their rows over torch's threads (core/model/native/fork_rule.h's
`shared_for`): each thread its own contiguous share, front to back, and a thread done with its own takes chunks
from the back of the others'. Seen through op tokentui_q4::shared_for_ranges, which records each range handed out
and which thread ran it (a product's output shows neither: test_ggml_kernels / test_ggml_step hold the products'
bits to one thread's)."""

from __future__ import annotations

import pytest
import torch

from tokentui.core.model.native.q4_native import load

pytestmark = pytest.mark.skipif(load(lambda _progress: None) is not None, reason="tokentui's library does not build")


def ranges(total: int, grain: int, align: int, slow_ms: float = 0.0, threads: int = 2,
           slow_thread: int = 0) -> list[tuple[int, int, int]]:
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = torch.ops.tokentui_q4.shared_for_ranges(total, grain, align, slow_thread, slow_ms)
    finally:
        torch.set_num_threads(saved)
    return [tuple(row) for row in out.tolist()]


def assert_tiles(calls, total: int) -> None:
    """The ranges cover [0, total) once each: no item run twice, none skipped."""
    spans = sorted((b, e) for b, e, _thread in calls)
    assert all(b < e for b, e in spans)
    assert spans[0][0] == 0 and spans[-1][1] == total
    assert all(e == b2 for (_b, e), (b2, _e2) in zip(spans, spans[1:]))


@pytest.mark.parametrize("total,grain,align", [(4096, 64, 8), (1000, 7, 1), (6144, 64, 8), (49152, 16, 1), (17, 1, 1)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_item_runs_once_in_aligned_chunks(total, grain, align, threads):
    calls = ranges(total, grain, align, threads=threads)
    assert_tiles(calls, total)
    assert all(b % align == 0 for b, _e, _t in calls)  # a range starts on a whole multiple of align
    if threads == 1:
        assert [(b, e) for b, e, _t in calls] == [(0, total)]  # one thread: one call, as at::parallel_for


def test_a_range_under_one_grain_runs_as_one_call():
    assert [(b, e) for b, e, _t in ranges(50, 64, 8)] == [(0, 50)]


def test_each_thread_runs_its_own_share_front_to_back():
    """Each thread reads one run of rows in order, its share (as fixed shares would), from the share's first row;
    what it takes of another's share comes from that share's back, so the owner's run stays unbroken."""
    total, threads = 4096, 2
    calls = ranges(total, 64, 8, threads=threads)
    assert_tiles(calls, total)
    share = total // threads
    for thread in {t for _b, _e, t in calls}:
        mine = [(b, e) for b, e, t in calls if t == thread]  # in the order the thread ran them
        own = [(b, e) for b, e in mine if b // share == thread]
        assert own and own[0][0] == thread * share
        assert all(e == b2 for (_b, e), (b2, _e2) in zip(own, own[1:]))  # ascending, contiguous
        taken = [(b, e) for b, e in mine if b // share != thread]
        assert all(e2 == b for (b, _e), (_b2, e2) in zip(taken, taken[1:]))  # descending from a share's back
        assert mine[:len(own)] == own  # its own share first


def test_a_slow_thread_leaves_its_shares_back_to_the_others():
    """Thread 0 slowed by 5 ms a chunk: thread 1 finishes its own half, then runs chunks of thread 0's half from the
    back, so the two finish near together (with fixed shares thread 1 would wait for all 16 of thread 0's chunks).
    On a loaded machine thread 0 may not start before thread 1 has taken its whole share: nothing asks that it ran."""
    total = 4096
    calls = ranges(total, 64, 8, slow_ms=5.0)
    assert_tiles(calls, total)
    stolen = [(b, e) for b, e, t in calls if t == 1 and b < total // 2]
    assert len(stolen) >= 8, calls  # at 5 ms a chunk, thread 0 finishes few of its 16 before thread 1 is done
    assert max(e for _b, e in stolen) == total // 2  # taken from the back of thread 0's share
    assert all(e2 == b for (b, _e), (_b2, e2) in zip(stolen, stolen[1:]))  # back to front, none skipped
    first = [b for b, _e, t in calls if t == 0 and b < total // 2]
    assert not first or first[0] == 0  # where thread 0 ran, it began at the front of its own


def test_chunks_taken_from_the_back_of_the_last_share_start_aligned():
    """The last share ends at the range's end, 1,001 here, not a multiple of 8: the chunks a thread takes from its
    back still start on one (a group of 8 interleaved rows is never split between two calls)."""
    total = 1001
    calls = ranges(total, 8, 8, slow_ms=2.0, slow_thread=1)
    assert_tiles(calls, total)
    assert any(t == 0 and b >= 504 for b, _e, t in calls), calls  # thread 0 took some of thread 1's share
    assert all(b % 8 == 0 for b, _e, _t in calls)


def test_bad_arguments_are_refused():
    with pytest.raises(RuntimeError, match="grain and align"):
        torch.ops.tokentui_q4.shared_for_ranges(10, 0, 1, 0, 0.0)
