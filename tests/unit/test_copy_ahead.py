"""The matrices of a later start copied while torch is imported (core/model/load/ahead.py): every copy the load
makes is taken from them, and the run is the first start's bit for bit; what is not taken is given back; nothing is
read ahead where the start is not a later one on the CPU, or where it is turned off. Oracles: the first start's run
(ids, probabilities, candidates), the file's own bytes, and the step's own count of copied matrices."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from gguf_fixtures import gguf_tools, tiny_gguf  # noqa: F401  (gguf_tools: a fixture)
from tokentui.core.link.protocol import EngineSpec
from tokentui.core.model.engine import Engine
from tokentui.core.model.load import ahead, build
from tokentui.core.model.load.gguf_reader import lean_reader
from tokentui.core.model.load.loader import load_model
from tokentui.core.model.load.stored_folder import cached_folder
from tokentui.core.model.quant import ggml_linear
from tokentui.core.runs.events import StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("gguf_tools", "isolated_dirs", "one_torch_thread")]
PROMPT = "Is OpenAI open?"
SAMPLER = SamplerSettings(temperature=0.0)
OPTIONS = RunOptions(max_new_tokens=10, ignore_eos=True, top_candidates=5)


@pytest.fixture(scope="module", autouse=True)
def bound():
    why = ggml_linear.load(lambda _: None)
    if why is not None:
        pytest.skip(why)
    if not ggml_linear.huge_pages():
        pytest.skip("the kernel's transparent huge pages are off here: nothing is copied, ahead or not")


def first_start(tmp_path, family, fmt, tied):
    """A copy of the fixture file under a path of its own, started once (its cache folder and the step's verdict
    written) -> (the path, the first start's steps' figures)."""
    path = tmp_path / f"{family}-{fmt}.gguf"
    shutil.copyfile(tiny_gguf(family, fmt, tied=tied), path)
    engine = Engine(load_model(str(path), device="cpu"), SAMPLER, OPTIONS)
    return path, figures(engine.run(PROMPT))


@pytest.fixture(scope="module")
def started(tmp_path_factory, isolated_dirs, gguf_tools):
    """One qwen3 Q8_0 file started once, for the tests that only ask whether it is read ahead."""
    folder = tmp_path_factory.mktemp("started")
    path = folder / "qwen3-Q8_0.gguf"
    shutil.copyfile(tiny_gguf("qwen3", "Q8_0", tied=True), path)
    list(Engine(load_model(str(path), device="cpu"), SAMPLER, OPTIONS).run(PROMPT))
    assert (cached_folder(path) / ahead.PLACEMENT).is_file()
    return path


def figures(events) -> list:
    return [[s.id, s.chosen_raw_prob, [(c.id, c.raw_prob) for c in s.candidates]]
            for s in events if isinstance(s, StepEvent)]


def spec(path, **kw) -> EngineSpec:
    return EngineSpec(model=str(path), device="cpu", sampler=SAMPLER, options=OPTIONS, **kw)


def copied(engine) -> dict:
    """The step's matrices kept as stored in a huge-page copy (a tied head and the embedding's matrix are one)."""
    step = engine.plan.step.kernel  # the later start's ggml step (core/model/native/ggml_native.py's GGMLStep)
    matrices = [getattr(layer, name) for layer in step.layers for name in ("q", "k", "v", "o", "gate", "up", "down")]
    return {id(m.matrix.raw): m for m in [*matrices, step.head] if m.resident is not None}


def mapping_of(address: int) -> tuple[str, bool]:
    """(permissions, THPeligible) of this process's mapping holding `address` (/proc/self/smaps)."""
    found = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                start, end = (int(x, 16) for x in head[0].split("-"))
                found = head[1] if start <= address < end else None
            elif found is not None and head[0] == "THPeligible:":
                return found, head[1] == "1"
    raise AssertionError(f"no mapping holds {address:#x}")


class Started:
    """start_ahead as load_engine calls it, keeping what it returned."""

    def __init__(self, monkeypatch):
        self.copies = []
        real = ahead.start_ahead

        def spy(s):
            copy = real(s)
            self.copies.append(copy)
            return copy
        monkeypatch.setattr(build, "start_ahead", spy)


@pytest.mark.parametrize("family, fmt, tied", [("qwen2", "Q8_0", True), ("llama", "Q8_0", False),
                                               ("qwen3", "Q4_K_M", True), ("mistral", "Q4_0", False)])
def test_a_later_start_takes_every_copy_from_those_made_ahead(tmp_path, monkeypatch, family, fmt, tied):
    """load_engine on a later start: each matrix the step keeps as stored in huge pages was copied ahead and taken
    from there (none planned left over, none copied again), and the run is the first start's bit for bit. llama's
    and mistral's q / k rows are reordered (copies of their own, not planned); a tied head multiplies by the
    embedding (planned), an untied one does not (the embedding is a lookup table: not planned); Q4_0 / Q4_K are
    repacked where this CPU has ggml's interleaved kernels, otherwise copied as stored, and ahead."""
    path, expected = first_start(tmp_path, family, fmt, tied)
    started = Started(monkeypatch)
    engine = build.load_engine(spec(path))
    copy, = started.copies
    assert copy is not None
    report = copy.close()  # closed by the load already: the same report
    resident = copied(engine)
    assert report.planned == report.taken == len(resident) > 0
    assert report.taken_bytes == sum(m.resident.numel() for m in resident.values())
    assert ahead.take(copy.plan[0].offset, copy.plan[0].nbytes) is None  # closed: nothing open any more
    assert figures(engine.run(PROMPT)) == expected
    names = {t.name for t in lean_reader(path).tensors if int(t.data_offset) in {p.offset for p in copy.plan}}
    assert ("token_embd.weight" in names) == tied
    reordered = any(n.endswith(("attn_q.weight", "attn_k.weight")) for n in names)
    if family in ("llama", "mistral"):
        assert not reordered
    elif fmt == "Q8_0":
        assert reordered  # as stored in qwen's files: copied ahead like the rest


def test_each_copy_made_ahead_is_the_files_bytes_and_what_is_not_taken_goes_back(tmp_path):
    """The copies are the file's bytes at each planned offset, whether the thread made them or the one asking did;
    one taken twice, an offset not planned or a wrong size give none; the close says what was taken."""
    path, _ = first_start(tmp_path, "qwen2", "Q8_0", True)
    copy = ahead.start_ahead(spec(path))
    assert copy is not None and ahead.start_ahead(spec(path)) is None  # one open at a time
    assert copy.warm == ()  # nothing repacked or reordered in a qwen Q8_0 file
    data = path.read_bytes()
    last = copy.plan[-1]  # likely not reached by the thread yet: made by this caller
    for p in (last, copy.plan[0]):
        view = ahead.take(p.offset, p.nbytes)
        assert bytes(view) == data[p.offset:p.offset + p.nbytes]
        assert ahead.take(p.offset, p.nbytes) is None  # taken already
    p = copy.plan[1]
    assert ahead.take(p.offset + 1, p.nbytes) is None and ahead.take(p.offset, p.nbytes - 1) is None
    first, end = data[p.offset:p.offset + 8], data[p.offset + p.nbytes - 8:p.offset + p.nbytes]
    assert ahead.take(p.offset, p.nbytes, bytes(8), end) is None  # not what the caller read there: left untaken
    assert ahead.take(p.offset, p.nbytes, first, bytes(8)) is None
    middle = ahead.take(p.offset, p.nbytes, first, end)
    assert bytes(middle) == data[p.offset:p.offset + p.nbytes]
    perms, eligible = mapping_of(torch.frombuffer(view, dtype=torch.uint8).data_ptr())
    assert perms == "rw-p" and eligible  # private anonymous memory the kernel may back with huge pages
    report = copy.close()
    assert (report.planned, report.taken) == (len(copy.plan), 3)
    assert report.taken_bytes == last.nbytes + copy.plan[0].nbytes + p.nbytes
    assert report.planned_bytes == sum(q.nbytes for q in copy.plan)
    assert bytes(view) == data[copy.plan[0].offset:copy.plan[0].offset + copy.plan[0].nbytes]  # still mapped


def test_a_file_changed_after_the_start_gives_no_copy_and_the_load_copies_it_again(tmp_path, monkeypatch):
    """The path names another file by the time the load asks (its modification time moved): nothing is taken, the
    load runs on copies of its own, and its run is the file's first start's (the cache key moved with the time)."""
    path, expected = first_start(tmp_path, "qwen3", "Q8_0", True)
    started = Started(monkeypatch)
    real_reserve = build.reserve_ahead

    def touch_then_reserve(s, copied):  # runs right after start_ahead, before the load reads the file
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        return real_reserve(s, copied)
    monkeypatch.setattr(build, "reserve_ahead", touch_then_reserve)
    engine = build.load_engine(spec(path))
    report = started.copies[0].close()
    assert report.planned > 0 and report.taken == 0
    assert figures(engine.run(PROMPT)) == expected


@pytest.mark.parametrize("change", ["first start", "off", "device", "dtype", "quantize", "huge pages", "damaged"])
def test_nothing_is_read_ahead_where_the_start_is_not_a_later_one_on_the_cpu(tmp_path, monkeypatch, started, change):
    """A first start (no cache folder), $TOKENTUI_COPY_AHEAD=0, another device, --dtype, --quantize, huge pages
    turned off, or a placement that is not JSON: no copy ahead, and so nothing open for the load to take."""
    path = started
    s = spec(path)
    if change == "first start":
        path = tmp_path / "new.gguf"
        shutil.copyfile(tiny_gguf("qwen3", "Q8_0", tied=True), path)
        s = spec(path)
    elif change == "damaged":
        path, _ = first_start(tmp_path, "qwen3", "Q8_0", True)
        (cached_folder(path) / ahead.PLACEMENT).write_text("{")
        s = spec(path)
    elif change == "off":
        monkeypatch.setenv(ahead.AHEAD_ENV, "0")
    elif change == "huge pages":
        monkeypatch.setenv(ggml_linear.HUGE_PAGES_ENV, "0")
    elif change == "device":
        s = EngineSpec(model=str(path), device="cuda", sampler=SAMPLER, options=OPTIONS)
    else:
        s = spec(path, **{change: {"dtype": "float32", "quantize": "int4"}[change]})
    assert ahead.start_ahead(s) is None
    assert ahead.take(0, 1) is None
    control = ahead.start_ahead(spec(path)) if change not in ("first start", "off", "huge pages", "damaged") \
        else None
    if control is not None:  # the same file with the plain flags is read ahead: the change is what said no
        assert control.close().planned > 0


def test_what_the_load_reads_from_the_files_map_is_read_through_ahead(tmp_path):
    """A llama Q4_0 file: its q / k (reordered) and its Q4_0 matrices (repacked where this CPU has ggml's interleaved
    kernels) are read from the file's map after the imports, so the thread reads them through once, after its copies:
    every byte of them by the time it is done, none of them copied."""
    path, _ = first_start(tmp_path, "llama", "Q4_0", False)
    copy = ahead.start_ahead(spec(path))
    assert copy is not None
    tensors = {int(t.data_offset): t.name for t in lean_reader(path).tensors}
    warm = {tensors[offset] for offset, _ in copy.warm}
    q_k = {n for n in tensors.values() if n.endswith(("attn_q.weight", "attn_k.weight"))}
    assert q_k and q_k <= warm
    assert not warm & {tensors[p.offset] for p in copy.plan}
    assert copy.finished(60)
    report = copy.close()
    assert report.warmed_bytes == sum(nbytes for _, nbytes in copy.warm) > 0 and report.taken == 0


def test_the_cache_folders_name_transformers_release_as_transformers_does():
    """The stored and packed folders' keys read transformers' release without importing it: the same string as its
    own `__version__`, so the folders a start made before that change are found again."""
    import transformers

    from tokentui.core.model.load.stored_folder import transformers_version

    assert transformers_version() == transformers.__version__
