"""The system prompt a chat template inserts when the user gives none, read off the template (the edit dialog says
what an empty field means with it)."""

from __future__ import annotations

import copy

import pytest

from tokentui.core.steps.template import apply_template, default_system_prompt

pytestmark = pytest.mark.slow

# The shapes of Qwen2.5's (a default system message) and Qwen3's (none) templates, reduced to the system part.
QWEN25_LIKE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if message.role != 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QWEN3_LIKE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
NO_SYSTEM_ROLE = (
    "{%- for message in messages %}{%- if message.role == 'system' %}{{ raise_exception('no system role') }}"
    "{%- endif %}{{- message.role + ': ' + message.content + '\\n' }}{%- endfor %}"
)


def with_template(tokenizer, template):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    return tok


def test_smollm2_default_is_what_its_template_writes(smol_tokenizer):
    default = default_system_prompt(smol_tokenizer)
    assert default == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    # oracle: the templated prompt without a system prompt carries exactly that text where a given one would go
    assert apply_template(smol_tokenizer, "hi").text == apply_template(smol_tokenizer, "hi", default).text


@pytest.mark.parametrize("template,expected", [
    (QWEN25_LIKE, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
    (QWEN3_LIKE, None),
    (NO_SYSTEM_ROLE, None),
    (None, None),
])
def test_other_template_shapes(smol_tokenizer, template, expected):
    tok = with_template(smol_tokenizer, template)
    assert default_system_prompt(tok) == expected
    if expected is not None:
        assert apply_template(tok, "hi").text == apply_template(tok, "hi", expected).text


def test_the_engine_reports_the_default_with_every_prompt(smol_tokenizer):
    """The edit dialog reads it off the run's prompt event."""
    from tiny_models import tiny_model
    from tokentui.core.model.engine import Engine
    from tokentui.core.runs.events import PromptEvent
    from tokentui.core.model.load.loader import LoadedModel, model_facts
    from tokentui.core.settings import RunOptions, SamplerSettings

    model = tiny_model("llama", smol_tokenizer)
    loaded = LoadedModel(model=model, tokenizer=smol_tokenizer, facts=model_facts(model, smol_tokenizer, name="tiny"))
    engine = Engine(loaded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=2), )
    prompt = next(e for e in engine.run("hi") if isinstance(e, PromptEvent))
    assert prompt.default_system_prompt == default_system_prompt(smol_tokenizer)
    assert prompt.default_system_prompt and prompt.default_system_prompt in prompt.text
