"""Two faster parses of a GGUF file than gguf-py's own GGUFReader, with its fields and tensors:

- `fast_reader`: the same parse, several times faster: it slices a plain ndarray view of the file's memory map
  instead of the memmap itself (numpy's memmap does per-slice bookkeeping, and the parse takes one slice per
  metadata value: 2 per vocabulary entry). The same fields and tensors; tensor data are read-only views of the same
  map. transformers' own GGUF parse runs on it (gguf_check.fast_transformers_parse).
- `lean_reader`: for a start that needs the tensor table and the scalar metadata only (the as-stored path's routing,
  check and tensor map: the tokenizer and config come from their cache): each array of more than SKIM_AT entries is
  skimmed — its type and length kept, its entries stepped over and not parsed. gguf-py makes two arrays per entry of
  a vocabulary (151,936 for Qwen) and of its merges, which took seconds and a few hundred bytes an entry at every
  start (BENCHMARKS.md); stepping over them reads only each string's length. A skimmed field's `data` has the
  array's length (the checks compare it with the embedding's rows) and refuses to be read (`Skimmed`), so nothing can
  take its entries for values.
"""

from __future__ import annotations

import functools
import struct
import sys
from pathlib import Path

SKIM_AT = 256  # longer arrays are skimmed by lean_reader (the per-layer arrays some architectures have stay whole)


class Skimmed:
    """The `data` of an array field that lean_reader stepped over: its length, and no entries."""

    def __init__(self, name: str, count: int) -> None:
        self.name, self.count = name, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):
        raise LookupError(f"the GGUF field {self.name}'s {self.count} entries were not parsed (lean_reader); "
                          "read them with fast_reader")


def fast_reader(path: Path):
    """gguf-py's GGUFReader of `path`, its parse faster (the module docstring)."""
    return fast_reader_class()(str(path))


def lean_reader(path: Path):
    """gguf-py's GGUFReader of `path` with its long arrays skimmed (the module docstring)."""
    return _lean_reader_class()(str(path))


@functools.cache
def fast_reader_class():
    import numpy as np
    from gguf import GGUFReader

    class FastReader(GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):  # gguf-py's own, on the plain view
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self._plain = self.data.view(np.ndarray)
            count = int(count)
            arr = plain[offset:offset + np.dtype(dtype).itemsize * count].view(dtype=dtype)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    return FastReader


@functools.cache
def _lean_reader_class():
    import numpy as np
    from gguf import GGUFValueType
    from gguf.gguf_reader import ReaderField

    class LeanReader(fast_reader_class()):
        def _build_fields(self, offs, count):
            """gguf-py's _build_fields (the same fields, in order, the same refusals of a duplicate key or an
            unknown type), the long arrays skimmed."""
            for _ in range(count):
                orig_offs = offs
                kv_klen, kv_kdata = self._get_str(offs)
                offs += int(kv_klen.nbytes + kv_kdata.nbytes)
                raw_kv_type = self._get(offs, np.uint32)
                offs += int(raw_kv_type.nbytes)
                name = str(bytes(kv_kdata), encoding="utf-8")
                parts = [kv_klen, kv_kdata, raw_kv_type]
                skimmed = self._skim(name, offs, int(raw_kv_type[0]))
                if skimmed is not None:
                    size, value_parts, types = skimmed
                    data = Skimmed(name, int(value_parts[1][0]))
                else:
                    size, value_parts, idxs, types = self._get_field_parts(offs, raw_kv_type[0])
                    data = [idx + len(parts) for idx in idxs]
                self._push_field(ReaderField(orig_offs, name, parts + value_parts, data, types), skip_sum=True)
                offs += size
            return offs

        def _skim(self, name, offs, raw_type):
            """(bytes, parts, types) of a long array of scalars or strings at `offs`, stepped over; None for any
            other value (parsed as gguf-py does)."""
            if raw_type != GGUFValueType.ARRAY:
                return None
            raw_itype = self._get(offs, np.uint32)
            alen = self._get(offs + 4, np.uint64)
            if len(raw_itype) < 1 or len(alen) < 1:
                raise ValueError(f"the field {name} runs past the end of the file")
            count, itype = int(alen[0]), int(raw_itype[0])
            start = offs + 12
            if count <= SKIM_AT:
                return None
            if itype == GGUFValueType.STRING:
                end = self._step_over_strings(start, count)
            elif GGUFValueType(itype) in self.gguf_scalar_to_np:
                end = start + count * np.dtype(self.gguf_scalar_to_np[GGUFValueType(itype)]).itemsize
            else:
                return None  # an array of arrays: gguf-py's own parse
            if end > len(self.data):
                raise ValueError(f"the field {name} runs past the end of the file")
            return end - offs, [raw_itype, alen, self._get(start, np.uint8, end - start)], \
                [GGUFValueType.ARRAY, GGUFValueType(itype)]

        def _step_over_strings(self, offs, count):
            """Where `count` strings (each a u64 length and its bytes) starting at `offs` end."""
            view = memoryview(self.data.view(np.ndarray)).cast("B")
            little = (self.byte_order == "I") == (sys.byteorder == "little")  # "I": the host's order, "S": swapped
            length = struct.Struct("<Q" if little else ">Q")
            size = len(view)
            for _ in range(count):
                if offs + 8 > size:
                    raise ValueError("a string array runs past the end of the file")
                offs += 8 + length.unpack_from(view, offs)[0]
            return offs

    return LeanReader
