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

The token -> bytes vocabulary this builds on is core/steps/token_bytes.py; the display form of a token (`display_piece`,
`display_text`) is core/steps/display.py.

Never imports textual: the engine, `--headless --json` and the benchmarks use it too.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..runs.events import MultiTokenChar
from .token_bytes import MODE_BYTE_LEVEL, MODE_DECODE, TokenBytes, token_bytes

__all__ = ["DetokStep", "DetokEnd", "IncrementalDetokenizer", "oneshot_text"]

_REPLACEMENT = "\ufffd"


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
