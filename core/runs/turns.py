"""A conversation of several turns, and a raw completion (issue 40, item 13): what the engine is asked for and what
it reports, torch-free, so the dashboard's process builds a request and the model process runs it (as branch points
and fan-out requests travel, core/link/protocol.py).

A follow-up turn is a run whose prompt is the whole conversation so far — the system prompt (where given), each
user message and each answer *as it was generated* (its text, and how it ended: an answer cut at the length limit
or stopped stays cut) — then the new user message, wrapped by the model's chat template. The engine keeps the KV
cache of its latest run (core/model/branch.py's `HeldCache`): the follow-up's prompt ids share a prefix with the
ids that cache holds, and only the ids past that common prefix are prefilled (core/model/turn.py). Where the
template renders an earlier turn differently the second time (Qwen3 drops an answer's <think> block from the
history; a retokenized answer may split differently from the ids generated) the common prefix is shorter: that is
what is reported, not a fault.

A raw run (`--raw`, `r` in the prompt editor) applies no chat template: the text is tokenized as is, with the
tokenizer's own special tokens (its BOS where it adds one, as llama.cpp's /completion does), and a raw follow-up
is the document so far (each message and answer, one after the other, as typed and generated) plus the new text:
a plain completion going on, as mikupad does.

The stream of a turn: TurnEvent, [Notice...], PromptEvent (the whole conversation's text and ids), [PrefillProgress...],
PrefillEvent (`tokens` the ids computed, `reused_tokens` the cached ones: their sum is the prompt), StepEvent...,
DoneEvent. `TurnEvent.reused_tokens` is None where the engine cannot know it (a served model: the server's prefix
cache decides, and it says so only where it reports cached tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..errors import PromptError
from .events import Event
from .pickling import install_fast_pickling

__all__ = ["Message", "TurnEvent", "TurnRequest", "common_prefix", "follow_up", "history_of", "kv_size", "raw_text",
           "reuse_line"]

ROLES = ("system", "user", "assistant")
# how an answer ended (DoneEvent.reason), as the history's assistant message keeps it
ENDINGS = ("eos", "length", "stopped", "context", "error", "scored")


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a conversation. `ended`: how an assistant message (an answer) ended, its run's `done` reason
    (None: not an answer, or not known)."""

    role: str
    content: str
    ended: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"a message's role is one of {', '.join(ROLES)}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise ValueError(f"a message's content is text, got {type(self.content).__name__}")
        if self.ended is not None and (self.role != "assistant" or not isinstance(self.ended, str)):
            raise ValueError("only an answer (an assistant message) says how it ended")

    def template_dict(self) -> dict:
        """The message as a chat template reads it."""
        return {"role": self.role, "content": self.content}


def _check_order(messages: tuple[Message, ...]) -> None:
    """[system] then user, assistant, user, ..., user: a conversation a chat template takes, ending with the user
    message the run answers."""
    body = messages[1:] if messages and messages[0].role == "system" else messages
    if not body:
        raise PromptError("a conversation needs a user message")
    for n, message in enumerate(body):
        wanted = "user" if n % 2 == 0 else "assistant"
        if message.role != wanted:
            raise PromptError(f"message {n + 1} of the conversation is a {message.role} message where a {wanted} "
                              "message belongs (user and assistant take turns)")
    if body[-1].role != "user":
        raise PromptError("a conversation ends with the user message the model answers")


@dataclass(frozen=True)
class TurnRequest:
    """A run over `messages` ([system], user, assistant, ..., the new user message): a follow-up turn when it holds
    an earlier answer, a first turn otherwise. `raw`: no chat template (the module docstring). `parent`: the name of
    the run it follows (its record's file name, or the tree's "#N"), None for a first turn. Checked as built: an
    empty new message is one line (PromptError), nothing is sent."""

    messages: tuple[Message, ...]
    raw: bool = False
    parent: str | None = None

    def __post_init__(self) -> None:
        messages = tuple(self.messages)
        if not all(isinstance(m, Message) for m in messages):
            raise PromptError("a conversation is a list of messages")
        object.__setattr__(self, "messages", messages)
        if not isinstance(self.raw, bool):
            raise PromptError(f"raw is true or false, got {self.raw!r}")
        if self.parent is not None and not isinstance(self.parent, str):
            raise PromptError(f"the parent run's name is text, got {type(self.parent).__name__}")
        _check_order(messages)
        if not messages[-1].content.strip():
            raise PromptError("the follow-up is empty: type a message" if self.turn > 1 else
                              "the prompt is empty: type a question (or pass --prompt TEXT)")

    @property
    def turn(self) -> int:
        """This run's turn: 1 + the answers before it."""
        return 1 + sum(m.role == "assistant" for m in self.messages)

    @property
    def system(self) -> str | None:
        return self.messages[0].content if self.messages[0].role == "system" else None

    @property
    def user(self) -> str:
        """The new user message (the one this run answers)."""
        return self.messages[-1].content

    @classmethod
    def first(cls, prompt: str, system: str | None = None, *, raw: bool = False) -> "TurnRequest":
        """A first turn: `prompt` (and `system`, where given) alone."""
        messages = ([Message("system", system)] if system else []) + [Message("user", prompt)]
        return cls(tuple(messages), raw=raw)


@dataclass(frozen=True, slots=True)
class TurnEvent(Event):
    """A run that is a turn of a conversation starts (a follow-up, or a raw run): comes first, before its prompt
    event. `turn` counts from 1; `messages` is the whole conversation the prompt holds, the new user message last;
    `parent` names the run it follows. `reused_tokens`: positions of the previous turn's KV cache reused (0: all
    prefilled afresh; None: not known, a served model's prefix cache decides); `reused_kv_bytes` the bytes those
    positions hold (None: not known). `turn_starts`: where each turn's user message starts in the prompt's ids (turn
    1 at 0; empty where it could not be found)."""

    event: ClassVar[str] = "turn"
    turn: int
    messages: list[Message]
    raw: bool = False
    parent: str | None = None
    reused_tokens: int | None = None
    reused_kv_bytes: int | None = None
    turn_starts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.turn, bool) or not isinstance(self.turn, int) or self.turn < 1:
            raise ValueError(f"a turn is numbered from 1, got {self.turn!r}")
        for name in ("reused_tokens", "reused_kv_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} is a count >= 0 (or null: not known), got {value!r}")

    @property
    def user(self) -> str:
        return self.messages[-1].content if self.messages else ""


# --------------------------------------------------------------------------------------------- words
def kv_size(nbytes: int) -> str:
    """Bytes in binary units, as the KV panel writes them (tui/format.py's human_bytes; repeated here because the
    headless command says the reuse too and must not import the dashboard)."""
    n = float(nbytes)
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            break
    return f"{n:.0f} {unit}" if n >= 100 else f"{n:.1f} {unit}"


def reuse_line(turn: TurnEvent, prefill=None) -> str:
    """What a turn's prefill computed and reused, in one line: "prefill 23 new tokens · 187 reused from turn 1 (KV
    4.1 MiB)". A served model's follow-up sends the whole conversation: what its server's prompt cache reused is
    the PrefillEvent's `reused_tokens` where the server reported it (llama-server's `timings.cache_n`), else
    "unknown", never a guess. A raw first run says it is raw. `prefill`: the turn's PrefillEvent (None: not come
    yet)."""
    if turn.turn == 1:  # a raw run: nothing before it to reuse
        computed = f"prefill {prefill.tokens} token{'s' if prefill.tokens != 1 else ''}" if prefill else \
            "prefill waiting"
        return f"raw: no chat template · {computed}" if turn.raw else computed
    local = turn.reused_tokens is not None  # the engine reused its own cache (the local engine)
    reused = turn.reused_tokens if local else (prefill.reused_tokens if prefill is not None else None)
    if prefill is None:
        computed = "prefill waiting"
    elif local:
        computed = f"prefill {prefill.tokens} new token{'s' if prefill.tokens != 1 else ''}"
    else:
        computed = f"prefill: the whole conversation sent ({prefill.tokens} tokens)"
    before = f"turn {turn.turn - 1}"
    if reused is None:
        if prefill is None:
            return computed
        return f"{computed} · reuse unknown (the server's prompt cache decides; it reported no cached tokens)"
    if not local:
        return f"{computed} · {reused} of them from the server's prompt cache (its cache_n)"
    if reused == 0:
        return f"{computed} · nothing reused from {before}"
    size = f" (KV {kv_size(turn.reused_kv_bytes)})" if turn.reused_kv_bytes else ""
    return f"{computed} · {reused} reused from {before}{size}"


# --------------------------------------------------------------------------------------------- helpers
def common_prefix(a, b) -> int:
    """The length of the longest common prefix of two id sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def raw_text(messages) -> str:
    """A raw conversation's document: every message's content, one after the other, as typed and generated (the
    system prompt has no place in a raw document and is not in it)."""
    return "".join(m.content for m in messages if m.role != "system")


def history_of(run) -> tuple[Message, ...]:
    """The conversation a finished (or stopped, or paused) run holds, its answer last: its turn's messages, or its
    prompt's system and user message, then the answer as generated (`run.text`: a branch's includes its parent's
    tokens before the branch point) and how it ended (its `done` reason; "stopped" while it has none yet).
    PromptError (one line) when the run has no answer yet."""
    turn = getattr(run, "turn", None)
    prompt = run.prompt
    if prompt is None or (len(run) == 0 and run.done is None):
        raise PromptError("no answer yet to follow up: let the model answer first")
    if run.done is not None and run.done.reason == "error" and not run.text:
        raise PromptError("the run failed before it answered: there is no answer to follow up")
    if turn is not None:
        before = tuple(turn.messages)
    else:
        before = tuple(([Message("system", prompt.system_prompt)] if prompt.system_prompt else [])
                       + [Message("user", prompt.user_prompt)])
    ended = run.done.reason if run.done is not None else "stopped"
    return before + (Message("assistant", run.text, ended=ended),)


def follow_up(run, message: str, *, raw: bool | None = None, parent: str | None = None) -> TurnRequest:
    """The follow-up turn to `run`: its history (`history_of`) and `message`. `raw`: as the run was (None) or as
    given. PromptError (one line) for a run with no answer or an empty message."""
    if not isinstance(message, str) or not message.strip():
        raise PromptError("the follow-up is empty: type a message")
    history = history_of(run)
    turn = getattr(run, "turn", None)
    was_raw = bool(turn.raw) if turn is not None else False
    return TurnRequest(history + (Message("user", message),), raw=was_raw if raw is None else raw, parent=parent)


install_fast_pickling(globals())
