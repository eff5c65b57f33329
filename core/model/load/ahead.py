"""A later start's matrices copied into huge-page memory while the process is still importing torch and transformers
(issue 37's cold start): `start_ahead(spec)`, `take(offset, nbytes)`, `AheadCopy.close()`.

A GGUF that runs as stored has each matrix its step multiplies by copied from the file into memory asked for huge
pages (core/model/quant/ggml_linear.py's `_resident`, whose docstring says why). On a later start those copies came
after the imports of torch and transformers (1.3-2.2 s on one core) and took 0.5-1.4 s more for a 505 MB Q8_0 file
on a 2-vCPU machine: the kernel finding huge pages, and the file's pages read in (BENCHMARKS.md, "The copies made
while torch is imported"). Nothing in them needs torch: which tensors the step will copy is in the file's cache
folder (the first start's placement, core/model/load/gguf_direct.py) and where each lies in the file is in its
tensor table (`lean_reader`). So `start_ahead`, called first thing by the load (core/model/load/build.py), reads those
tensors into one anonymous mapping asked for huge pages, on a thread of its own: each `os.preadv` releases the GIL,
so the copies run on the other core while this one imports. `_resident` then takes a matrix's copy from here
(`take`: at once where the thread has made it, after it where the thread is making it, or made by the caller itself
where the thread has not reached it), and the load closes the copy once the model is placed (`AheadCopy.close`):
the thread stopped, and the pages of any copy nobody took given back. The tensors the load reads from the file's map
after the imports instead (Q4_0 / Q4_K, repacked; llama's reordered q / k) are read through once by the same thread,
after the copies, so that their pages are in memory by then.

It is a guess made before anything is checked, so it never decides anything: a tensor the load does not ask for is
given back at the close, a tensor it asks for that is not here is copied as before, and with $TOKENTUI_COPY_AHEAD=0
nothing is read ahead (comparisons). This module imports neither torch nor transformers (an import-linter contract).

Why hand-written: the mapping is Python's own `mmap` with `madvise`, the copies plain `preadv` calls; no library
places a file's byte ranges into huge-page memory without torch (ggml_memory.cpp does, once torch is loaded).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from ..quant.ggml_settings import INTERLEAVED, ROWS_INTERLEAVED, huge_pages, repack_enabled

AHEAD_ENV = "TOKENTUI_COPY_AHEAD"  # "0": nothing read ahead (before/after timings)
HUGE_PAGE = 2 << 20
PAGE = mmap.PAGESIZE
PIECE = 8 << 20  # bytes a copy's read takes at most: a stop is seen between two
WARM_PIECE = 1 << 20  # bytes a read through takes at most, into one buffer reused (its memory counts in the peak)
# What the first start leaves in the cache folder that says which tensors the step copies (gguf_direct.py's names)
PLACEMENT, ROW_ORDERS, FACTS = "placement.json", "row_orders.npz", "facts.json"
EMBEDDING = "token_embd.weight"  # a lookup table, copied only where the head multiplies by it (a tied head)
_PENDING, _COPYING, _DONE, _FAILED = range(4)


@dataclass(frozen=True)
class Planned:
    """One tensor to copy: where its bytes lie in the file, how many, and where its copy goes in the mapping."""

    offset: int
    nbytes: int
    at: int

    def __post_init__(self):
        if self.offset < 0 or self.nbytes <= 0 or self.at < 0 or self.at % PAGE:
            raise ValueError(f"a planned copy needs offset >= 0, nbytes > 0 and a page-aligned place, not {self}")


@dataclass(frozen=True)
class AheadReport:
    """What a copy ahead came to, at its close: tensors and bytes planned, taken by the load, given back."""

    planned: int
    planned_bytes: int
    taken: int
    taken_bytes: int
    warmed_bytes: int = 0  # of the repacked tensors' bytes read through before the close (`AheadCopy`'s `warm`)


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class AheadCopy:
    """The copies of `plan`'s tensors of the file at `path`, made on a thread from construction on (the module
    docstring); then the file's `warm` ranges (offset, bytes: the tensors ggml repacks from the file's map after the
    imports) read through once and dropped, so that the repacking finds their pages in memory: on the machines
    measured, pages the page cache held but nothing had read for ~20 s took seconds to come back from the host
    (BENCHMARKS.md, "The copies made while torch is imported"). One is open in a process at a time (`start_ahead`
    registers it; `take` asks it)."""

    def __init__(self, path: Path, plan: list[Planned], warm: tuple[tuple[int, int], ...] = ()):
        if not plan:
            raise ValueError("a copy ahead needs at least one tensor")
        self.path = path
        self.plan = sorted(plan, key=lambda p: p.offset)
        self.warm = tuple(sorted(warm))
        self._warmed = 0
        self._index = {p.offset: i for i, p in enumerate(self.plan)}
        self._state = [_PENDING] * len(self.plan)
        self._taken = [False] * len(self.plan)
        self._changed = threading.Condition()
        self._stop = False
        self._report: AheadReport | None = None  # once closed
        self._same: bool | None = None  # whether the path names the file read (`_same_file`)
        self._fd = os.open(path, os.O_RDONLY)
        self._identity = _identity(os.fstat(self._fd))
        size = max(p.at + _round_up(p.nbytes, PAGE) for p in self.plan)
        try:
            # private: Python's default for anonymous memory is shared (shmem), which gets no transparent huge pages
            # where the kernel's shmem_enabled is `never`, its default. A huge page more: the copies start on one.
            self._map = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (OSError, ValueError):
            os.close(self._fd)
            raise
        probe = ctypes.c_char.from_buffer(self._map)
        self._start = -ctypes.addressof(probe) % HUGE_PAGE
        del probe  # (a buffer export: the mapping could not be closed while it lived)
        try:
            self._map.madvise(mmap.MADV_HUGEPAGE, self._start, size)
        except (AttributeError, OSError):  # no THP built in: plain pages, as ggml_memory.cpp's chunks then get
            pass
        self._view = memoryview(self._map)[self._start:self._start + size]
        self._thread = threading.Thread(target=self._run, name="tokentui-ahead", daemon=True)
        self._thread.start()

    def finished(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds (None: for as long as it takes) for the thread to have made every copy and
        read every warm range; -> whether it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def planned_bytes(self) -> int:
        return sum(p.nbytes for p in self.plan)

    def _run(self) -> None:
        """The thread: each planned tensor not yet claimed, in the file's order; then the warm ranges."""
        for i in range(len(self.plan)):
            with self._changed:
                if self._stop:
                    return
                if self._state[i] != _PENDING:
                    continue
                self._state[i] = _COPYING
            self._finish(i, self._copy(self.plan[i]))
        scratch = memoryview(bytearray(WARM_PIECE))
        try:
            for offset, nbytes in self.warm:
                done = 0
                while done < nbytes and not self._stop:
                    got = os.preadv(self._fd, [scratch[:min(WARM_PIECE, nbytes - done)]], offset + done)
                    if got <= 0:
                        return
                    done += got
                    self._warmed += got
        except OSError:  # the load reads the file itself, and says what is wrong with it
            return

    def _copy(self, p: Planned) -> bool:
        """Read `p`'s bytes from the file into its place (positional reads: the thread and a caller of `take` may
        read at once); False where the file ended early, could not be read, or a stop came."""
        done = 0
        try:
            while done < p.nbytes:
                if self._stop:
                    return False
                n = min(PIECE, p.nbytes - done)
                got = os.preadv(self._fd, [self._view[p.at + done:p.at + done + n]], p.offset + done)
                if got <= 0:
                    return False
                done += got
        except (OSError, ValueError):
            return False
        return True

    def _finish(self, i: int, ok: bool) -> None:
        with self._changed:
            self._state[i] = _DONE if ok else _FAILED
            self._changed.notify_all()

    def take(self, offset: int, nbytes: int, head: bytes = b"", tail: bytes = b"") -> memoryview | None:
        """The copy of the file's `nbytes` at `offset` (writable: the caller wraps it, and it stays mapped while a
        wrapper lives); None where it was not planned, could not be made, the path now names another file, or it
        does not start with `head` and end with `tail` (the caller's own reading of those bytes: a guard against a
        wrong offset or file; such a copy stays untaken, and goes back at the close)."""
        i = self._index.get(offset)
        if i is None or self.plan[i].nbytes != nbytes or self._taken[i] or not self._same_file():
            return None
        with self._changed:
            mine = self._state[i] == _PENDING
            if mine:
                self._state[i] = _COPYING
            else:
                while self._state[i] == _COPYING:
                    self._changed.wait()
        if mine:
            self._finish(i, self._copy(self.plan[i]))
        p = self.plan[i]
        view = self._view[p.at:p.at + p.nbytes]
        # compared as bytes, holding the GIL (a call that gave it up let the tokenizer's thread keep it a switch
        # interval each time: BENCHMARKS.md, "The copies made while torch is imported")
        if self._state[i] != _DONE or bytes(view[:len(head)]) != head or bytes(view[nbytes - len(tail):]) != tail:
            return None
        self._taken[i] = True
        return view

    def _same_file(self) -> bool:
        """Whether the path still names the file read, asked once (at the first take: a stat per matrix let the
        tokenizer's thread take the GIL for a switch interval each time)."""
        if self._same is None:
            try:
                self._same = _identity(os.stat(self.path)) == self._identity
            except OSError:
                self._same = False
        return self._same

    def close(self) -> AheadReport:
        """Stop the thread, give back the pages of every copy not taken, close the file; -> what it came to (the same
        report again on a second close). The taken copies stay mapped while anything wraps them (the mapping is
        unmapped after the last)."""
        global _OPEN
        if self._report is not None:
            return self._report
        with self._changed:
            self._stop = True
        self._thread.join()
        for p, taken in zip(self.plan, self._taken):
            if not taken:
                try:
                    self._map.madvise(mmap.MADV_DONTNEED, self._start + p.at, _round_up(p.nbytes, PAGE))
                except OSError:  # kept until the mapping goes, with the last copy taken
                    pass
        os.close(self._fd)
        self._view = memoryview(b"")  # the slices taken keep the mapping, and only they
        if _OPEN is self:
            _OPEN = None
        taken = [p for p, t in zip(self.plan, self._taken) if t]
        self._report = AheadReport(len(self.plan), self.planned_bytes, len(taken), sum(p.nbytes for p in taken),
                                   self._warmed)
        return self._report


_OPEN: AheadCopy | None = None  # the copy ahead of the load under way, if any


def take(offset: int, nbytes: int, head: bytes = b"", tail: bytes = b"") -> memoryview | None:
    """The open copy ahead's copy of the file's `nbytes` at `offset` (`AheadCopy.take`), None where none is open."""
    return _OPEN.take(offset, nbytes, head, tail) if _OPEN is not None else None


def start_ahead(spec) -> AheadCopy | None:
    """Start copying the matrices a later start of `spec`'s GGUF will copy into huge pages (the module docstring),
    and make it the open copy; None where this is not such a start as far as can be told without torch (no GGUF
    file, other flags, a GPU's driver present with --device auto, no huge pages, no complete cache folder with a
    placement), where the placement cannot be read, or with $TOKENTUI_COPY_AHEAD=0."""
    global _OPEN
    if os.environ.get(AHEAD_ENV, "1") == "0" or _OPEN is not None or not huge_pages() or not spec.model:
        return None
    path = Path(spec.model).expanduser()
    if path.suffix.lower() != ".gguf" or spec.quantize != "none" or spec.device_map \
            or (spec.dtype or "auto").strip().lower() != "auto" or not _cpu(spec.device):
        return None
    try:
        if not path.is_file():
            return None
        plan, warm = _plan(path)
        if not plan:
            return None
        _OPEN = AheadCopy(path, plan, warm)
    except Exception:  # noqa: BLE001 - a guess only: the load reads the folder and the file itself, and says
        return None   # what is wrong with either in its own words
    return _OPEN


def _cpu(device: str | None) -> bool:
    """Whether the model will run on the CPU as far as can be told without torch: --device cpu, or auto on a machine
    without an NVIDIA or AMD GPU's driver loaded."""
    device = (device or "auto").strip().lower()
    if device == "cpu":
        return True
    return device == "auto" and not Path("/proc/driver/nvidia/version").exists() and not Path("/dev/kfd").exists()


def _plan(path: Path) -> tuple[list[Planned], tuple[tuple[int, int], ...]]:
    """(the tensors a later start of `path` copies as stored: its placement's matrices (the embedding only where the
    head is tied to it), less those whose rows the first start reordered (those are copies of their own) and those
    ggml repacks instead, each placed on a page boundary after the last; (offset, bytes) of those reordered or
    repacked: they are read from the file's map after the imports)."""
    import numpy as np

    from .gguf_reader import lean_reader
    from .stored_folder import cached_folder

    folder = cached_folder(path)
    if not all((folder / name).is_file() for name in (".complete", FACTS, PLACEMENT, ROW_ORDERS)):
        return [], ()
    placement = json.loads((folder / PLACEMENT).read_text())
    wanted = {str(name) for module, name in placement["matrices"].items() if isinstance(name, str)}
    if placement.get("tied_head") is not True:
        wanted.discard(EMBEDDING)
    with np.load(folder / ROW_ORDERS, allow_pickle=False) as orders:
        reordered = set(orders.files)
    repack = repack_enabled()
    plan, warm, at = [], [], 0
    for tensor in sorted(lean_reader(path).tensors, key=lambda t: int(t.data_offset)):
        if tensor.name not in wanted or len(tensor.shape) != 2:
            continue
        offset, nbytes = int(tensor.data_offset), int(tensor.n_bytes)
        if tensor.name in reordered or (repack and tensor.tensor_type.name in INTERLEAVED
                                        and int(tensor.shape[1]) % ROWS_INTERLEAVED == 0):
            warm.append((offset, nbytes))  # read from the file's map after the imports: only read through here
            continue
        plan.append(Planned(offset, nbytes, at))
        at += _round_up(nbytes, PAGE)
    return plan, tuple(warm)


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to
