"""The script tests/fakes.py's ScriptedEngine plays: the article's prompt and answer "Partly. Some weights are
open. (开放)" for Qwen3-0.6B — each step's token and its ten raw candidates — with the sampler arithmetic and the
prompt tokenizer it uses. Tests import these names from tests/fakes.py, which re-exports them."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tokentui.core.runs.events import MultiTokenChar, PromptPiece
from tokentui.core.runs.facts import ModelFacts
from tokentui.core.settings import SamplerSettings

EOS_ID = 151645
SPECIAL_IDS = frozenset({151643, 151644, EOS_ID})  # <|endoftext|>, <|im_start|>, <|im_end|>
KV_BYTES_PER_TOKEN = 2 * 28 * 8 * 128 * 2  # 114,688 (bf16)

FACTS = ModelFacts(
    name="Qwen3-0.6B",
    source="in-memory",
    architecture="Qwen3ForCausalLM",
    parameters=596_049_920,
    layers=28,
    hidden_size=1024,
    vocab_rows=151_936,
    attention_heads=16,
    kv_heads=8,
    head_dim=128,
    kv_bytes_per_token=KV_BYTES_PER_TOKEN,
    max_context=40_960,
    device="cpu",
    dtype="bfloat16",
    chat_template=True,
    trust_remote_code=False,
    load_seconds=1.5,
)

# The article's 13 prompt tokens for "Is OpenAI open?"
ARTICLE_PROMPT = [
    (151644, "<|im_start|>", True), (872, "user", False), (198, "↵", False), (3872, "Is", False),
    (5264, "␣Open", False), (15469, "AI", False), (1787, "␣open", False), (30, "?", False),
    (151645, "<|im_end|>", True), (198, "↵", False), (151644, "<|im_start|>", True),
    (77091, "assistant", False), (198, "↵", False),
]


@dataclass(frozen=True)
class ScriptStep:
    """One scripted token and the raw candidates around it (id, piece, raw probability), best first."""

    id: int
    piece: str
    text: str
    candidates: tuple[tuple[int, str, float], ...]
    special: bool = False
    pending_hex: str = ""
    pending_needed: int = 0
    completed: tuple[MultiTokenChar, ...] = ()


def _alts(*pairs) -> tuple[tuple[int, str, float], ...]:
    return tuple(pairs)


ANSWER: tuple[ScriptStep, ...] = (
    ScriptStep(4707, "Part", "Part", _alts((4707, "Part", 0.52), (5264, "␣Open", 0.26), (2753, "No", 0.13),
                                           (9454, "Yes", 0.03), (1084, "␣It", 0.02), (785, "The", 0.015),
                                           (2308, "␣No", 0.01), (32, "A", 0.006), (30172, "Open", 0.005),
                                           (40, "I", 0.004))),
    ScriptStep(398, "ly", "ly", _alts((398, "ly", 0.91), (13, ".", 0.04), (11, ",", 0.02), (25, ":", 0.01),
                                      (3918, "ially", 0.008), (12, "-", 0.004), (0, "!", 0.002),
                                      (198, "↵", 0.002), (26, ";", 0.001), (323, "␣and", 0.001))),
    ScriptStep(13, ".", ".", _alts((13, ".", 0.62), (11, ",", 0.3), (25, ":", 0.03), (0, "!", 0.02),
                                   (26, ";", 0.01), (1365, "␣—", 0.007), (198, "↵", 0.005), (320, "␣(", 0.004),
                                   (323, "␣and", 0.002), (12, "-", 0.001))),
    ScriptStep(4329, "␣Some", " Some", _alts((4329, "␣Some", 0.48), (5264, "␣Open", 0.21), (1084, "␣It", 0.12),
                                             (576, "␣The", 0.08), (4138, "␣While", 0.04), (1205, "␣Its", 0.02),
                                             (13023, "␣Many", 0.01), (4354, "␣However", 0.01),
                                             (8853, "␣Only", 0.008), (220, "␣", 0.004))),
    ScriptStep(14324, "␣weights", " weights", _alts((4119, "␣models", 0.44), (14324, "␣weights", 0.37),
                                                    (315, "␣of", 0.07), (2038, "␣code", 0.05),
                                                    (3412, "␣research", 0.03), (5479, "␣parts", 0.02),
                                                    (7375, "␣tools", 0.01), (5896, "␣projects", 0.004),
                                                    (821, "␣data", 0.002), (1849, "␣work", 0.001))),
    ScriptStep(525, "␣are", " are", _alts((525, "␣are", 0.88), (315, "␣of", 0.04), (614, "␣have", 0.03),
                                          (1033, "␣were", 0.02), (1083, "␣also", 0.01), (11, ",", 0.005),
                                          (320, "␣(", 0.003), (2578, "␣like", 0.002), (323, "␣and", 0.001),
                                          (13, ".", 0.001))),
    ScriptStep(1787, "␣open", " open", _alts((1787, "␣open", 0.79), (4652, "␣released", 0.1),
                                             (17424, "␣public", 0.05), (2500, "␣available", 0.03),
                                             (537, "␣not", 0.01), (1431, "␣now", 0.006), (1602, "␣free", 0.002),
                                             (8789, "␣shared", 0.001), (3601, "␣published", 0.0005),
                                             (13, ".", 0.0005))),
    ScriptStep(13, ".", ".", _alts((13, ".", 0.71), (11, ",", 0.15), (320, "␣(", 0.06), (26, ";", 0.03),
                                   (323, "␣and", 0.02), (198, "↵", 0.01), (1365, "␣—", 0.006), (0, "!", 0.002),
                                   (25, ":", 0.001), (12, "-", 0.001))),
    ScriptStep(320, "␣(", " (", _alts((320, "␣(", 0.55), (EOS_ID, "<|im_end|>", 0.35), (4329, "␣Some", 0.04),
                                      (576, "␣The", 0.03), (198, "↵", 0.01), (1084, "␣It", 0.008),
                                      (4354, "␣However", 0.004), (5264, "␣Open", 0.003), (2308, "␣No", 0.002),
                                      (220, "␣", 0.001))),
    ScriptStep(28156, "<0xE5><0xBC>", "", _alts((28156, "<0xE5><0xBC>", 0.9), (100713, "开放", 0.05),
                                                (5264, "Open", 0.02),
                                           (36667, "公", 0.01), (99243, "部", 0.008), (70, "e", 0.005),
                                           (45, "N", 0.003), (47, "P", 0.002), (32, "A", 0.001), (40, "I", 0.001)),
               pending_hex="e5 bc", pending_needed=1),
    ScriptStep(222, "<0x80>", "开", _alts((222, "<0x80>", 0.97), (223, "<0x81>", 0.01), (224, "<0x82>", 0.008),
                                       (225, "<0x83>", 0.005), (226, "<0x84>", 0.003), (227, "<0x85>", 0.002),
                                       (228, "<0x86>", 0.001), (229, "<0x87>", 0.0005), (230, "<0x88>", 0.0003),
                                       (231, "<0x89>", 0.0002)),
               completed=(MultiTokenChar("开", "e5 bc 80", 2),)),
    ScriptStep(99803, "放", "放", _alts((99803, "放", 0.93), (29826, "源", 0.04), (21470, "发", 0.01),
                                       (15946, "口", 0.008), (17992, "启", 0.005), (44934, "始", 0.003),
                                       (34204, "关", 0.002), (99447, "放权", 0.001), (37029, "合", 0.0005),
                                       (64, "a", 0.0005))),
    ScriptStep(8, ")", ")", _alts((8, ")", 0.96), (701, "),", 0.02), (568, ").", 0.01), (11, ",", 0.004),
                                  (198, "↵", 0.003), (220, "␣", 0.001), (7287, "/", 0.0005), (7, "(", 0.0003),
                                  (25, ":", 0.0001), (26, ";", 0.0001))),
    ScriptStep(EOS_ID, "<|im_end|>", "", _alts((EOS_ID, "<|im_end|>", 0.94), (576, "␣The", 0.02),
                                               (4329, "␣Some", 0.01), (198, "↵", 0.01), (1084, "␣It", 0.008),
                                               (151643, "<|endoftext|>", 0.005), (2308, "␣No", 0.004),
                                               (320, "␣(", 0.002), (11, ",", 0.0007), (13, ".", 0.0003)),
               special=True),
)

ANSWER_TEXT = "Partly. Some weights are open. (开放)"

# every piece the script knows, for a forced token's display (a token it never names shows as its id)
PIECES = {i: piece for step in ANSWER for i, piece, _ in step.candidates} | {i: p for i, p, _ in ARTICLE_PROMPT}


def piece_of(token: int) -> str:
    return PIECES.get(token, f"<id {token}>")


def piece_text(piece: str, special: bool) -> str:
    """The text a token completes when it is not the scripted one: its piece, spaces and newlines restored."""
    return "" if special else piece.replace("␣", " ").replace("↵", "\n")


def _entropy_bits(probs) -> float:
    return -sum(p * math.log2(p) for p in probs if p > 0)


def apply_sampler(raw: list[float], s: SamplerSettings) -> list[float]:
    """Post-sampler probabilities over the candidate list (treated as the whole distribution)."""
    total = sum(raw)
    raw = [p / total for p in raw]
    order = sorted(range(len(raw)), key=lambda i: -raw[i])
    if s.is_greedy:
        out = [0.0] * len(raw)
        out[order[0]] = 1.0
        return out
    scaled = [p ** (1.0 / s.temperature) for p in raw]
    z = sum(scaled)
    probs = [p / z for p in scaled]
    keep = set(order[: s.top_k]) if s.top_k else set(order)
    cumulative = 0.0
    kept_p = set()
    for i in order:
        if i not in keep:
            continue
        kept_p.add(i)
        cumulative += probs[i]
        if cumulative >= s.top_p - 1e-12:
            break
    z = sum(probs[i] for i in kept_p)
    return [probs[i] / z if i in kept_p else 0.0 for i in range(len(raw))]


def tokenize(prompt: str, system: str | None) -> tuple[str, list[PromptPiece], bool]:
    if prompt == "Is OpenAI open?" and system is None:
        text = "<|im_start|>user\nIs OpenAI open?<|im_end|>\n<|im_start|>assistant\n"
        return text, [PromptPiece(i, p, s) for i, p, s in ARTICLE_PROMPT], True
    pieces: list[PromptPiece] = []

    def words(s: str) -> None:
        for m in re.finditer(r" ?\w+| ?[^\w\s]|\s", s):
            w = m.group(0)
            disp = w.replace(" ", "␣").replace("\n", "↵")
            pieces.append(PromptPiece(sum(ord(c) * 31 ** n for n, c in enumerate(w)) % 150_000, disp, False))

    def special(name: str, id_: int) -> None:
        pieces.append(PromptPiece(id_, name, True))

    text = ""
    if system is not None:
        text += f"<|im_start|>system\n{system}<|im_end|>\n"
        special("<|im_start|>", 151644); words("system\n" + system); special("<|im_end|>", 151645); words("\n")
    text += f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    special("<|im_start|>", 151644); words("user\n" + prompt); special("<|im_end|>", 151645); words("\n")
    special("<|im_start|>", 151644); words("assistant\n")
    return text, pieces, True
