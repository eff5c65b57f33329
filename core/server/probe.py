"""What a server is and what it says about its model: the engine (llama.cpp, vLLM, SGLang), the served model,
its context, the endpoints it has for the chat template, tokens and KV cache use. Numbers a server does not
report stay None in the ModelFacts (the dashboard says "not reported by the server").

Each answer is read by a parser of its own (`read_models`, `read_props`), which checks the fields it uses: a wrong
type is a ServerError naming the field (core/server/shape.py), an absent or null one is "not reported"."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from ..runs.facts import ModelFacts, ServerFacts
from ..steps.display import printable_line
from ..errors import ServerError
from .http import Connection
from .kv import read_slots
from .shape import obj, opt_bool, opt_int, opt_list, opt_obj, opt_str, wrong

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
    model: str = ""  # the served model's id as requests name it (the facts show it with the API key masked)


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model of a server's /v1/models listing: its id (what requests name) and what the entry says of it
    (None: not reported; llama-server's `meta`, vLLM's `max_model_len`)."""

    id: str
    owned_by: str = ""
    max_model_len: int | None = None
    n_ctx_train: int | None = None
    n_params: int | None = None
    n_embd: int | None = None
    n_vocab: int | None = None
    arch: str | None = None


def read_models(value, where: str) -> list[ModelEntry]:
    """A /v1/models answer: {"data": [{"id": ..., ...}, ...]} (OpenAI's shape); a count of 0 is not reported."""
    listing = obj(value, where)
    entries = []
    for n, entry in enumerate(opt_list(listing, "data", where) or []):
        at = f"{where}: data[{n}]"
        entry = obj(entry, at)
        name = opt_str(entry, "id", at)
        if not name:
            raise wrong(at, "id should be the model's name", entry.get("id"))
        meta = opt_obj(entry, "meta", at) or {}
        entries.append(ModelEntry(
            id=name, owned_by=(opt_str(entry, "owned_by", at) or "").lower(),
            max_model_len=opt_int(entry, "max_model_len", at) or None,
            n_ctx_train=opt_int(meta, "n_ctx_train", f"{at}.meta") or None,
            n_params=opt_int(meta, "n_params", f"{at}.meta") or None,
            n_embd=opt_int(meta, "n_embd", f"{at}.meta") or None,
            n_vocab=opt_int(meta, "n_vocab", f"{at}.meta") or None,
            arch=opt_str(meta, "arch", f"{at}.meta") or None))
    return entries


@dataclass(frozen=True, slots=True)
class Props:
    """llama-server's /props: its build and its context size (None: not reported)."""

    build_info: str | None
    n_ctx: int | None


def read_props(value, where: str) -> Props | None:
    """/props as llama-server answers it; None when the answer is not llama-server's (another server's /props)."""
    if not isinstance(value, dict) or not ("default_generation_settings" in value or "build_info" in value):
        return None
    settings = opt_obj(value, "default_generation_settings", where) or {}
    n_ctx = opt_int(settings, "n_ctx", f"{where}: default_generation_settings") or opt_int(value, "n_ctx", where)
    return Props(build_info=opt_str(value, "build_info", where), n_ctx=n_ctx or None)


def served_model(conn: Connection, model: str | None) -> ModelEntry:
    """The server's /v1/models entry of `model` (--server-model; None: the only one it lists), or one line saying
    why there is none (an unreachable server, a refused key, several models, an unknown name)."""
    entries = read_models(conn.get_json("/v1/models"), f"{conn.address.url}/v1/models")
    if not entries:
        raise ServerError(f"{conn.address.url}/v1/models lists no model: is this an OpenAI-compatible server?")
    names = [e.id for e in entries]
    if model is None:
        if len(names) > 1:
            raise ServerError(f"the server hosts {len(names)} models ({conn.shown(', '.join(names[:6]))}): pick one "
                              "with --server-model NAME")
        return entries[0]
    if model not in names:
        raise ServerError(f"--server-model {conn.shown(model)!r}: the server lists {conn.shown(', '.join(names[:6]))}")
    return entries[names.index(model)]


def probe(conn: Connection, model: str | None, probs: str, top_logprobs: int, started: float | None = None
          ) -> tuple[ModelFacts, Dialect]:
    """Ask the server what it serves. `model`: --server-model (None: the only one it lists). `probs`: "auto", or
    what the user says the server gives ("raw" / "post-sampler", e.g. for vLLM's --logprobs-mode)."""
    started = time.perf_counter() if started is None else started
    entry = served_model(conn, model)
    model = entry.id
    url = conn.address.url

    props = read_props(conn.get_json("/props", quiet_statuses=QUIET), f"{url}/props")
    version = None
    n_ctx = None
    if props is not None:
        engine = "llama.cpp"
        version, n_ctx = props.build_info, props.n_ctx
    elif entry.owned_by == "vllm":
        engine = "vLLM"
        info = conn.get_json("/version", quiet_statuses=QUIET)
        version = opt_str(obj(info, f"{url}/version"), "version", f"{url}/version") if info is not None else None
    elif entry.owned_by == "sglang":
        engine = "SGLang"
    else:
        engine = "OpenAI-compatible"
    llama_cpp = engine == "llama.cpp"
    n_ctx = n_ctx or entry.max_model_len or entry.n_ctx_train

    prefix_caching: bool | None = True if llama_cpp else None  # llama.cpp: cache_prompt, which we send
    if engine == "SGLang":
        info = conn.get_json("/get_server_info", quiet_statuses=QUIET)
        if info is not None:
            where = f"{url}/get_server_info"
            info = obj(info, where)
            version = opt_str(info, "version", where) or version
            radix_off = opt_bool(info, "disable_radix_cache", where)
            if radix_off is not None:
                prefix_caching = not radix_off

    metrics = conn.get_text("/metrics", quiet_statuses=QUIET)
    kv_metric = next((name for name in _KV_METRICS if metrics and re.search(rf"^{re.escape(name)}[{{ ]", metrics,
                                                                             re.M)), None)
    kv_source = "/metrics" if kv_metric else None
    if kv_source is None and llama_cpp and read_slots(conn) is not None:
        kv_source = "/slots"
    dialect = Dialect(engine=engine, llama_cpp=llama_cpp,
                      template="/apply-template" if llama_cpp else "/tokenize",
                      tokenize="/tokenize", detokenize="/detokenize", kv_metric=kv_metric, kv_source=kv_source,
                      model=model)
    if probs == "auto":
        probs = "raw" if llama_cpp else "unknown"  # llama-server: raw unless asked for post_sampling_probs
    server = ServerFacts(url=conn.address.url, engine=engine, model=model, probs=probs, top_logprobs=top_logprobs,
                         version=printable_line(version) if version is not None else None,
                         prefix_caching=prefix_caching,
                         kv_source=kv_source, template_source=dialect.template,
                         token_ids=llama_cpp)
    facts = ModelFacts(
        # llama-server names its model by the GGUF's path: the panel shows the file's name, safe to print
        # (ServerFacts.model keeps the id requests use)
        name=printable_line(model.rsplit("/", 1)[-1] if model.startswith("/") else model), source="server",
        architecture=printable_line(entry.arch or "not reported by the server"),
        parameters=entry.n_params, layers=None, hidden_size=entry.n_embd,
        vocab_rows=entry.n_vocab, attention_heads=None, kv_heads=None, head_dim=None,
        kv_bytes_per_token=None, max_context=n_ctx, device=f"{engine} server", dtype="not reported by the server",
        chat_template=True, load_seconds=time.perf_counter() - started, kv_bytes_per_value=0, server=server)
    return conn.key_mask().value(facts), dialect  # what the server names (its model, version) without the key

