"""What a server is and what it says about its model: the engine (llama.cpp, vLLM, SGLang), the served model,
its context, the endpoints it has for the chat template, tokens and KV cache use. Numbers a server does not
report stay None in the ModelFacts (the dashboard says "not reported by the server")."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from ..runs.events import ModelFacts, ServerFacts
from ..errors import ServerError
from .http import Connection
from .kv import read_slots

QUIET = (400, 401, 403, 404, 405, 422, 501)  # an endpoint this server does not have (or does not let us use)

# KV cache use as a fraction in 0..1, by engine: llama-server (--metrics), vLLM (newer, then older), SGLang
_KV_METRICS = ("llamacpp:kv_cache_usage_ratio", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
               "sglang:token_usage")


@dataclass(frozen=True, slots=True)
class Dialect:
    """How to talk to this server beyond the OpenAI API they share."""

    engine: str
    llama_cpp: bool  # llama-server's own request fields (n_probs, post_sampling_probs, cache_prompt, samplers)
    template: str | None  # "/apply-template" (llama.cpp) or "/tokenize" (vLLM, SGLang: messages -> ids)
    tokenize: str | None  # the tokenize endpoint, when the server has one
    detokenize: str | None
    kv_metric: str | None  # the /metrics name of the KV cache use, when /metrics reports one
    kv_source: str | None  # where the KV cache use is read: "/metrics", "/slots" (llama-server), None: nowhere


def served_model(conn: Connection, model: str | None) -> dict:
    """The server's /v1/models entry of `model` (--server-model; None: the only one it lists), or one line saying
    why there is none (an unreachable server, a refused key, several models, an unknown name)."""
    listing = conn.get_json("/v1/models")
    entries = listing.get("data") if isinstance(listing, dict) else None
    entries = [e for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)] \
        if isinstance(entries, list) else []
    if not entries:
        raise ServerError(f"{conn.address.url}/v1/models lists no model: is this an OpenAI-compatible server?")
    names = [e["id"] for e in entries]
    if model is None:
        if len(names) > 1:
            raise ServerError(f"the server hosts {len(names)} models ({', '.join(names[:6])}): pick one with "
                              "--server-model NAME")
        return entries[0]
    if model not in names:
        raise ServerError(f"--server-model {model!r}: the server lists {', '.join(names[:6])}")
    return entries[names.index(model)]


def probe(conn: Connection, model: str | None, probs: str, top_logprobs: int, started: float | None = None
          ) -> tuple[ModelFacts, Dialect]:
    """Ask the server what it serves. `model`: --server-model (None: the only one it lists). `probs`: "auto", or
    what the user says the server gives ("raw" / "post-sampler", e.g. for vLLM's --logprobs-mode)."""
    started = time.perf_counter() if started is None else started
    entry = served_model(conn, model)
    model = entry["id"]

    props = conn.get_json("/props", quiet_statuses=QUIET)
    owner = str(entry.get("owned_by") or "").lower()
    version = None
    n_ctx = None
    if isinstance(props, dict) and ("default_generation_settings" in props or "build_info" in props):
        engine = "llama.cpp"
        version = props.get("build_info") if isinstance(props.get("build_info"), str) else None
        settings = props.get("default_generation_settings") or {}
        n_ctx = _int(settings.get("n_ctx")) or _int(props.get("n_ctx"))
    elif owner == "vllm":
        engine = "vLLM"
        info = conn.get_json("/version", quiet_statuses=QUIET)
        version = info.get("version") if isinstance(info, dict) else None
    elif owner == "sglang":
        engine = "SGLang"
    else:
        engine = "OpenAI-compatible"
    llama_cpp = engine == "llama.cpp"
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    n_ctx = n_ctx or _int(entry.get("max_model_len")) or _int(meta.get("n_ctx_train"))

    prefix_caching: bool | None = True if llama_cpp else None  # llama.cpp: cache_prompt, which we send
    if engine == "SGLang":
        info = conn.get_json("/get_server_info", quiet_statuses=QUIET)
        if isinstance(info, dict):
            version = info.get("version") if isinstance(info.get("version"), str) else version
            if isinstance(info.get("disable_radix_cache"), bool):
                prefix_caching = not info["disable_radix_cache"]

    metrics = conn.get_text("/metrics", quiet_statuses=QUIET)
    kv_metric = next((name for name in _KV_METRICS if metrics and re.search(rf"^{re.escape(name)}[{{ ]", metrics,
                                                                             re.M)), None)
    kv_source = "/metrics" if kv_metric else None
    if kv_source is None and llama_cpp and read_slots(conn) is not None:
        kv_source = "/slots"
    dialect = Dialect(engine=engine, llama_cpp=llama_cpp,
                      template="/apply-template" if llama_cpp else "/tokenize",
                      tokenize="/tokenize", detokenize="/detokenize", kv_metric=kv_metric, kv_source=kv_source)
    if probs == "auto":
        probs = "raw" if llama_cpp else "unknown"  # llama-server: raw unless asked for post_sampling_probs
    server = ServerFacts(url=conn.address.url, engine=engine, model=model, probs=probs, top_logprobs=top_logprobs,
                         version=version, prefix_caching=prefix_caching,
                         kv_source=kv_source, template_source=dialect.template,
                         token_ids=llama_cpp)
    facts = ModelFacts(
        # llama-server names its model by the GGUF's path: the panel shows the file's name (ServerFacts.model keeps
        # the id requests use)
        name=model.rsplit("/", 1)[-1] if model.startswith("/") else model, source="server", architecture=str(meta.get("arch") or "not reported by the server"),
        parameters=_int(meta.get("n_params")), layers=None, hidden_size=_int(meta.get("n_embd")),
        vocab_rows=_int(meta.get("n_vocab")), attention_heads=None, kv_heads=None, head_dim=None,
        kv_bytes_per_token=None, max_context=n_ctx, device=f"{engine} server", dtype="not reported by the server",
        chat_template=True, load_seconds=time.perf_counter() - started, kv_bytes_per_value=0, server=server)
    return facts, dialect


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
