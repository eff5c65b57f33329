"""Where a GGMLLinear's products read its matrix from (core/model/quant/ggml_linear.py's `resident`, core/model/native/
ggml_memory.cpp's huge-page memory): a matrix in a GGUF file's read-only map is copied, byte for byte, into memory the
kernel was asked to back with transparent huge pages (the mapping's VmFlags carry `hg`, madvise's MADV_HUGEPAGE), its
file pages given back, and multiplies to the very same values as the file's bytes; a repacked copy is made in such
memory too; nothing is copied for a matrix in anonymous memory, with $TOKENTUI_GGML_HUGE_PAGES=0, or where the
kernel's transparent huge pages are `never`. Memory reserved ahead of a load (`reserve_huge_pages`) holds the copies
made after it, and what none reached is given back when it is trimmed. Skipped in one line where ggml's library cannot
be had."""

from __future__ import annotations

import gguf
import pytest
import torch

from tokentui.core.model.quant import ggml_linear, ggml_settings
from tokentui.core.model.quant.ggml_linear import GGMLLinear, GGMLMatrix

from test_ggml_kernels import bound_ggml, gguf_values, packed_or_skip, stored, values


@pytest.fixture(scope="module", autouse=True)
def ggml():
    with bound_ggml():
        yield


@pytest.fixture(autouse=True)
def huge_pages_on(monkeypatch, tmp_path):
    """The tests' own THP setting (`madvise`, as on the machines measured), whatever this kernel's."""
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    monkeypatch.setattr(ggml_settings, "THP_SETTING", str(setting))
    monkeypatch.delenv(ggml_linear.HUGE_PAGES_ENV, raising=False)
    return setting


def file_matrices(tmp_path, tensors: dict[str, tuple[torch.Tensor, str]]) -> dict[str, GGMLMatrix]:
    """Each (values, format) written to a GGUF file by gguf-py, and read back as matrices viewing the file's map."""
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, (w, fmt) in tensors.items():
        raw = gguf.quantize(w.numpy(), gguf.GGMLQuantizationType[fmt])
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType[fmt])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {t.name: GGMLMatrix.from_gguf_tensor(t) for t in gguf.GGUFReader(str(path)).tensors}


def mapping_flags(tensor: torch.Tensor) -> tuple[int, int, list[str]]:
    """(start, end, VmFlags) of the mapping in /proc/self/smaps that holds tensor's bytes."""
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel()
    found = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0] if line.split() else ""
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                a, b = (int(x, 16) for x in head.split("-"))
                found = (a, b) if a <= start and end <= b else None
            elif found is not None and line.startswith("VmFlags:"):
                return found[0], found[1], line.split()[1:]
    raise AssertionError("no mapping holds the tensor")


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_a_files_matrix_runs_from_a_huge_page_copy_of_its_bytes(tmp_path, fmt):
    """The copy is the file's bytes exactly, outside the file's map, in memory advised for huge pages; products (one
    row: vec_dot; many: llama.cpp's matrix product through a ggml graph) and `weight` give the very values of the
    file's own bytes."""
    w = values(64, 512)
    matrix = file_matrices(tmp_path, {"w": (w, fmt)})["w"]
    ops = torch.ops.tokentui_ggml
    assert ops.in_file_map(matrix.raw)
    before = matrix.raw.clone()
    plain = GGMLLinear(GGMLMatrix(before, fmt, 64, 512), repack=False)  # anonymous memory: run where it lies
    assert plain.resident is None and plain.run_bytes.data_ptr() == before.data_ptr()
    layer = GGMLLinear(matrix, repack=False)
    copy = layer.resident
    assert copy is not None and layer.run_bytes.data_ptr() == copy.data_ptr() and layer.kernel == "vec_dot"
    assert torch.equal(copy, before) and not ops.in_file_map(copy)
    assert "hg" in mapping_flags(copy)[2]
    for rows in (1, 3, ggml_linear.PRODUCT_ROWS + 5):
        x = values(rows, 512, seed=rows)
        assert torch.equal(layer(x), plain(x))
    assert torch.equal(layer.weight, gguf_values(before, fmt))
    assert torch.equal(matrix.raw, before)  # the file's pages, given back, read again from the file if touched


def test_small_matrices_share_huge_pages():
    """Copies of matrices under a huge page's 2 MiB each lie one after another in one advised mapping (each on its
    own would hold no whole huge page), and live on after the mapping's other copies are freed."""
    ops = torch.ops.tokentui_ggml
    sources = [torch.full((600, 1024), i, dtype=torch.uint8) for i in range(4)]
    copies = [ops.resident(s) for s in sources]
    spans = [mapping_flags(c) for c in copies]
    assert len({(a, b) for a, b, _ in spans}) == 1 and "hg" in spans[0][2]
    start, end, _ = spans[0]
    assert end - start >= 2 << 20 and start % (2 << 20) == 0
    del copies[:3]
    assert torch.equal(copies[0], sources[3])


def test_a_repacked_copy_is_made_in_huge_page_memory(tmp_path):
    packed_or_skip("Q4_0")
    matrix = file_matrices(tmp_path, {"w": (values(64, 512), "Q4_0")})["w"]
    layer = GGMLLinear(matrix)
    assert layer.resident is None and layer.run_bytes.data_ptr() == layer.packed.data_ptr()
    assert "hg" in mapping_flags(layer.packed)[2]


def test_nothing_is_copied_where_huge_pages_are_off(tmp_path, monkeypatch, huge_pages_on):
    matrices = file_matrices(tmp_path, {"a": (values(64, 512), "Q8_0"), "b": (values(64, 512, seed=1), "Q8_0")})
    monkeypatch.setenv(ggml_linear.HUGE_PAGES_ENV, "0")
    assert not ggml_linear.huge_pages()
    layer = GGMLLinear(matrices["a"])
    assert layer.resident is None and layer.run_bytes.data_ptr() == matrices["a"].raw.data_ptr()
    monkeypatch.delenv(ggml_linear.HUGE_PAGES_ENV)
    never = tmp_path / "never"
    never.write_text("always madvise [never]\n")
    monkeypatch.setattr(ggml_settings, "THP_SETTING", str(never))  # (a setting is read once a process: another file)
    assert not ggml_linear.huge_pages()
    assert GGMLLinear(matrices["b"]).resident is None
    monkeypatch.setattr(ggml_settings, "THP_SETTING", str(tmp_path / "absent"))
    assert not ggml_linear.huge_pages()


def mapping_rss_kib(tensor: torch.Tensor) -> int:
    """The resident kB (smaps' Rss) of the mapping in /proc/self/smaps that holds tensor's first byte."""
    start = tensor.data_ptr()
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0] if line.split() else ""
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                a, b = (int(x, 16) for x in head.split("-"))
                inside = a <= start < b
            elif inside and line.startswith("Rss:"):
                return int(line.split()[1])
    raise AssertionError("no mapping holds the tensor")


def test_a_large_matrix_gives_its_file_pages_back_as_it_is_copied(tmp_path):
    """A matrix larger than the copy's slice (8 MiB; a tied embedding and head is ~150 MiB) is never held twice:
    `resident` itself gives each copied slice's file pages back, so once it returns the file's map holds next to
    nothing of it, though every page was in memory before (the load's peak memory, issue 37)."""
    w = torch.randn(6144, 4096, generator=torch.Generator().manual_seed(5))
    matrix = file_matrices(tmp_path, {"w": (w, "Q8_0")})["w"]
    ops = torch.ops.tokentui_ggml
    size_kib = matrix.raw.numel() // 1024
    assert size_kib > 2 * 8 * 1024  # more than two slices
    before = matrix.raw.clone()  # reads every page of the file's map
    assert mapping_rss_kib(matrix.raw) >= size_kib  # all in memory now
    copy = ops.resident(matrix.raw)
    assert torch.equal(copy, before)
    assert mapping_rss_kib(matrix.raw) < 1024  # given back while copying (a header page or two may stay)


HUGE_PAGE = 2 << 20


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def test_matrices_copied_after_a_reservation_are_carved_from_it_and_the_rest_is_given_back(tmp_path):
    """`reserve_huge_pages` maps the memory a load is about to copy into ahead (its pages faulted in by a thread):
    the copies made next lie one after another in it, a matrix over a quarter of a 64 MiB chunk too (without the
    reservation it would get a mapping of its own), byte for byte the file's and multiplying to the same values;
    one reservation is open at a time, and trimming it gives back exactly the whole huge pages no copy reached."""
    matrices = file_matrices(tmp_path, {"small": (values(64, 512), "Q8_0"),
                                        "large": (values(4096, 4352, seed=1), "Q8_0")})
    assert matrices["large"].nbytes > (64 << 20) // 4  # 18.9 MB: over a quarter of a chunk
    before = {name: m.raw.clone() for name, m in matrices.items()}
    asked = 48 << 20
    assert ggml_linear.reserve_huge_pages(asked) == asked
    assert ggml_linear.reserve_huge_pages(asked) == 0  # one at a time
    try:
        small, large = (GGMLLinear(matrices[name], repack=False) for name in ("small", "large"))
    finally:
        given = ggml_linear.trim_reserved()
    used = _round_up(small.resident.numel(), 64) + _round_up(large.resident.numel(), 64)
    assert large.resident.data_ptr() == small.resident.data_ptr() + _round_up(small.resident.numel(), 64)
    assert given == asked - _round_up(used, HUGE_PAGE)
    assert ggml_linear.trim_reserved() == 0  # closed
    for name, layer in (("small", small), ("large", large)):
        assert torch.equal(layer.resident, before[name])
        plain = GGMLLinear(GGMLMatrix(before[name], "Q8_0", layer.out_features, layer.in_features), repack=False)
        x = values(2, layer.in_features, seed=3)
        assert torch.equal(layer(x), plain(x))
    assert "hg" in mapping_flags(large.resident)[2]


def test_a_reservation_nothing_was_copied_into_is_given_back_whole():
    assert ggml_linear.reserve_huge_pages(3 << 20) == 4 << 20  # whole huge pages
    assert ggml_linear.trim_reserved() == 4 << 20
    assert ggml_linear.reserve_huge_pages(0) == 0 and ggml_linear.trim_reserved() == 0


def test_no_reservation_where_huge_pages_are_off(monkeypatch):
    monkeypatch.setenv(ggml_linear.HUGE_PAGES_ENV, "0")
    assert ggml_linear.reserve_huge_pages(4 << 20) == 0 and ggml_linear.trim_reserved() == 0
