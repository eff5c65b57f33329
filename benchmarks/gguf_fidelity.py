"""Issue 37's fidelity target: greedy top-1 agreement with the float32 reference over --steps positions, tokentui
(the decode step it runs on the file) against llama-server on the same file, teacher-forced on the reference's own
greedy answer.

    .venv/bin/python benchmarks/gguf_fidelity.py --folder HF_FOLDER --gguf NAME=PATH [--gguf ...] [--steps 128]
        [--prompt TEXT ...]

--prompt (repeatable; the default is the seeds' prompt) gives more positions than one answer's 128: on random
weights the top two scores are often close, so one prompt's count moves by a few positions either way.

The reference: the HF folder the files were converted from, in float32 (transformers), its greedy answer to the
default prompt (chat template, no end of sequence before --steps). Per position t, each contender gets the prompt
and the reference's first t tokens and is counted right when its top token is the reference's token t: tokentui
through the decode plan's step on one KV cache (the prompt prefilled, then one reference token a step), llama-server
by one `/completion` (n_predict 1, temperature 0, prompt cache on) per position.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import llama_serve  # noqa: E402

PROMPT = "Is OpenAI open?"


def reference(folder: Path, steps: int, text: str = PROMPT) -> tuple[list[int], list[int]]:
    """(prompt ids, the float32 model's greedy answer of `steps` tokens to `text`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    ids = torch.tensor([list(prompt)])
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
    return list(prompt), out[0, ids.shape[1]:].tolist()


def tokentui_agreement(path: Path, prompt: list[int], answer: list[int]) -> tuple[int, str]:
    """(positions where tokentui's decode step's top token is the reference's, the step's description)."""
    from tokentui.core.model.engine import Engine
    from tokentui.core.model.load.loader import load_model

    loaded = load_model(str(path), device="cpu")
    engine = Engine(loaded)
    plan_step = engine.plan.step
    run, _ = plan_step.new_cache(len(prompt), len(answer) + 1)
    with torch.inference_mode():
        logits = plan_step.prefill(run, torch.tensor([prompt]), True)
        right = 0
        for token in answer:
            right += int(int(torch.argmax(logits.reshape(-1)[-loaded.facts.vocab_rows:])) == token)
            logits = plan_step.step(run, token)
    return right, engine.facts.decode_plan


def server_agreement(path: Path, prompt: list[int], answer: list[int], threads: int) -> int:
    import httpx

    server = llama_serve.start(path, threads=threads)
    right = 0
    try:
        with httpx.Client(trust_env=False, timeout=600) as client:
            for t, token in enumerate(answer):
                body = {"prompt": prompt + answer[:t], "n_predict": 1, "temperature": 0.0, "cache_prompt": True,
                        "return_tokens": True}
                reply = client.post(f"{server.url}/completion", json=body)
                reply.raise_for_status()
                right += int((reply.json().get("tokens") or [None])[0] == token)
    finally:
        server.stop()
    return right


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--gguf", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", action="append", help="a user message (repeatable; default: the seeds')")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cases = [reference(args.folder, args.steps, text) for text in (args.prompt or [PROMPT])]
    for prompt, answer in cases:
        print(f"reference: {len(prompt)} prompt ids, {len(answer)} greedy tokens", flush=True)
    print("| file | prompt | tokentui top-1 = reference | llama-server top-1 = reference | tokentui's step |")
    print("|---|---|---|---|---|")
    for spec in args.gguf:
        name, _, path = spec.partition("=")
        total = [0, 0, 0]
        for k, (prompt, answer) in enumerate(cases, 1):
            ours, step = tokentui_agreement(Path(path), prompt, answer)
            theirs = server_agreement(Path(path), prompt, answer, args.threads)
            total = [total[0] + ours, total[1] + theirs, total[2] + len(answer)]
            print(f"| {name} | {k} | {ours}/{len(answer)} | {theirs}/{len(answer)} | {step} |", flush=True)
        if len(cases) > 1:
            print(f"| {name} | all | {total[0]}/{total[2]} | {total[1]}/{total[2]} | |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
