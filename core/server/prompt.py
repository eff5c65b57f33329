"""Steps 1 and 2 for a served model: the chat template rendered and the prompt tokenized by the server itself
(llama-server's /apply-template and /tokenize; vLLM's and SGLang's /tokenize with messages, /detokenize), so
the ids tokentui sends are the ones the server would have made. What the server cannot do is said in a Notice."""

from __future__ import annotations

import re

from ..steps.display import display_bytes, display_text
from ..runs.events import Notice, PromptEvent, PromptPiece
from ..errors import ServerError
from .http import Connection
from .probe import QUIET, Dialect
from .shape import obj, opt_list, wrong
from .vocab import read_text, read_tokens

# Pieces worth asking whether they are special: a special token's text is a bracketed name (<|im_start|>, <s>,
# [INST]); asking about every piece would cost one request per distinct prompt token.
_LOOKS_SPECIAL = re.compile(r"^(<[^<>\s]+>|\[[^\[\]\s]+\])$")


def build_prompt(conn: Connection, dialect: Dialect, model: str, prompt: str, system: str | None,
                 conversation: list[dict] | None = None) -> tuple[list[Notice], PromptEvent]:
    """The prompt event of `prompt` (and `system`), or of a whole `conversation` (a follow-up turn's messages, the
    new user message last: core/runs/turns.py; `prompt` is that message): the server renders its template over every
    message, as it keeps no state between requests."""
    messages = conversation if conversation is not None else \
        ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": prompt}]
    notices: list[Notice] = []
    text: str | None = None
    ids: list[int] | None = None
    url = conn.address.url
    if dialect.llama_cpp:
        answer = conn.post_json("/apply-template", {"messages": messages}, quiet_statuses=QUIET)
        if answer is not None:
            text = read_text(answer, ("prompt",), f"{url}/apply-template")
    else:
        answer = conn.post_json("/tokenize", {"model": model, "messages": messages, "add_generation_prompt": True},
                                quiet_statuses=QUIET)
        tokens = read_tokens(answer, f"{url}/tokenize") if answer is not None else None
        if tokens is not None:
            ids = [t.id for t in tokens]
            back = conn.post_json("/detokenize", {"model": model, "tokens": ids}, quiet_statuses=QUIET)
            if back is not None:
                text = read_text(back, ("prompt",), f"{url}/detokenize")
    templated = text is not None or ids is not None
    if not templated:
        notices.append(Notice(f"the server ({dialect.engine}) exposes no chat-template endpoint: the prompt is "
                              "sent as raw text, without the chat template"))
        body = "".join(m["content"] for m in messages if m["role"] != "system") if conversation else prompt
        text = body if system is None else f"{system}\n\n{body}"
    pieces = _tokenize(conn, dialect, model, text, ids)
    if pieces is None:
        raise ServerError(f"{conn.address.url}{dialect.tokenize}: the server cannot tokenize, so tokentui cannot "
                          "show the prompt's tokens nor continue from a prefix after a settings change")
    return notices, PromptEvent(text=text or "", ids=[p.id for p in pieces], pieces=pieces, templated=templated,
                                user_prompt=prompt, system_prompt=system)


def raw_prompt(conn: Connection, dialect: Dialect, model: str, text: str, user: str) -> PromptEvent:
    """A raw run's prompt event (core/runs/turns.py): `text` tokenized by the server as is, with its own special
    tokens (its BOS where the model adds one, as its completion endpoint does with a text prompt); no template."""
    pieces = _tokenize(conn, dialect, model, text, None, add_special=True)
    if pieces is None:
        raise ServerError(f"{conn.address.url}{dialect.tokenize}: the server cannot tokenize, so tokentui cannot "
                          "show the raw prompt's tokens nor continue from a prefix after a settings change")
    return PromptEvent(text=text, ids=[p.id for p in pieces], pieces=pieces, templated=False, user_prompt=user)


def _tokenize(conn: Connection, dialect: Dialect, model: str, text: str, ids: list[int] | None,
              add_special: bool = False) -> list[PromptPiece] | None:
    """The pieces of `text` as the server tokenizes it (`add_special`: with the special tokens it adds, e.g. BOS)."""
    where = f"{conn.address.url}/tokenize"
    if dialect.llama_cpp:
        answer = conn.post_json("/tokenize", {"content": text, "add_special": add_special, "parse_special": True,
                                              "with_pieces": True}, quiet_statuses=QUIET)
        tokens = read_tokens(answer, where) if answer is not None else None
        if tokens is None:
            return None
        shown = [(t.id, display_bytes(t.piece) if isinstance(t.piece, bytes) else
                  display_text(t.piece) if t.piece is not None else f"token_id:{t.id}") for t in tokens]
    else:
        body = {"model": model, "prompt": text, "add_special_tokens": add_special, "return_token_strs": True}
        strs = None
        if ids is None:
            answer = conn.post_json("/tokenize", body, quiet_statuses=QUIET)
            tokens = read_tokens(answer, where) if answer is not None else None
            if tokens is None:
                return None
            ids = [t.id for t in tokens]
            strs = opt_list(obj(answer, where), "token_strs", where)
        if strs is None or len(strs) != len(ids):
            strs = [None] * len(ids)
        for n, piece in enumerate(strs):
            if piece is not None and not isinstance(piece, str):
                raise wrong(f"{where}: token_strs[{n}]", "should be text", piece)
        shown = [(i, display_text(s) if s is not None else f"token_id:{i}") for i, s in zip(ids, strs)]
    special = _special_ids(conn, dialect, model, {i: p for i, p in shown if _LOOKS_SPECIAL.match(p)})
    return [PromptPiece(id=i, piece=p, special=i in special) for i, p in shown]


def _special_ids(conn: Connection, dialect: Dialect, model: str, candidates: dict[int, str]) -> set[int]:
    """The ids among `candidates` that are special: their text, tokenized as plain text, is not that one token."""
    special = set()
    for token_id, text in candidates.items():
        if dialect.llama_cpp:
            body = {"content": text, "add_special": False, "parse_special": False}
        else:
            body = {"model": model, "prompt": text, "add_special_tokens": False}
        answer = conn.post_json("/tokenize", body, quiet_statuses=QUIET)
        tokens = read_tokens(answer, f"{conn.address.url}/tokenize") if answer is not None else None
        if tokens is not None and [t.id for t in tokens] != [token_id]:
            special.add(token_id)
    return special
