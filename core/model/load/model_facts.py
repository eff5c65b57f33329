"""The model facts of a loaded model (`model_facts`): every number the model panel shows, read off the loaded objects
— the config, the weights as they are held (a ggml module's rows, not its on-demand float32 copy), the tokenizer —
not from documentation. Split from core/model/load/loader.py, which calls it once a model is loaded."""

from __future__ import annotations

from ...runs.facts import ModelFacts


def model_facts(model, tokenizer, *, name: str, source: str = "in-memory", trust_remote_code: bool = False,
                load_seconds: float = 0.0) -> ModelFacts:
    """Everything the model panel shows, read off the loaded objects (not from documentation)."""
    import torch

    from ..architecture import decoder_config, kv_groups
    from ..model_anatomy import anatomy
    from ..quant.qlinear import quantized_parameters
    from ...runs.architecture import kv_bytes_per_token

    config = model.config
    text_config = decoder_config(model)
    param = next(model.parameters())
    bytes_per_value = torch.empty((), dtype=param.dtype).element_size()
    try:  # read off the module tree and the cache's layer classes; a family they do not fit shows as not known
        groups, parts = kv_groups(model), anatomy(model)
    except Exception:  # never a traceback at load: the run still works, its KV figures come from the tensors
        groups, parts = None, None
    attention = next((b for b in parts.blocks if b.heads), None) if parts is not None else None
    heads = getattr(text_config, "num_attention_heads", None)
    out_emb = model.get_output_embeddings()
    # out_features first: a GGMLLinear head's `weight` is a float32 copy made on demand (quant/ggml_linear.py)
    rows = getattr(out_emb, "out_features", None) or (out_emb.weight.shape[0] if out_emb is not None else None)
    vocab_rows = int(rows) if rows is not None else int(text_config.vocab_size)
    return ModelFacts(
        name=name,
        source=source,
        architecture=(config.architectures or [type(model).__name__])[0],
        parameters=sum(p.numel() for p in model.parameters()) + quantized_parameters(model) + _ggml_values(model),
        layers=int(getattr(text_config, "num_hidden_layers", 0) or getattr(text_config, "n_layer", 0) or 0),
        hidden_size=int(getattr(text_config, "hidden_size", 0) or getattr(text_config, "n_embd", 0) or 0),
        vocab_rows=vocab_rows,
        attention_heads=attention.heads if attention is not None else (None if parts is not None else heads),
        kv_heads=attention.kv_heads if attention is not None and attention.kv_heads else None,
        head_dim=attention.head_dim if attention is not None and attention.head_dim else None,
        kv_bytes_per_token=kv_bytes_per_token(groups, bytes_per_value) if groups is not None else None,
        kv_bytes_per_value=bytes_per_value,
        max_context=int(getattr(text_config, "max_position_embeddings", 0) or 0),
        device=str(param.device),
        dtype=str(param.dtype).removeprefix("torch."),
        chat_template=bool(getattr(tokenizer, "chat_template", None)),
        trust_remote_code=trust_remote_code,
        load_seconds=round(load_seconds, 3),
        tied_lm_head=tied_lm_head(model),
        kv_groups=groups,
        anatomy=parts,
        truths=_truths(model, parts),
    )


def _truths(model, parts):
    """The one-pass panel's small truths (core/model/observe/truths.py); None where the model's modules do not
    give them (never a traceback at load)."""
    from ..observe.truths import model_truths

    try:
        return model_truths(model, parts.final_norm if parts is not None else None)
    except Exception:
        return None


def tied_lm_head(model) -> bool | None:
    """Whether the LM head multiplies by the embedding table itself: the weights actually shared (one tensor, or
    two views of the same memory), whatever `config.tie_word_embeddings` claims. None when the model has no
    separate input or output embeddings to compare, or their weights are not materialised (meta tensors)."""
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    a, b = (_stored_bytes(m) for m in (inp, out))
    if a is not None and b is not None:  # ggml rows (a GGMLLinear / GGMLEmbedding) or a table viewed as them
        return a.data_ptr() == b.data_ptr() != 0 and a.numel() == b.numel()
    a, b = getattr(inp, "weight", None), getattr(out, "weight", None)
    if a is None or b is None:
        return None
    if a is b:
        return True
    if a.is_meta or b.is_meta:
        return None
    return a.device == b.device and a.shape == b.shape and a.data_ptr() == b.data_ptr() != 0


def _ggml_values(model) -> int:
    """Weights held as ggml rows (GGMLLinear / GGMLEmbedding: not Parameters), each matrix once; a matrix that is a
    Parameter's own memory (a tied head viewing the embedding table) is counted there already."""
    params = {p.data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    for module in model.modules():
        matrix = getattr(module, "matrix", None)
        if matrix is not None and hasattr(matrix, "raw") and matrix.raw.data_ptr() not in params:
            seen[matrix.raw.data_ptr()] = matrix.rows * matrix.cols
    return sum(seen.values())


def _stored_bytes(module):
    """The bytes a module multiplies by without reading its `weight` (a GGMLLinear's is a float32 copy made on
    demand): a ggml module's rows, an nn.Embedding's table as bytes; None for anything else."""
    import torch

    matrix = getattr(module, "matrix", None)
    if matrix is not None:
        return matrix.raw
    if not isinstance(module, torch.nn.Embedding) or module.weight.is_meta:
        return None
    return module.weight.detach().reshape(-1).view(torch.uint8)
