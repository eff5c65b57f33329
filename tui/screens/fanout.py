"""`f`: fan out at the step in view — what else does the distribution hold from here? N samples of M tokens are
drawn in one batched decode that shares the prefix's KV cache (core/model/fanout.py); this dialog lists them,
most likely first (sequence log-probability: the sum of ln post-sampler probability), marks where each leaves the
run (`run +k`: its k-th token is the first the run did not take; the shared part is dim) and where it leaves the
other samples (`split +k`; `twin`: another sample is the same throughout), and sets the first tokens drawn against
the step's post-sampler probabilities. Enter adopts the highlighted sample as a branch (its tokens forced from the
step, then the model goes on); esc closes.

It reads the FanoutState of tui/explore.py, which the controller fills as the samples come; `refresh_state`
paints it again.
"""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from tokentui.core.runs.fanout_view import first_difference, first_tokens, piece_texts, ranked, split_from_others
from tokentui.core.samplers import stage_summary

from .modal import ListDialog, list_dialog_css

BAR = 12  # cells of the first-token share bars


def _settings(s) -> str:
    if s.is_greedy:
        return "greedy"
    cuts = [part for part in stage_summary(s, exact=True) if not part.endswith(" off")]  # the stages that cut
    return " ".join([f"T {s.temperature:g}", *cuts])


def sample_line(sample, run_after: tuple[int, ...], samples, width: int) -> Text:
    """One sample: number, log-probability, where it leaves the run and the others, its text (shared part dim)."""
    line = Text()
    line.append(f"#{sample.n:<2} ", style="bold")
    line.append(f"{sample.logprob:7.2f} " if sample.logprob is not None else "      ? ")
    leaves = first_difference(sample.ids, run_after[:len(sample.ids)]) if run_after else 0
    line.append(f"{'= run' if leaves is None else f'run +{leaves + 1}':<7}", style="dim" if leaves is None else "")
    split = split_from_others(sample, samples)
    line.append(f"{'twin' if split is None else f'split +{split + 1}':<9}", style="dim")
    room = max(width - cell_len(line.plain), 8)
    shared = len(sample.ids) if leaves is None else leaves
    body = Text()
    for k, text in enumerate(piece_texts(sample.pieces)):
        body.append(text, style="dim" if k < shared else "bold")
    if cell_len(body.plain) > room:
        body.truncate(room - 1)
        body.append("…", style="dim")
    line.append_text(body)
    return line


def first_token_lines(samples, candidates) -> Text:
    """The first tokens drawn: each one's share of the samples next to the step's post-sampler probability."""
    out = Text()
    counted = first_tokens(samples, candidates)
    total = sum(t.count for t in counted)
    for n, t in enumerate(counted[:5]):
        if n:
            out.append("\n")
        out.append(set_cell_size(t.piece, 12) + " ", style="bold")
        drawn = round(t.share * BAR)
        out.append("█" * drawn + "·" * (BAR - drawn), style="green")
        prob = f"{t.prob:5.1%}" if t.prob is not None else "  —  "
        out.append(f" {t.count}/{total} drawn · p {prob}")
    return out


class FanoutScreen(ListDialog):

    DEFAULT_CSS = list_dialog_css("FanoutScreen", width=110, list_height=10) + """
    FanoutScreen #fanout-first { color: $text; margin: 1 0 0 0; height: auto; }
    """

    def __init__(self, state, run_label: str = "") -> None:
        super().__init__()
        self.state = state
        self.run_label = run_label
        self._shown = -1  # samples listed so far

    def compose(self) -> ComposeResult:
        state = self.state
        r = state.request
        with Vertical() as body:
            body.border_title = (f"fan-out at step {r.at + 1}" + (f" of {self.run_label}" if self.run_label else "")
                                 + f" · {r.n} × {r.m} tokens")
            body.border_subtitle = "↑↓ pick · enter adopt as a branch · esc close"
            yield Static("", id="fanout-head", markup=False)
            yield OptionList(id="fanout-samples")
            yield Static("", id="fanout-first")

    def on_mount(self) -> None:
        self.refresh_state()
        self.query_one(OptionList).focus()

    def refresh_state(self) -> None:
        state, r = self.state, self.state.request
        head = self.query_one("#fanout-head", Static)
        settings = _settings(state.event.settings) if state.event is not None else ""
        seeds = f"seeds {r.seed}..{r.seed + r.n - 1}"
        drawn_with = {sample.seed for sample in state.samples}
        if len(state.samples) > 1 and len(drawn_with) == 1:  # a server's: one request, one seed (core/server/fanout.py)
            seeds = f"one request seeded {drawn_with.pop()}"
        if state.error is not None:
            head.update(Text(f"The fan-out failed: {state.error}", style="bold red"))
        elif state.running:
            head.update(f"Drawing {r.n} samples of {r.m} tokens in one batched decode ({settings or 'the settings'}, "
                        f"{seeds})…")
        else:
            reused = state.event.kv_reused_tokens if state.event is not None else 0
            prefix = f"{reused} cached positions reused" if reused else "prefix prefilled once"
            head.update(f"{len(state.samples)} samples · {settings} · {seeds} · {prefix} · most likely first "
                        f"(Σ ln p after the sampler)")
        if len(state.samples) != self._shown:
            self._shown = len(state.samples)
            options = self.query_one(OptionList)
            highlighted = options.highlighted
            options.clear_options()
            width = max((self.size.width or 110) - 6, 40)
            after = state.run_after()
            options.add_options([Option(sample_line(s, after, state.samples, min(width, 104)), id=str(s.n))
                                 for s in ranked(state.samples)])
            if state.samples:
                options.highlighted = highlighted if highlighted is not None else 0
        first = self.query_one("#fanout-first", Static)
        if state.samples and state.event is not None:
            text = Text("first tokens drawn, against the step's probability after the sampler:\n", style="dim")
            text.append_text(first_token_lines(state.samples, state.event.candidates))
            first.update(text)
        else:
            first.update("")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id))
