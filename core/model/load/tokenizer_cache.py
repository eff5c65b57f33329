"""A converted model's tokenizer in tokentui's cache folders: settled on the first start, read back fast on later ones.

`settled(tokenizer)` is what a file's first start runs with: the tokenizer transformers made from the file, saved and
read back as every later start reads it. The two can differ: transformers' Qwen2Tokenizer, made from a GGUF's
vocabulary, splits text with GPT-2's pattern, but read back from the folder it saved it rebuilds Qwen's own
pre-tokenizer (digits one by one, newlines together) — so a first start and the starts after it tokenized the same
prompt differently. Settled, they cannot.

`cached_tokenizer(folder)` reads a cache folder's tokenizer: with `tokenizers` and jinja2 alone
(core/model/load/file_tokenizer.py's FileTokenizer) where the folder's verdict says it answered every question of its
probe as transformers' tokenizer does, with the libraries it was compared with; else transformers' own, compared once
and its verdict kept for the next start.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .file_tokenizer import FileTokenizer, agrees

__all__ = ["VERDICT", "cached_tokenizer", "save_tokenizer", "settled"]

VERDICT = "file_tokenizer.json"  # in a cache folder: whether FileTokenizer stands in for transformers' tokenizer
FORMAT = 1  # bump when FileTokenizer or its probe changes what it answers


def _libraries() -> dict:
    """What a verdict holds for: this module's format and the libraries FileTokenizer reads and renders with
    (transformers' version is in the cache folder's own key)."""
    import jinja2
    import tokenizers

    return {"format": FORMAT, "tokenizers": tokenizers.__version__, "jinja2": jinja2.__version__}


def settled(tokenizer):
    """`tokenizer` (made by transformers from a model file) saved and read back by transformers: the tokenizer every
    later start reads from the cache folder."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="tokentui-tokenizer-") as tmp:
        tokenizer.save_pretrained(tmp)
        return AutoTokenizer.from_pretrained(tmp)


def save_tokenizer(folder: Path, tokenizer) -> bool:
    """Save `tokenizer` in the cache folder being written, with its verdict: -> whether a later start may read it
    with FileTokenizer."""
    tokenizer.save_pretrained(folder)
    return _keep_verdict(folder, tokenizer)


def _keep_verdict(folder: Path, tokenizer) -> bool:
    """Compare FileTokenizer read from `folder` (which holds `tokenizer` saved) with `tokenizer`, and keep the verdict
    there (nothing where the folder cannot be written: compared again next time). -> whether it agreed."""
    try:
        why = agrees(FileTokenizer.from_folder(folder), tokenizer)
    except (OSError, ValueError, TypeError) as err:  # a folder FileTokenizer does not read: transformers' it is
        why = f"not read: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
    verdict = {**_libraries(), "agrees": why is None, "differs_on": why}
    path = Path(folder) / VERDICT
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(verdict))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
    return why is None


def _agreed_before(folder: Path) -> bool | None:
    """The folder's verdict for these libraries: True / False, None where there is none for them."""
    try:
        verdict = json.loads((Path(folder) / VERDICT).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(verdict, dict) or any(verdict.get(k) != v for k, v in _libraries().items()):
        return None
    return verdict.get("agrees") is True


def cached_tokenizer(folder: Path):
    """The tokenizer of tokentui's cache folder `folder` (module docstring). Raises what transformers' loading
    raises for a damaged folder."""
    agreed = _agreed_before(folder)
    if agreed:
        try:
            return FileTokenizer.from_folder(folder)
        except (OSError, ValueError):  # changed since it was compared: transformers' reads it
            pass
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if agreed is None:
        _keep_verdict(folder, tokenizer)
    return tokenizer
