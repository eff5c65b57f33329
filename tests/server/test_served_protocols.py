"""The protocols that keep the served-model modules free of import cycles (core/server/served.py's `Served`, what a
run or a fan-out reads of its engine; core/server/stream.py's `StreamOwner`, what a stream reads of its
connection) name only what the real objects have: a connected ServerEngine and its Connection."""

from __future__ import annotations

from fake_openai_server import FakeServer

from tokentui.core.server.engine import ServerEngine, ServerOptions
from tokentui.core.server.served import Served
from tokentui.core.server.stream import StreamOwner


def members(protocol: type) -> set[str]:
    names = set(protocol.__annotations__)
    names |= {name for name, value in vars(protocol).items()
              if not name.startswith("_") and (callable(value) or isinstance(value, property))}
    return names


def test_a_served_engine_and_its_connection_have_what_the_protocols_name():
    assert {"conn", "vocab", "request_body", "stopping", "paused"} <= members(Served)  # the protocol was read
    assert {"address", "cancelled", "shown", "failure"} == members(StreamOwner)
    with FakeServer(engine="vllm") as server:
        engine = ServerEngine.connect(ServerOptions(server.url))
        try:
            missing = {name for name in members(Served) if not hasattr(engine, name)}
            assert missing == set()
            assert {name for name in members(StreamOwner) if not hasattr(engine.conn, name)} == set()
            assert isinstance(engine.conn.address.url, str)
        finally:
            engine.close()
