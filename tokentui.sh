#!/usr/bin/env bash
# Start the tokentui dashboard on the embedded model (sets up ./.venv on first use). Flags pass through.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$root/scripts/setup.sh"
exec "$root/.venv/bin/tokentui" "$@"
