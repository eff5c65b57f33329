"""A deterministic stand-in for `tokentui.core.engine.Engine`, for the dashboard's tests.

`ScriptedEngine` has the engine's interface (facts, options, sampler, update_sampler, run, pause, resume,
step_once, stop, paused) and plays the article's answer "Partly. Some weights are open. (开放)": fixed
candidates, fixed timings, and 开 (e5 bc 80) split over two tokens so the pending-bytes path is exercised.
The sampler is honoured: temperature / top-k / top-p reshape the post-sampler probabilities, greedy picks the top
candidate, a cut token is never chosen, and a change made with `update_sampler` shows up in the next step's
`settings` with `settings_changed=True`.
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator

from tokentui.core.errors import ModelLoadError, TokentuiError
from tokentui.core.gate import StepGate
from tokentui.core.events import (
    Candidate,
    DoneEvent,
    ErrorEvent,
    Event,
    LoadProgress,
    ModelFacts,
    MultiTokenChar,
    Notice,
    PrefillEvent,
    PromptEvent,
    PromptPiece,
    StepEvent,
)
from tokentui.core.settings import RunOptions, SamplerSettings

EOS_ID = 151645
SPECIAL_IDS = frozenset({151643, 151644, EOS_ID})  # <|endoftext|>, <|im_start|>, <|im_end|>
KV_BYTES_PER_TOKEN = 2 * 28 * 8 * 128 * 2  # 114,688 (bf16)

FACTS = ModelFacts(
    name="Qwen3-0.6B",
    source="in-memory",
    architecture="Qwen3ForCausalLM",
    parameters=596_049_920,
    layers=28,
    hidden_size=1024,
    vocab_rows=151_936,
    attention_heads=16,
    kv_heads=8,
    head_dim=128,
    kv_bytes_per_token=KV_BYTES_PER_TOKEN,
    max_context=40_960,
    device="cpu",
    dtype="bfloat16",
    chat_template=True,
    trust_remote_code=False,
    load_seconds=1.5,
)

# The article's 13 prompt tokens for "Is OpenAI open?"
ARTICLE_PROMPT = [
    (151644, "<|im_start|>", True), (872, "user", False), (198, "↵", False), (3872, "Is", False),
    (5264, "␣Open", False), (15469, "AI", False), (1787, "␣open", False), (30, "?", False),
    (151645, "<|im_end|>", True), (198, "↵", False), (151644, "<|im_start|>", True),
    (77091, "assistant", False), (198, "↵", False),
]


@dataclass(frozen=True)
class ScriptStep:
    """One scripted token and the raw candidates around it (id, piece, raw probability), best first."""

    id: int
    piece: str
    text: str
    candidates: tuple[tuple[int, str, float], ...]
    special: bool = False
    pending_hex: str = ""
    pending_needed: int = 0
    completed: tuple[MultiTokenChar, ...] = ()


def _alts(*pairs) -> tuple[tuple[int, str, float], ...]:
    return tuple(pairs)


ANSWER: tuple[ScriptStep, ...] = (
    ScriptStep(4707, "Part", "Part", _alts((4707, "Part", 0.52), (5264, "␣Open", 0.26), (2753, "No", 0.13),
                                           (9454, "Yes", 0.03), (1084, "␣It", 0.02), (785, "The", 0.015),
                                           (2308, "␣No", 0.01), (32, "A", 0.006), (30172, "Open", 0.005),
                                           (40, "I", 0.004))),
    ScriptStep(398, "ly", "ly", _alts((398, "ly", 0.91), (13, ".", 0.04), (11, ",", 0.02), (25, ":", 0.01),
                                      (3918, "ially", 0.008), (12, "-", 0.004), (0, "!", 0.002),
                                      (198, "↵", 0.002), (26, ";", 0.001), (323, "␣and", 0.001))),
    ScriptStep(13, ".", ".", _alts((13, ".", 0.62), (11, ",", 0.3), (25, ":", 0.03), (0, "!", 0.02),
                                   (26, ";", 0.01), (1365, "␣—", 0.007), (198, "↵", 0.005), (320, "␣(", 0.004),
                                   (323, "␣and", 0.002), (12, "-", 0.001))),
    ScriptStep(4329, "␣Some", " Some", _alts((4329, "␣Some", 0.48), (5264, "␣Open", 0.21), (1084, "␣It", 0.12),
                                             (576, "␣The", 0.08), (4138, "␣While", 0.04), (1205, "␣Its", 0.02),
                                             (13023, "␣Many", 0.01), (4354, "␣However", 0.01),
                                             (8853, "␣Only", 0.008), (220, "␣", 0.004))),
    ScriptStep(14324, "␣weights", " weights", _alts((4119, "␣models", 0.44), (14324, "␣weights", 0.37),
                                                    (315, "␣of", 0.07), (2038, "␣code", 0.05),
                                                    (3412, "␣research", 0.03), (5479, "␣parts", 0.02),
                                                    (7375, "␣tools", 0.01), (5896, "␣projects", 0.004),
                                                    (821, "␣data", 0.002), (1849, "␣work", 0.001))),
    ScriptStep(525, "␣are", " are", _alts((525, "␣are", 0.88), (315, "␣of", 0.04), (614, "␣have", 0.03),
                                          (1033, "␣were", 0.02), (1083, "␣also", 0.01), (11, ",", 0.005),
                                          (320, "␣(", 0.003), (2578, "␣like", 0.002), (323, "␣and", 0.001),
                                          (13, ".", 0.001))),
    ScriptStep(1787, "␣open", " open", _alts((1787, "␣open", 0.79), (4652, "␣released", 0.1),
                                             (17424, "␣public", 0.05), (2500, "␣available", 0.03),
                                             (537, "␣not", 0.01), (1431, "␣now", 0.006), (1602, "␣free", 0.002),
                                             (8789, "␣shared", 0.001), (3601, "␣published", 0.0005),
                                             (13, ".", 0.0005))),
    ScriptStep(13, ".", ".", _alts((13, ".", 0.71), (11, ",", 0.15), (320, "␣(", 0.06), (26, ";", 0.03),
                                   (323, "␣and", 0.02), (198, "↵", 0.01), (1365, "␣—", 0.006), (0, "!", 0.002),
                                   (25, ":", 0.001), (12, "-", 0.001))),
    ScriptStep(320, "␣(", " (", _alts((320, "␣(", 0.55), (EOS_ID, "<|im_end|>", 0.35), (4329, "␣Some", 0.04),
                                      (576, "␣The", 0.03), (198, "↵", 0.01), (1084, "␣It", 0.008),
                                      (4354, "␣However", 0.004), (5264, "␣Open", 0.003), (2308, "␣No", 0.002),
                                      (220, "␣", 0.001))),
    ScriptStep(28156, "<0xE5><0xBC>", "", _alts((28156, "<0xE5><0xBC>", 0.9), (100713, "开放", 0.05),
                                                (5264, "Open", 0.02),
                                           (36667, "公", 0.01), (99243, "部", 0.008), (70, "e", 0.005),
                                           (45, "N", 0.003), (47, "P", 0.002), (32, "A", 0.001), (40, "I", 0.001)),
               pending_hex="e5 bc", pending_needed=1),
    ScriptStep(222, "<0x80>", "开", _alts((222, "<0x80>", 0.97), (223, "<0x81>", 0.01), (224, "<0x82>", 0.008),
                                       (225, "<0x83>", 0.005), (226, "<0x84>", 0.003), (227, "<0x85>", 0.002),
                                       (228, "<0x86>", 0.001), (229, "<0x87>", 0.0005), (230, "<0x88>", 0.0003),
                                       (231, "<0x89>", 0.0002)),
               completed=(MultiTokenChar("开", "e5 bc 80", 2),)),
    ScriptStep(99803, "放", "放", _alts((99803, "放", 0.93), (29826, "源", 0.04), (21470, "发", 0.01),
                                       (15946, "口", 0.008), (17992, "启", 0.005), (44934, "始", 0.003),
                                       (34204, "关", 0.002), (99447, "放权", 0.001), (37029, "合", 0.0005),
                                       (64, "a", 0.0005))),
    ScriptStep(8, ")", ")", _alts((8, ")", 0.96), (701, "),", 0.02), (568, ").", 0.01), (11, ",", 0.004),
                                  (198, "↵", 0.003), (220, "␣", 0.001), (7287, "/", 0.0005), (7, "(", 0.0003),
                                  (25, ":", 0.0001), (26, ";", 0.0001))),
    ScriptStep(EOS_ID, "<|im_end|>", "", _alts((EOS_ID, "<|im_end|>", 0.94), (576, "␣The", 0.02),
                                               (4329, "␣Some", 0.01), (198, "↵", 0.01), (1084, "␣It", 0.008),
                                               (151643, "<|endoftext|>", 0.005), (2308, "␣No", 0.004),
                                               (320, "␣(", 0.002), (11, ",", 0.0007), (13, ".", 0.0003)),
               special=True),
)

ANSWER_TEXT = "Partly. Some weights are open. (开放)"


def _entropy_bits(probs) -> float:
    return -sum(p * math.log2(p) for p in probs if p > 0)


def apply_sampler(raw: list[float], s: SamplerSettings) -> list[float]:
    """Post-sampler probabilities over the candidate list (treated as the whole distribution)."""
    total = sum(raw)
    raw = [p / total for p in raw]
    order = sorted(range(len(raw)), key=lambda i: -raw[i])
    if s.is_greedy:
        out = [0.0] * len(raw)
        out[order[0]] = 1.0
        return out
    scaled = [p ** (1.0 / s.temperature) for p in raw]
    z = sum(scaled)
    probs = [p / z for p in scaled]
    keep = set(order[: s.top_k]) if s.top_k else set(order)
    cumulative = 0.0
    kept_p = set()
    for i in order:
        if i not in keep:
            continue
        kept_p.add(i)
        cumulative += probs[i]
        if cumulative >= s.top_p - 1e-12:
            break
    z = sum(probs[i] for i in kept_p)
    return [probs[i] / z if i in kept_p else 0.0 for i in range(len(raw))]


def tokenize(prompt: str, system: str | None) -> tuple[str, list[PromptPiece], bool]:
    if prompt == "Is OpenAI open?" and system is None:
        text = "<|im_start|>user\nIs OpenAI open?<|im_end|>\n<|im_start|>assistant\n"
        return text, [PromptPiece(i, p, s) for i, p, s in ARTICLE_PROMPT], True
    pieces: list[PromptPiece] = []

    def words(s: str) -> None:
        for m in re.finditer(r" ?\w+| ?[^\w\s]|\s", s):
            w = m.group(0)
            disp = w.replace(" ", "␣").replace("\n", "↵")
            pieces.append(PromptPiece(sum(ord(c) * 31 ** n for n, c in enumerate(w)) % 150_000, disp, False))

    def special(name: str, id_: int) -> None:
        pieces.append(PromptPiece(id_, name, True))

    text = ""
    if system is not None:
        text += f"<|im_start|>system\n{system}<|im_end|>\n"
        special("<|im_start|>", 151644); words("system\n" + system); special("<|im_end|>", 151645); words("\n")
    text += f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    special("<|im_start|>", 151644); words("user\n" + prompt); special("<|im_end|>", 151645); words("\n")
    special("<|im_start|>", 151644); words("assistant\n")
    return text, pieces, True


class ScriptedEngine:
    """Plays `ANSWER` step by step; see the module docstring.

    delay: seconds between steps (so pilot tests can press keys mid-run).
    fail_at: yield an ErrorEvent instead of step `fail_at`. raise_at: raise RuntimeError there instead.
    chat_template=False: raw prompt, with a Notice first.
    """

    def __init__(self, *, delay: float = 0.0, options: RunOptions | None = None,
                 sampler: SamplerSettings | None = None, facts: ModelFacts = FACTS, fail_at: int | None = None,
                 raise_at: int | None = None, chat_template: bool = True,
                 default_system: str | None = None, keep_end_tokens: bool = False):
        self.facts = facts if chat_template else replace(facts, chat_template=False)
        self.options = options or RunOptions()
        self.delay = delay
        self.fail_at = fail_at
        self.raise_at = raise_at
        self.chat_template = chat_template
        self.default_system = default_system  # what the template would put in an empty system message
        self.keep_end_tokens = keep_end_tokens  # with ignore_eos, play the end token too (as the real engine does)
        self._sampler = (sampler or SamplerSettings()).validated()
        self._changed = False
        self._lock = threading.Lock()
        self._gate_ = StepGate()  # pause / single step exactly as the real engine does them
        self._cond = self._gate_.lock
        self._stop = False
        self.runs: list[tuple[str, str | None]] = []
        self.events: list[Event] = []  # every event of every run
        self.steps: list[StepEvent] = []  # every step of every run
        self.active = 0  # runs in progress (must never exceed 1)
        self.max_active = 0
        self.stop_calls = 0
        self._taken = 0  # steps (over all runs) that have read their settings
        self.updates: list[tuple[int, dict]] = []  # (steps taken when called, changes): the next step is steps[n]

    # ---- settings --------------------------------------------------------------------------------------------
    @property
    def sampler(self) -> SamplerSettings:
        with self._lock:
            return self._sampler

    def update_sampler(self, **changes) -> SamplerSettings:
        with self._lock:
            new = self._sampler.with_changes(**changes)  # raises SettingsError
            if new != self._sampler:
                self._changed = True
            self._sampler = new
            self.updates.append((self._taken, dict(changes)))
            return new

    # ---- control ---------------------------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        return self._gate_.paused

    def pause(self) -> None:
        self._gate_.pause()

    def resume(self) -> None:
        self._gate_.resume()

    def step_once(self) -> None:
        self._gate_.step_once()

    def stop(self) -> None:
        with self._cond:
            self.stop_calls += 1
            self._stop = True
            self._cond.notify_all()

    def _gate(self) -> bool:
        """Wait at a step boundary while paused; False when the run must stop."""
        return self._gate_.wait(lambda: self._stop)

    def _sleep(self) -> None:
        if self.delay:
            with self._cond:
                if not self._stop:
                    self._cond.wait(self.delay)

    # ---- the run ---------------------------------------------------------------------------------------------
    def run(self, prompt: str, system: str | None = None) -> Iterator[Event]:
        with self._cond:  # like the real engines, a step granted before the run (pause + step) carries into it
            self._stop = False
        with self._lock:
            self._changed = False
        self.runs.append((prompt, system))
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            for event in self._run(prompt, system):
                self.events.append(event)
                if isinstance(event, StepEvent):
                    self.steps.append(event)
                yield event
        finally:
            self.active -= 1

    def _run(self, prompt: str, system: str | None) -> Iterator[Event]:
        if not prompt.strip():
            yield ErrorEvent("The prompt is empty: type a question", -1, "prompt")
            return
        if self.chat_template:
            text, pieces, templated = tokenize(prompt, system)
        else:
            yield Notice("This model has no chat template: the raw prompt is used as typed")
            text = prompt
            pieces = [PromptPiece(100 + n, w.replace(" ", "␣"), False)
                      for n, w in enumerate(re.findall(r" ?\S+", prompt))]
            templated = False
        ids = [p.id for p in pieces]
        yield PromptEvent(text=text, ids=ids, pieces=pieces, templated=templated, user_prompt=prompt,
                          system_prompt=system, default_system_prompt=self.default_system)
        n_prompt = len(ids)
        yield PrefillEvent(tokens=n_prompt, ms=42.0, kv_tokens=n_prompt, kv_bytes=n_prompt * KV_BYTES_PER_TOKEN)

        opts = self.options
        script = list(ANSWER)
        if opts.ignore_eos:
            body = list(ANSWER) if self.keep_end_tokens else [s for s in ANSWER if s.id != EOS_ID]
            script = []
            while len(script) < opts.max_new_tokens:
                script.extend(body)
        decode_ms = 0.0
        text_out: list[str] = []
        reason = "eos"
        index = 0
        for index, scripted in enumerate(script):
            if index >= opts.max_new_tokens:
                reason = "length"
                break
            if index:
                self._sleep()
            if not self._gate():
                reason = "stopped"
                break
            if self.fail_at == index:
                yield ErrorEvent(f"NaN in the logits at step {index + 1}: the run stopped", index, "nan")
                return
            if self.raise_at == index:
                raise RuntimeError(f"scripted crash at step {index + 1}")
            with self._lock:
                settings = self._sampler
                changed, self._changed = self._changed, False
                self._taken += 1
            step = self._step(index, scripted, settings, changed, n_prompt)
            if index:
                decode_ms += step.latency_ms
            text_out.append(step.text)
            yield step
            if step.id == EOS_ID and not opts.ignore_eos:
                reason = "eos"
                index += 1
                break
        else:
            index = len(script)
            reason = "length" if opts.ignore_eos else reason
        tokens = index  # steps taken (a stopped run did not take step `index`)
        kv_tokens = n_prompt + max(0, tokens - 1)
        decode_tok_s = (tokens - 1) / (decode_ms / 1000) if tokens > 1 and decode_ms else 0.0
        yield DoneEvent(reason=reason, tokens=tokens, runs=tokens, scores=tokens * self.facts.vocab_rows,
                        ttft_ms=45.0, decode_tok_s=decode_tok_s, text="".join(text_out), prompt_tokens=n_prompt,
                        kv_tokens=kv_tokens, kv_bytes=kv_tokens * KV_BYTES_PER_TOKEN)

    def _step(self, index: int, scripted: ScriptStep, s: SamplerSettings, changed: bool, n_prompt: int) -> StepEvent:
        raw = [c[2] for c in scripted.candidates]
        total = sum(raw)
        probs = apply_sampler(raw, s)
        cands = [Candidate(c[0], c[1], c[2] / total, p, special=c[0] in SPECIAL_IDS)
                 for c, p in zip(scripted.candidates, probs)]
        chosen_rank = next(i for i, c in enumerate(cands) if c.id == scripted.id)
        if s.is_greedy or cands[chosen_rank].prob == 0:
            chosen_rank = 0  # greedy, or the scripted token was cut: take the top one
        chosen = cands[chosen_rank]
        if chosen.id == scripted.id:
            text, pending_hex, pending_needed, completed = (scripted.text, scripted.pending_hex,
                                                            scripted.pending_needed, list(scripted.completed))
            special = scripted.special
        else:
            text = chosen.piece.replace("␣", " ").replace("↵", "\n")
            special = chosen.special
            text = "" if special else text
            pending_hex, pending_needed, completed = "", 0, []
        kept = [c for c in cands if c.prob > 0]
        latency = 45.0 if index == 0 else 20.0 + (index % 4) * 1.5
        kv_tokens = n_prompt + index
        return StepEvent(
            index=index, id=chosen.id, piece=chosen.piece, special=special, text=text,
            pending_hex=pending_hex, pending_needed=pending_needed, completed_chars=completed,
            candidates=cands, chosen_rank=chosen_rank, chosen_raw_prob=chosen.raw_prob, chosen_prob=chosen.prob,
            kept_count=len(kept), kept_mass=sum(c.raw_prob for c in kept),
            entropy_bits=_entropy_bits(c.raw_prob for c in cands),
            sampled_entropy_bits=_entropy_bits(c.prob for c in cands),
            greedy=s.is_greedy, settings=s.to_dict(), settings_changed=changed,
            latency_ms=latency, forward_ms=latency - 0.5,
            kv_tokens=kv_tokens, kv_bytes=kv_tokens * KV_BYTES_PER_TOKEN,
        )


def make_loader(engine: ScriptedEngine | None = None, *, error: Exception | None = None,
                stages: int = 3, delay: float = 0.0, fail_times: int | None = None
                ) -> Callable[[Callable[[LoadProgress], None]], ScriptedEngine]:
    """A loader for DashboardConfig.load: reports `stages` progress steps, then returns `engine` or raises.

    fail_times: raise `error` only on the first N calls (to test retry).
    """
    engine = engine or ScriptedEngine()
    calls = {"n": 0}

    def load(progress: Callable[[LoadProgress], None]) -> ScriptedEngine:
        calls["n"] += 1
        for n in range(stages):
            progress(LoadProgress("converting GGUF", (n + 1) / stages))
            if delay:
                time.sleep(delay / max(1, stages))
        if error is not None and (fail_times is None or calls["n"] <= fail_times):
            raise error
        return engine

    load.calls = calls  # type: ignore[attr-defined]
    load.engine = engine  # type: ignore[attr-defined]
    return load


__all__ = [
    "ANSWER",
    "ANSWER_TEXT",
    "FACTS",
    "ModelLoadError",
    "ScriptedEngine",
    "TokentuiError",
    "apply_sampler",
    "make_loader",
    "screen_text",
    "slow_engine",
    "wait_for",
]


# ---- pilot helpers -------------------------------------------------------------------------------------------

async def wait_for(pilot, predicate: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    """Let the app run until `predicate()` is true; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        await pilot.pause(0.01)


def slow_engine(delay: float = 0.1, steps: int = 400, **kwargs) -> ScriptedEngine:
    """A run that lasts (steps × delay) seconds, so keys can be pressed while it generates."""
    return ScriptedEngine(delay=delay, options=RunOptions(max_new_tokens=steps, ignore_eos=True), **kwargs)


def screen_text(app) -> str:
    """What the terminal shows now, as plain text (the screen plus any modal on top)."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()
