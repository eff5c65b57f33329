"""A recorded run — or a tree of runs (core/runs/tree.py) — played back through the engine interface, so the
dashboard (and headless mode) can show a record as if a model were writing it: `tokentui replay FILE.jsonl` (or
`FILE.tree.jsonl`). No torch, no model. A tree's first run plays as `run()`; each of its branches plays as
`branch(point)` with the point it was recorded at (the dashboard asks for them in order, as they were taken), and
any other point is refused in one line.

Timing: each step comes after its recorded latency (the prefill after its recorded time), divided by `speed`
(2 = twice as fast), and no wait longer than MAX_WAIT_S; speed 0 plays it as fast as it can be read. Pause, step and
stop act at step boundaries, as in the engine, and never wait for a recorded time: pausing (space) ends the wait in
progress and holds the replay at the next step, and while paused a step let through (n) or the resumed run comes at
once (a replay has nothing to compute). The sampler cannot change a recorded run: `set_sampler` refuses with a
SettingsError; nor can a replay branch (`branch_refusal` says how to branch a record instead).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Iterator

from ..errors import SettingsError
from ..interface import BaseEngine
from .ending import stopped_done
from .events import DoneEvent, Event, LoadProgress, Notice, PrefillEvent, PrefillProgress, PromptEvent, StepEvent
from .facts import ModelFacts
from ..errors import RecordError
from .run import Run
from .tree import RunTree, TreeNode, is_tree_file
from ..settings import RunOptions, SamplerSettings


MIN_SPEED = 0.001  # a thousand times slower than recorded: a 20 ms step takes 20 s (1e-300 would take forever)
MAX_WAIT_S = 60.0  # the longest a replay waits for one step (or prefill), whatever the record and the speed say


def check_speed(speed: float) -> float:
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or math.isnan(speed) or math.isinf(speed) \
            or speed < 0:
        raise SettingsError(f"--speed must be a number >= 0 (1 = as recorded, 0 = as fast as possible), got {speed!r}")
    if 0 < speed < MIN_SPEED:
        raise SettingsError(f"--speed {speed!r} is below {MIN_SPEED:g} (a step would take {1 / speed:.3g} times as "
                            "long as it did): use a speed >= 0.001, or 0 for as fast as possible")
    return float(speed)


def _sampler_of(run: Run) -> SamplerSettings:
    """The settings the first step was taken with (the defaults when the record has no step); valid, since a
    step's settings are a SamplerSettings (the record's reader refuses a record whose settings are not)."""
    first = run.first
    return first.settings if first is not None else SamplerSettings()


def _options_of(run: Run) -> RunOptions:
    """What bounded the recorded run, as far as the record tells: the length it reached, whether it went on past
    an end token (a special token before the last step: only --ignore-eos does that), the candidates per step, and
    whether its steps carry the logit lens (the dashboard then opens with the lens panel, as the run was watched),
    the attention and the sublayer norms (issue 39: the dashboard's views of them)."""
    done = run.done
    tokens = max(1, done.tokens if done is not None else len(run))
    specials = run.values("special", 0, max(0, len(run) - 1))
    first = run.first
    return RunOptions(max_new_tokens=tokens, ignore_eos=any(specials),
                      top_candidates=max(1, len(first.candidates)) if first is not None else 10,
                      logit_lens=any(step.lens is not None for step in run),
                      attention=any(step.attention is not None for step in run),
                      attention_heads=any(a.heads is not None for step in run for a in step.attention or ()),
                      sublayers=any(step.sublayers is not None for step in run))


class ReplayEngine(BaseEngine):
    """Plays a `Run` (usually `Run.from_record(path)`), or the runs of a tree, with the engine interface
    (core/interface.py)."""

    def __init__(self, run: Run, speed: float = 1.0, name: str | None = None, tree: RunTree | None = None) -> None:
        if run.facts is None:
            raise ValueError("a replay needs the run's model facts")
        self.source = run
        self.tree = tree
        self.speed = check_speed(speed)
        label = name or (run.record_path.name if run.record_path is not None else "a run")
        # the model panel says where the run comes from; the load time was the recorded model's, not this one's
        self.facts: ModelFacts = replace(run.facts, source=f"replay of {label}", load_seconds=0.0)
        self.options: RunOptions = _options_of(run)
        super().__init__(_sampler_of(run))  # pause / single step / stop exactly as the engine's (core/controls.py)

    @classmethod
    def from_record(cls, path: str | Path, speed: float = 1.0) -> "ReplayEngine":
        return cls(Run.from_record(path), speed=speed)

    @classmethod
    def from_file(cls, path: str | Path, speed: float = 1.0) -> "ReplayEngine":
        """A record or a tree file (told apart by its first line); RecordError (one line) when it is neither."""
        if is_tree_file(path):
            tree = RunTree.read(path)
            if 1 not in tree.runs:
                raise RecordError(f"{path}: the tree's first run was not recorded: nothing to replay")
            return cls(tree.runs[1], speed=speed, name=Path(path).name, tree=tree)
        return cls.from_record(path, speed=speed)

    @property
    def as_tree(self) -> RunTree:
        """What the replay holds, as a tree (a lone record: a tree of one run)."""
        if self.tree is not None:
            return self.tree
        return RunTree(prompt=self.source.prompt.user_prompt if self.source.prompt else "",
                       model=self.source.facts.name, nodes=[TreeNode(1)], runs={1: self.source})

    # ---- settings: fixed by the record (pause, step and stop: core/controls.py's, at step boundaries) --------
    def set_sampler(self, settings: SamplerSettings) -> SamplerSettings:
        raise SettingsError("a replay cannot change the sampler: it plays the steps as they were recorded")

    @property
    def branch_refusal(self) -> str | None:
        if self.tree is not None and len(self.tree) > 1:
            return None  # its recorded branches (any other point is refused)
        return ("a replay cannot branch: it plays a record back with no model loaded (branch the record with "
                "`tokentui branch RECORD --at STEP --token ID`)")

    # a replay has no model to run: forcing a phrase, scoring and fanning out are refused, saying how to do them
    phrase_refusal = ("a replay cannot run the model: force a phrase on the record with `tokentui branch RECORD "
                      "--at STEP --text PHRASE`")
    score_refusal = "a replay cannot run the model: score a text with `tokentui score --prompt P --answer A`"
    fanout_refusal = ("a replay cannot run the model: fan out from the record with `tokentui fanout RECORD --at "
                      "STEP -n N`")

    def _branch(self, point, run_id: int) -> Iterator[Event]:
        """The recorded branch that left at `point` (the tree's, in order); another point is refused."""
        for node in self.tree.nodes[1:]:
            run = self.tree.runs.get(node.number)
            if run is None or run.branch is None or (node.at, node.token) != (point.at, point.token):
                continue
            if tuple(run.branch.tokens) == tuple(point.tokens):
                yield from self._play(run, None, None, run_id)
                return
        raise SettingsError(f"a replay plays only the branches it recorded; step {point.at + 1} with token "
                            f"{point.token} is not one of them (branch the record with `tokentui branch`)")

    @property
    def turn_refusal(self) -> str | None:
        if self.tree is not None and any(node.is_turn for node in self.tree.nodes):
            return None  # its recorded follow-ups (any other is refused)
        return ("a replay cannot run the model: ask a follow-up with `tokentui --headless --prompt … "
                "--follow-up …`")

    def _turn(self, request, run_id: int) -> Iterator[Event]:
        """The recorded follow-up with `request`'s turn and user message (the tree's, in order); another is
        refused."""
        for node in self.tree.nodes[1:]:
            run = self.tree.runs.get(node.number)
            if run is not None and node.is_turn and (node.turn, node.user) == (request.turn, request.user):
                yield from self._play(run, None, None, run_id)
                return
        raise SettingsError("a replay plays only the follow-ups it recorded; this one is not one of them (ask it "
                            "with `tokentui --headless --prompt … --follow-up …`)")

    def _wait(self, ms: float, run_id: int) -> bool:
        """Sleep `ms` of recorded time at the replay's speed, at most MAX_WAIT_S; not at all while paused (the gate
        holds the step: n or space lets it through at once), and no longer once paused meanwhile. False when
        stopped."""
        seconds = min(ms / 1000.0 / self.speed, MAX_WAIT_S) if self.speed > 0 and ms > 0 else 0.0
        return self.sleep_at_gate(seconds, run_id, until_paused=True)

    # ---- the run -------------------------------------------------------------------------------------------
    def run(self, prompt: str | None = None, system: str | None = None, *, run_id: int | None = None
            ) -> Iterator[Event]:
        """The recorded run's events from its prompt on (the prompt and system given are not run: a note says
        so when they differ from the recorded ones). Ends with the recorded end, or — stopped, or a record cut
        short — with a `done` event (reason "stopped") for the steps played."""
        return super().run(prompt, system, run_id=run_id)

    def _run(self, prompt: str | None, system: str | None, run_id: int) -> Iterator[Event]:
        yield from self._play(self.source, prompt, system, run_id)

    def _play(self, source: Run, prompt: str | None, system: str | None, run_id: int) -> Iterator[Event]:
        # like the engine's, a step granted before the run (pause + step) carries into it
        recorded = source.prompt
        if recorded is not None and prompt is not None and (prompt, system) != (recorded.user_prompt,
                                                                                recorded.system_prompt):
            yield Notice("a replay plays the recorded prompt; the prompt given is not run")
        played = 0
        prefill_ms = 0.0
        prompt_tokens = 0
        for event in source.events():
            if isinstance(event, (ModelFacts, LoadProgress)):
                continue
            if isinstance(event, PromptEvent):
                prompt_tokens = len(event.ids)
            elif isinstance(event, PrefillProgress):
                if not self._wait(event.elapsed_ms - prefill_ms, run_id):
                    break
                prefill_ms = event.elapsed_ms
            elif isinstance(event, PrefillEvent):
                if not self._wait(event.ms - prefill_ms, run_id):
                    break
                prefill_ms = event.ms
            elif isinstance(event, StepEvent):
                # the run's first step (a branch's: at its branch point) came its latency after the prompt went in,
                # of which the prefill has been waited for already
                wait = event.latency_ms - prefill_ms if event.index == source.offset else event.latency_ms
                if not self._wait(wait, run_id) or not self.wait_at_gate(run_id):
                    break
                played += 1
            yield event
            if isinstance(event, DoneEvent):
                return
        if source.record_notice is not None and not self.stopping(run_id):
            yield Notice(f"{source.record_notice}: replayed up to there")
        yield stopped_done(source[:played], prompt_tokens, self.facts.vocab_rows)
