"""Issue 26 through the model process (core/link/protocol.py's StartScore, StartFanout, Tokenize; the child loop of
core/model/process_main.py) on the embedded model: the same events as the in-process engine, and a phrase's pieces
answered while a run is paused."""

from __future__ import annotations

import pytest
import pytest_asyncio

from client_replies import Replies
from tokentui.core.link.process_client import ProcessClient
from tokentui.core.link.protocol import EngineSpec
from tokentui.core.model.engine import Engine
from tokentui.core.runs.events import StepEvent
from tokentui.core.runs.explore_events import SampleEvent
from tokentui.core.runs.requests import FanoutRequest, ScoreRequest
from tokentui.core.runs.run import Run
from tokentui.core.settings import RunOptions, SamplerSettings

pytestmark = pytest.mark.asyncio(loop_scope="module")

SAMPLING = SamplerSettings(temperature=0.8, top_p=1.0, seed=3)
SHORT = RunOptions(max_new_tokens=8, ignore_eos=True)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def child(embedded):
    client = ProcessClient(EngineSpec(sampler=SAMPLING, options=SHORT, dtype="float32"))  # the `embedded` model's path
    await client.load()
    yield client
    client.close()


async def test_a_score_and_a_fan_out_in_the_child_equal_the_in_process_engine_s(embedded, child):
    local = Engine(embedded, SAMPLING, SHORT)
    request = ScoreRequest("What is the capital of France?", "Paris, of course.")
    here = [e for e in local.score(request) if isinstance(e, StepEvent)]
    replies = Replies(child)
    child.score(request)
    there = [e for e in await replies.rest() if isinstance(e, StepEvent)]
    assert [s.id for s in there] == [s.id for s in here] and all(s.forced for s in there)
    assert [s.chosen_raw_prob for s in there] == pytest.approx([s.chosen_raw_prob for s in here], abs=1e-5)

    run = Run(local.facts)
    for event in local.run("Is OpenAI open?"):
        run.apply(event)
    fan = FanoutRequest.of_run(run, 2, n=3, m=4, seed=7)
    here = [e for e in local.fanout(fan) if isinstance(e, SampleEvent)]
    child.fanout(fan)
    there = [e for e in await replies.rest() if isinstance(e, SampleEvent)]
    assert [s.ids for s in there] == [s.ids for s in here] and [s.seed for s in there] == [7, 8, 9]


async def test_a_phrase_is_tokenized_by_the_child_while_its_run_is_paused(embedded, child):
    replies = Replies(child)
    child.start("Is OpenAI open?")
    await replies.next_step()
    child.pause()
    pieces = await child.tokenize(" Lyon, and")
    assert [p.id for p in pieces] == embedded.tokenizer(" Lyon, and", add_special_tokens=False)["input_ids"]
    assert pieces[0].piece == "␣Lyon" and child.paused
    child.resume()
    await replies.rest()
