"""A scored text's and a fan-out's records (issue 26) read back as the runs they were and replay; the torch-free
reading of a fan-out (core/runs/fanout_view.py) the command line and the dashboard share."""

from __future__ import annotations

import pytest

from fake_script import ANSWER_TEXT
from fakes import ScriptedEngine

from tokentui.core.runs.events import DoneEvent, StepEvent
from tokentui.core.runs.explore_events import SampleEvent, ScoreSummary
from tokentui.core.runs.fanout_view import first_difference, first_tokens, piece_texts, ranked, split_from_others
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.recording import RecordedRun
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.requests import FanoutRequest, ScoreRequest
from tokentui.core.runs.run import Run
from tokentui.core.settings import SamplerSettings


def recorded(engine, events, folder) -> Run:
    with RecordedRun(engine.facts, RunRecorder(folder), on_note=lambda message: None) as record:
        record.open()
        played = list(record.record(events))
    back = Run.from_record(record.path)
    return back, played


def test_a_fan_out_s_record_holds_its_samples_and_replays_them(tmp_path):
    engine = ScriptedEngine(sampler=SamplerSettings(temperature=0.8, seed=2))
    run = Run(engine.facts)
    for event in engine.run("Is OpenAI open?"):
        run.apply(event)
    request = FanoutRequest.of_run(run, 3, n=5, m=4, seed=9)
    back, played = recorded(engine, engine.fanout(request), tmp_path)
    samples = [e for e in played if isinstance(e, SampleEvent)]
    assert back.fanout.at == 3 and back.fanout.seed == 9 and back.samples == samples and len(back) == 0
    assert back.end.reason == "length"
    replayed = list(ReplayEngine(back, speed=0).run(""))
    assert [e for e in replayed if isinstance(e, SampleEvent)] == samples and isinstance(replayed[-1], DoneEvent)


def test_a_scored_text_s_record_is_a_run_of_forced_steps_and_its_summary(tmp_path):
    engine = ScriptedEngine()
    back, played = recorded(engine, engine.score(ScoreRequest("Is OpenAI open?", ANSWER_TEXT)), tmp_path)
    steps = [e for e in played if isinstance(e, StepEvent)]
    assert back.score.answer == ANSWER_TEXT and len(back) == len(steps) and all(s.forced for s in back)
    assert back.score_summary == next(e for e in played if isinstance(e, ScoreSummary))
    assert back.end.reason == "scored" and back.text == ANSWER_TEXT
    replayed = list(ReplayEngine(back, speed=0).run(""))
    assert [e.id for e in replayed if isinstance(e, StepEvent)] == [s.id for s in steps]


class _S:
    def __init__(self, n, ids, logprob, pieces=None):
        self.n, self.ids, self.logprob = n, ids, logprob
        self.pieces = pieces or [str(i) for i in ids]


def test_samples_rank_by_log_probability_and_say_where_they_part():
    a, b, c, d = _S(0, [1, 2, 3], -2.0), _S(1, [1, 2, 4], -1.0), _S(2, [5, 6], None), _S(3, [1, 2, 3], -2.0)
    assert [s.n for s in ranked([a, b, c, d])] == [1, 0, 3, 2]
    assert first_difference([1, 2, 3], [1, 2, 4]) == 2 and first_difference([1, 2], [1, 2]) is None
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert split_from_others(b, [a, b, c, d]) == 2  # it follows a (and d) for two tokens
    assert split_from_others(a, [a, b, c, d]) is None  # d is its twin
    assert split_from_others(c, [a, b, c, d]) == 0


def test_first_tokens_count_the_draws_against_the_step_s_probabilities():
    from tokentui.core.runs.events import Candidate

    samples = [_S(0, [7, 1], -1), _S(1, [7, 2], -1), _S(2, [8], -1), _S(3, [9], -1)]
    cands = [Candidate(7, "a", 0.5, 0.6), Candidate(8, "b", 0.3, 0.4)]
    got = first_tokens(samples, cands)
    assert [(t.id, t.count, t.share, t.prob) for t in got] == [(7, 2, 0.5, 0.6), (8, 1, 0.25, 0.4),
                                                              (9, 1, 0.25, None)]


@pytest.mark.parametrize("pieces, texts", [
    (["␣Some", "↵", "."], [" Some", "⏎", "."]),
    (["␣(", "<0xE5><0xBC>", "<0x80>", "放"], [" (", "", "开", "放"]),
])
def test_piece_texts_write_a_split_character_where_it_completes(pieces, texts):
    assert piece_texts(pieces) == texts
