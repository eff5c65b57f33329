"""FileTokenizer (core/model/load/file_tokenizer.py) against its oracle, transformers' tokenizer read from the same
folder: the same ids, text, special tokens and rendered chat templates, for a byte-level BPE (SmolLM2's), a
SentencePiece-style byte-fallback BPE with Llama-2's template, a template using every global and extension
transformers' sandbox gives, and Qwen2Tokenizer as a GGUF's first start saves it (tokenizer_cache.py's `settled`).
The probe (`agrees`) can fail: it names the first difference, which is how a folder it does not read the same way
keeps transformers' tokenizer. And the module reads and renders without importing transformers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, processors
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from gguf_fixtures import gguf_tools, tokenizer_folder  # noqa: F401  (gguf_tools: a fixture)
from tokentui.core.model.load.file_tokenizer import FileTokenizer, agrees

LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
          "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
          "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
          "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
          "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
          "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
          "{% endfor %}")
# every global, filter and extension transformers' sandbox adds: namespace, dict, tojson, loop controls, generation
EVERYTHING = ("{%- set ns = namespace(n=0) -%}{%- set d = dict(a=1) -%}{%- for m in messages -%}"
              "{%- if m.role == 'system' %}[{{ m.content | tojson }}]{% continue %}{% endif -%}"
              "{%- set ns.n = ns.n + 1 -%}<{{ m.role }} n={{ ns.n }} a={{ d.a }}>"
              "{%- if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
              "{% else %}{{ m.content | trim }}{% endif %}</{{ m.role }}>\n"
              "{%- if ns.n > 5 %}{% break %}{% endif -%}{%- endfor -%}"
              "{%- if add_generation_prompt %}<assistant>{{ eos_token }}{% endif -%}\n"
              "{% for m in messages %}\n    {% if m.role == 'user' %}\nU: {{ m.content }}\n    {% endif %}\n"
              "{% endfor %}\n")  # the last lines: block tags on lines of their own (trim_blocks, lstrip_blocks)
NO_SYSTEM = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
             "{{ m.role }}: {{ m.content }}\n{% endfor %}")
ESCAPE = "{% set ns = namespace() %}{% set ns._private = 1 %}{{ messages[0].content }}"


def byte_fallback_tokenizer(template: str) -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE (▁ for spaces, <0xNN> bytes, BOS added by the post-processor), as Llama-2's."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ("▁", "h", "i", "▁h", "▁hi", "e", "l", "o", "▁he", "▁hel", "▁hell", "▁hello", "a", "b", "c", "n", "s", "t"):
        vocab.setdefault(piece, len(vocab))
    merges = [("▁", "h"), ("▁h", "i"), ("▁h", "e"), ("▁he", "l"), ("▁hel", "l"), ("▁hell", "o")]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   chat_template=template)


def saved(tokenizer, folder):
    tokenizer.save_pretrained(folder)
    return FileTokenizer.from_folder(folder), AutoTokenizer.from_pretrained(folder)


def test_smollm2s_tokenizer_answers_as_transformers():
    mine, theirs = FileTokenizer.from_folder(tokenizer_folder()), AutoTokenizer.from_pretrained(tokenizer_folder())
    assert agrees(mine, theirs) is None
    messages = [{"role": "user", "content": "Is OpenAI open?"}]
    text = mine.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "You are a helpful AI assistant named SmolLM" in text  # its default system prompt, rendered
    ids = mine(text, add_special_tokens=False)["input_ids"]
    assert ids == theirs(text, add_special_tokens=False)["input_ids"] and mine.eos_token_id in ids
    assert mine.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)
    assert (len(mine), mine.all_special_ids) == (len(theirs), theirs.all_special_ids)


@pytest.mark.parametrize("template", [LLAMA2, EVERYTHING, NO_SYSTEM], ids=["llama-2", "every global", "refuses"])
def test_a_byte_fallback_tokenizer_and_its_templates_answer_as_transformers(tmp_path, template):
    mine, theirs = saved(byte_fallback_tokenizer(template), tmp_path)
    assert agrees(mine, theirs) is None
    for messages in ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": " hello "}],
                     [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                      {"role": "user", "content": "abc"}]):
        try:
            expected = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as err:  # the template refuses: so must ours, with the template's message
            with pytest.raises(type(err), match=str(err)):
                mine.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            continue
        assert mine.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == expected
    ids = mine.encode("hello hi 开放 👋")  # the BOS its post-processor adds, raw bytes for what the vocabulary lacks
    assert ids == theirs.encode("hello hi 开放 👋") and ids[0] == mine.bos_token_id == 1
    assert mine.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True) == "hello hi 开放 👋"


def test_the_sandbox_refuses_what_transformers_refuses(tmp_path):
    mine, theirs = saved(byte_fallback_tokenizer(ESCAPE), tmp_path)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(Exception, match="underscore-prefixed") as refused:
        theirs.apply_chat_template(messages, tokenize=False)
    with pytest.raises(type(refused.value), match="underscore-prefixed"):
        mine.apply_chat_template(messages, tokenize=False)


@pytest.mark.slow
@pytest.mark.usefixtures("gguf_tools")
def test_a_qwen2_tokenizer_agrees_once_settled_and_the_probe_names_the_difference_before(tmp_path):
    """Qwen2Tokenizer made from a GGUF splits with GPT-2's pattern; read back from its folder it rebuilds Qwen's. The
    folder saved straight from it is read by FileTokenizer as saved, which the probe finds differs; settled (saved and
    read back, as a first start now does) the two agree."""
    from gguf_fixtures import tiny_gguf
    from tokentui.core.model.load.tokenizer_cache import settled

    path = tiny_gguf("qwen3", "Q8_0", tied=True)
    from_gguf = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    assert type(from_gguf).__name__ == "Qwen2Tokenizer"
    mine, theirs = saved(from_gguf, tmp_path / "unsettled")
    assert agrees(mine, theirs) is not None  # the probe can fail
    assert mine.encode("a\n\nb") != theirs.encode("a\n\nb")
    mine, theirs = saved(settled(from_gguf), tmp_path / "settled")
    assert agrees(mine, theirs) is None
    assert mine.encode("a\n\nb") == theirs.encode("a\n\nb") == settled(from_gguf).encode("a\n\nb")


@pytest.mark.parametrize("config, why", [({"chat_template": [{"name": "default", "template": "x"}]}, "named"),
                                         ({"image_token": "<s>"}, "model-specific"),
                                         ({"extra_special_tokens": {"a": "<s>"}}, "named extra")])
def test_a_folder_it_does_not_read_as_transformers_does_is_refused(tmp_path, config, why):
    byte_fallback_tokenizer(LLAMA2).save_pretrained(tmp_path)
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    if "chat_template" in config:
        (tmp_path / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match=why):
        FileTokenizer.from_folder(tmp_path)


def test_it_reads_and_renders_without_importing_transformers():
    code = ("import sys\nfrom tokentui.core.model.load.file_tokenizer import FileTokenizer\n"
            f"t = FileTokenizer.from_folder({str(tokenizer_folder())!r})\n"
            "text = t.apply_chat_template([{'role': 'user', 'content': 'hi'}], add_generation_prompt=True, "
            "tokenize=False)\n"
            "assert t.decode(t.encode(text), skip_special_tokens=False) == text\n"
            "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_copy_takes_another_template_and_the_original_keeps_its_own():
    import copy

    original = FileTokenizer.from_folder(tokenizer_folder())
    messages = [{"role": "user", "content": "hi"}]
    before = original.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)  # compiled now
    other = copy.deepcopy(original)
    other.chat_template = NO_SYSTEM
    assert other.apply_chat_template(messages, tokenize=False) == "user: hi\n"
    assert original.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == before
    assert other.encode("Is OpenAI open?") == original.encode("Is OpenAI open?")
