"""Issue 37's fidelity target: greedy top-1 agreement with the float32 reference over --steps positions, tokentui
(the decode step it runs on the file) against llama-server on the same file, teacher-forced on the reference's own
greedy answer.

    .venv/bin/python benchmarks/gguf_fidelity.py --gguf NAME=PATH [--gguf ...] [--folder HF_FOLDER] [--steps 128]
        [--prompt TEXT ...]

--prompt (repeatable; the default is the seeds' prompt) gives more positions than one answer's 128: on random
weights the top two scores are often close, so one prompt's count moves by a few positions either way.

The reference is the float32 model, its greedy answer to each prompt (chat template, no end of sequence before
--steps). Without --folder it is each file's own weights de-quantized to float32 and run by transformers (tokentui's
`--dtype float32`): the model the file holds, as the embedded model's "float32 reference" in issues 25 and 37 is, so
what is counted is each engine's own rounding. With --folder it is the HF folder the files were converted from,
before quantization: the file's quantization error then comes first, and both engines share it.

Per position t, each contender gets the prompt and the reference's first t tokens and is counted right when its top
token is the reference's token t: tokentui through the decode plan's step on one KV cache (the prompt prefilled,
then one reference token a step), llama-server by one `/completion` (n_predict 1, temperature 0, prompt cache on)
per position. Beside each count: the positions only one of the two gets right, and over several prompts a sign test
on those (the chance of so uneven a split if neither engine were closer to the reference).

On random weights the top two scores are often within an activation's 8-bit rounding of each other, so the counts
move by a few positions either way with any change of summation order. Beside them, a measure that does not wait for
a flip: per position, the mean |log p - the reference's log p| over the reference's 5 likeliest tokens
(llama-server's from its `n_probs` 20 log-probabilities, the softmax of its raw scores; a token that either engine
does not have among its 20 likeliest is left out of both engines' means), and on how many positions each engine is
the closer one, with the same sign test. The positions of one prompt share its KV cache (its prefill decides all
128 together), so they are not independent: the last line for each file counts the prompts where each engine is
the closer, with the sign test over prompts.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import llama_serve  # noqa: E402

PROMPT = "Is OpenAI open?"


@dataclass(frozen=True)
class Case:
    """One prompt's reference: its ids, the float32 model's greedy answer, and per answer position the reference's
    `TOP` likeliest tokens with their log-probabilities."""

    prompt: list[int]
    answer: list[int]
    top: list[dict[int, float]]


@dataclass(frozen=True)
class Position:
    """One contender at one position: whether its top token is the reference's, and its log-probabilities of those
    of the reference's likeliest tokens that are among its own `SERVER_PROBS` likeliest, beside the reference's."""

    right: bool
    log_p: dict[int, float]
    reference: dict[int, float]

    def error(self, tokens) -> float:
        """Mean |log p - the reference's log p| over `tokens` (some of `log_p`'s)."""
        return statistics.fmean(abs(self.log_p[i] - self.reference[i]) for i in tokens)


TOP = 5
SERVER_PROBS = 20


def float32_model(source: Path):
    """(transformers' float32 model, its tokenizer): an HF folder's own, or a GGUF file's weights de-quantized."""
    if source.is_dir():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        return (AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval(),
                AutoTokenizer.from_pretrained(source))
    from tokentui.core.model.load.loader import load_model

    loaded = load_model(str(source), device="cpu", dtype="float32")
    return loaded.model.eval(), loaded.tokenizer


def reference(source: Path, steps: int, texts: list[str]) -> list[Case]:
    """Per text, its Case from the float32 model at `source`."""
    model, tokenizer = float32_model(source)
    return [_case(model, tokenizer, steps, text) for text in texts]


def _case(model, tokenizer, steps: int, text: str) -> Case:
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=False)
    prompt = tokenizer.encode(chat, add_special_tokens=False)  # a file's own tokenizer renders text only
    ids = torch.tensor([list(prompt)])
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
        answer = out[0, ids.shape[1]:].tolist()
        scores = model(out).logits[0, len(prompt) - 1:-1].float()  # [steps, vocab]: position t predicts answer[t]
        top = torch.topk(torch.log_softmax(scores, -1), TOP)
    return Case(list(prompt), answer, [dict(zip(i.tolist(), v.tolist())) for i, v in zip(top.indices, top.values)])


def _position(case: Case, t: int, top_id: int | None, log_p: dict[int, float]) -> Position:
    return Position(top_id == case.answer[t], {i: log_p[i] for i in case.top[t] if i in log_p}, case.top[t])


def tokentui_positions(path: Path, cases: list[Case]) -> tuple[list[list[Position]], str]:
    """(per case, per position, tokentui's decode step against the reference; the step's description), the file
    loaded once."""
    from tokentui.core.model.engine import Engine
    from tokentui.core.model.load.loader import load_model

    loaded = load_model(str(path), device="cpu")
    engine = Engine(loaded)
    plan_step = engine.plan.step
    out = []
    for case in cases:
        run, _ = plan_step.new_cache(len(case.prompt), len(case.answer) + 1)
        positions = []
        with torch.inference_mode():
            logits = plan_step.prefill(run, torch.tensor([case.prompt]), True)
            for t, token in enumerate(case.answer):
                log_p = torch.log_softmax(logits.reshape(-1)[-loaded.facts.vocab_rows:].float(), -1)
                top = torch.topk(log_p, SERVER_PROBS)  # what llama-server's n_probs gives, so both are held alike
                positions.append(_position(case, t, int(top.indices[0]), dict(zip(top.indices.tolist(),
                                                                                    top.values.tolist()))))
                logits = plan_step.step(run, token)
        out.append(positions)
    return out, engine.facts.decode_plan


def server_positions(path: Path, cases: list[Case], threads: int) -> list[list[Position]]:
    """Per case, per position, llama-server on the same file against the reference (one server for all cases)."""
    import httpx

    server = llama_serve.start(path, threads=threads)
    out = []
    try:
        with httpx.Client(trust_env=False, timeout=600) as client:
            for case in cases:
                positions = []
                for t in range(len(case.answer)):
                    body = {"prompt": case.prompt + case.answer[:t], "n_predict": 1, "temperature": 0.0,
                            "cache_prompt": True, "return_tokens": True, "n_probs": SERVER_PROBS}
                    reply = client.post(f"{server.url}/completion", json=body)
                    reply.raise_for_status()
                    result = reply.json()
                    probs = (result.get("completion_probabilities") or [{}])[0].get("top_logprobs", [])
                    positions.append(_position(case, t, (result.get("tokens") or [None])[0],
                                               {int(p["id"]): float(p["logprob"]) for p in probs}))
                out.append(positions)
    finally:
        server.stop()
    return out


def errors(ours: list[Position], theirs: list[Position]) -> list[tuple[float, float]]:
    """Each engine's error at each paired position, over the same tokens: the reference's likeliest that both have
    among their own likeliest (a token one of them puts lower is left out of both, not out of one)."""
    shared = [(a, b, a.log_p.keys() & b.log_p.keys()) for a, b in zip(ours, theirs)]
    return [(a.error(tokens), b.error(tokens)) for a, b, tokens in shared if tokens]


def by_prompt(ours: list[list[Position]], theirs: list[list[Position]]) -> str:
    """The prompts where tokentui's mean error is the lower / llama-server's / neither (to 4 decimals, as printed),
    with the sign test over the first two: a prompt's positions share its prefill, the prompts are independent."""
    means = [[round(statistics.fmean(e), 4) for e in zip(*errors(a, b))] for a, b in zip(ours, theirs)]
    closer, farther = sum(a < b for a, b in means), sum(a > b for a, b in means)
    return (f"prompts where tokentui is closer / llama-server is / equal: {closer} / {farther} / "
            f"{len(means) - closer - farther}, p = {sign_test(closer, farther):.2g}")


def row(ours: list[Position], theirs: list[Position]) -> str:
    """The table's figures for paired positions: counts right, only one right, mean errors, closer / farther."""
    pairs = errors(ours, theirs)
    closer, farther = sum(a < b for a, b in pairs), sum(a > b for a, b in pairs)
    only_ours = sum(a.right and not b.right for a, b in zip(ours, theirs))
    only_theirs = sum(b.right and not a.right for a, b in zip(ours, theirs))
    n = len(ours)
    return (f"{sum(a.right for a in ours)}/{n} | {sum(b.right for b in theirs)}/{n} | {only_ours} | {only_theirs} | "
            f"p = {sign_test(only_ours, only_theirs):.2f} | {statistics.fmean(a for a, _ in pairs):.4f} | "
            f"{statistics.fmean(b for _, b in pairs):.4f} | {closer} / {farther} | p = {sign_test(closer, farther):.2g}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, help="the reference: this HF folder (default: each file de-quantized)")
    parser.add_argument("--gguf", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", action="append", help="a user message (repeatable; default: the seeds')")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    texts = args.prompt or [PROMPT]
    shared = reference(args.folder, args.steps, texts) if args.folder else None
    print(f"reference: {args.folder or 'each file de-quantized to float32'}", flush=True)
    print("| file | prompt | tokentui top-1 = reference | llama-server | only tokentui right | only llama-server | "
          "sign test | tokentui mean \\|Δ log p\\| | llama-server's | tokentui closer / farther | sign test | "
          "tokentui's step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for spec in args.gguf:
        name, _, path = spec.partition("=")
        cases = shared or reference(Path(path), args.steps, texts)
        ours, step = tokentui_positions(Path(path), cases)
        theirs = server_positions(Path(path), cases, args.threads)
        for k, (a, b) in enumerate(zip(ours, theirs), 1):
            print(f"| {name} | {k} | {row(a, b)} | {step} |", flush=True)
        if len(cases) > 1:
            print(f"| {name} | all | {row(sum(ours, []), sum(theirs, []))} | |", flush=True)
            print(f"{name}: {by_prompt(ours, theirs)}", flush=True)
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
