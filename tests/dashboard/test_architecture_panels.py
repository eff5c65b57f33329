"""Issue 24 in the dashboard: the KV, model and one-pass panels for models that are not plain attention + MLP (the
facts of tiny models from tests/arch_matrix.py, played by the scripted engine), and the KV panel's formula, multiplied
out, against the facts' own figures for every kind of layer."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from arch_matrix import build
from fakes import make_loader, wait_for
from snapshot_apps_anatomy import TimedEngine
from tokentui.core.model.load.loader import model_facts
from tokentui.core.runs.architecture import formula_terms, state_bytes
from tokentui.core.settings import RunOptions
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.panels.kv import formula_lines

NAMES = ["llama", "falcon_mqa", "falcon_new", "gemma2", "cohere2", "deepseek_v3", "llama4", "qwen3_next", "lfm2",
         "mamba", "mamba2"]
_FACTS: dict = {}


def facts_of(name, tokenizer):
    if name not in _FACTS:
        _FACTS[name] = model_facts(build(name, tokenizer), tokenizer, name=f"tiny-{name}")
    return _FACTS[name]


def evaluate(term: str) -> int:
    """A formula term's bytes: `2×1L×2h×16×4 B ≤39` -> 256, `2L×(16+8)×4 B` -> 192 (digits only, our text)."""
    arithmetic = re.sub(r"[a-zA-Z]+ ", "", term.split(" B")[0]).replace(",", "").replace("×", "*").replace(
        "L", "").replace("h", "")
    assert re.fullmatch(r"[\d*+() ]+", arithmetic), term
    return eval(arithmetic)  # noqa: S307 - digits and * + ( ) only, checked above


@pytest.mark.parametrize("name", NAMES)
def test_the_formula_multiplies_out_to_the_per_token_figure_and_the_state(name, smol_tokenizer):
    facts = facts_of(name, smol_tokenizer)
    bpv = facts.kv_bytes_per_value
    terms = formula_terms(facts.kv_groups, bpv)
    for form in (1, 2):  # the short and the shortest text say the same bytes
        assert sum(evaluate(t[form]) for t in terms if t[3]) == facts.kv_bytes_per_token
        assert sum(evaluate(t[form]) for t in terms if not t[3]) == state_bytes(facts.kv_groups, bpv)
    assert [t[3] for t in terms] == sorted((t[3] for t in terms), reverse=True)  # the per-position terms first
    for width in (34, 80):  # the panel's lines, one per kind when they do not fit on one
        lines = formula_lines(facts, facts.kv_groups, bpv, width=width, room=6)
        assert lines[0].startswith("= ") and all(len(line) <= width or len(lines) > 1 for line in lines)


async def run_app(facts, size=(160, 48)):
    engine = TimedEngine(facts=facts, options=RunOptions(max_new_tokens=12, ignore_eos=True))
    app = TokentuiApp(DashboardConfig(load=make_loader(engine), sampler=engine.sampler, options=engine.options,
                                      user_theme_dir=None, recorder=None))
    return app


def panel(app, widget_id: str) -> str:
    return app.query_one(f"#{widget_id}").last_text.plain


@pytest.mark.parametrize("name, kv, model, one_pass", [
    ("mamba", ["per token  0 B + 12.0 KiB fixed", "= 2L×(conv 128×4+SSM 128×8)×4 B"],
     ["blocks       2 SSM (MambaMixer)", "context      — no limit in the config"],
     ["SSM mixer reads its state", "[1, 128, 4] + [1, 128, 8]"]),
    ("qwen3_next",
     ["per token  256 B + 18.0 KiB fixed", "= 2×1L×2h×16×4 B", "+ 3L×(conv 128×4+rec 4×16×16)×4 B"],
     ["blocks       3 linear attn + 1 attention", "experts      top-2 of 4 + 1 shared"],
     ["3 linear-attention blocks", "linear attention reads its state"]),
    ("gemma2", ["per token  512 B, 256 B past 39"], ["window       sliding 40 in 1 of 2 layers"],
     ["1 sliding block", "1 full block"]),
    ("deepseek_v3", ["per token  192 B", "= 2L×(16+8)×4 B"], ["attention    4 heads · a latent KV (MLA)"],
     ["1 dense block", "latent attention reads the KV cache", "16] + [1, 1, "]),
])
async def test_the_panels_say_what_the_layers_hold(name, kv, model, one_pass, smol_tokenizer):
    facts = replace(facts_of(name, smol_tokenizer), tied_lm_head=True)
    app = await run_app(facts)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.pause(0.1)
        app.redraw()
        await pilot.pause(0.05)
        for wanted, text in ((kv, panel(app, "kv")), (model, panel(app, "model")),
                             (one_pass, app.anatomy_panel.last_text.plain)):
            for line in wanted:
                assert line in text, (line, text)
        await pilot.press("q")
