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
by one `/completion` (n_predict 1, temperature 0, prompt cache on) per position. Beside each count: the positions
only one of the two gets right, and over several prompts a sign test on those (the chance of so uneven a split if
neither engine were closer to the reference).
"""

from __future__ import annotations

import argparse
import math
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


def tokentui_agreement(path: Path, prompt: list[int], answer: list[int]) -> tuple[list[bool], str]:
    """(per position, whether tokentui's decode step's top token is the reference's; the step's description)."""
    from tokentui.core.model.engine import Engine
    from tokentui.core.model.load.loader import load_model

    loaded = load_model(str(path), device="cpu")
    engine = Engine(loaded)
    plan_step = engine.plan.step
    run, _ = plan_step.new_cache(len(prompt), len(answer) + 1)
    with torch.inference_mode():
        logits = plan_step.prefill(run, torch.tensor([prompt]), True)
        right = []
        for token in answer:
            right.append(int(torch.argmax(logits.reshape(-1)[-loaded.facts.vocab_rows:])) == token)
            logits = plan_step.step(run, token)
    return right, engine.facts.decode_plan


def server_agreement(path: Path, prompt: list[int], answer: list[int], threads: int) -> list[bool]:
    """Per position, whether llama-server's top token is the reference's."""
    import httpx

    server = llama_serve.start(path, threads=threads)
    right = []
    try:
        with httpx.Client(trust_env=False, timeout=600) as client:
            for t, token in enumerate(answer):
                body = {"prompt": prompt + answer[:t], "n_predict": 1, "temperature": 0.0, "cache_prompt": True,
                        "return_tokens": True}
                reply = client.post(f"{server.url}/completion", json=body)
                reply.raise_for_status()
                right.append((reply.json().get("tokens") or [None])[0] == token)
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
    print("| file | prompt | tokentui top-1 = reference | llama-server top-1 = reference | only tokentui right | "
          "only llama-server right | tokentui's step |")
    print("|---|---|---|---|---|---|---|")
    for spec in args.gguf:
        name, _, path = spec.partition("=")
        total = [0, 0, 0, 0, 0]
        for k, (prompt, answer) in enumerate(cases, 1):
            ours, step = tokentui_agreement(Path(path), prompt, answer)
            theirs = server_agreement(Path(path), prompt, answer, args.threads)
            row = [sum(ours), sum(theirs), len(answer), sum(a and not b for a, b in zip(ours, theirs)),
                   sum(b and not a for a, b in zip(ours, theirs))]
            total = [t + r for t, r in zip(total, row)]
            print(f"| {name} | {k} | {row[0]}/{row[2]} | {row[1]}/{row[2]} | {row[3]} | {row[4]} | {step} |",
                  flush=True)
        if len(cases) > 1:
            print(f"| {name} | all | {total[0]}/{total[2]} | {total[1]}/{total[2]} | {total[3]} | {total[4]} | "
                  f"sign test p = {sign_test(total[3], total[4]):.2f} |", flush=True)
    return 0


def sign_test(ours_only: int, theirs_only: int) -> float:
    """Two-sided exact sign test over the positions where exactly one engine is right: the chance of a split at least
    this uneven if either engine were as likely to be the right one (hand-written: four lines, no scipy here)."""
    n, k = ours_only + theirs_only, min(ours_only, theirs_only)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


if __name__ == "__main__":
    sys.exit(main())
