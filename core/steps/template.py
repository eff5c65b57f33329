"""Step 1 — chat template: the prompt wrapped in the model family's own format.

A model trained as an assistant has only seen its questions inside this format; the wrong one lowers answer
quality. Models without a template (base models) read the raw prompt, and the run says so with a notice.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PromptError


@dataclass(frozen=True, slots=True)
class Templated:
    text: str  # what the model reads
    templated: bool  # False: the model has no chat template, the raw prompt is used
    add_special_tokens: bool  # tokenizer flag: the template already holds BOS etc.; raw text gets them added


def apply_template(tokenizer, prompt: str, system: str | None = None) -> Templated:
    if not prompt or not prompt.strip():
        raise PromptError("the prompt is empty: type a question (or pass --prompt TEXT)")
    if getattr(tokenizer, "chat_template", None):
        messages = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as err:  # a template that rejects e.g. a system role: say which, keep going raw
            raise PromptError(f"the model's chat template failed: {err}".splitlines()[0]) from err
        return Templated(text=text, templated=True, add_special_tokens=False)
    text = f"{system}\n\n{prompt}" if system else prompt
    return Templated(text=text, templated=False, add_special_tokens=True)


# Private-use characters: no chat template or prompt contains them, so they mark where each message lands.
_SYSTEM_MARK = "\ue000system\ue000"
_USER_MARK = "\ue001user\ue001"


def default_system_prompt(tokenizer) -> str | None:
    """The system prompt the model's chat template inserts when the user gives none (SmolLM2 and Qwen2.5 add one,
    Qwen3 none), or None.

    Read off the template itself, not a list of models: render it once with a marked system message and once
    without; whatever stands in the marked message's place in the second rendering is the default. Not every
    template has one shape (some put the date or tools in the system message), so anything that does not line
    up is reported as "none" rather than guessed."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        plain = tokenizer.apply_chat_template([{"role": "user", "content": _USER_MARK}],
                                              add_generation_prompt=True, tokenize=False)
        marked = tokenizer.apply_chat_template([{"role": "system", "content": _SYSTEM_MARK},
                                                {"role": "user", "content": _USER_MARK}],
                                               add_generation_prompt=True, tokenize=False)
    except Exception:  # a template that refuses a system role has no default system prompt either
        return None
    if _SYSTEM_MARK not in marked or _USER_MARK not in marked or _USER_MARK not in plain:
        return None
    at = marked.index(_SYSTEM_MARK)
    head = marked[:at]  # what opens the system message
    tail = marked[at + len(_SYSTEM_MARK):marked.index(_USER_MARK)]  # closes it and opens the user's
    before_user = plain[:plain.index(_USER_MARK)]
    if len(before_user) < len(head) + len(tail) or not before_user.startswith(head) \
            or not before_user.endswith(tail):
        return None
    default = before_user[len(head):len(before_user) - len(tail)]
    return default or None
