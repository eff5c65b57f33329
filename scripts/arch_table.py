"""Write the table of architectures × features from the architecture matrix (tests/arch_matrix.py): each
tiny model is built and checked as tests/unit/test_architecture_matrix.py checks it (a minute or two on 2 cores),
and the table between the markers in docs/models.md is replaced by what was measured. The test fails when that
table is not the matrix's. Each row says what was checked, not only that it held: the greedy ids against `generate`'s and
how many of those are distinct (the tiny models are built at an init where their output depends on the context), and
the teacher-forced logits (every step's raw log-probabilities against one full forward, within the tolerance shown).

    .venv/bin/python scripts/arch_table.py          # rewrite docs/models.md's table
    .venv/bin/python scripts/arch_table.py --check  # exit 1 when it differs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when docs/models.md differs")
    args = parser.parse_args()
    import torch

    from arch_matrix import BEGIN, END, SPECS, observe, render, table_section
    from tokentui.core.model.load.loader import load_model

    torch.set_num_threads(1)
    tokenizer = load_model(None, device="cpu", dtype="float32").tokenizer  # the embedded model's
    table = render([observe(name, tokenizer) for name in SPECS])
    page = REPO / "docs" / "models.md"
    text = page.read_text(encoding="utf-8")
    current = table_section(text)
    if args.check:
        print("docs/models.md's table is the matrix's" if current == table else "docs/models.md's table differs")
        return 0 if current == table else 1
    if not current:
        raise SystemExit(f"docs/models.md has no table markers: put {BEGIN} and {END} where it goes")
    page.write_text(text.replace(current, table), encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
