"""Step 1 — chat template: the prompt wrapped in the model family's own format.

A model trained as an assistant has only seen its questions inside this format; the wrong one lowers answer
quality. Models without a template (base models) read the raw prompt, and the run says so with a notice.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import PromptError


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
