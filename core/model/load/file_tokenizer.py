"""A model's tokenizer read back from the folder tokentui cached it in (tokenizer.json, tokenizer_config.json and
chat_template.jinja, as transformers' `save_pretrained` wrote them) with `tokenizers` and jinja2 alone.

Why not transformers' own class: on a start that has the file's tokenizer cached, transformers' tokenizer classes
parse tokenizer.json in Python and build the BPE again (0.27 s for a 151,936-entry vocabulary, against 0.15 s for
`tokenizers` reading the same file), and importing transformers costs ~0.5 s (its package) to ~1.3 s (with its
modeling) of a start that llama-server makes whole in ~1.2 s (BENCHMARKS.md, issue 37). What the engine asks of a
tokenizer is done here by the same Rust tokenizer transformers wraps (`backend_tokenizer`), and the chat template is
rendered in the same jinja2 sandbox, with the same options, globals and filters, as transformers'
`render_jinja_template` (utils/chat_template_utils.py, 5.x).

It stands in for transformers' tokenizer only where it gave the same answers as transformers' on the file's first
start (`agrees`, run where the cache folder is written: core/model/load/tokenizer_cache.py's `save_tokenizer`);
a folder it cannot read as it reads it (named templates, model-specific special tokens) is refused with ValueError.
This module never imports transformers (tests/unit/test_file_tokenizer.py checks it in a fresh process).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

__all__ = ["FileTokenizer", "agrees"]

# transformers' PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES, in its order (all_special_tokens lists them so)
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_CONFIG = "tokenizer_config.json"
_TEMPLATE = "chat_template.jinja"
_TEMPLATES_DIR = "additional_chat_templates"


def _content(value, key: str) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's dict."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"{key}: a special token of another form ({type(value).__name__})")


class FileTokenizer:
    """The members of transformers' tokenizer that tokentui uses, over a `tokenizers.Tokenizer` and a chat template.
    Build one with `from_folder`."""

    def __init__(self, backend, special: dict[str, str], extra: list[str], chat_template: str | None,
                 clean_up: bool = False, name_or_path: str = ""):
        self.backend_tokenizer = backend
        self.chat_template = chat_template
        self.clean_up_tokenization_spaces = clean_up
        self.name_or_path = name_or_path  # the folder it was read from (transformers' attribute of that name)
        self._special = dict(special)
        self._extra = list(extra)
        for token in (*self._special.values(), *self._extra):
            if backend.token_to_id(token) is None:
                raise ValueError(f"the special token {token!r} is not in the vocabulary")

    @property
    def chat_template(self) -> str | None:
        return self._source

    @chat_template.setter
    def chat_template(self, source: str | None) -> None:
        self._source = source
        self._template = None  # compiled on first use

    def __getstate__(self) -> dict:  # a copy compiles the template again (jinja2's Template is not copyable)
        return {**self.__dict__, "_template": None}

    @classmethod
    def from_folder(cls, folder: Path) -> "FileTokenizer":
        """The tokenizer saved in `folder`; ValueError (one line) for what is not read here, OSError for a missing
        file."""
        from tokenizers import Tokenizer

        folder = Path(folder)
        config = json.loads((folder / _CONFIG).read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise ValueError(f"{_CONFIG} is not an object")
        if (folder / _TEMPLATES_DIR).exists():
            raise ValueError("named chat templates (transformers chooses among them)")
        template_file = folder / _TEMPLATE
        template = template_file.read_text(encoding="utf-8") if template_file.is_file() else config.get("chat_template")
        if template is not None and not isinstance(template, str):
            raise ValueError("named chat templates (transformers chooses among them)")
        special = {name: token for name in SPECIAL_NAMES
                   if (token := _content(config.get(name), name)) is not None}
        others = [key for key, value in config.items() if key.endswith("_token") and key not in SPECIAL_NAMES
                  and value is not None]
        if others:
            raise ValueError(f"model-specific special tokens ({', '.join(sorted(others))})")
        extra = config.get("extra_special_tokens", config.get("additional_special_tokens")) or []
        if not isinstance(extra, (list, tuple)):
            raise ValueError("named extra special tokens")
        extra = [_content(token, "extra_special_tokens") for token in extra]
        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
        return cls(backend, special, extra, template or None, bool(config.get("clean_up_tokenization_spaces")),
                   str(folder))

    # ------------------------------------------------------------------------------------------ special tokens
    @property
    def special_tokens_map(self) -> dict[str, str]:
        return dict(self._special)

    @property
    def all_special_tokens(self) -> list[str]:
        seen: list[str] = []
        for token in (*self._special.values(), *self._extra):
            if token not in seen:
                seen.append(token)
        return seen

    @property
    def all_special_ids(self) -> list[int]:
        return [self.backend_tokenizer.token_to_id(token) for token in self.all_special_tokens]

    def _id(self, name: str) -> int | None:
        token = self._special.get(name)
        return None if token is None else self.backend_tokenizer.token_to_id(token)

    bos_token = property(lambda self: self._special.get("bos_token"))
    eos_token = property(lambda self: self._special.get("eos_token"))
    unk_token = property(lambda self: self._special.get("unk_token"))
    pad_token = property(lambda self: self._special.get("pad_token"))
    bos_token_id = property(lambda self: self._id("bos_token"))
    eos_token_id = property(lambda self: self._id("eos_token"))
    unk_token_id = property(lambda self: self._id("unk_token"))
    pad_token_id = property(lambda self: self._id("pad_token"))

    @property
    def added_tokens_decoder(self) -> dict:
        return self.backend_tokenizer.get_added_tokens_decoder()

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    # ------------------------------------------------------------------------------------------ text <-> ids
    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text to encode must be a string, got {type(text).__name__}")
        return list(self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool | None = None) -> str:
        """The Rust tokenizer's decode, without transformers' clean-up of spaces before punctuation: tokentui never
        asks for it (a stream cannot take back a space it showed), so asking for it (or, with None, a folder whose
        config turns it on) is a ValueError rather than a second copy of transformers' rule."""
        clean = self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        if clean:
            raise ValueError("FileTokenizer decodes without clean_up_tokenization_spaces (pass False)")
        ids = [int(ids)] if isinstance(ids, int) else [int(i) for i in ids]
        return self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self.backend_tokenizer.token_to_id(tokens)
        return [self.backend_tokenizer.token_to_id(t) for t in tokens]

    # ------------------------------------------------------------------------------------------ chat template
    def apply_chat_template(self, conversation, add_generation_prompt: bool = False, tokenize: bool = True,
                            **kwargs) -> str:
        """The chat template over `conversation` (messages as dicts), rendered as transformers renders it for
        messages of plain strings: each message a fresh dict without its None values, the template given `messages`,
        `tools` and `documents` (None), `add_generation_prompt`, the special tokens by name, then `kwargs`.
        Text only (`tokenize=False`, the one way tokentui calls it)."""
        if tokenize:
            raise ValueError("FileTokenizer renders a chat template as text only (pass tokenize=False)")
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        messages = []
        for message in conversation:
            if not isinstance(message, dict) or not all(isinstance(v, (str, type(None))) for v in message.values()):
                raise TypeError("FileTokenizer renders messages whose values are strings")
            messages.append({str(k): v for k, v in message.items() if v is not None})
        if self._template is None:
            self._template = _compile(self.chat_template)
        return self._template.render(messages=messages, tools=None, documents=None,
                                     add_generation_prompt=add_generation_prompt, **{**self._special, **kwargs})


def _compile(source: str):
    """`source` compiled in the sandbox transformers renders chat templates in (`_cached_compile_jinja_template`):
    an immutable sandbox trimming blocks, loop controls, its `{% generation %}` tag (rendered as its body: the
    assistant mask it tracks is not asked for here), and its globals and `tojson` filter."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        @staticmethod
        def _body(caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}.")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(source)


# ---------------------------------------------------------------------------------------------- the verdict
# What `agrees` asks both tokenizers: text that crosses every kind of piece a vocabulary splits differently (spaces
# and runs of them, newlines and tabs, digits, punctuation, accents, CJK, an emoji of several code points), each
# special token inside text, and conversations of each shape tokentui renders.
_PROBE = ("Is OpenAI open?  The model writes one token at a time:\n\t1,234.5 tokens/s — déjà vu, naïve café. "
          "什么是大语言模型？ 开放吗？ 👋🏽 e\u0301 ' '' \"quoted\" (parens) [brackets] {braces} <tag> a_b-c/d\\e ~!@#$%^&*")
_CONVERSATIONS = (
    [{"role": "user", "content": "Is OpenAI open?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "什么是KV cache？"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": "  spaces  and\nnewlines "}],
)


def _answers(tokenizer) -> dict:
    """What the engine asks of a tokenizer, asked of `tokenizer` (an exception's type stands for its answer)."""
    def ask(call):
        try:
            return call()
        except Exception as err:  # both tokenizers must fail alike
            return f"raised {type(err).__name__}"

    specials = list(tokenizer.all_special_tokens)
    text = _PROBE + " ".join(specials) + _PROBE.join(specials)
    size = len(tokenizer)
    sweep = sorted({*range(min(size, 512)), *range(max(0, size - 256), size),
                    *(int(i) for i in tokenizer.backend_tokenizer.get_added_tokens_decoder())})
    answers = {
        "len": size, "special_tokens_map": dict(tokenizer.special_tokens_map), "all_special_ids":
        list(tokenizer.all_special_ids), "ids": [tokenizer.bos_token_id, tokenizer.eos_token_id,
                                                 tokenizer.pad_token_id, tokenizer.unk_token_id],
        "chat_template": tokenizer.chat_template, "tokens": tokenizer.convert_ids_to_tokens(sweep),
        "sweep_decoded": [tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                          for i in sweep],
    }
    for special in (True, False):
        ids = tokenizer(text, add_special_tokens=special)["input_ids"]
        answers[f"encode {special}"] = list(ids)
        answers[f"encode() {special}"] = list(tokenizer.encode(text, add_special_tokens=special))
        for skip in (True, False):
            answers[f"decode {special} {skip}"] = tokenizer.decode(ids, skip_special_tokens=skip,
                                                                   clean_up_tokenization_spaces=False)
    if tokenizer.chat_template:
        for n, conversation in enumerate(_CONVERSATIONS):
            for prompt in (True, False):
                answers[f"template {n} {prompt}"] = ask(lambda: tokenizer.apply_chat_template(
                    [dict(m) for m in conversation], add_generation_prompt=prompt, tokenize=False))
    return answers


def agrees(mine: FileTokenizer, theirs) -> str | None:
    """None where `mine` answers every question of the probe as transformers' `theirs` does (the same ids, text,
    special tokens, vocabulary size and rendered conversations), else the first question they differ on."""
    a, b = _answers(mine), _answers(theirs)
    for key in b:
        if a.get(key) != b[key]:
            return key
    return None
