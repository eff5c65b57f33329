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

# Pieces worth asking whether they are special: a special token's text is a bracketed name (<|im_start|>, <s>,
# [INST]); asking about every piece would cost one request per distinct prompt token.
_LOOKS_SPECIAL = re.compile(r"^(<[^<>\s]+>|\[[^\[\]\s]+\])$")


def build_prompt(conn: Connection, dialect: Dialect, model: str, prompt: str, system: str | None
                 ) -> tuple[list[Notice], PromptEvent]:
    messages = ([{"role": "system", "content": system}] if system is not None else []) + \
        [{"role": "user", "content": prompt}]
    notices: list[Notice] = []
    text: str | None = None
    ids: list[int] | None = None
    if dialect.llama_cpp:
        answer = conn.post_json("/apply-template", {"messages": messages}, quiet_statuses=QUIET)
        if isinstance(answer, dict) and isinstance(answer.get("prompt"), str):
            text = answer["prompt"]
    else:
        answer = conn.post_json("/tokenize", {"model": model, "messages": messages, "add_generation_prompt": True},
                                quiet_statuses=QUIET)
        if isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
            ids = [int(i) for i in answer["tokens"]]
            back = conn.post_json("/detokenize", {"model": model, "tokens": ids}, quiet_statuses=QUIET)
            if isinstance(back, dict) and isinstance(back.get("prompt"), str):
                text = back["prompt"]
    templated = text is not None or ids is not None
    if not templated:
        notices.append(Notice(f"the server ({dialect.engine}) exposes no chat-template endpoint: the prompt is "
                              "sent as raw text, without the chat template"))
        text = prompt if system is None else f"{system}\n\n{prompt}"
    pieces = _tokenize(conn, dialect, model, text, ids)
    if pieces is None:
        raise ServerError(f"{conn.address.url}{dialect.tokenize}: the server cannot tokenize, so tokentui cannot "
                          "show the prompt's tokens nor continue from a prefix after a settings change")
    return notices, PromptEvent(text=text or "", ids=[p.id for p in pieces], pieces=pieces, templated=templated,
                                user_prompt=prompt, system_prompt=system)


def _tokenize(conn: Connection, dialect: Dialect, model: str, text: str, ids: list[int] | None
              ) -> list[PromptPiece] | None:
    if dialect.llama_cpp:
        answer = conn.post_json("/tokenize", {"content": text, "add_special": False, "parse_special": True,
                                              "with_pieces": True}, quiet_statuses=QUIET)
        if not isinstance(answer, dict) or not isinstance(answer.get("tokens"), list):
            return None
        raw = [(int(t["id"]), t.get("piece")) for t in answer["tokens"] if isinstance(t, dict)]
        shown = [(i, display_bytes(bytes(p)) if isinstance(p, list) else display_text(str(p))) for i, p in raw]
    else:
        body = {"model": model, "prompt": text, "add_special_tokens": False, "return_token_strs": True}
        if ids is None:
            answer = conn.post_json("/tokenize", body, quiet_statuses=QUIET)
            if not isinstance(answer, dict) or not isinstance(answer.get("tokens"), list):
                return None
            ids = [int(i) for i in answer["tokens"]]
            strs = answer.get("token_strs")
        else:
            strs = None
        if not isinstance(strs, list) or len(strs) != len(ids):
            strs = [None] * len(ids)
        shown = [(i, display_text(s) if isinstance(s, str) else f"token_id:{i}") for i, s in zip(ids, strs)]
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
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if isinstance(tokens, list) and [t if isinstance(t, int) else t.get("id") for t in tokens] != [token_id]:
            special.add(token_id)
    return special
