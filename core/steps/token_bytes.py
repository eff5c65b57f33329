"""Token id -> bytes: the exact bytes each vocabulary entry adds to the decoded text (`TokenBytes`).

A token is a run of *bytes*, not of characters: byte-level BPE (GPT-2, Qwen, SmolLM, Llama-3) spells every byte
in a printable stand-in alphabet, SentencePiece with byte fallback (Llama-2, Mistral, Gemma) has `<0xNN>` tokens
for single raw bytes. This module reads the tokenizer's own decoder description once, decides how its ids become
bytes (`MODE_BYTE_LEVEL`, `MODE_SENTENCEPIECE`, or `MODE_DECODE` for decoders it does not reproduce), and maps ids
to bytes lazily, one shared cache per tokenizer (`token_bytes`). The streaming detokenizer (core/steps/detokenize.py)
and the display form of a token (core/steps/display.py) are built on it.

Never imports textual: the engine, `--headless --json` and the benchmarks use it too.
"""

from __future__ import annotations

import json
import re
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = [
    "MODE_BYTE_LEVEL",
    "MODE_SENTENCEPIECE",
    "MODE_DECODE",
    "TokenBytes",
    "token_bytes",
    "is_special",
]

# How a tokenizer's ids become bytes; see `TokenBytes.mode`.
MODE_BYTE_LEVEL = "byte-level"  # every token is raw bytes spelled in the GPT-2 byte alphabet
MODE_SENTENCEPIECE = "sentencepiece"  # tokens are text ("▁" = space), `<0xNN>` tokens are single raw bytes
MODE_DECODE = "decode"  # unknown decoder: decode the growing id list and emit the new suffix

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>\Z")


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's `bytes_to_unicode`: the printable stand-in character for each of the 256 bytes.

    Byte-level BPE vocabularies spell every byte as one printable character (Ġ = 0x20 space, Ċ = 0x0A newline)
    so that a token string is always valid text even when it holds half a character. This table undoes that.
    """
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {chr(b): b for b in printable}
    n = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + n)] = b
            n += 1
    return table


# ---------------------------------------------------------------------------------------------------------
# Reading the tokenizer's decoder


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to reproduce the tokenizer's decoder token by token (parsed once from its JSON description)."""

    mode: str
    # Per-token string rewrites applied before byte fallback, in the decoder's order:
    # ("replace", pattern, content) or ("metaspace", replacement, drop_in_first_token).
    rewrites: tuple[tuple[str, str, Any], ...] = ()
    byte_fallback: bool = False
    # A `Strip` after `Fuse`: strips up to `strip_left` leading `strip_content` chars of the *whole* text.
    strip_left: int = 0
    strip_content: str = " "
    reason: str = ""  # why MODE_DECODE was chosen, for logs and tests


def _decoder_json(backend: Any) -> dict | None:
    """The fast tokenizer's decoder as a dict, or None when it has none.

    `decoder.__getstate__()` serializes only the decoder (cheap); the whole tokenizer's JSON is the fallback
    because it also serializes a vocabulary that can hold 150k entries.
    """
    decoder = backend.decoder
    if decoder is None:
        return None
    try:
        state = decoder.__getstate__()
        return json.loads(state)
    except Exception:  # pragma: no cover - older / odd tokenizers builds
        return json.loads(backend.to_str()).get("decoder")


def _plan_for(decoder: dict | None) -> _Plan:
    """Map a decoder description onto one of the modes this module reproduces exactly, else MODE_DECODE.

    Only orders we can stream without changing already-emitted text are accepted: per-token rewrites
    (Replace, Metaspace) before ByteFallback/Fuse, and a left-only Strip after Fuse (Llama-2 / Mistral strip
    the one space that SentencePiece prepends to the whole text). Anything else is decoded the slow way.
    """
    if decoder is None:
        return _Plan(MODE_DECODE, reason="no decoder")
    steps = decoder["decoders"] if decoder.get("type") == "Sequence" else [decoder]
    # Flatten nested sequences.
    flat: list[dict] = []
    stack = list(reversed(steps))
    while stack:
        step = stack.pop()
        if step.get("type") == "Sequence":
            stack.extend(reversed(step["decoders"]))
        else:
            flat.append(step)
    types = [s.get("type") for s in flat]
    if types == ["ByteLevel"]:
        return _Plan(MODE_BYTE_LEVEL)
    if "ByteLevel" in types:
        return _Plan(MODE_DECODE, reason="ByteLevel combined with other decoders")

    rewrites: list[tuple[str, str, Any]] = []
    byte_fallback = fused = False
    strip_left, strip_content = 0, " "
    for step in flat:
        kind = step.get("type")
        if kind == "Replace":
            pattern = step.get("pattern", {})
            if "String" not in pattern or byte_fallback or fused:
                return _Plan(MODE_DECODE, reason=f"Replace {pattern} after ByteFallback/Fuse or regex")
            rewrites.append(("replace", pattern["String"], step.get("content", "")))
        elif kind == "Metaspace":
            if byte_fallback or fused:
                return _Plan(MODE_DECODE, reason="Metaspace after ByteFallback/Fuse")
            scheme = step.get("prepend_scheme")
            if scheme is None:  # descriptions written before `prepend_scheme` existed
                scheme = "always" if step.get("add_prefix_space", True) else "never"
            rewrites.append(("metaspace", step.get("replacement", "▁"), scheme != "never"))
        elif kind == "ByteFallback":
            if fused:
                return _Plan(MODE_DECODE, reason="ByteFallback after Fuse")
            byte_fallback = True
        elif kind == "Fuse":
            fused = True
        elif kind == "Strip":
            if not fused or step.get("stop", 0) != 0 or strip_left:
                return _Plan(MODE_DECODE, reason="Strip per token or on the right")
            strip_left, strip_content = int(step.get("start", 0)), step.get("content", " ")
        else:
            return _Plan(MODE_DECODE, reason=f"decoder {kind}")
    return _Plan(
        MODE_SENTENCEPIECE,
        rewrites=tuple(rewrites),
        byte_fallback=byte_fallback,
        strip_left=strip_left,
        strip_content=strip_content,
    )


# ---------------------------------------------------------------------------------------------------------
# Token id -> bytes


class TokenBytes:
    """Maps a token id to the exact bytes it adds to the decoded text, lazily and cached.

    `tb[id]` is those bytes (b"" for special tokens, which a `skip_special_tokens` decode drops, and for ids
    the tokenizer does not know). Nothing is precomputed: vocabularies reach 150k+ entries and the dashboard
    only ever looks at the prompt and the tokens generated.

    `mode` says how the bytes relate to the tokenizer's one-shot decode:

    * MODE_BYTE_LEVEL: all tokens' bytes concatenate into one UTF-8 stream (invalid bytes become U+FFFD).
    * MODE_SENTENCEPIECE: tokens are text; with byte fallback a `<0xNN>` token is one raw byte
      (`byte_value(id)`), and runs of such bytes form characters.
    * MODE_DECODE: the decoder is one we do not reproduce; `tb[id]` is then only a per-token approximation
      (`tokenizer.decode([id])`) for display, and `IncrementalDetokenizer` decodes the whole id list instead.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._plan = _plan_for(_decoder_json(self._backend)) if self._backend is not None else _Plan(
            MODE_DECODE, reason="not a fast tokenizer"
        )
        self._special = self._special_ids()
        self._strings: dict[int, str | None] = {}
        self._bytes: dict[int, bytes] = {}
        self._first: dict[int, bytes] = {}
        self._byte_values: dict[int, int | None] = {}
        self._size = _safe_len(tokenizer)

    # -- facts about the tokenizer

    @property
    def mode(self) -> str:
        return self._plan.mode

    @property
    def byte_fallback(self) -> bool:
        """True when `<0xNN>` tokens stand for raw bytes (SentencePiece byte fallback)."""
        return self._plan.byte_fallback

    @property
    def strip_left(self) -> int:
        """How many leading `strip_content` characters the decoder strips off the whole text (Llama-2: 1)."""
        return self._plan.strip_left

    @property
    def strip_content(self) -> str:
        return self._plan.strip_content

    @property
    def reason(self) -> str:
        """Why MODE_DECODE was chosen ("" otherwise)."""
        return self._plan.reason

    def _special_ids(self) -> frozenset[int]:
        """Ids a `skip_special_tokens=True` decode drops: transformers' special ids plus added tokens marked special.

        Both sources are needed: transformers lists bos/eos/pad/unk, while chat tokens such as `<|im_start|>`
        or `<file_sep>` are often only flagged special in the added-token table.
        """
        ids: set[int] = set()
        try:
            ids.update(int(i) for i in self.tokenizer.all_special_ids if i is not None)
        except Exception:
            pass
        added = None
        if self._backend is not None:
            try:
                added = self._backend.get_added_tokens_decoder()
            except Exception:
                added = None
        if added is None:
            added = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
        ids.update(int(i) for i, tok in added.items() if getattr(tok, "special", False))
        return frozenset(ids)

    def is_special(self, token_id: int) -> bool:
        return int(token_id) in self._special

    def token_string(self, token_id: int) -> str | None:
        """The vocabulary entry for `token_id` (e.g. "ĠOpen", "▁Open", "<0xE5>"), None for unknown ids."""
        token_id = int(token_id)
        if token_id not in self._strings:
            try:
                if self._backend is not None:
                    s = self._backend.id_to_token(token_id)
                else:
                    s = self.tokenizer.convert_ids_to_tokens(token_id)
            except Exception:
                s = None
            self._strings[token_id] = s
        return self._strings[token_id]

    # -- bytes

    def _rewrite(self, s: str, first: bool) -> str:
        """The decoder's per-token rewrites (Replace "▁"→" ", Metaspace), in order.

        Metaspace drops its replacement character entirely in the first token of the text (that is where
        SentencePiece prepended a space) and turns it into a space everywhere else.
        """
        for kind, a, b in self._plan.rewrites:
            if kind == "replace":
                s = s.replace(a, b)
            else:  # metaspace
                s = s.replace(a, "" if (first and b) else " ")
        return s

    def _compute(self, token_id: int, first: bool) -> bytes:
        if token_id in self._special:
            return b""
        s = self.token_string(token_id)
        if s is None:
            return b""
        mode = self._plan.mode
        if mode == MODE_BYTE_LEVEL:
            table = _unicode_to_byte()
            try:
                return bytes(table[c] for c in s)
            except KeyError:
                # Same rule as the ByteLevel decoder: a token (typically an added one) with any character
                # outside the byte alphabet is taken as its own UTF-8 text.
                return s.encode("utf-8")
        if mode == MODE_SENTENCEPIECE:
            value = self.byte_value(token_id)
            if value is not None:
                return bytes([value])
            return self._rewrite(s, first).encode("utf-8")
        # MODE_DECODE: a per-token decode, only good for display (partial characters come out as U+FFFD).
        try:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        except Exception:
            text = s
        return text.encode("utf-8")

    def __getitem__(self, token_id: int) -> bytes:
        token_id = int(token_id)
        data = self._bytes.get(token_id)
        if data is None:
            data = self._bytes[token_id] = self._compute(token_id, first=False)
        return data

    def first(self, token_id: int) -> bytes:
        """The bytes `token_id` adds when it is the first non-special token of the text.

        Differs from `tb[id]` only for Metaspace decoders, which drop the prepended "▁" there.
        """
        token_id = int(token_id)
        if not any(kind == "metaspace" and flag for kind, _, flag in self._plan.rewrites):
            return self[token_id]
        data = self._first.get(token_id)
        if data is None:
            data = self._first[token_id] = self._compute(token_id, first=True)
        return data

    def byte_value(self, token_id: int) -> int | None:
        """For SentencePiece byte fallback: the raw byte a `<0xNN>` token stands for, else None."""
        token_id = int(token_id)
        if not self._plan.byte_fallback or token_id in self._special:
            return None
        if token_id not in self._byte_values:
            s = self.token_string(token_id)
            value = None
            if s is not None:
                s = self._rewrite(s, first=False)
                m = _BYTE_TOKEN.match(s)
                if m:
                    value = int(m.group(1), 16)
            self._byte_values[token_id] = value
        return self._byte_values[token_id]


def _safe_len(tokenizer: Any) -> int:
    try:
        return len(tokenizer)
    except Exception:
        return -1


_CACHE: "weakref.WeakKeyDictionary[Any, TokenBytes]" = weakref.WeakKeyDictionary()


def token_bytes(tokenizer: Any) -> TokenBytes:
    """The `TokenBytes` for `tokenizer`, shared per tokenizer so its cache is built once.

    Rebuilt when the vocabulary size changes (tokens were added). A `TokenBytes` is returned as is.
    """
    if isinstance(tokenizer, TokenBytes):
        return tokenizer
    try:
        tb = _CACHE.get(tokenizer)
    except TypeError:  # not weak-referenceable
        return TokenBytes(tokenizer)
    if tb is None or tb._size != _safe_len(tokenizer):
        tb = TokenBytes(tokenizer)
        _CACHE[tokenizer] = tb
    return tb


def is_special(tokenizer: Any, token_id: int) -> bool:
    """True when `token_id` is a special token (dropped from the text, shown by its literal name)."""
    return token_bytes(tokenizer).is_special(token_id)
