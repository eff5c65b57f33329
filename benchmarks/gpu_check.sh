#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py says what it runs and needs): one table of the real product on a CUDA
# machine. Python: $PYTHON, else ./.venv/bin/python, else python3.
#   bash benchmarks/gpu_check.sh                      # CUDA, bf16, 1,024 tokens
#   bash benchmarks/gpu_check.sh --device cpu --tiny  # dry run of every row on a CPU
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; else py="$(command -v python3)"; fi
fi
exec "$py" "$root/benchmarks/gpu_check.py" "$@"
