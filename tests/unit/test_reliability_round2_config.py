"""Issue 35, items 2 and 9 (HF folders): a config.json that does not belong to its safetensors weights is refused in
one line before transformers builds anything (core/model/load/config_check.py): sizes out of range, more layers than
the weights hold, a tensor whose shape is not the one the config implies; transformers' own size-mismatch error
("For details look at the above report!") becomes one line carrying the report; and every family of the
architecture matrix (tests/arch_matrix.py), saved as it is, passes the check."""

from __future__ import annotations

import json
import re

import pytest
from safetensors.torch import load_file, save_file

from arch_matrix import SPECS, build
from tiny_models import tiny_model
from tokentui.core.errors import ModelLoadError
from tokentui.core.model.load.config_check import check_model_folder
from tokentui.core.model.load.loader import load_model

VOCAB = 320
FIX = "fix config.json or download the model again"


class Ids:
    """What tiny_model / arch_matrix.build read off a tokenizer: its length and special ids (no tokenizer needed:
    every refusal here comes before the tokenizer is read)."""

    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def __len__(self):
        return VOCAB


def saved(model, folder, **max_shard):
    model.save_pretrained(folder, **max_shard)
    return folder


def edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def transpose_tensor(file, name):
    tensors = load_file(file)
    tensors[name] = tensors[name].T.contiguous()
    save_file(tensors, file, metadata={"format": "pt"})


def refusal(folder) -> str:
    with pytest.raises(ModelLoadError) as caught:
        load_model(str(folder), device="cpu", dtype="float32")
    text = str(caught.value)
    assert "\n" not in text and "above report" not in text, text
    return text


@pytest.fixture
def llama(tmp_path):
    return saved(tiny_model("llama", Ids()), tmp_path / "llama")  # hidden 64, 2 layers, vocab 320, tied


@pytest.mark.parametrize("key, value", [
    ("max_position_embeddings", -5), ("hidden_size", 2 ** 40), ("num_attention_heads", 0),
    ("vocab_size", "320"), ("intermediate_size", 128.5), ("num_hidden_layers", True)])
def test_a_size_that_is_not_a_positive_whole_number_is_refused(llama, key, value):
    edit_config(llama, **{key: value})
    assert refusal(llama) == (f"llama: config.json gives {key} = {json.dumps(value)}; it must be a whole number from "
                              "1 to 2147483647 (fix config.json or download the model again)")


def test_more_layers_than_the_weights_hold_is_refused(llama):
    edit_config(llama, num_hidden_layers=3)  # transformers would load it, the third layer random
    assert refusal(llama) == ("llama: config.json says 3 layers (num_hidden_layers) but model.safetensors holds "
                              "weights for 2; fix config.json or download the model again")


def test_a_dimension_larger_than_any_tensor_is_refused(llama):
    edit_config(llama, hidden_size=2 ** 30)
    assert refusal(llama) == ("llama: config.json says hidden_size 1073741824 but no tensor in model.safetensors has "
                              "a dimension that large (the largest is 320); fix config.json or download the model "
                              "again")


def test_a_swapped_tensor_shape_names_the_tensor_and_both_shapes(llama):
    transpose_tensor(llama / "model.safetensors", "model.embed_tokens.weight")
    assert refusal(llama) == ("llama: model.embed_tokens.weight is [64, 320] in model.safetensors but config.json "
                              "implies [320, 64]; fix config.json or download the model again")


def test_a_config_whose_sizes_disagree_with_every_layer_names_the_embedding_first(tmp_path):
    folder = saved(build("gpt2", Ids()), tmp_path / "gpt2")  # its blocks' names come before wte's in the file
    edit_config(folder, n_embd=32)
    assert refusal(folder).startswith("gpt2: transformer.wte.weight is [320, 64] in model.safetensors but "
                                      "config.json implies [320, 32] (and ")


def test_sharded_weights_are_checked_through_their_index(tmp_path):
    folder = saved(tiny_model("llama", Ids()), tmp_path / "sharded", max_shard_size="40KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 1
    edit_config(folder, num_hidden_layers=3)  # (10^9: tests/cli/test_reliability_round2_config_cli.py, bounded)
    assert refusal(folder) == ("sharded: config.json says 3 layers (num_hidden_layers) but "
                               "model.safetensors.index.json lists weights for 2; fix config.json or download the "
                               "model again")
    edit_config(folder, num_hidden_layers=2)
    name = "model.layers.1.mlp.down_proj.weight"
    transpose_tensor(folder / index[name], name)
    assert refusal(folder) == (f"sharded: {name} is [128, 64] in {index[name]} but config.json implies [64, 128]; "
                               "fix config.json or download the model again")


def test_transformers_size_mismatch_report_becomes_one_line(tmp_path):
    """Mixtral's experts are fused while loading (a conversion the check leaves to transformers): transformers
    itself finds the mismatch and raises pointing at a report nobody sees; the line carries the report."""
    folder = saved(build("mixtral", Ids()), tmp_path / "mixtral")
    edit_config(folder, intermediate_size=160)
    text = refusal(folder)
    assert text.startswith("mixtral: model.layers.0.mlp.experts.down_proj is [4, 64, 128] in the weights but "
                           "config.json implies [4, 64, 160] (and "), text


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_matrix_family_passes_and_its_wrong_configs_do_not(tmp_path, name):
    """No family tokentui supports is refused as saved; the same family with one layer more than its weights, or
    its embedding table stored transposed, is refused by the loader before transformers builds it."""
    model = build(name, Ids())
    folder = saved(model, tmp_path / name)
    check_model_folder(folder, name)  # as saved: no refusal
    config = json.loads((folder / "config.json").read_text())
    key = next(k for k in ("num_hidden_layers", "n_layer") if k in config)
    edit_config(folder, **{key: config[key] + 1})
    assert re.fullmatch(rf"{name}: config.json says {config[key] + 1} layers \({key}\) but model.safetensors holds "
                        rf"weights for {config[key]}; {FIX}", refusal(folder))
    edit_config(folder, **{key: config[key]})
    embedding = next(k for k, p in model.named_parameters() if p is model.get_input_embeddings().weight)
    transpose_tensor(folder / "model.safetensors", embedding)
    hidden = model.get_input_embeddings().weight.shape[1]
    assert refusal(folder) == (f"{name}: {embedding} is [{hidden}, {VOCAB}] in model.safetensors but config.json "
                               f"implies [{VOCAB}, {hidden}]; fix config.json or download the model again")
