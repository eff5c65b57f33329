"""Step 6, detokenize: turn the stream of chosen token ids back into text, one token at a time.

Why this is its own module and not `tokenizer.decode([id])` per token: a token is a run of *bytes*, not of
characters. Byte-level BPE (GPT-2, Qwen, SmolLM, Llama-3) and SentencePiece byte fallback (Llama-2, Mistral,
Gemma) both cut multi-byte characters in the middle — 开 is `e5 bc 80` and may arrive as `e5 bc` + `80`. Decoding
each token alone turns every half character into U+FFFD, and the dashboard would print garbage that a one-shot
decode of the same ids never shows. So we rebuild each token's exact bytes from the tokenizer's own decoder
description, push them through the standard library's incremental UTF-8 decoder, and keep the bytes of an
unfinished character "pending" (the dashboard shows them as hex) until the character completes.

The contract, tested against the tokenizer itself: the concatenation of everything `IncrementalDetokenizer`
emits (plus `finish()`) equals `oneshot_text(tokenizer, ids)`.

The module also gives step 2 its display form of a token (`display_piece`): spaces as `␣`, newlines as `↵`,
bytes that are not a character on their own as `<0xNN>`, special tokens as their literal text. `display_text` is
the one whitespace / control-character mapping, which the dashboard uses too.

Never imports textual: the engine, `--headless --json` and the benchmarks use it too.
"""

from __future__ import annotations

import codecs
import json
import re
import weakref
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable

from .events import MultiTokenChar

__all__ = [
    "MODE_BYTE_LEVEL",
    "MODE_SENTENCEPIECE",
    "MODE_DECODE",
    "TokenBytes",
    "token_bytes",
    "display_piece",
    "display_text",
    "display_bytes",
    "is_special",
    "DetokStep",
    "DetokEnd",
    "IncrementalDetokenizer",
    "oneshot_text",
]

# How a tokenizer's ids become bytes; see `TokenBytes.mode`.
MODE_BYTE_LEVEL = "byte-level"  # every token is raw bytes spelled in the GPT-2 byte alphabet
MODE_SENTENCEPIECE = "sentencepiece"  # tokens are text ("▁" = space), `<0xNN>` tokens are single raw bytes
MODE_DECODE = "decode"  # unknown decoder: decode the growing id list and emit the new suffix

_REPLACEMENT = "\ufffd"
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>\Z")

# What the dashboard draws instead of invisible characters. Every space is shown, not only a leading one: a
# token like "  " (two spaces, common in code) would otherwise look empty.
_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


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

    def piece(self, token_id: int) -> str:
        """The display form of `token_id`; see `display_piece`."""
        token_id = int(token_id)
        if token_id in self._special:
            return self.token_string(token_id) or ""
        return display_bytes(self[token_id])


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


# ---------------------------------------------------------------------------------------------------------
# Display


def display_text(text: str) -> str:
    """The one display mapping of a token's text, on one line: every space `␣`, newline `↵`, tab `⇥`, carriage
    return `␍`, other control characters (which would move the terminal's cursor) `<0xNN>`, and nothing at all
    `∅` (never a blank cell). Used by `display_piece` here and by the dashboard's panels; a text already in
    display form comes back unchanged.
    """
    out = []
    for c in text:
        v = _VISIBLE.get(c)
        if v is not None:
            out.append(v)
        elif c < " " or c == "\x7f":
            out.append(f"<0x{ord(c):02X}>")
        else:
            out.append(c)
    return "".join(out) or "∅"


def display_bytes(data: bytes) -> str:
    """Bytes as the dashboard shows them: characters where the bytes form whole UTF-8 characters, each
    remaining byte as `<0xNN>` (half of 开 shows as `<0xE5><0xBC>`).

    Uses the codec's `surrogateescape` handler to find the bytes that are not characters on their own: each
    such byte comes back as one lone surrogate U+DC80..U+DCFF.
    """
    text = data.decode("utf-8", errors="surrogateescape")
    out = []
    for c in text:
        if "\udc80" <= c <= "\udcff":
            out.append(f"<0x{ord(c) - 0xDC00:02X}>")
        else:
            out.append(display_text(c))
    return "".join(out)


def display_piece(tokenizer: Any, token_id: int) -> str:
    """The piece for `token_id` as the dashboard shows it (prompt table, candidates, chosen token).

    `␣Open` for " Open", `↵` for a newline, `<0xE5><0xBC>` for the first two bytes of 开, and a special token
    as its literal text (`<|im_end|>`). `tokenizer` may be a tokenizer or its `TokenBytes`.
    """
    return token_bytes(tokenizer).piece(token_id)


def is_special(tokenizer: Any, token_id: int) -> bool:
    """True when `token_id` is a special token (dropped from the text, shown by its literal name)."""
    return token_bytes(tokenizer).is_special(token_id)


# ---------------------------------------------------------------------------------------------------------
# Streaming


@dataclass(frozen=True, slots=True)
class DetokStep:
    """What one pushed token did to the text.

    `text`: newly completed text ("" while bytes are pending, and for special tokens).
    `pending`: bytes of an incomplete character still waiting for more tokens (always b"" in MODE_DECODE,
    where they cannot be known). `pending_needed`: how many more bytes that character needs.
    `completed`: characters this token completed whose bytes came from more than one token.
    `special`: the token is special and contributes no text.
    """

    text: str
    pending: bytes = b""
    pending_needed: int = 0
    completed: list[MultiTokenChar] = field(default_factory=list)
    special: bool = False

    @property
    def pending_hex(self) -> str:
        """The pending bytes as lowercase, space-separated hex ("e5 bc"), the form events carry."""
        return self.pending.hex(" ")


@dataclass(frozen=True, slots=True)
class DetokEnd:
    """How a stream ended (`IncrementalDetokenizer.end()`).

    `text`: text released at the end, never a U+FFFD for held bytes. `dropped`: bytes of an incomplete character
    still held (they can no longer complete); `dropped_needed`: how many more it needed; `dropped_text`: what a
    one-shot decode makes of them (U+FFFD: one for a byte-level prefix, one per byte for a byte-fallback run), so
    that the stream's text + `dropped_text` == the one-shot decode.
    """

    text: str
    dropped: bytes = b""
    dropped_needed: int = 0
    dropped_text: str = ""

    @property
    def dropped_hex(self) -> str:
        return self.dropped.hex(" ")


def _needed_after(pending: bytes) -> int:
    """Bytes still missing from an incomplete character, read off its UTF-8 lead byte."""
    if not pending:
        return 0
    lead = pending[0]
    total = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return max(total - len(pending), 0)


class IncrementalDetokenizer:
    """Step 6: push the chosen ids one by one; get back the text each one completes.

    In the byte modes the decoding itself is `codecs.getincrementaldecoder("utf-8")(errors="replace")`: it
    holds back the bytes of an incomplete character (never a premature U+FFFD), and replaces invalid bytes
    exactly where a one-shot `bytes.decode("utf-8", "replace")` — and the tokenizers library's lossy decode,
    which follows the same Unicode "maximal subpart" rule — would. Alongside, we remember which push each
    pending byte came from, so a completed character can report how many tokens it took.

    SentencePiece byte fallback decodes a *run* of consecutive `<0xNN>` tokens as a whole: a run that is not
    valid UTF-8 becomes one U+FFFD per byte, and a run cut short by a text token is invalid. We follow that
    rule, with one deliberate exception: characters of a run that were complete and already shown stay shown
    when a later byte of the same run turns out invalid (a one-shot decode would turn them into U+FFFD too;
    streaming cannot take text back). Only malformed model output hits this.

    MODE_DECODE (a decoder we do not reproduce, or a slow tokenizer) re-decodes the whole id list after each
    push and emits the new suffix, holding it back while it ends in U+FFFD (likely an incomplete character),
    like transformers' TextStreamer and vLLM do. There `pending` is always b"" and `completed` always [],
    since the bytes are unknown; each push costs a decode of everything so far.
    """

    def __init__(self, tokenizer: Any):
        self.tokens = token_bytes(tokenizer)
        self.mode = self.tokens.mode
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = b""
        self._origins: list[int] = []  # push index each pending byte came from
        self._parts: list[str] = []
        self._count = 0  # tokens pushed
        self._started = False  # a non-special token has been pushed
        self._strip_left = self.tokens.strip_left
        self._run_invalid = False  # byte fallback: the current byte run already failed
        self._ids: list[int] = []  # MODE_DECODE only
        self._emitted = ""  # MODE_DECODE only

    @property
    def text(self) -> str:
        """Everything emitted so far (including what `finish()` flushed)."""
        return "".join(self._parts)

    @property
    def pending(self) -> bytes:
        return self._pending

    # -- the byte machinery

    def _feed_byte(self, value: int, origin: int) -> tuple[str, MultiTokenChar | None, bool]:
        """Feed one byte. Returns (text out, the multi-token char it completed or None, invalid bytes seen).

        One byte at a time keeps the bookkeeping simple: the decoder's buffer is always a prefix of one
        character, so its output is at most some U+FFFD for invalid bytes followed by one real character,
        whose bytes are the tail of what was consumed.
        """
        before, origins = self._pending, self._origins
        out = self._decoder.decode(bytes([value]))
        buffered = self._decoder.getstate()[0]
        all_bytes = before + bytes([value])
        all_origins = origins + [origin]
        consumed = len(all_bytes) - len(buffered)
        self._pending = bytes(buffered)
        self._origins = all_origins[consumed:]
        if not out:
            return "", None, False
        last = out[-1]
        encoded = last.encode("utf-8", errors="surrogatepass")
        if all_bytes[:consumed].endswith(encoded):  # the last char is real (a genuine U+FFFD included)
            char_origins = all_origins[consumed - len(encoded) : consumed]
            tokens = len(set(char_origins))
            char = MultiTokenChar(last, encoded.hex(" "), tokens) if tokens > 1 else None
            return out, char, len(out) > 1
        return out, None, True

    def _feed(self, data: bytes, origin: int) -> tuple[str, list[MultiTokenChar]]:
        """Feed a token's bytes; byte by byte while a character from earlier tokens is pending, then in bulk."""
        texts: list[str] = []
        completed: list[MultiTokenChar] = []
        i = 0
        while i < len(data) and self._pending:
            out, char, _ = self._feed_byte(data[i], origin)
            texts.append(out)
            if char is not None:
                completed.append(char)
            i += 1
        if i < len(data):
            rest = data[i:]
            if rest.isascii():
                texts.append(rest.decode("ascii"))  # the decoder's buffer is empty: ASCII passes straight through
            else:
                texts.append(self._decoder.decode(rest))
                buffered = bytes(self._decoder.getstate()[0])
                self._pending = buffered
                self._origins = [origin] * len(buffered)
        return "".join(texts), completed

    def _reset_bytes(self) -> None:
        self._decoder.reset()
        self._pending = b""
        self._origins = []

    def _strip(self, text: str) -> str:
        """Reproduce a `Strip` decoder after `Fuse`: drop leading `content` characters of the whole text."""
        if self._strip_left <= 0 or not text:
            return text
        content = self.tokens.strip_content
        i = 0
        while i < len(text) and self._strip_left > 0 and text[i] == content:
            i += 1
            self._strip_left -= 1
        if i < len(text):
            self._strip_left = 0  # text started: later spaces are real
        return text[i:]

    def _step(self, text: str, completed: list[MultiTokenChar] | None = None, special: bool = False) -> DetokStep:
        if text:
            self._parts.append(text)
        return DetokStep(text, self._pending, _needed_after(self._pending), completed or [], special)

    # -- public

    def push(self, token_id: int) -> DetokStep:
        """Add one token; returns the text it completed and what is still pending."""
        token_id = int(token_id)
        origin = self._count
        self._count += 1
        tb = self.tokens
        if tb.is_special(token_id):
            # Skipped exactly like a skip_special_tokens decode skips it: it does not even interrupt a pending
            # character or a byte-fallback run.
            return self._step("", special=True)

        if self.mode == MODE_DECODE:
            return self._step(self._decode_push(token_id))

        first = not self._started
        self._started = True
        if self.mode == MODE_BYTE_LEVEL:
            text, completed = self._feed(tb.first(token_id) if first else tb[token_id], origin)
            return self._step(self._strip(text), completed)

        # MODE_SENTENCEPIECE
        value = tb.byte_value(token_id)
        if value is not None:
            if self._run_invalid:
                return self._step(self._strip(_REPLACEMENT))
            held = len(self._pending)
            out, char, invalid = self._feed_byte(value, origin)
            if invalid:
                # ByteFallback: an invalid run is one U+FFFD per byte, for every byte of the run not yet shown.
                self._reset_bytes()
                self._run_invalid = True
                return self._step(self._strip(_REPLACEMENT * (held + 1)))
            return self._step(self._strip(out), [char] if char else [])

        # A text token ends any byte run; an unfinished run is invalid, one U+FFFD per byte.
        text = _REPLACEMENT * len(self._pending)
        self._reset_bytes()
        self._run_invalid = False
        data = tb.first(token_id) if first else tb[token_id]
        text += data.decode("utf-8", errors="replace")  # token text, so always valid
        return self._step(self._strip(text))

    def push_many(self, token_ids: Iterable[int]) -> list[DetokStep]:
        return [self.push(i) for i in token_ids]

    def finish(self) -> str:
        """Flush at the end of generation: bytes still pending can no longer complete, so they become U+FFFD
        now — and only now, as in a one-shot decode. Returns the flushed text (usually "")."""
        if self.mode == MODE_DECODE:
            text = self._decode_tail(final=True)
        elif self.mode == MODE_BYTE_LEVEL:
            text = self._decoder.decode(b"", final=True)
            self._reset_bytes()
        else:
            text = _REPLACEMENT * len(self._pending)
            self._reset_bytes()
            self._run_invalid = False
        text = self._strip(text)
        if text:
            self._parts.append(text)
        return text

    def end(self) -> DetokEnd:
        """End of generation without inventing text: bytes still held are returned as `dropped` instead of being
        released as U+FFFD (the engine reports them as bytes). MODE_DECODE cannot know its bytes, so there the
        tail is released as `finish()` would (possibly U+FFFD) and nothing is reported dropped."""
        if self.mode == MODE_DECODE or not self._pending:
            return DetokEnd(self.finish())
        held = self._pending
        needed = _needed_after(held)
        if self.mode == MODE_BYTE_LEVEL:
            dropped_text = held.decode("utf-8", errors="replace")  # the held bytes are one valid prefix: one U+FFFD
        else:
            dropped_text = _REPLACEMENT * len(held)  # ByteFallback: an unfinished run is one U+FFFD per byte
        self._reset_bytes()
        self._run_invalid = False
        return DetokEnd("", held, needed, dropped_text)

    # -- MODE_DECODE

    def _decode_push(self, token_id: int) -> str:
        self._ids.append(token_id)
        return self._decode_tail(final=False)

    def _decode_tail(self, final: bool) -> str:
        if not self._ids:
            return ""
        full = oneshot_text(self.tokens.tokenizer, self._ids)
        if not final and full.endswith(_REPLACEMENT):
            return ""  # probably an incomplete character: wait for the next token
        # If the decoder rewrote text already emitted (it should not for the decoders we know), we cannot
        # take it back; emit what lies beyond it.
        new = full[len(self._emitted) :]
        self._emitted = full if len(full) > len(self._emitted) else self._emitted
        return new


def oneshot_text(tokenizer: Any, ids: Iterable[int]) -> str:
    """The oracle the stream must equal: a one-shot decode of `ids` without special tokens.

    `clean_up_tokenization_spaces` is off because streaming cannot un-emit a space: the clean-up deletes the
    space before punctuation ("Hello , world" → "Hello, world") only once it sees the punctuation, after the
    space was already shown.
    """
    if isinstance(tokenizer, TokenBytes):
        tokenizer = tokenizer.tokenizer
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=True, clean_up_tokenization_spaces=False)
