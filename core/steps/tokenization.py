"""Step 2 — tokenize: the formatted text becomes token IDs from the model's fixed vocabulary.

Each piece is kept with its ID for display: the space before a word belongs to that word's token (`␣Open`),
special tokens (`<|im_start|>`) are single vocabulary entries and are flagged.
"""

from __future__ import annotations

from .display import display_piece
from ..runs.events import PromptPiece
from .template import Templated
from .token_bytes import TokenBytes


def tokenize(tokenizer, templated: Templated, token_bytes: TokenBytes) -> tuple[list[int], list[PromptPiece]]:
    ids: list[int] = tokenizer(templated.text, add_special_tokens=templated.add_special_tokens)["input_ids"]
    pieces = [PromptPiece(id=i, piece=display_piece(token_bytes, i), special=token_bytes.is_special(i)) for i in ids]
    return ids, pieces
