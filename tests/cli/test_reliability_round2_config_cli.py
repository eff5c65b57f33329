"""Issue 35, items 2 and 9, from the command line: an HF folder whose config.json says 10^9 layers is refused at once
in one line (it used to grow memory without limit, printing nothing), and one whose context is -5 is refused before
any prompt is measured against it (it used to say "the prompt is 2 tokens, 8 over this model's context of -5")."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

from cli_run import one_line_error
from tiny_models import tiny_model

MEMORY = 4 * 1024 ** 3  # the address space the command gets: far more than a tiny model needs
SECONDS = 60


class Ids:
    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def __len__(self):
        return 320


def bounded_tokentui(*args):
    """`tokentui` in a subprocess that cannot take more than MEMORY or SECONDS (what the old code did without end)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))

    return subprocess.run([sys.executable, "-m", "tokentui", *args], capture_output=True, text=True,
                          timeout=SECONDS, preexec_fn=limit, env=dict(os.environ))


def word_tokenizer():
    """A tokenizer of the words w0..w319 (one id each), so that the folder runs as it is."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(len(Ids()))}, unk_token="w3"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w3", pad_token="w0", bos_token="w1",
                                   eos_token="w2")


def folder_with(tmp_path, **changes):
    folder = tmp_path / "tiny"
    tiny_model("llama", Ids()).save_pretrained(folder)  # hidden 64, 2 layers, vocab 320
    word_tokenizer().save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_billion_layers_is_refused_at_once(tmp_path, isolated_dirs):
    folder = folder_with(tmp_path, num_hidden_layers=10 ** 9)
    started = time.perf_counter()
    result = bounded_tokentui("--headless", "--no-record", "--device", "cpu", "--model", str(folder))
    seconds = time.perf_counter() - started
    one_line_error(result, "tiny: config.json says 1000000000 layers (num_hidden_layers) but model.safetensors "
                           "holds weights for 2; fix config.json or download the model again")
    assert seconds < SECONDS / 2, seconds  # the command's own start-up, then the check: milliseconds


def test_a_billion_layers_beside_an_unreadable_weights_file_is_refused_too(tmp_path, isolated_dirs):
    folder = folder_with(tmp_path, num_hidden_layers=10 ** 9)
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)  # no names to count layers by
    result = bounded_tokentui("--headless", "--no-record", "--device", "cpu", "--model", str(folder))
    one_line_error(result, "tiny: config.json says 1000000000 layers (num_hidden_layers), more than tokentui accepts "
                           "(10000) when the weights' names do not show them")


def test_a_negative_context_is_refused_before_the_prompt(tmp_path, isolated_dirs):
    folder = folder_with(tmp_path, max_position_embeddings=-5)
    result = bounded_tokentui("--headless", "--no-record", "--device", "cpu", "--model", str(folder), "--prompt",
                              "w5 w6", "--max-new-tokens", "2")
    one_line_error(result, "tiny: config.json gives max_position_embeddings = -5; it must be a whole number from 1 "
                           "to 2147483647 (fix config.json or download the model again)")
