"""Token bytes as a server gives them, in the shape core/steps/detokenize.py and core/steps/display.py read (a TokenBytes).

A local model's bytes come from its tokenizer; a served model's from the server: llama-server names each token's
exact bytes in its stream, other servers their text (whole UTF-8) or vLLM's "bytes:\\x.." form. What the stream
does not say is asked of the server (`lookup`: its /detokenize, with special tokens rendered) once per id.

`read_tokens` and `read_text` are the parsers of the answers about tokens (/tokenize, /detokenize,
/apply-template), checked as core/server/shape.py checks every answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..steps.token_bytes import MODE_BYTE_LEVEL, TokenBytes, _Plan
from .shape import byte_list, obj, opt_list, token_id, wrong


@dataclass(frozen=True, slots=True)
class ServedToken:
    """One token of a server's /tokenize answer: its id and, where the server gave it (llama-server's with_pieces),
    its piece: bytes (a token that is not whole UTF-8), text, or None (not given)."""

    id: int
    piece: bytes | str | None = None


def read_tokens(value, where: str) -> list[ServedToken] | None:
    """A /tokenize answer: {"tokens": [id, ...]} or llama-server's {"tokens": [{"id": ..., "piece": ...}, ...]};
    None when the answer has no `tokens` (the server cannot tokenize this way)."""
    answer = obj(value, where)
    tokens = opt_list(answer, "tokens", where)
    if tokens is None:
        return None
    out = []
    for n, token in enumerate(tokens):
        at = f"{where}: tokens[{n}]"
        if isinstance(token, dict):
            piece = token.get("piece")
            if isinstance(piece, list):
                piece = byte_list(piece, at)
            elif piece is not None and not isinstance(piece, str):
                raise wrong(at, "piece should be text or a list of bytes", piece)
            out.append(ServedToken(token_id(token.get("id"), at), piece))
        else:
            out.append(ServedToken(token_id(token, at)))
    return out


def read_text(value, keys: tuple[str, ...], where: str) -> str | None:
    """The text of an answer under the first of `keys` it has (/detokenize's "content" or "prompt", /apply-template's
    "prompt"); None when it has none of them."""
    answer = obj(value, where)
    for key in keys:
        text = answer.get(key)
        if text is not None:
            if not isinstance(text, str):
                raise wrong(where, f"{key} should be text", text)
            return text
    return None

# lookup(id) -> (bytes or None when the server's text is not whole UTF-8, the text the server renders, special)
Lookup = Callable[[int], tuple[bytes | None, str, bool]]


class ServerVocab(TokenBytes):
    """A byte-level vocabulary filled in as the server names tokens. Not built from a tokenizer: TokenBytes'
    own __init__ (which reads one) is not called; the lookups it serves are overridden here."""

    def __init__(self, lookup: Lookup | None = None) -> None:  # noqa: super().__init__ reads a tokenizer
        self.tokenizer = None
        self._backend = None
        self._plan = _Plan(MODE_BYTE_LEVEL)
        self._special: set[int] = set()
        self._strings: dict[int, str | None] = {}
        self._bytes: dict[int, bytes] = {}
        self._unknown: set[int] = set()  # ids whose bytes the server could not give
        self._first = {}
        self._byte_values = {}
        self._size = -1
        self._lookup = lookup

    def learn(self, token_id: int | None, data: bytes | None, text: str = "") -> None:
        """Bytes (and text) the stream gave for `token_id`; a token the server renders as nothing (a control
        token) is looked up, which says whether it is special."""
        if token_id is None or token_id in self._bytes:
            return
        if data == b"" and self._lookup is not None:
            self._resolve(token_id)
            return
        if data is None:
            self._resolve(token_id)
            return
        self._bytes[token_id] = data
        self._strings[token_id] = text or data.decode("utf-8", errors="replace")

    def _resolve(self, token_id: int) -> None:
        if self._lookup is None:
            self._bytes[token_id] = b""
            self._unknown.add(token_id)
            self._strings[token_id] = f"token_id:{token_id}"
            return
        data, text, special = self._lookup(token_id)
        if special:
            self._special.add(token_id)
            self._bytes[token_id] = b""
        elif data is None:  # part of a character: the server's text for it is U+FFFD, its bytes unknown
            self._bytes[token_id] = b""
            self._unknown.add(token_id)
            text = ""
        else:
            self._bytes[token_id] = data
        self._strings[token_id] = text or f"token_id:{token_id}"

    def known(self, token_id: int) -> bool:
        return token_id in self._bytes

    def bytes_unknown(self, token_id: int) -> bool:
        return token_id in self._unknown

    def is_special(self, token_id: int) -> bool:
        return int(token_id) in self._special

    def token_string(self, token_id: int) -> str | None:
        return self._strings.get(int(token_id))

    def __getitem__(self, token_id: int) -> bytes:
        token_id = int(token_id)
        if token_id not in self._bytes:
            self._resolve(token_id)
        return self._bytes[token_id]

    def first(self, token_id: int) -> bytes:
        return self[token_id]

    def byte_value(self, token_id: int) -> int | None:
        return None
