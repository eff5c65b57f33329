"""`tokentui branch` of a served model's record: the API key goes only to a server named on the command line, never
to the one the record names (a shared record could name any host)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from cli_run import one_line_error
from fake_openai_server import FakeServer

SECRET = "sk-branch-0123456789abcdef"


def _tokentui(*args, key: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "TOKENTUI_API_KEY"}
    if key is not None:
        env["TOKENTUI_API_KEY"] = key
    return subprocess.run([sys.executable, "-m", "tokentui", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def _record_pointing_at(tmp_path, made_on: FakeServer, url: str):
    """A record made on `made_on`, its model.server.url then changed to `url` (as a shared record could be)."""
    made = _tokentui("--server", made_on.url, "--headless", "--greedy", "--max-new-tokens", "3",
                     "--record-dir", str(tmp_path / "runs"))
    assert made.returncode == 0, made.stderr
    record = next((tmp_path / "runs").iterdir())
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert lines[0]["server"]["url"] == made_on.url
    lines[0]["server"]["url"] = url
    edited = tmp_path / "shared.jsonl"
    edited.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return edited


def _authorizations(server: FakeServer) -> list[str]:
    return [h.get("Authorization", "") for h in server.headers]


def test_branch_refuses_to_send_the_key_to_the_server_a_record_names(tmp_path):
    with FakeServer() as origin, FakeServer() as elsewhere:
        record = _record_pointing_at(tmp_path, origin, elsewhere.url)
        refused = _tokentui("branch", str(record), "--at", "1", "--token", "101", "--no-record", key=SECRET)
        one_line_error(refused, f"add --server {elsewhere.url}", code=2)
        assert "only to a server named on the command line" in refused.stderr and SECRET not in refused.stderr
        assert elsewhere.headers == []  # nothing was sent to the host the record names
        # named on the command line, it is the user's choice: the key goes there
        named = _tokentui("branch", str(record), "--at", "1", "--token", "101", "--no-record", "--server",
                          elsewhere.url, key=SECRET)
        assert named.returncode == 0, named.stderr
        assert set(_authorizations(elsewhere)) == {f"Bearer {SECRET}"}


def test_branch_without_a_key_uses_the_records_server_and_sends_no_key(tmp_path):
    with FakeServer() as origin:
        record = _record_pointing_at(tmp_path, origin, origin.url)
        before = len(origin.headers)
        branched = _tokentui("branch", str(record), "--at", "1", "--token", "101", "--no-record")
        assert branched.returncode == 0, branched.stderr
        assert _authorizations(origin)[before:] and not any(_authorizations(origin)[before:])


def test_replay_of_a_served_record_never_connects(tmp_path):
    with FakeServer() as origin, FakeServer() as named_in_record:
        record = _record_pointing_at(tmp_path, origin, named_in_record.url)
        played = _tokentui("replay", str(record), "--headless", "--speed", "0", key=SECRET)
        assert played.returncode == 0 and played.stdout.strip() == "Hi", played.stderr  # its 3 recorded tokens
        assert named_in_record.headers == []  # the record's server heard nothing, with or without a key
