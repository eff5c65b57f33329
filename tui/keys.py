"""One table of every key: the app's bindings, the footer, the help screen and the command palette read it."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding

from tokentui.core.samplers import PARAMS, TOP_K_STEPS, next_notch  # noqa: F401 (TOP_K_STEPS: the ladder, for tests)

TRAVEL = Binding.Group("past", compact=True)  # the time-travel cursor: one step back / forward


@dataclass(frozen=True)
class KeySpec:
    id: str  # binding id (usable in a Textual keymap), "tokentui.<name>"
    keys: str  # Textual key names, comma-separated
    display: str  # how the help screen shows the keys
    action: str
    footer: str  # short description for the footer
    title: str  # command palette title
    help: str  # one line for the help screen and the palette
    group: Binding.Group | None = None
    show: bool = True
    bar: bool = True  # in the key bar (tui/keybar.py); False: the help screen and the palette only


def _sampler_keys() -> tuple[KeySpec, ...]:
    """A key down and a key up for each sampler parameter that has them (core/samplers.py PARAMS), in the chain's
    order: `sampler('<name>', ±1)` moves it one notch (the parameter's own `nudge`)."""
    specs = []
    for p in PARAMS:
        if p.keys is None:
            continue
        down, up, down_help, up_help = p.keys
        group = Binding.Group(p.short_name, compact=True)
        title = p.label[0].upper() + p.label[1:]
        specs.append(KeySpec(f"tokentui.{p.label}-down", down, down, f"sampler({p.name!r}, -1)", "−",
                             f"{title} down", down_help, group, bar=p.in_bar))
        specs.append(KeySpec(f"tokentui.{p.label}-up", f"{up},shift+{down}", up, f"sampler({p.name!r}, 1)", "+",
                             f"{title} up", up_help, group, bar=p.in_bar))
    return tuple(specs)


SAMPLER_KEYS = _sampler_keys()

KEYS: tuple[KeySpec, ...] = (
    KeySpec("tokentui.help", "question_mark", "?", "help", "help", "Help",
            "list every key"),
    *SAMPLER_KEYS,
    KeySpec("tokentui.greedy", "g", "g", "toggle_greedy", "greedy", "Greedy / sample",
            "switch between greedy decoding (always the top token) and sampling"),
    KeySpec("tokentui.seed", "s", "s", "new_seed", "seed", "New seed",
            "draw a new random seed for sampling"),
    KeySpec("tokentui.pause", "space", "space", "toggle_pause", "pause", "Pause / resume",
            "pause or resume generation at the next step boundary; while loading: pause at the first token"),
    KeySpec("tokentui.step", "n,right", "n / →", "step", "step", "One step",
            "while paused: let exactly one token through; while generating: pause (then n steps)"),
    KeySpec("tokentui.cursor-back", "left_square_bracket", "[", "cursor(-1)", "back", "Step back (time travel)",
            "view the step before as it was (the run goes on)", TRAVEL),
    KeySpec("tokentui.cursor-forward", "right_square_bracket", "]", "cursor(1)", "forward",
            "Step forward (time travel)", "view the step after (stops at the newest)", TRAVEL),
    KeySpec("tokentui.cursor-back-10", "left_curly_bracket", "{", "cursor(-10)", "back 10", "Ten steps back",
            "view the step ten before", bar=False),
    KeySpec("tokentui.cursor-forward-10", "right_curly_bracket", "}", "cursor(10)", "forward 10", "Ten steps forward",
            "view the step ten after", bar=False),
    KeySpec("tokentui.cursor-first", "less_than_sign", "<", "cursor_first", "first", "First step",
            "view the first step (a click on a token views its step)", bar=False),
    KeySpec("tokentui.live", "escape", "esc", "cursor_live", "live", "Back to live",
            "leave time travel: follow the newest step again", bar=False),
    KeySpec("tokentui.sampler-editor", "S,shift+s", "S", "sampler_editor", "sampler", "Sampler editor",
            "every stage's settings, order, on / off (enter applies, esc cancels)", bar=False),
    KeySpec("tokentui.preview-branch", "enter", "enter", "preview_branch", "take", "Take the preview",
            "a step previewed under new settings: branch there with them", bar=False),
    KeySpec("tokentui.restart", "r", "r", "restart", "restart", "Restart",
            "run the same prompt again with the same seed"),
    KeySpec("tokentui.edit", "e", "e", "edit_prompt", "prompt", "Edit prompt",
            "edit the prompt and system prompt (ctrl+a selects all, ctrl+r raw: no chat template), then run again"),
    KeySpec("tokentui.follow-up", "u", "u", "follow_up", "follow-up", "Follow-up",
            "after an answer: ask a follow-up in the same conversation (the earlier turns' KV cache reused)",
            bar=False),
    KeySpec("tokentui.heat", "h", "h", "toggle_heat", "heat", "Heat map",
            "colour each answer token by the probability it had; show token boundaries"),
    KeySpec("tokentui.ids", "i", "i", "toggle_ids", "ids", "Token ids",
            "show the token id on every prompt chip", bar=False),
    KeySpec("tokentui.export", "x", "x", "export", "export", "Export answer",
            "write the answer to a text file next to the run record and show both paths"),
    KeySpec("tokentui.branch", "b", "b", "branch", "branch", "Branch here",
            "another candidate at the step in view (its rank 1–9 at once), or t: a phrase to force; a paused run "
            "stays paused"),
    KeySpec("tokentui.fanout", "f", "f", "fanout", "fan out", "Fan out here",
            "8 samples × 32 tokens from the step in view; enter adopts one", bar=False),
    KeySpec("tokentui.branches", "B,shift+b", "B", "branches", "runs", "Runs of this prompt",
            "list the first run and its branches: switch to one, or compare two side by side (c)"),
    KeySpec("tokentui.lens", "l", "l", "toggle_lens", "lens", "Logit lens",
            "each layer's top token for the step in view (off by default: it costs time; from the next step)"),
    KeySpec("tokentui.anatomy", "a", "a", "toggle_anatomy", "one pass", "One pass",
            "each stage of the step in view: shape, host or device, time", bar=False),
    KeySpec("tokentui.attention", "A,shift+a", "A", "toggle_attention", "attention", "Attention view",
            "where the step's new token looks (captured from the next step)", bar=False),
    KeySpec("tokentui.logits", "L,shift+l", "L", "toggle_logits", "logits", "Raw logits",
            "the candidates' raw column as raw logits or as raw probabilities", bar=False),
    KeySpec("tokentui.palette", "ctrl+p", "ctrl+p", "command_palette", "palette", "Command palette",
            "search every action, and switch themes", bar=False),
    KeySpec("tokentui.quit", "q", "q", "quit", "quit", "Quit",
            "stop generating and leave"),
)


def app_bindings() -> list[Binding]:
    bindings = []
    for spec in KEYS:
        bindings.append(Binding(
            spec.keys, spec.action, spec.footer, show=spec.show,
            key_display="^p" if spec.keys == "ctrl+p" else spec.display.split(" ")[0],
            tooltip=spec.help, id=spec.id, group=spec.group,
        ))
    return bindings


next_top_k = next_notch  # top-k's one notch (K / k), for callers of the old name
