"""Issue 35 (reliability, round 2), the GGUF items on the command line: a file whose layer count its tensors
contradict is refused in seconds with one line and status 2; a model cache on a read-only file system leaves the
default model running from memory, with one line saying the cache is off and why (in-process tests of the same:
tests/unit/test_reliability_round2_gguf.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
from gguf import GGUFReader

from cli_run import one_line_error, tokentui
from tokentui.core.model.load.loader import embedded_gguf


def test_a_billion_blocks_is_refused_in_seconds(tmp_path, isolated_dirs):
    """Before: nothing printed while memory grew by ~30 MB/s building decoder layers (3.4 GB after two minutes):
    here that is a timeout."""
    path = tmp_path / "billion.gguf"
    shutil.copyfile(embedded_gguf(), path)
    reader = GGUFReader(str(path), "r+")
    reader.fields["llama.block_count"].parts[-1][0] = 10**9
    reader.data.flush()
    del reader
    started = time.monotonic()
    result = tokentui("--headless", "--no-record", "--model", str(path), "--prompt", "hi", timeout=90)
    one_line_error(result, f"{path}: corrupt GGUF file: it says 1000000000 blocks (llama.block_count) but holds "
                           "tensors for 30; download it again or pass another --model")
    assert time.monotonic() - started < 60  # the parse of the tensor table: seconds, not minutes


def read_only_mount_works() -> bool:
    """Whether this machine lets a process mount a read-only tmpfs in namespaces of its own (util-linux's unshare,
    user namespaces allowed): the EROFS a read-only home gives, without touching the machine's own mounts."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o ro none /tmp && ! touch /tmp/x'],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(not read_only_mount_works(), reason="cannot mount a read-only tmpfs here (unshare -rm)")
def test_a_read_only_cache_runs_the_default_model_from_memory(tmp_path, isolated_dirs):
    """TOKENTUI_CACHE_DIR on a read-only tmpfs, mounted for this process only: the first start's conversion cannot
    be saved. Before: "unexpected error" and a crash log (Errno 30 from write_cache)."""
    cache = tmp_path / "read-only-cache"
    cache.mkdir()
    mount = 'mount -t tmpfs -o ro none "$0" && TOKENTUI_CACHE_DIR="$0" exec "$@"'
    result = subprocess.run(["unshare", "-rm", "sh", "-c", mount, str(cache), sys.executable, "-m", "tokentui",
                             "--headless", "--no-record", "--prompt", "Say hi", "--max-new-tokens", "3",
                             "--temperature", "0"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-800:]
    assert result.stdout.strip()  # the answer
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert lines == [f"tokentui: the model cache is off: {cache}/quantized cannot be written (Read-only file "
                     "system), so this model was converted in memory and will be again at every start; set "
                     "TOKENTUI_CACHE_DIR to a writable folder"], result.stderr
