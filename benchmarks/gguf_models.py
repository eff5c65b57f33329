"""The benchmark files of issue 37: random-weight models with the exact shapes of the seeds' models, in the formats
users download, made the way those files are made (llama.cpp's convert_hf_to_gguf.py from a bf16 Hugging Face
folder, then its llama-quantize), built once and cached beside the tests' fixtures (tests/gguf_fixtures.py's
mechanism: the user's tokentui cache, ``fixtures/bench-<key>``).

    .venv/bin/python benchmarks/gguf_models.py      builds what is missing, prints each file's path and size

    qwen3-0.6b   Qwen3-0.6B's config (q/k RMSNorm, tied): the bf16 HF folder, Q8_0, Q4_K_M, Q4_0 (and the BF16 GGUF
                 they are quantized from)
    qwen2.5-0.5b Qwen2.5-0.5B's config (q/k/v bias, tied): Q8_0

The tokenizer is the embedded SmolLM2's (49,152 tokens); the configs' vocabulary of 151,936 is kept (the converter
pads the GGUF's token list with [PAD] tokens), so the embedding and head have the real models' sizes. Weights are
drawn as transformers initialises them (normal, std = the config's initializer_range 0.02; norms 1), once, with a
fixed seed, in float32, and saved as bf16; the embedding rows past the tokenizer's 49,152 (the [PAD] tokens, which
no text encodes to) are zero, as a trained model's unused rows are near it, so that a tied head never picks them
(a random row would win about two steps in three, and the text shown would be empty).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import gguf_fixtures  # noqa: E402
from gguf_fixtures import HOME_CACHE, converted, locked, quantized, staged, tokenizer_folder  # noqa: E402

FORMAT = 2  # bump when what is built changes in a way the key does not see (2: the unused embedding rows zero)
# the published configs' shapes (their config.json), less what only the hub needs
MODELS = {
    "qwen3-0.6b": ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1e6,
                                 rms_norm_eps=1e-6, max_position_embeddings=40960, vocab_size=151936,
                                 tie_word_embeddings=True, initializer_range=0.02, attention_bias=False)),
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, rope_theta=1e6, rms_norm_eps=1e-6,
                                   max_position_embeddings=32768, vocab_size=151936, tie_word_embeddings=True,
                                   initializer_range=0.02, use_sliding_window=False)),
}
FILES = {"qwen3-0.6b": ("Q8_0", "Q4_K_M", "Q4_0"), "qwen2.5-0.5b": ("Q8_0",)}
SEED = 0


def _folder(name: str) -> Path:
    from gguf_fixtures import VERSION

    ident = json.dumps({"model": MODELS[name], "seed": SEED, "llama.cpp": VERSION, "format": FORMAT},
                       sort_keys=True)
    return HOME_CACHE / "fixtures" / f"bench-{name}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def hf_folder(name: str) -> Path:
    """The bf16 safetensors folder of model `name` (config, weights, SmolLM2's tokenizer), made first when missing."""
    folder = _folder(name) / "hf-bf16"
    with locked(folder):
        if not (folder / "config.json").is_file():
            import torch
            import transformers
            from transformers import AutoTokenizer

            family, config = MODELS[name]
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder())
            config_cls, model_cls = {"qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
                                     "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[family]
            torch.manual_seed(SEED)
            model = model_cls(config_cls(**config, bos_token_id=tokenizer.bos_token_id,
                                         eos_token_id=tokenizer.eos_token_id,
                                         pad_token_id=tokenizer.pad_token_id)).eval()
            model.config.architectures = [model_cls.__name__]
            with torch.no_grad():
                model.get_input_embeddings().weight[len(tokenizer):] = 0.0
            model = model.to(torch.bfloat16)
            with staged(folder) as tmp:
                model.save_pretrained(tmp, safe_serialization=True)
                tokenizer.save_pretrained(tmp)
    return folder


def gguf_model(name: str, fmt: str) -> Path:
    """Model `name` as a GGUF of format fmt: BF16 and Q8_0 from the converter, the rest quantized from BF16."""
    if fmt not in (*FILES[name], "BF16"):
        raise ValueError(f"{name} is built in {', '.join(FILES[name])} (and BF16), not {fmt}")
    target = _folder(name) / f"{name}-{fmt}.gguf"
    if target.is_file():
        return target
    if fmt in gguf_fixtures.CONVERTED:
        return converted(hf_folder(name), fmt, target)
    return quantized(gguf_model(name, "BF16"), fmt, target)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def main() -> int:
    rows = [("qwen3-0.6b", "hf-bf16", lambda: hf_folder("qwen3-0.6b"))]
    rows += [(name, fmt, lambda name=name, fmt=fmt: gguf_model(name, fmt)) for name in FILES for fmt in FILES[name]]
    for name, fmt, make in rows:
        t0 = time.monotonic()
        path = make()
        took = time.monotonic() - t0
        print(f"{name:13} {fmt:8} {_size(path) / 1e6:8.1f} MB  {path}" + (f"  (built in {took:.0f} s)"
                                                                        if took > 1 else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
