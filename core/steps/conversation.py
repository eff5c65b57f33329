"""Step 1 for a conversation (core/runs/turns.py): every message so far wrapped by the model's chat template, or,
for a raw run, the text as is.

The template is transformers' own `apply_chat_template` over the whole history plus the new user message (with the
generation prompt), so the ids a follow-up's prompt has are exactly what the model's template makes of that
conversation — including what it does to earlier turns (Qwen3's drops an answer's <think> block).
"""

from __future__ import annotations

from ..errors import PromptError
from ..runs.turns import TurnRequest, common_prefix, raw_text
from .template import Templated

RAW_LABEL = "raw: no chat template"  # what the prompt panel and the notices call a raw run


def render_conversation(tokenizer, request: TurnRequest) -> Templated:
    """The text the model reads for `request`: the chat template over its messages, or (raw, or a model with no
    template) the messages' text one after the other, tokenized with the tokenizer's own special tokens."""
    if request.raw:
        return Templated(text=raw_text(request.messages), templated=False, add_special_tokens=True)
    if not getattr(tokenizer, "chat_template", None):
        system = request.system
        body = raw_text(request.messages)
        return Templated(text=f"{system}\n\n{body}" if system else body, templated=False, add_special_tokens=True)
    try:
        text = tokenizer.apply_chat_template([m.template_dict() for m in request.messages],
                                             add_generation_prompt=True, tokenize=False)
    except Exception as err:  # a template that rejects e.g. a system role or a second turn: say which
        raise PromptError(f"the model's chat template failed: {err}".splitlines()[0]) from err
    return Templated(text=text, templated=True, add_special_tokens=False)


def turn_starts(tokenizer, request: TurnRequest, ids: list[int]) -> list[int]:
    """Where each turn's user message starts in `ids` (the request's prompt ids): turn 1 at 0, turn k at the
    common prefix of `ids` with the conversation up to turn k - 1's answer, rendered the same way (without the
    generation prompt). Empty where a rendering fails (a template that will not end on an answer)."""
    messages = request.messages
    starts = [0]
    for n, message in enumerate(messages):
        if message.role != "assistant":
            continue
        head = messages[:n + 1]
        try:
            if request.raw or not getattr(tokenizer, "chat_template", None):
                text = raw_text(head)
                special = True
            else:
                text = tokenizer.apply_chat_template([m.template_dict() for m in head], add_generation_prompt=False,
                                                     tokenize=False)
                special = False
            head_ids = tokenizer(text, add_special_tokens=special)["input_ids"]
        except Exception:  # a template that refuses to end on an answer: no marks, the ids are still right
            return []
        starts.append(min(common_prefix(head_ids, ids), len(ids)))
    return starts
